"""A client for the OCI distribution API: manifests and blobs by digest, cross-repository mounts,
tags, referrers; every call bounded and retried the way busy registries need.

Registries under load answer 503 and 429, drop connections mid-upload and answer slowly. Each call
is retried on a dropped or refused connection, a timeout, 408, 429 and 5xx, waiting as the
registry's ``Retry-After`` asks (capped) or backing off exponentially; a registry that keeps failing
ends the run as :class:`Unavailable` (exit 4) in one line that names it. The bound is per call:
what already landed is never sent again (blobs are looked up by digest first, and an upload cut
off resumes where the registry stands: :mod:`.upload`), so a long push converges however many
calls fail on the way. Anonymous, basic and bearer-token registries are
supported, with the credentials Docker would send (:mod:`buildkit.ship.credentials`: credHelpers,
credsStore, auths); a registry that still refuses names itself and the login command.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import requests

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.reach import cause, http_failure, registry_failure
from buildkit.retry import MAX_WAIT, RETRIED_STATUS, TRANSIENT, RetryPolicy
from buildkit.settings import env_whole_number
from buildkit.ship.credentials import Credentials, credentials_for, login_hint
from buildkit.ship.upload import Opener, Upload

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_MANIFESTS = (DOCKER_MANIFEST, OCI_MANIFEST)
INDEXES = (DOCKER_LIST, OCI_INDEX)
ACCEPT = ", ".join((DOCKER_MANIFEST, DOCKER_LIST, OCI_MANIFEST, OCI_INDEX))
_REPOSITORY_OF_PATH = re.compile(r"^/(?P<repo>.+?)/(?:manifests|blobs|tags|referrers)/")


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    size: int
    body: bytes

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEXES or (self.media_type not in IMAGE_MANIFESTS and "manifests" in self.json())


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def host_url(host: str) -> str:
    """``https://HOST``; plain http on loopback only (the test registries, a local mirror)."""
    loopback = host.split(":")[0] in ("127.0.0.1", "localhost", "[::1]")
    return f"{'http' if loopback else 'https'}://{host}"


def default_retries() -> int:
    """How many times a call is tried again: ``$ASCENDKIT_REGISTRY_RETRIES``, default 6 (about 45 s
    of a registry that stays down before the run ends)."""
    return env_whole_number("ASCENDKIT_REGISTRY_RETRIES", 6, 0, 100)


class Registry:
    """One registry host. ``retries``: how many times one call is tried again (default
    :func:`default_retries`); ``max_wait``: the longest pause between two tries, whatever
    ``Retry-After`` says."""

    def __init__(
        self,
        host: str,
        *,
        retries: int | None = None,
        backoff: float = 0.5,
        max_wait: float = MAX_WAIT,
        timeout: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.host = host
        self.base = f"{host_url(host)}/v2"
        self.policy = RetryPolicy(default_retries() if retries is None else retries, backoff, max_wait, sleep)
        self.timeout = timeout
        self.session = requests.Session()
        self._tokens: dict[str, str] = {}  # repository ("" for the host) -> bearer token
        self._basic: tuple[str, str] | None = None
        self._credentials: Credentials | None = None
        self._looked_up = False  # the helper runs once per registry, when the registry first asks
        self.retried = 0  # calls tried again, for the summary and the tests
        self.sent = 0  # blob bytes that left for this registry (a resent chunk counts twice)
        self.restarted = 0  # uploads the registry dropped, sent again from byte 0
        self._counting = threading.Lock()  # blobs go up several at a time

    # ---- transport ----------------------------------------------------------------------------

    def credentials(self) -> Credentials | None:
        if not self._looked_up:
            self._credentials, self._looked_up = credentials_for(self.host), True
        return self._credentials

    def _authorize(self, challenge: str, repository: str) -> bool:
        """Answer a ``Bearer realm=...,service=...,scope=...`` or ``Basic`` challenge; True when credentials were found."""
        scheme = challenge.split(" ", 1)[0].lower()
        found = self.credentials()
        if scheme == "basic":
            self._basic = found.basic if found else None
            return self._basic is not None
        if scheme != "bearer":
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            return False
        if found and found.identity_token:  # a refresh token: OAuth2 to the token service, as Docker does
            form = {"grant_type": "refresh_token", "refresh_token": found.identity_token, "client_id": "ascendkit", **params}
            response = self.session.post(realm, data=form, timeout=self.timeout)
        else:
            response = self.session.get(realm, params=params, auth=found.basic if found else None, timeout=self.timeout)
        if response.status_code != 200:
            return False
        body = response.json()
        token = body.get("token") or body.get("access_token")
        if token:
            self._tokens[repository] = str(token)
        return bool(token)

    def _headers(self, repository: str, extra: dict[str, str] | None) -> dict[str, str]:
        headers = dict(extra or {})
        token = self._tokens.get(repository)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._basic:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(self._basic).encode()).decode()
        return headers

    @property
    def retries(self) -> int:
        return self.policy.retries

    @property
    def max_wait(self) -> float:
        return self.policy.max_wait

    def _wait(self, attempt: int, response: requests.Response | None) -> None:
        self.policy.wait(attempt, response)

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        url: str | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One call of the distribution API (``url`` overrides ``base + path``, for upload locations),
        tried again on a lost connection, a timeout, 408, 429 and 5xx; Unavailable once the tries run out."""
        match = _REPOSITORY_OF_PATH.match(path)
        repository = match["repo"] if match else ""
        target = url or f"{self.base}{path}"
        last = ""
        authorized = False
        attempt = 0
        while True:
            response = None
            try:
                response = self.session.request(
                    method,
                    target,
                    headers=self._headers(repository, headers),
                    params=params,
                    data=body,
                    timeout=self.timeout,
                    stream=stream,
                )
            except TRANSIENT as exc:
                last = cause(exc)
            if response is not None:
                if response.status_code == 401 and not authorized:
                    authorized = True
                    if self._authorize(response.headers.get("WWW-Authenticate", ""), repository):
                        continue
                if response.status_code not in RETRIED_STATUS:
                    return response
                last = http_failure(response.status_code, response.content)
            if attempt >= self.retries:
                break
            self.count_retry()
            self._wait(attempt, response)
            attempt += 1
        what = path.lstrip("/").split("/")[-2] if path.count("/") >= 2 else path  # manifests, blobs, uploads, tags...
        raise Unavailable(f"{registry_failure(self.host, last)} ({method} {what}, {self.retries + 1} attempts)")

    def _failed(self, doing: str, response: requests.Response) -> PublishFailed:
        said = f"registry {self.host}: {doing} gave {http_failure(response.status_code, response.content)}"
        if response.status_code in (401, 403):
            found = self._credentials if self._looked_up else None
            whose = f"the credentials from {found.source} were refused" if found else "no credentials were sent"
            return PublishFailed(f"{said}; {whose}: {login_hint(self.host)}")
        return PublishFailed(said)

    # ---- manifests ----------------------------------------------------------------------------

    def get_manifest(self, repository: str, reference: str) -> Manifest | None:
        response = self.request("GET", f"/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._failed(f"reading {repository}:{reference}", response)
        body = response.content
        digest = digest_of(body)
        if reference.startswith("sha256:") and digest != reference:
            raise PublishFailed(f"registry {self.host}: {repository}@{reference} served a manifest whose digest is {digest}")
        media_type = response.headers.get("Content-Type", "").split(";")[0]
        if media_type not in (*IMAGE_MANIFESTS, *INDEXES):
            media_type = str(json.loads(body).get("mediaType", "")) or media_type
        return Manifest(digest, media_type, len(body), body)

    def has_manifest(self, repository: str, reference: str) -> bool:
        response = self.request("HEAD", f"/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        return response.status_code == 200

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        response = self.put_manifest_response(repository, reference, body, media_type)
        said = response.headers.get("Docker-Content-Digest")
        digest = digest_of(body)
        if said and said != digest:
            raise PublishFailed(f"registry {self.host}: stored {repository}:{reference} as {said}, not the {digest} sent")
        return digest

    def put_manifest_response(self, repository: str, reference: str, body: bytes, media_type: str) -> requests.Response:
        response = self.request("PUT", f"/{repository}/manifests/{reference}", body=body, headers={"Content-Type": media_type})
        if response.status_code not in (200, 201):
            raise self._failed(f"writing {repository}:{reference}", response)
        return response

    def tags(self, repository: str) -> list[str]:
        """Every tag of ``repository`` (following the ``Link`` pages); [] for a repository it does not know."""
        found: list[str] = []
        path: str | None = f"/{repository}/tags/list"
        params: dict[str, str] | None = {"n": "1000"}
        while path:
            response = self.request("GET", path, params=params)
            if response.status_code == 404:
                return found
            if response.status_code != 200:
                raise self._failed(f"listing the tags of {repository}", response)
            found += [str(t) for t in response.json().get("tags") or []]
            link = re.match(r"<(?P<next>[^>]+)>", response.headers.get("Link", ""))
            path, params = (link["next"].removeprefix("/v2"), None) if link else (None, None)
        return found

    def referrers(self, repository: str, digest: str, artifact_type: str | None = None) -> list[dict[str, Any]] | None:
        """The OCI 1.1 referrers of ``digest`` (of ``artifact_type`` when given); None when the registry has no referrers API."""
        params = {"artifactType": artifact_type} if artifact_type else None
        response = self.request("GET", f"/{repository}/referrers/{digest}", params=params)
        if response.status_code != 200 or not response.headers.get("Content-Type", "").startswith(OCI_INDEX):
            return None
        manifests = response.json().get("manifests", [])
        return [m for m in manifests if isinstance(m, dict) and (artifact_type is None or m.get("artifactType") == artifact_type)]

    # ---- blobs --------------------------------------------------------------------------------

    def blob_size(self, repository: str, digest: str) -> int | None:
        """The size of blob ``digest`` in ``repository``, None when the registry does not have it there."""
        response = self.request("HEAD", f"/{repository}/blobs/{digest}")
        if response.status_code != 200:
            return None
        return int(response.headers.get("Content-Length", "-1"))

    def get_blob(self, repository: str, digest: str) -> bytes | None:
        """A small blob (a config, an SBOM), checked against its digest."""
        response = self.request("GET", f"/{repository}/blobs/{digest}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._failed(f"reading blob {digest[:19]} of {repository}", response)
        if digest_of(response.content) != digest:
            raise PublishFailed(f"registry {self.host}: blob {digest[:19]} of {repository} does not match its digest")
        return response.content

    def open_blob(self, repository: str, digest: str, offset: int = 0) -> requests.Response:
        """A blob as a stream (the caller closes it), from ``offset`` on where the registry serves
        ranges (206; a 200 is the whole blob); InputError when the registry does not have it."""
        headers = {"Range": f"bytes={offset}-"} if offset else None
        response = self.request("GET", f"/{repository}/blobs/{digest}", stream=True, headers=headers)
        if response.status_code == 404:
            response.close()
            raise InputError(f"registry {self.host}: {repository} has no blob {digest}")
        if response.status_code not in (200, 206):
            raise self._failed(f"reading blob {digest[:19]} of {repository}", response)
        return response

    def mount_blob(self, repository: str, digest: str, source: str) -> bool:
        """Link blob ``digest`` of ``source`` into ``repository`` on this registry without sending it; False when refused."""
        response = self.request("POST", f"/{repository}/blobs/uploads/", params={"mount": digest, "from": source})
        if response.status_code == 201:
            return True
        if response.status_code == 202 and response.headers.get("Location"):  # an upload was opened instead: close it
            self.request("DELETE", "", url=self._location(response.headers["Location"]))
        return False

    def _location(self, location: str) -> str:
        return self.base.removesuffix("/v2") + location if location.startswith("/") else location

    def upload_blob(self, repository: str, digest: str, size: int, opener: Opener, tell: Callable[[str], None] | None = None) -> None:
        """Upload a blob (``opener(offset)`` gives its bytes from ``offset`` on), in chunks that a
        dropped connection does not make start again (:mod:`.upload` says how); ``tell`` hears of
        each resumption."""
        Upload(self, repository, digest, size, opener, tell).run()

    def count_retry(self) -> None:
        with self._counting:
            self.retried += 1

    def count_sent(self, size: int) -> None:
        with self._counting:
            self.sent += size

    def count_restart(self) -> None:
        with self._counting:
            self.restarted += 1

    def find_blob(self, repository: str, digest: str, mount_from: Iterable[str] = ()) -> int | None:
        """The size of ``digest`` in ``repository``: there already, or mounted from the first of
        ``mount_from`` (other repositories of this registry) that lends it; None when it is still missing."""
        size = self.blob_size(repository, digest)
        return size if size is not None else self._mounted(repository, digest, mount_from)

    def _mounted(self, repository: str, digest: str, mount_from: Iterable[str]) -> int | None:
        """The size of ``digest`` once mounted from the first of ``mount_from`` that lends it; None when none does."""
        for source in mount_from:
            if source != repository and self.mount_blob(repository, digest, source):
                return self.blob_size(repository, digest)
        return None

    def ensure_blob(
        self,
        repository: str,
        digest: str,
        size: int,
        opener: Opener,
        mount_from: Iterable[str] = (),
        tell: Callable[[str], None] | None = None,
    ) -> Literal["present", "mounted", "sent"]:
        """The one blob copy publish and mirror share: found, else mounted, else uploaded; how it got there."""
        if self.blob_size(repository, digest) is not None:
            return "present"
        if self._mounted(repository, digest, mount_from) is not None:
            return "mounted"
        self.upload_blob(repository, digest, size, opener, tell)
        return "sent"

    def put_blob(self, repository: str, data: bytes) -> str:
        """A small blob from memory, unless the registry has it; returns its digest."""
        digest = digest_of(data)
        if self.blob_size(repository, digest) is None:
            self.upload_blob(repository, digest, len(data), lambda offset: io.BytesIO(data[offset:]))
        return digest
