"""Everything an image is built from, as one digest: the Dockerfile the builder runs, every file of the
build context (the scripts it COPYs, each lock section), the build arguments, the base by digest, the
platform and the builder. Images are built to reproduce (:mod:`buildkit.ship.layers.normalize`): the same
inputs publish the same image. So a publish tags the image ``inputs-<digest>`` too, and ``build
--push`` with inputs a registry already holds under that tag need not build at all: it tags what is
there (:mod:`buildkit.ship.reuse`).

What the digest cannot see, it cannot promise: OS packages from a live mirror that has moved on since
(the build record's caveats name that layer). ``--no-cache`` builds all the same."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from buildkit.image.buildplan import BuildPlan
from buildkit.image.render import context_paths
from buildkit.resources import PACKAGE_DIR

FORMAT = 1  # bump when what the digest covers changes: an older tag then finds nothing
TAG_PREFIX = "inputs-"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_inputs(plan: BuildPlan, builder: str, base_digest: str) -> dict[str, Any]:
    """What ``plan`` builds from with ``builder`` over the base ``base_digest``, each part by its sha256."""
    return {
        "format": FORMAT,
        "dockerfile": _sha256(plan.dockerfile_for(builder).encode()),
        "context": {relative: _sha256((PACKAGE_DIR.parent / relative).read_bytes()) for relative in context_paths()},
        "locks": {relative: _sha256(text.encode()) for relative, text in sorted(plan.lock_files)},
        "build_args": dict(sorted(plan.buildargs)),
        "base": base_digest,
        "platform": plan.platform,
        "builder": builder,
    }


def inputs_digest(inputs: dict[str, Any]) -> str:
    return _sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())


def inputs_tag(digest: str) -> str:
    """The tag naming the image built from inputs of ``digest`` (a tag holds at most 128 characters)."""
    return f"{TAG_PREFIX}{digest[:48]}"
