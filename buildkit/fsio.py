"""File helpers with one policy for every command: read only regular files, of bounded size; write
only regular files, atomically (a reader, or a crash, never sees a half-written output); ``-``
means stdout; several outputs are written all-or-nothing; a folder a failed command created goes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from buildkit.errors import InputError, OutputError

STDOUT = Path("-")
MAX_INPUT_BYTES = 64 << 20  # matrices, job files, logs and manifests are far smaller; a bigger one is a mistake


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device")):
        if test(mode):
            return name
    for test, name in ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def input_status(path: Path, what: str) -> os.stat_result:
    """Stat an input, following symlinks; refuse what is missing, looped or not a regular file."""
    try:
        status = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:  # ELOOP, EACCES, ENAMETOOLONG, ENOTDIR ...
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    except (RuntimeError, ValueError) as exc:  # a symlink loop on some Pythons; a NUL byte in the path
        raise InputError(f"{path}: cannot read the {what}: {exc}") from None
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"{path}: the {what} is {_kind(status.st_mode)}, not a regular file")
    if status.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{path}: the {what} is {status.st_size} bytes; more than {MAX_INPUT_BYTES >> 20} MiB is not one")
    return status


def read_input_bytes(path: Path, what: str) -> bytes:
    input_status(path, what)
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def read_input_text(path: Path, what: str, *, errors: str = "strict") -> str:
    """A UTF-8 input file as text (``errors="replace"`` for logs, whose bytes are not ours)."""
    data = read_input_bytes(path, what)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None


def read_input_json(source: str, what: str, hint: str) -> Any:
    """A JSON input from a file or ``-`` (stdin); not JSON is the line and ``hint`` (what to give instead)."""
    text = sys.stdin.read() if source == "-" else read_input_text(Path(source), what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: line {exc.lineno}: not JSON ({exc.msg}); {hint}") from None


def check_output_file(path: Path) -> None:
    """Refuse an output path that is not (or would not be) a regular file in an existing directory."""
    try:
        status = path.lstat()
    except (FileNotFoundError, NotADirectoryError):  # the directory checks below say which
        status = None
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise OutputError(f"{path}: cannot write: {exc}") from None
    if status is not None and stat.S_ISLNK(status.st_mode):
        raise OutputError(f"{path}: is a symlink; give the file itself (ascendkit replaces outputs, never writes through links)")
    if status is not None and not stat.S_ISREG(status.st_mode):
        hint = "; give a file name" if stat.S_ISDIR(status.st_mode) else "; use -o - for stdout"
        raise OutputError(f"{path}: is {_kind(status.st_mode)}, not a regular file{hint}")
    directory = path.parent if str(path.parent) else Path()
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{path}: {directory} is not a directory")
    if not directory.is_dir():
        raise OutputError(f"{path}: directory {directory} does not exist")


def _write_temp(path: Path, content: str | bytes) -> Path:
    directory = path.parent if str(path.parent) else Path()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write in {directory}: {exc.strerror}") from None
    try:
        if isinstance(content, bytes):
            with os.fdopen(fd, "wb") as binary:
                binary.write(content)
        else:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(content)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        Path(tmp).chmod(mode)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``text`` to the regular file ``path`` via a temporary file in its directory and a rename.

    Raises :class:`OutputError` (and leaves nothing behind) when the path is a directory, a device,
    a FIFO or a symlink, or its directory is missing or not writable."""
    write_all_atomic([(path, text)])


def write_all_atomic(files: list[tuple[Path, str | bytes]]) -> None:
    """Write several files all or nothing: every one to a temporary file first, then rename each.

    A refusal or a failed write leaves every target as it was."""
    for path, _ in files:
        check_output_file(path)
    temps: list[tuple[Path, Path]] = []
    try:
        for path, text in files:
            temps.append((_write_temp(path, text), path))
        for tmp, path in temps:
            tmp.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)


def write_output(path: Path | None, text: str) -> bool:
    """``-o FILE`` writes atomically; no ``-o`` or ``-o -`` writes to stdout. True when a file was written."""
    if path is None or path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return False
    write_atomic(path, text)
    return True


def check_output_dir(path: Path, what: str) -> None:
    """Refuse an output directory that exists as something else, or cannot be created."""
    try:
        status = path.stat()
    except FileNotFoundError:
        parent = path.parent if str(path.parent) else Path()
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise OutputError(f"{path}: cannot create the {what}: {parent} is not a directory") from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"{path}: cannot create the {what}: {parent} is not writable") from None
        return
    except OSError as exc:
        raise OutputError(f"{path}: cannot use as the {what}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(status.st_mode):
        raise OutputError(f"{path}: the {what} is {_kind(status.st_mode)}, not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: the {what} is not writable")


@contextlib.contextmanager
def output_dir(path: Path, what: str) -> Iterator[Path]:
    """Create ``path`` (and missing parents) for a command's outputs; if the command fails, remove
    the directories it created that are still empty, so a failure leaves no trace."""
    check_output_dir(path, what)
    created: list[Path] = []
    probe = path
    while not probe.exists():
        created.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{path}: cannot create the {what}: {exc.strerror or exc}") from None
    try:
        yield path
    except BaseException:
        for directory in created:  # deepest first
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty
        raise


def cache_dir() -> Path:
    """ascendkit's cache directory: ``$ASCENDKIT_CACHE``, else ``$XDG_CACHE_HOME/ascendkit`` (``~/.cache/ascendkit``).
    The layer cache and the sdists downloaded for locks live here."""
    configured = os.environ.get("ASCENDKIT_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ascendkit"


def read_cache(path: Path) -> dict[str, Any]:
    """The entries of a JSON cache file ascendkit wrote; none when it is missing or unreadable (a
    cache only saves time)."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def write_cache(path: Path, entries: dict[str, Any], limit: int) -> None:
    """The newest ``limit`` of ``entries`` (in insertion order) into cache file ``path``, atomically;
    a cache that cannot be written costs time next run, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(dict(list(entries.items())[-limit:]), indent=0) + "\n")
    except (OSError, OutputError):
        pass


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (wheels and rootfs tarballs run to GBs)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
