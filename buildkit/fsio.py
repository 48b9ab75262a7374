"""File helpers: atomic writes (a reader, or a crash, never sees a half-written output) and hashing."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from buildkit.errors import OutputError


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and a rename.

    Raises :class:`OutputError` (and leaves nothing behind) when the directory is missing or not
    writable.
    """
    directory = path.parent if str(path.parent) else Path()
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; give a file name")
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{path}: {directory} is not a directory")
    if not directory.is_dir():
        raise OutputError(f"{path}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write in {directory}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (wheels and rootfs tarballs run to GBs)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
