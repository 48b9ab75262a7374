"""Blob uploads that survive a dropped connection: a blob goes up in chunks (the distribution API's
``PATCH`` with ``Content-Range``), and after a failure the upload asks the registry where it stands
(``GET`` on the upload's location, its ``Range``) and goes on from there, so a connection cut at
4.9 GB of a 5 GB layer costs the chunk in flight, not the layer. A blob no bigger than a chunk goes
in one request: resuming it would send it all again anyway.

A registry that refuses chunks (405, 501 on the first ``PATCH``) gets the blob in one ``PUT``. A
registry that forgets an upload cut short (CNCF distribution, and so Harbor and GitLab's registry,
drops the session when part of a chunk reached it before the cut: its upload state no longer
matches, and it says ``BLOB_UPLOAD_INVALID``) gets the blob again from byte 0, whole: chunks gain
nothing there, and one request is the fewest that can be cut. Behind a proxy that holds each
request body until it is whole (nginx's default, ``proxy_request_buffering on``) no part of a cut
chunk reaches it, and the upload resumes.

Every failure counts against the blob's tries (``RegistrySession.retries``); a try that moves the upload
on gives the tries back, so a long upload on a bad link finishes as long as it keeps moving.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeVar

import requests

from buildkit.errors import PublishFailed, Unavailable
from buildkit.reach import cause, http_failure, registry_failure
from buildkit.retry import RETRIED_STATUS, TRANSIENT
from buildkit.settings import env_whole_number

if TYPE_CHECKING:
    from buildkit.ship.oci.session import RegistrySession

Opener = Callable[[int], IO[bytes]]  # the blob's bytes from an offset on
READ = 1 << 20
_RANGE = re.compile(r"^(?:bytes=)?0-(?P<end>\d+)$")
_LOST = ("BLOB_UPLOAD_UNKNOWN", "BLOB_UPLOAD_INVALID")
_OCTETS = {"Content-Type": "application/octet-stream"}


def chunk_size() -> int:
    """Bytes per ``PATCH``: ``$ASCENDKIT_UPLOAD_CHUNK_MB`` MiB, default 64 (what a cut costs at most)."""
    return env_whole_number("ASCENDKIT_UPLOAD_CHUNK_MB", 64, 1, 4096) << 20


def parallel_uploads() -> int:
    """Blobs of one image sent at once: ``$ASCENDKIT_UPLOAD_PARALLEL``, default 4 (docker's is 5)."""
    return env_whole_number("ASCENDKIT_UPLOAD_PARALLEL", 4, 1, 32)


class _Counted:
    """Exactly ``length`` bytes of ``stream`` as a request body (sent with Content-Length), counted as they leave."""

    def __init__(self, stream: IO[bytes], length: int, count: Callable[[int], None]) -> None:
        self.stream, self.length, self.left, self.count = stream, length, length, count

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[bytes]:
        while self.left > 0:
            piece = self.stream.read(min(READ, self.left))
            if not piece:
                raise PublishFailed(f"the blob's source ended {self.left} bytes early")
            self.left -= len(piece)
            self.count(len(piece))
            yield piece


@dataclass
class _Session:
    location: str  # absolute: where the next request of this upload goes
    offset: int = 0  # bytes the registry holds


class Upload:
    """One blob into one repository, in chunks; :meth:`run` returns once the registry holds it."""

    def __init__(
        self, registry: RegistrySession, repository: str, digest: str, size: int, opener: Opener, tell: Callable[[str], None] | None = None
    ) -> None:
        self.registry, self.repository, self.digest, self.size, self.opener = registry, repository, digest, size, opener
        self.tell = tell or (lambda _: None)
        self.chunk = chunk_size()
        self.stream: IO[bytes] | None = None
        self.failures = 0
        self.reauthorized = 0  # tokens fetched again since the upload last moved on
        self.last = ""

    # ---- the conversation -----------------------------------------------------------------------

    def _send(self, method: str, url: str, body: _Counted | None = None, headers: dict[str, str] | None = None) -> requests.Response:
        registry = self.registry
        response = registry.session.request(
            method, url, data=body, headers=registry.headers(self.repository, headers), timeout=registry.timeout
        )
        if response.status_code == 401 and self.reauthorized < 2:
            self.reauthorized += 1
            if registry.authorize(response.headers.get("WWW-Authenticate", ""), self.repository):
                raise _Again  # a token that expired during a long upload: fetched again, the request sent again
        return response  # a 401 that a new token does not cure is the caller's to report

    def _start(self) -> _Session:
        started = self.registry.request("POST", f"/{self.repository}/blobs/uploads/")
        location = started.headers.get("Location", "")
        if started.status_code != 202 or not location:
            raise self.registry.failed(f"starting an upload to {self.repository}", started)
        least = started.headers.get("OCI-Chunk-Min-Length", "")
        if least.isdigit():
            self.chunk = max(self.chunk, int(least))
        return _Session(self.registry.location(location))

    def _where(self, session: _Session) -> _Session | None:
        """Where the registry stands in ``session`` (a new location and offset); None when it dropped the session."""
        try:
            response = self._send("GET", session.location)
        except TRANSIENT as exc:
            self.last = cause(exc)
            return session  # not known: the next chunk's answer will say
        if response.status_code in (200, 204):
            location = response.headers.get("Location")
            return _Session(self.registry.location(location) if location else session.location, _held(response))
        if response.status_code in (400, 404) or any(code in response.text for code in _LOST):
            return None
        if response.status_code in RETRIED_STATUS:
            self.last = http_failure(response.status_code, response.content)
            return session
        raise self.registry.failed(f"asking where the upload of blob {self.digest[:19]} stands", response)

    def _failed(self, response: requests.Response | None) -> None:
        """One more failure: Unavailable when the tries are spent, else the wait the registry asked for."""
        self.failures += 1
        self._close()
        if self.failures > self.registry.retries:
            raise Unavailable(
                f"{registry_failure(self.registry.host, self.last)} (uploading blob {self.digest[:19]}, {self.failures} attempts)"
            )
        self.registry.count_retry()
        self.registry.wait(self.failures - 1, response)

    def _close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    # ---- the upload -----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self.size <= self.chunk:
                self._whole()  # one chunk or one request: the same bytes at stake, one request fewer
            else:
                self._chunked()
        finally:
            self._close()

    def _chunked(self) -> None:
        session = self._start()
        while True:
            response = None
            try:
                if session.offset >= self.size:
                    response = self._send("PUT", _with_digest(session.location, self.digest))
                    if response.status_code in (201, 204):
                        return
                else:
                    if self.stream is None:
                        self.stream = self.opener(session.offset)
                    length = min(self.chunk, self.size - session.offset)
                    last = session.offset + length - 1
                    body = _Counted(self.stream, length, self.registry.count_sent)
                    headers = {**_OCTETS, "Content-Range": f"{session.offset}-{last}"}
                    response = self._send("PATCH", session.location, body, headers)
                    if response.status_code == 202:
                        session = self._moved(session, response, last + 1)
                        continue
                    if response.status_code in (405, 501) and session.offset == 0:
                        self._close()
                        return self._whole()  # a registry that takes blobs in one request only
            except _Again:
                self._close()
                continue
            except TRANSIENT as exc:
                self.last = cause(exc)
            if response is not None:
                if response.status_code not in (*RETRIED_STATUS, 400, 404, 416):
                    raise self.registry.failed(f"uploading blob {self.digest[:19]} to {self.repository}", response)
                self.last = http_failure(response.status_code, response.content)
            self._failed(response)
            found = self._where(session)
            what = f"{self.registry.host}/{self.repository}: blob {self.digest[:19]} ({self.size / 1e6:,.0f} MB)"
            if found is None:  # the registry dropped the session: resumed nowhere
                if self.registry.blob_size(self.repository, self.digest) is not None:
                    return  # the last PUT landed before its answer was lost
                self.registry.count_restart()
                self.tell(f"{what}: the registry dropped the upload ({self.last}); sending it again, whole")
                return self._whole()
            if found.offset != session.offset:
                self.failures = 0  # it moved on: the tries are given back
            self.tell(f"{what}: {self.last}; resuming at {found.offset / 1e6:,.0f} MB, where the registry stands")
            session = found

    def _moved(self, session: _Session, response: requests.Response, expected: int) -> _Session:
        location = response.headers.get("Location")
        offset = _held(response) if response.headers.get("Range") else expected
        if offset != expected:  # the registry holds other than what was sent: go on from where it says
            self._close()
        self.failures = self.reauthorized = 0
        return _Session(self.registry.location(location) if location else session.location, offset)

    def _whole(self) -> None:
        """The blob in one request per try, each try from byte 0 in a new session; its own tries."""
        self.failures = 0
        while True:
            session = self._start()
            response = None
            try:
                body = _Counted(self.opener(0), self.size, self.registry.count_sent)
                try:
                    response = self._send("PUT", _with_digest(session.location, self.digest), body, _OCTETS)
                finally:
                    body.stream.close()
                if response.status_code == 201:
                    return
                if response.status_code not in RETRIED_STATUS and response.status_code != 404:
                    raise self.registry.failed(f"uploading blob {self.digest[:19]} to {self.repository}", response)
                self.last = http_failure(response.status_code, response.content)
            except _Again:
                continue
            except TRANSIENT as exc:
                self.last = cause(exc)
            self._failed(response)


def _held(response: requests.Response) -> int:
    """The bytes an upload holds by its ``Range: 0-<last>``. Distribution says ``0-0`` for none,
    and for one byte too: taken as none (a registry holding one byte refuses the next chunk's
    range, and the try after asks again)."""
    end = _RANGE.match(response.headers.get("Range", ""))
    return int(end["end"]) + 1 if end and int(end["end"]) > 0 else 0


class _Again(Exception):
    """The request met an expired token: it is sent again, and it is not a failure."""


def _with_digest(location: str, digest: str) -> str:
    return f"{location}{'&' if '?' in location else '?'}digest={digest}"


T = TypeVar("T")
R = TypeVar("R")


def each_at_once(work: Callable[[T], R], items: Iterable[T], parallel: int | None = None) -> list[R]:
    """``work`` on every item, ``parallel`` at a time (default :func:`parallel_uploads`), results in
    the items' order. After a failure nothing more is started; the first failure is raised once
    the work under way has ended."""
    todo = list(items)
    if len(todo) <= 1:
        return [work(item) for item in todo]
    stop = threading.Event()

    def guarded(item: T) -> R:
        if stop.is_set():
            raise _Skipped
        try:
            return work(item)
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=min(parallel or parallel_uploads(), len(todo))) as pool:
        futures = [pool.submit(guarded, item) for item in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        if stop.is_set():
            for future in futures:
                future.cancel()
    for future in futures:
        failure = None if future.cancelled() else future.exception()
        if failure is not None and not isinstance(failure, _Skipped):
            raise failure
    return [f.result() for f in futures]


class _Skipped(Exception):
    """An item not started because another failed."""
