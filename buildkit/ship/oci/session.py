"""One owner for talking to a registry host: its credentials and tokens, the headers every call
carries, the retry policy every call is held to, and the failures a call ends with. The API client
(:mod:`buildkit.ship.oci.registry`) and the chunked uploads (:mod:`buildkit.ship.oci.upload`) both speak through it, so neither
reaches into the other.

Registries under load answer 503 and 429, drop connections mid-upload and answer slowly. Each call
is retried on a dropped or refused connection, a timeout, 408, 429 and 5xx, waiting as the
registry's ``Retry-After`` asks (capped) or backing off exponentially; a registry that keeps failing
ends the run as :class:`Unavailable` (exit 4) in one line that names it. Anonymous, basic and
bearer-token registries are supported, with the credentials Docker would send
(:mod:`buildkit.ship.oci.credentials`: credHelpers, credsStore, auths); a registry that still refuses
names itself and the login command.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Callable

import requests

from buildkit.errors import PublishFailed, Unavailable
from buildkit.reach import cause, http_failure, registry_failure
from buildkit.retry import MAX_WAIT, RETRIED_STATUS, TRANSIENT, RetryPolicy
from buildkit.settings import env_whole_number
from buildkit.ship.oci.credentials import Credentials, credentials_for, login_hint

_REPOSITORY_OF_PATH = re.compile(r"^/(?P<repo>.+?)/(?:manifests|blobs|tags|referrers)/")


def host_url(host: str) -> str:
    """``https://HOST``; plain http on loopback only (the test registries, a local mirror)."""
    loopback = host.split(":")[0] in ("127.0.0.1", "localhost", "[::1]")
    return f"{'http' if loopback else 'https'}://{host}"


def default_retries() -> int:
    """How many times a call is tried again: ``$ASCENDKIT_REGISTRY_RETRIES``, default 6 (about 45 s
    of a registry that stays down before the run ends)."""
    return env_whole_number("ASCENDKIT_REGISTRY_RETRIES", 6, 0, 100)


class RegistrySession:
    """A session with one registry host. ``retries``: how many times one call is tried again (default
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

    def credentials(self) -> Credentials | None:
        if not self._looked_up:
            self._credentials, self._looked_up = credentials_for(self.host), True
        return self._credentials

    def authorize(self, challenge: str, repository: str) -> bool:
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

    def headers(self, repository: str, extra: dict[str, str] | None) -> dict[str, str]:
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

    def wait(self, attempt: int, response: requests.Response | None) -> None:
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
                    headers=self.headers(repository, headers),
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
                    if self.authorize(response.headers.get("WWW-Authenticate", ""), repository):
                        continue
                if response.status_code not in RETRIED_STATUS:
                    return response
                last = http_failure(response.status_code, response.content)
            if attempt >= self.retries:
                break
            self.count_retry()
            self.wait(attempt, response)
            attempt += 1
        what = path.lstrip("/").split("/")[-2] if path.count("/") >= 2 else path  # manifests, blobs, uploads, tags...
        raise Unavailable(f"{registry_failure(self.host, last)} ({method} {what}, {self.retries + 1} attempts)")

    def failed(self, doing: str, response: requests.Response) -> PublishFailed:
        said = f"registry {self.host}: {doing} gave {http_failure(response.status_code, response.content)}"
        if response.status_code in (401, 403):
            found = self._credentials if self._looked_up else None
            whose = f"the credentials from {found.source} were refused" if found else "no credentials were sent"
            return PublishFailed(f"{said}; {whose}: {login_hint(self.host)}")
        return PublishFailed(said)

    def blob_size(self, repository: str, digest: str) -> int | None:
        """The size of blob ``digest`` in ``repository``, None when the registry does not have it there
        (a HEAD: what the API client looks up before sending, and an upload after a lost answer)."""
        response = self.request("HEAD", f"/{repository}/blobs/{digest}")
        if response.status_code != 200:
            return None
        return int(response.headers.get("Content-Length", "-1"))

    def location(self, location: str) -> str:
        """An upload's ``Location`` as a URL (registries may answer with a path)."""
        return self.base.removesuffix("/v2") + location if location.startswith("/") else location

    def count_retry(self) -> None:
        with self._counting:
            self.retried += 1

    def count_sent(self, size: int) -> None:
        with self._counting:
            self.sent += size

    def count_restart(self) -> None:
        with self._counting:
            self.restarted += 1
