"""What each pinned release declares it requires, read from what its index publishes, without
installing or downloading it whole: the METADATA file beside a wheel (PEP 658/714) where the index
serves one, else the wheel's own ``*.dist-info/METADATA`` read through HTTP ranges (the zip's
central directory and that one member, a few hundred KiB of a wheel of any size), else what its
sdist says (:mod:`buildkit.lock.sdist`). Each answer is cached on disk by the file's sha256.
"""

from __future__ import annotations

import email.parser
import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from buildkit.errors import AscendkitError
from buildkit.fsio import write_atomic
from buildkit.lock.index import DistFile, IndexClient, IndexUnreachable, ProjectMissing, failure_of, installable, target_tags
from buildkit.lock.sdist import SdistReader, cache_dir, public_url
from buildkit.matrix.model import PypiPin, Stack
from buildkit.reach import cause
from buildkit.retry import RetryPolicy

CHUNK = 256 * 1024  # one range request: the tail holds the central directory of all but the largest wheels


@dataclass(frozen=True)
class Declared:
    """One release's declared requirements (``Requires-Dist``), as its metadata says them."""

    dist: str
    version: str
    requires: tuple[str, ...]
    requires_python: str | None
    source: str  # the file they were read from, by name (and the member, for an sdist's)
    sha256: str = ""  # that file's, as its index publishes it

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "requires": list(self.requires)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Declared:
        requires = data.get("requires") or []
        assert isinstance(requires, list)
        python = data.get("requires_python")
        python_spec = None if python is None else str(python)
        source, sha256 = str(data["source"]), str(data.get("sha256") or "")
        return cls(str(data["dist"]), str(data["version"]), tuple(map(str, requires)), python_spec, source, sha256)


# How the checks ask for a pin's declared requirements: (stack, arch, component, pin) -> them, or None
# where they cannot be read here.
Reader = Callable[[Stack, str, str, PypiPin], Declared | None]


class MetadataUnavailable(Exception):
    """The index has no file of the release to read, or did not answer."""


def parse_metadata(text: str, dist: str, version: str, source: str, sha256: str = "") -> Declared:
    """Core metadata (RFC 822 headers) -> what it requires."""
    message = email.parser.HeaderParser().parsestr(text)
    requires = tuple(r.strip() for r in message.get_all("Requires-Dist") or [])
    python = message.get("Requires-Python")
    return Declared(dist, version, requires, python.strip() if python else None, source, sha256)


class _Ranges(io.RawIOBase):
    """A remote file read by HTTP range requests, as much as ``zipfile`` asks for (in chunks), each request tried as
    ``policy`` allows. A server that answers a range request with the whole file is refused, unless ``whole_ok``: then
    that answer is the file, read once."""

    def __init__(self, session: requests.Session, url: str, size: int, timeout: float, policy: RetryPolicy, whole_ok: bool) -> None:
        self.session, self.url, self.size, self.timeout = session, url, size, timeout
        self.policy, self.whole_ok = policy, whole_ok
        self.pos = 0
        self.chunks: dict[int, bytes] = {}

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        data = bytearray()
        while len(data) < want:
            start = (self.pos + len(data)) // CHUNK * CHUNK
            chunk = self._chunk(start)
            skip = self.pos + len(data) - start
            data += chunk[skip : skip + want - len(data)]
        buffer[:want] = data
        self.pos += want
        return want

    def _chunk(self, start: int) -> bytes:
        if start not in self.chunks:
            end = min(start + CHUNK, self.size) - 1
            answer = _answer(
                self.policy, lambda: self.session.get(self.url, headers={"Range": f"bytes={start}-{end}"}, timeout=self.timeout), self.url
            )
            if answer.status_code == 200 and self.whole_ok and len(answer.content) == self.size:
                self.chunks.update((at, answer.content[at : at + CHUNK]) for at in range(0, self.size, CHUNK))
                return self.chunks[start]
            if answer.status_code != 206 or len(answer.content) != end - start + 1:
                raise MetadataUnavailable(f"{public_url(self.url)}: the server answered a range request with HTTP {answer.status_code}")
            self.chunks[start] = answer.content
        return self.chunks[start]


def _answer(policy: RetryPolicy, send: Callable[[], requests.Response], url: str) -> requests.Response:
    done = policy.call(send, failure_of)
    if done.response is None:
        raise MetadataUnavailable(f"{public_url(url)}: {done.last}")
    return done.response


def _remote_zip(client: IndexClient, wheel: DistFile, policy: RetryPolicy, whole_ok: bool) -> zipfile.ZipFile:
    """A wheel on its index opened as a zip: its length by HEAD, then what ``zipfile`` reads by ranges (:class:`_Ranges`)."""
    session, timeout = client.session, client.timeout
    head = _answer(policy, lambda: session.head(wheel.url, timeout=timeout, allow_redirects=True), wheel.url)
    size = int(head.headers.get("Content-Length", "0"))
    if head.status_code != 200 or not size:
        raise MetadataUnavailable(f"{public_url(wheel.url)}: HTTP {head.status_code}, no length to read ranges of")
    remote = _Ranges(session, head.url or wheel.url, size, timeout, policy, whole_ok)
    return zipfile.ZipFile(io.BufferedReader(remote, buffer_size=CHUNK))


class MetadataReader:
    """Declared requirements of releases on their indexes; thread-safe, cached on disk (each file
    written whole, so concurrent readers of one release never see half of it)."""

    def __init__(self, client: IndexClient, sdists: SdistReader | None = None, cache: Path | None = None) -> None:
        self.client = client
        self.sdists = sdists or SdistReader(client)
        self.cache = cache or cache_dir() / "metadata"

    def for_pin(self, index_url: str, component: str, pin: PypiPin, arch: str, python: str) -> Declared:
        """What a pin declares as the stack installs it: a source build's from its sdist (its project
        file and extras where the matrix names them, as the lock reads it), else its wheel's."""
        if pin.build_from_source:
            project = (pin.project_file, pin.extras) if pin.project_file is not None else None
            return self._from_sdist(index_url, pin.dist(component), pin.version, project)
        return self.declared(index_url, pin.dist(component), pin.version, target_tags(arch, python), python)

    def declared(self, index_url: str, dist: str, version: str, tags: frozenset[Tag], python: str) -> Declared:
        """What ``dist==version`` requires, from the file of it the target (``tags``, ``python``) would install."""
        try:
            project = self.client.project(index_url, dist)
        except (IndexUnreachable, ProjectMissing) as exc:
            raise MetadataUnavailable(str(exc)) from None
        files = [f for f in project.files if _same(f, version) and not f.yanked]
        wheels = [f for f in files if f.kind == "wheel"]
        chosen = next((f for f in wheels if installable(f, tags, python)), wheels[0] if wheels else None)
        if chosen is None:
            if not any(f.kind == "sdist" for f in files):
                raise MetadataUnavailable(f"{public_url(index_url)} has no file of {dist}=={version}")
            return self._from_sdist(index_url, dist, version, None)
        cached = self.cache / f"{chosen.sha256 or canonicalize_name(chosen.filename)}.json"
        if cached.is_file():
            return Declared.from_json(json.loads(cached.read_text(encoding="utf-8")))
        found = parse_metadata(self._wheel_metadata(chosen), dist, version, chosen.filename, chosen.sha256 or "")
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, json.dumps(found.to_json(), indent=1) + "\n")
        return found

    def _from_sdist(self, index_url: str, dist: str, version: str, project: tuple[str, tuple[str, ...]] | None) -> Declared:
        """What an sdist declares, read as the lock reads it (``project``: the project file and extras it builds with)."""
        try:
            sdist = self.sdists.metadata(index_url, dist, version, project)
        except (AscendkitError, IndexUnreachable) as exc:
            raise MetadataUnavailable(str(exc)) from None
        return Declared(dist, version, sdist.requires, None, f"{sdist.filename}: {sdist.requires_from}", sdist.sha256)

    def _wheel_metadata(self, wheel: DistFile) -> str:
        session, timeout = self.client.session, self.client.timeout
        try:
            if wheel.core_metadata:
                answer = session.get(wheel.url + ".metadata", timeout=timeout)
                if answer.status_code == 200:
                    return answer.content.decode("utf-8", errors="replace")
            with _remote_zip(self.client, wheel, RetryPolicy(0), whole_ok=False) as archive:
                member = next((n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
                if member is None:
                    raise MetadataUnavailable(f"{wheel.filename} has no .dist-info/METADATA")
                return archive.read(member).decode("utf-8", errors="replace")
        except (requests.RequestException, zipfile.BadZipFile) as exc:
            raise MetadataUnavailable(f"{wheel.filename}: {cause(exc) if isinstance(exc, requests.RequestException) else exc}") from None


def wheel_names(client: IndexClient, wheel: DistFile) -> list[str]:
    """The member names of a wheel on its index, from its zip's central directory read through HTTP ranges (a few
    hundred KiB of a wheel of any size); the whole file, once, where the server answers no ranges. A dropped
    connection, a 429 or a 5xx is tried again as the client's policy allows."""
    try:
        with _remote_zip(client, wheel, client.policy, whole_ok=True) as archive:
            return archive.namelist()
    except (requests.RequestException, zipfile.BadZipFile) as exc:
        raise MetadataUnavailable(f"{wheel.filename}: {cause(exc) if isinstance(exc, requests.RequestException) else exc}") from None


def _same(file: DistFile, version: str) -> bool:
    try:
        return file.version == Version(version)
    except InvalidVersion:
        return str(file.version) == version


def index_reader(reader: MetadataReader, index_urls: dict[str, str]) -> Reader:
    """What each pin declares, from its index for the arch (``index_urls``: index name -> URL, mirrors
    applied); None for a pin whose metadata cannot be read here (its index unreachable, no file)."""

    def read(stack: Stack, arch: str, component: str, pin: PypiPin) -> Declared | None:
        try:
            return reader.for_pin(index_urls[pin.index_for(arch)], component, pin, arch, stack.python)  # type: ignore[arg-type]  # the matrix's arches
        except MetadataUnavailable:
            return None

    return read
