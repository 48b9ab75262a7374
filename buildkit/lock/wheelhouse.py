"""Wheelhouses: every locked artifact of one (stack, arch) in a directory, for air-gapped builds.

``make_wheelhouse`` downloads, for each package of a resolved lock, the file the target installs
(a wheel for its platform and CPython, or the sdist for components built from source), each one
checked against the lock's hashes before it is kept. ``missing_from`` is the check
``ascendkit build --offline`` runs first: it names every locked package the directory cannot
supply, so a gap is reported before the engine starts, not halfway through a build.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from buildkit.errors import InputError, Unavailable
from buildkit.fsio import output_dir, sha256_of
from buildkit.lock.index import DistFile, HashMismatch, IndexClient, IndexUnreachable, ProjectMissing, download, installable, target_tags
from buildkit.lock.inputs import LockTarget, lock_inputs
from buildkit.lock.lockfile import LockedPackage, LockFile, lock_problem, read_lock
from buildkit.matrix.load import LoadedMatrix


@dataclass(frozen=True)
class WheelhouseReport:
    directory: Path
    downloaded: tuple[str, ...]
    reused: tuple[str, ...]
    total_bytes: int

    def describe(self) -> dict[str, object]:
        return {
            "directory": str(self.directory),
            "files": len(self.downloaded) + len(self.reused),
            "downloaded": list(self.downloaded),
            "reused": len(self.reused),
            "bytes": self.total_bytes,
        }


def current_lock(loaded: LoadedMatrix, target: LockTarget) -> LockFile:
    """The target's lock, refused when it is missing, stale or unresolved."""
    inputs = lock_inputs(loaded, target)
    problem = lock_problem(loaded.root, inputs)
    if problem is not None:
        raise InputError(problem)
    lock = read_lock(loaded.root / target.path)
    if not lock.resolved:
        reason = lock.header.get("reason", "")
        raise InputError(
            f"{target.path} is unresolved ({reason}); an offline build needs a resolved lock: run `ascendkit lock` where its indexes answer"
        )
    return lock


def _file_key(filename: str) -> tuple[str, str] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return canonicalize_name(name), str(version)


def choose_file(files: tuple[DistFile, ...], package: LockedPackage, *, arch: str, python: str, from_source: bool) -> DistFile | None:
    """The file of ``package`` the target installs, among those whose hash the lock allows."""
    allowed = set(package.hashes)
    candidates = [f for f in files if str(f.version) == package.version and f.sha256 and f"sha256:{f.sha256}" in allowed]
    if from_source:
        sdists = [f for f in candidates if f.kind == "sdist"]
        return sorted(sdists, key=lambda f: f.filename)[0] if sdists else None
    tags = target_tags(arch, python)
    wheels = sorted((f for f in candidates if f.kind == "wheel" and installable(f, tags, python)), key=lambda f: f.filename)
    if wheels:
        return wheels[0]
    sdists = sorted((f for f in candidates if f.kind == "sdist"), key=lambda f: f.filename)
    return sdists[0] if sdists else None


def _inventory(directory: Path) -> dict[tuple[str, str], list[Path]]:
    found: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        key = _file_key(path.name) if path.is_file() else None
        if key is not None:
            found.setdefault(key, []).append(path)
    return found


def missing_from(directory: Path, lock: LockFile) -> list[str]:
    """Locked packages ``directory`` has no file for (by name, version and an allowed hash)."""
    if not directory.is_dir():
        raise InputError(f"--wheelhouse {directory}: no such directory")
    found = _inventory(directory)
    missing = []
    for layer, package in lock.packages:
        allowed = set(package.hashes)
        paths = found.get((package.key, package.version), [])
        if not any(f"sha256:{sha256_of(p)}" in allowed for p in paths):
            what = "no file" if not paths else f"{', '.join(p.name for p in paths)} with a hash the lock does not allow"
            missing.append(f"{package.key}=={package.version} (layer {layer}): {what}")
    return missing


def make_wheelhouse(
    loaded: LoadedMatrix, target: LockTarget, directory: Path, index_urls: dict[str, str], *, ca_bundle: Path | None = None, jobs: int = 8
) -> WheelhouseReport:
    lock = current_lock(loaded, target)
    python = loaded.matrix.stacks[target.stack_id].python
    with output_dir(directory, "wheelhouse (-o)"):
        return _fill(lock, target, python, directory, index_urls, ca_bundle=ca_bundle, jobs=jobs)


def _fill(
    lock: LockFile, target: LockTarget, python: str, directory: Path, index_urls: dict[str, str], *, ca_bundle: Path | None, jobs: int
) -> WheelhouseReport:
    client = IndexClient(ca_bundle=ca_bundle)
    present = _inventory(directory)

    def fetch(item: tuple[str, LockedPackage]) -> tuple[str, bool, int]:
        layer, package = item
        for path in present.get((package.key, package.version), []):
            if f"sha256:{sha256_of(path)}" in package.hashes:
                return path.name, False, path.stat().st_size
        url = index_urls.get(package.source)
        if url is None:
            raise InputError(f"{target.path}: {package.key} comes from index {package.source!r}, which the matrix does not define")
        try:
            project = client.project(url, package.key)
        except ProjectMissing:
            raise Unavailable(f"{package.key}=={package.version}: index {package.source} no longer has the project") from None
        chosen = choose_file(project.files, package, arch=target.arch, python=python, from_source=package.key in lock.source_builds)
        if chosen is None:
            raise Unavailable(
                f"{package.key}=={package.version} (layer {layer}): index {package.source} "
                f"serves no file for {target.arch} with a locked hash"
            )
        path = directory / chosen.filename
        assert chosen.sha256 is not None
        download(client.session, chosen.url, path, frozenset({chosen.sha256}))
        return chosen.filename, True, path.stat().st_size

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(fetch, lock.packages))
    except IndexUnreachable as exc:
        raise Unavailable(f"cannot download the wheelhouse: {exc}") from None
    except HashMismatch as exc:
        raise Unavailable(f"refused a download: {exc}") from None
    downloaded = tuple(sorted(name for name, new, _ in results if new))
    reused = tuple(sorted(name for name, new, _ in results if not new))
    return WheelhouseReport(directory, downloaded, reused, sum(size for _, _, size in results))
