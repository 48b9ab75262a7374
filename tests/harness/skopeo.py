"""skopeo, a registry client nobody here wrote, as the docker tests read what ascendkit pushed: a
manifest as stored, the tags of a repository, and a whole copy (every blob fetched and checked
against its digest)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any


def _run(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["skopeo", *argv], capture_output=True, check=False, timeout=600)


def raw(ref: str) -> bytes:
    """The manifest or index ``HOST/REPO:TAG`` (or ``@sha256:…``) names, byte for byte as the registry stores it."""
    proc = _run("inspect", "--tls-verify=false", "--raw", f"docker://{ref}")
    assert proc.returncode == 0, f"skopeo inspect {ref}: {proc.stderr.decode(errors='replace')}"
    return proc.stdout


def digest(ref: str) -> str:
    return "sha256:" + hashlib.sha256(raw(ref)).hexdigest()


def manifest(ref: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw(ref))
    return data


def tags(repository: str) -> list[str]:
    proc = _run("list-tags", "--tls-verify=false", f"docker://{repository}")
    assert proc.returncode == 0, f"skopeo list-tags {repository}: {proc.stderr.decode(errors='replace')}"
    return sorted(json.loads(proc.stdout)["Tags"])


def copy_whole(ref: str, dest: Path, *, all_arches: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``skopeo copy`` into a local directory: every blob fetched and checked against its digest."""
    return _run("copy", "--src-tls-verify=false", *(["--all"] if all_arches else []), f"docker://{ref}", f"dir:{dest}")
