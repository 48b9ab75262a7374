"""Reading the runtime and build requirements of a source-built component from its sdist, unbuilt."""

from __future__ import annotations

import email.parser
import os
import re
import sys
import tarfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement

from buildkit import fsio
from buildkit.errors import AscendkitError, InputError
from buildkit.lock.index import HashMismatch, IndexClient, IndexUnreachable, ProjectMissing, download
from buildkit.lock.inputs import LEGACY_BUILD_REQUIRES, REQUIREMENT_FILES, LockFailed, canon
from buildkit.settings import split_credentials

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class SourceMetadata:
    """What an sdist says it needs, read without building it."""

    dist: str
    version: str
    filename: str
    sha256: str
    requires_from: str  # the file the runtime requirements were read from
    requires: tuple[str, ...]
    build_requires: tuple[str, ...]


class _Archive:
    """Read members of an sdist (.tar.gz or .zip) by their path below its top directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.members: dict[str, bytes] = {}
        wanted = re.compile(r"^[^/]+/(requirements[^/]*\.txt|requirements/[^/]+\.txt|pyproject[^/]*\.toml|PKG-INFO)$")
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if wanted.match(name):
                        self.members[name.split("/", 1)[1]] = archive.read(name)
        else:
            with tarfile.open(path, "r:*") as archive:
                for member in archive:
                    if member.isfile() and wanted.match(member.name):
                        handle = archive.extractfile(member)
                        if handle is not None:
                            self.members[member.name.split("/", 1)[1]] = handle.read()

    def text(self, name: str) -> str | None:
        data = self.members.get(name)
        return None if data is None else data.decode("utf-8", errors="replace")


def _requirement_lines(archive: _Archive, name: str) -> list[str]:
    """Requirements of one requirements file in the sdist, following ``-r`` includes."""
    text = archive.text(name)
    if text is None:
        raise InputError(f"{archive.path.name}: {name} is included but not in the sdist")
    return requirement_lines(text, f"{archive.path.name}: {name}", name, archive.text)


def requirement_lines(
    text: str, where: str, name: str, include: Callable[[str], str | None] | None = None, seen: frozenset[str] = frozenset()
) -> list[str]:
    """The requirements of a requirements file's ``text`` (``name``: its path, for ``-r`` includes,
    which ``include`` reads; ``where`` names it in errors). Index options are dropped: the matrix
    decides indexes."""
    result: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            target = os.path.normpath(str(PurePosixPath(name).parent / line.split(None, 1)[1]))
            if target in seen:
                continue
            included = include(target) if include is not None else None
            if included is None:
                raise InputError(f"{where} line {number}: includes {target}, which cannot be read here")
            result += requirement_lines(included, where.replace(name, target), target, include, seen | {name})
            continue
        if line.startswith("-"):
            continue  # index options (--extra-index-url, --pre): the matrix decides indexes
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise InputError(f"{where} line {number}: not a requirement: {line!r} ({exc})") from None
        result.append(line)
    return result


def project_requirements(text: str, where: str, dist: str, extras: tuple[str, ...]) -> list[str]:
    """[project] dependencies of a pyproject file plus those of ``extras``, following the project's
    references to its own extras (``sglang[diffusion]``)."""
    try:
        project = tomllib.loads(text).get("project", {})
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: {exc}") from None
    optional = project.get("optional-dependencies", {})
    result = [str(r) for r in project.get("dependencies", [])]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in optional:
            raise InputError(f"{where}: no extra {extra!r} in [project.optional-dependencies] (it has {', '.join(sorted(optional))})")
        for line in optional[extra]:
            requirement = Requirement(str(line))
            if canon(requirement.name) == canon(dist):
                todo += sorted(requirement.extras)
            else:
                result.append(str(line))
    return result


def read_sdist(path: Path, dist: str, version: str, sha256: str, project: tuple[str, tuple[str, ...]] | None = None) -> SourceMetadata:
    """What the sdist at ``path`` needs; ``project`` (file, extras): read both from that file of the
    sdist instead, the pyproject.toml its build uses (SGLang's pyproject_npu.toml)."""
    archive = _Archive(path)
    requires_from = next((name for name in REQUIREMENT_FILES if name in archive.members), "")
    if project is not None:
        file, extras = project
        text = archive.text(file)
        if text is None:
            raise LockFailed(f"{path.name}: has no {file}, the project file the matrix builds {dist} with")
        requires = project_requirements(text, f"{path.name}: {file}", dist, extras)
        requires_from = file + (f"[{','.join(extras)}]" if extras else "")
        archive.members["pyproject.toml"] = archive.members[file]  # its build system too
    elif requires_from:
        requires = _requirement_lines(archive, requires_from)
    else:
        info = email.parser.Parser().parsestr(archive.text("PKG-INFO") or "")
        requires = list(info.get_all("Requires-Dist") or [])
        requires_from = "PKG-INFO"
    pyproject = archive.text("pyproject.toml")
    build_requires: list[str] = list(LEGACY_BUILD_REQUIRES)
    if pyproject is not None:
        try:
            data = tomllib.loads(pyproject)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path.name}: pyproject.toml: {exc}") from None
        system = data.get("build-system", {})
        if isinstance(system, dict) and isinstance(system.get("requires"), list):
            build_requires = [str(r) for r in system["requires"]]
    for requirement in build_requires:
        try:
            Requirement(requirement)
        except InvalidRequirement as exc:
            raise InputError(f"{path.name}: pyproject.toml [build-system] requires: {requirement!r}: {exc}") from None
    return SourceMetadata(dist, version, path.name, sha256, requires_from, tuple(requires), tuple(build_requires))


def cache_dir() -> Path:
    """Where downloaded sdists are kept, under ascendkit's cache (``$ASCENDKIT_CACHE`` honoured)."""
    return fsio.cache_dir() / "sdists"


class SdistReader:
    """Downloads (once per process, and once per machine via the cache) and reads sdists."""

    def __init__(self, client: IndexClient, cache: Path | None = None) -> None:
        self.client = client
        self.cache = cache or cache_dir()
        self._done: dict[tuple[str, str, str, str], SourceMetadata | AscendkitError | IndexUnreachable] = {}
        self._lock = threading.Lock()
        self._fetching: dict[tuple[str, str, str, str], threading.Lock] = {}

    def metadata(self, index_url: str, dist: str, version: str, project: tuple[str, tuple[str, ...]] | None = None) -> SourceMetadata:
        key = (index_url, canon(dist), version, repr(project))
        with self._lock:
            gate = self._fetching.setdefault(key, threading.Lock())
        with gate:
            if key not in self._done:
                try:
                    self._done[key] = self._fetch(index_url, dist, version, project)
                except (AscendkitError, IndexUnreachable) as exc:
                    self._done[key] = exc
        result = self._done[key]
        if isinstance(result, Exception):
            raise result
        return result

    def _fetch(self, index_url: str, dist: str, version: str, build_with: tuple[str, tuple[str, ...]] | None) -> SourceMetadata:
        try:
            project = self.client.project(index_url, dist)
        except ProjectMissing:
            raise LockFailed(f"{dist}=={version} is built from source, but {public_url(index_url)} has no project {dist}") from None
        sdists = [f for f in project.files if f.kind == "sdist" and str(f.version) == version and not f.yanked]
        if not sdists:
            raise LockFailed(f"{dist}=={version} is built from source, but {public_url(index_url)} has no sdist of that version")
        sdist = sorted(sdists, key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename))[0]
        if not sdist.sha256:
            raise LockFailed(f"{sdist.filename}: {public_url(index_url)} publishes no sha256 for it; it cannot be locked")
        path = self.cache / sdist.sha256 / sdist.filename
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                download(self.client.session, sdist.url, path, frozenset({sdist.sha256}))
            except HashMismatch as exc:
                raise LockFailed(f"{public_url(index_url)}: {exc}") from None
        return read_sdist(path, dist, version, sdist.sha256, build_with)


def public_url(url: str) -> str:
    return split_credentials(url)[0]
