"""The build context ``ascendkit build`` hands a builder: the Dockerfile rendered for it, the files it
COPYs from the repository and the lock sections each pip layer installs from."""

from __future__ import annotations

import shutil
from pathlib import Path

from buildkit.image.buildplan import BuildPlan
from buildkit.image.buildx import BUILDKIT
from buildkit.image.render import context_paths
from buildkit.resources import PACKAGE_DIR


def write_context(plan: BuildPlan, context: Path, builder: str = BUILDKIT, *, served: bool = False) -> None:
    """The build context of ``plan`` in ``context``: the Dockerfile for ``builder`` (``served``: BuildKit's
    without secret mounts), the files it COPYs, the lock sections (the benchmarks build the same context
    raw, to measure ascendkit's overhead)."""
    (context / "Dockerfile").write_text(plan.dockerfile_for(builder, served=served), encoding="utf-8")
    for relative in context_paths():  # COPYed by the Dockerfile from its repository path
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_DIR.parent / relative, context / relative)
    for relative, text in plan.lock_files:  # each pip layer COPYs its own from the context root
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        (context / relative).write_text(text, encoding="utf-8")
