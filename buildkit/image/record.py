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


def build_record(plan: BuildPlan, base: BaseImage) -> dict[str, Any]:
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
        # built to reproduce: the same inputs give the same published image (buildkit/ship/normalize.py)
        "reproducible": {"source_date_epoch": SOURCE_DATE_EPOCH, "label": EPOCH_LABEL},
        "build_args": {name: _public(value) for name, value in sorted(plan.buildargs)},
    }
