"""What a build was made from, as the build manifest keeps it for provenance: the checkout the
matrix is in, the matrix stack and its pins, the digests of the lock sections
and of the base image, and the build arguments (never a credential: those never are build
arguments, and a URL's ``user:password@`` is cut out all the same).

``publish`` turns it into the image's SLSA provenance, possibly on another machine, later.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from buildkit.image.buildplan import BuildPlan
from buildkit.image.inputs import build_inputs, inputs_digest, inputs_tag
from buildkit.image.render import os_family
from buildkit.image.sbom import BaseImage
from buildkit.plan.layers import EPOCH_LABEL, SOURCE_DATE_EPOCH
from buildkit.resources import PACKAGE_DIR
from buildkit.settings import split_credentials


def _public(value: str) -> str:
    """``value`` with any URL in it (space-separated, as the extra index variables hold several) stripped of ``user:password@``."""
    return " ".join(split_credentials(word)[0] for word in value.split(" "))


def _git(root: Path, *argv: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def source_of(root: Path = PACKAGE_DIR.parent) -> dict[str, Any] | None:
    """The repository and commit the build ran from: GitHub Actions' own variables in a workflow, else
    the git checkout ``root`` is in (the matrix's: it holds the matrix, the locks and, in ascendkit's
    own repository, the templates; ``dirty`` when it has changes); None outside a checkout."""
    if os.environ.get("GITHUB_ACTIONS") == "true" and os.environ.get("GITHUB_SHA"):
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
        return {"repository": f"{server}/{os.environ.get('GITHUB_REPOSITORY', '')}", "commit": os.environ["GITHUB_SHA"], "dirty": False}
    commit = _git(root, "rev-parse", "HEAD")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return None
    url = _public(_git(root, "config", "--get", "remote.origin.url")) or root.as_uri()
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return {"repository": url, "commit": commit, "dirty": dirty}


# What no rebuild can promise to make the same, per layer (the Dockerfile's step), by the OS family of the base.
_OS_CAVEATS = {
    "debian": "OS packages come from a live mirror (APT_MIRROR): a rebuild gives the same layer only while it serves the same versions",
    "rpm": "OS packages come from a live mirror, and the rpm database keeps each package's install time: this layer differs at every build",
}


_SOURCE_BUILD = re.compile(r"^# source build: (\S+) from \S+ \(sha256:([0-9a-f]{64})\)", re.MULTILINE)


def reproducibility_caveats(plan: BuildPlan) -> list[dict[str, str]]:
    """Each layer that may not reproduce, and why: the system step (a live mirror), and each layer that
    builds a package from its sdist (the lock names them; built without debug info, reproducible as far
    as its build is)."""
    caveats = [{"layer": "1. System packages", "why": _OS_CAVEATS[os_family(plan.os_name)]}]
    lock = (plan.matrix_root / plan.image.lock_path) if plan.matrix_root is not None else None
    text = lock.read_text(encoding="utf-8") if lock is not None and lock.is_file() else ""
    sdists = {sha: pin for pin, sha in _SOURCE_BUILD.findall(text)}
    for path, section in plan.lock_files:
        if not path.endswith(f"-{plan.arch}.txt"):
            continue  # another arch's section, in the image for its builds
        for sha, pin in sdists.items():
            if f"sha256:{sha}" in section:
                why = f"{pin} is built from its sdist (no debug info, hash-based bytecode): the same where its build is deterministic"
                caveats.append({"layer": f"layer of {path}", "why": why})
    return caveats


def build_record(plan: BuildPlan, base: BaseImage, builder: str) -> dict[str, Any]:
    inputs = build_inputs(plan, builder, base.digest)
    return {
        "source": source_of(plan.matrix_root or PACKAGE_DIR.parent),
        "stack": plan.stack_id,
        "framework": plan.image.framework,
        "chip": plan.chip_id,
        "arch": plan.arch,
        "os": plan.os_name,
        "skus": list(plan.expected.skus),
        "pins": [{"name": dist, "version": version} for dist, version in plan.expected.packages],
        "checkouts": [{"name": c.name, "uri": f"git+{c.url}", "ref": c.ref} for c in plan.image.checkouts],
        "lock_status": plan.lock_status,
        "lock_files": {path: hashlib.sha256(text.encode()).hexdigest() for path, text in plan.lock_files},
        "base_image": {"ref": base.ref, "digest": base.digest, "from_registry": base.from_registry}
        | ({"layers": base.layers} if base.layers >= 0 else {}),
        # built to reproduce: the same inputs give the same published image (buildkit/ship/layers/normalize.py)
        "reproducible": {"source_date_epoch": SOURCE_DATE_EPOCH, "label": EPOCH_LABEL, "caveats": reproducibility_caveats(plan)},
        "build_args": {name: _public(value) for name, value in sorted(plan.buildargs)},
        # every input as one digest: what `build --push` finds an image it need not build by (buildkit/image/inputs.py)
        "inputs": {"digest": inputs_digest(inputs), "tag": inputs_tag(inputs_digest(inputs)), "parts": inputs},
    }
