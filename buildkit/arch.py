"""The two CPU architectures images are built for, by the matrix's names, and Docker's names for them.
Standard library only: the command line offers them as choices without loading the matrix's models."""

from __future__ import annotations

from typing import Literal, get_args

Arch = Literal["aarch64", "x86_64"]
ARCHES: tuple[Arch, ...] = get_args(Arch)
DOCKER_ARCH: dict[str, str] = {"x86_64": "amd64", "aarch64": "arm64"}  # matrix arch -> OCI/Docker name


def normalize_arch(name: str) -> str:
    """``amd64``/``arm64`` (Docker, OCI) or ``x86_64``/``aarch64`` (uname) -> the matrix's name."""
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)
