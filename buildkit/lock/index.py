"""Read a package index's simple API (PEP 691 JSON, PEP 503 HTML for mirrors that lack JSON).

Answers one question per pin: which files of which versions does this index serve for a target
platform and Python, not for this machine. An index that cannot be reached is reported as such,
never as "not found".
"""

from __future__ import annotations

import hashlib
import html.parser
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import requests
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from buildkit.reach import cause, http_failure, index_failure
from buildkit.retry import TRANSIENT, RetryPolicy

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class DistFile:
    filename: str
    version: Version
    kind: str  # "wheel" or "sdist"
    tags: frozenset[Tag]
    requires_python: str | None
    yanked: bool
    url: str = ""  # absolute
    sha256: str | None = None
    core_metadata: bool = False  # the index serves its METADATA beside it, at url + ".metadata" (PEP 658/714)


@dataclass(frozen=True)
class Project:
    name: str
    files: tuple[DistFile, ...]


class IndexUnreachable(Exception):
    """The index did not answer (connection, timeout, TLS, 5xx): nothing can be said.

    ``why`` is the cause in a few words; the message adds the host and what to do (never the
    credentials of the URL, never a library's repr)."""

    def __init__(self, url: str, why: str) -> None:
        self.url, self.why = url, why
        super().__init__(index_failure(url, why))


class ProjectMissing(Exception):
    """The index answered: it has no such project."""


def target_tags(arch: str, python: str) -> frozenset[Tag]:
    """Wheel tags a manylinux CPython ``python`` on ``arch`` accepts (glibc up to 2.35)."""
    major, minor = (int(p) for p in python.split("."))
    platforms = [f"manylinux_2_{glibc}_{arch}" for glibc in range(35, 16, -1)]
    platforms += [f"manylinux2014_{arch}"] + ([f"manylinux2010_{arch}", f"manylinux1_{arch}"] if arch == "x86_64" else [])
    version = (major, minor)
    tags = set(cpython_tags(version, platforms=platforms))
    tags |= set(compatible_tags(version, interpreter=f"cp{major}{minor}", platforms=platforms))
    return frozenset(tags)


def _parse_file(
    filename: str, requires_python: str | None, yanked: bool, url: str = "", sha256: str | None = None, metadata: bool = False
) -> DistFile | None:
    try:
        if filename.endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(filename)
            return DistFile(filename, version, "wheel", frozenset(tags), requires_python, yanked, url, sha256, metadata)
        if filename.endswith((".tar.gz", ".zip")):
            _, version = parse_sdist_filename(filename)
            return DistFile(filename, version, "sdist", frozenset(), requires_python, yanked, url, sha256)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, str | None, bool, str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        attributes = dict(attrs)
        href = attributes.get("href") or ""
        name = urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1])
        metadata = any(attributes.get(a) not in (None, "false") for a in ("data-core-metadata", "data-dist-info-metadata"))
        self.files.append((name, attributes.get("data-requires-python"), "data-yanked" in attributes, href, metadata))


def failure_of(what: BaseException | requests.Response) -> str:
    """A failed try of an index request in a few words, for :meth:`RetryPolicy.call` (the full text of the exception
    repeats the URL and the connection pool's internals)."""
    return http_failure(what.status_code) if isinstance(what, requests.Response) else cause(what)


class IndexClient:
    """A caching, thread-safe reader of simple indexes."""

    def __init__(
        self, *, ca_bundle: Path | None = None, timeout: float = 15.0, retries: int = 2, policy: RetryPolicy | None = None
    ) -> None:
        self.session = requests.Session()
        if ca_bundle is not None:
            self.session.verify = str(ca_bundle)
        self.timeout = timeout
        self.policy = policy or RetryPolicy(retries)
        self._cache: dict[tuple[str, str], Project | Exception] = {}
        self._lock = threading.Lock()

    def project(self, index_url: str, name: str) -> Project:
        key = (index_url.rstrip("/"), canonicalize_name(name))
        with self._lock:
            cached = self._cache.get(key)
        if cached is None:
            try:
                cached = self._fetch(*key)
            except (IndexUnreachable, ProjectMissing) as exc:
                cached = exc
            with self._lock:
                self._cache[key] = cached
        if isinstance(cached, Exception):
            raise cached
        return cached

    def _fetch(self, index_url: str, name: str) -> Project:
        url = f"{index_url}/{name}/"

        try:
            done = self.policy.call(lambda: self.session.get(url, headers={"Accept": JSON_ACCEPT}, timeout=self.timeout), failure_of)
        except requests.RequestException as exc:  # not a lost connection (a bad URL, a redirect loop): not retried
            raise IndexUnreachable(index_url, cause(exc)) from None
        response = done.response
        if response is None:
            raise IndexUnreachable(index_url, done.last)
        if response.status_code == 404:
            raise ProjectMissing(f"{index_url} has no project {name}")
        if response.status_code != 200:
            raise IndexUnreachable(index_url, http_failure(response.status_code))
        return self._parse(name, response, response.url or url)

    @staticmethod
    def _parse(name: str, response: requests.Response, page_url: str) -> Project:
        files: list[DistFile] = []
        if "json" in response.headers.get("Content-Type", ""):
            for entry in response.json().get("files", []):
                url = urllib.parse.urljoin(page_url, entry.get("url", ""))
                sha256 = (entry.get("hashes") or {}).get("sha256")
                metadata = bool(entry.get("core-metadata") or entry.get("data-dist-info-metadata"))
                parsed = _parse_file(entry["filename"], entry.get("requires-python"), bool(entry.get("yanked")), url, sha256, metadata)
                if parsed:
                    files.append(parsed)
        else:
            anchors = _Anchors()
            anchors.feed(response.text)
            for filename, requires_python, yanked, href, metadata in anchors.files:
                url, _, fragment = urllib.parse.urljoin(page_url, html.unescape(href)).partition("#")
                sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
                python = html.unescape(requires_python) if requires_python else None
                parsed = _parse_file(html.unescape(filename), python, yanked, url, sha256, metadata)
                if parsed:
                    files.append(parsed)
        return Project(name, tuple(files))


def installable(file: DistFile, tags: frozenset[Tag], python: str) -> bool:
    """Would pip, on the target, take this file (before resolving dependencies)?"""
    if file.yanked:
        return False
    if file.requires_python:
        try:
            if Version(python + ".0") not in SpecifierSet(file.requires_python):
                return False
        except (InvalidSpecifier, InvalidVersion):
            pass  # pip ignores a malformed requires-python too
    return file.kind == "sdist" or bool(file.tags & tags)


class HashMismatch(Exception):
    """A downloaded file's sha256 is not the one expected."""


def download(
    session: requests.Session, url: str, dest: Path, sha256s: frozenset[str], timeout: float = 60.0, policy: RetryPolicy | None = None
) -> str:
    """Stream ``url`` to ``dest`` (via a temporary name), accepting it only if its sha256 is one of
    ``sha256s``; returns the digest. A dropped connection or a 429/5xx starts the file again, as
    ``policy`` allows (two more tries by default). Nothing is left at ``dest`` on any failure."""
    policy = policy or RetryPolicy(2)
    partial = dest.with_name(f".{dest.name}.part")
    for attempt in range(policy.retries + 1):
        digest = hashlib.sha256()
        response = None
        try:
            with session.get(url, stream=True, timeout=timeout) as response:
                if response.status_code != 200:
                    if not policy.retried(response.status_code) or attempt == policy.retries:
                        raise IndexUnreachable(url, f"{http_failure(response.status_code)} for {dest.name}")
                else:
                    with partial.open("wb") as out:
                        for chunk in response.iter_content(chunk_size=1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                    break
        except TRANSIENT as exc:
            partial.unlink(missing_ok=True)
            if attempt == policy.retries:
                raise IndexUnreachable(url, f"{cause(exc)} for {dest.name}") from None
        except requests.RequestException as exc:
            partial.unlink(missing_ok=True)
            raise IndexUnreachable(url, f"{cause(exc)} for {dest.name}") from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        policy.wait(attempt, response)
    found = digest.hexdigest()
    if found not in sha256s:
        partial.unlink(missing_ok=True)
        raise HashMismatch(f"{dest.name}: sha256 {found} is not one the lock allows")
    partial.replace(dest)
    return found
