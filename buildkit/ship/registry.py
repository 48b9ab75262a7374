"""A small client for the OCI distribution API: read manifests back, upload manifest lists.

docker-py pushes images but has no manifest-list API, and a push is only trusted once the
registry serves back the digest we pushed. Transient failures (connection errors, 429, 5xx) are
retried with exponential backoff; anonymous and bearer-token registries are supported, with
credentials taken from ``~/.docker/config.json`` when it has them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.reach import cause, http_failure, registry_failure

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((DOCKER_MANIFEST, DOCKER_LIST, OCI_MANIFEST, OCI_INDEX))
_REF = re.compile(r"^(?P<host>[a-zA-Z0-9.-]+(:\d+)?)/(?P<repo>[a-z0-9]+([._/-][a-z0-9]+)*)$")


@dataclass(frozen=True)
class RegistryRef:
    """``HOST[:PORT]/REPO`` as given to ``--registry``."""

    host: str
    repository: str

    @classmethod
    def parse(cls, text: str) -> RegistryRef:
        match = _REF.match(text.strip())
        if not match or ("." not in match["host"] and ":" not in match["host"] and match["host"] != "localhost"):
            raise InputError(
                f"--registry {text!r}: expected HOST[:PORT]/REPO, e.g. 127.0.0.1:5000/ascendkit or registry.example.com/ml/verl"
            )
        return cls(match["host"], match["repo"])

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    size: int
    body: bytes

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


def _docker_config_auth(host: str) -> tuple[str, str] | None:
    path = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(path.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for key, entry in auths.items():
        if key.removeprefix("https://").removeprefix("http://").split("/")[0] == host and entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return user, password
    return None


class Registry:
    def __init__(self, host: str, *, retries: int = 4, backoff: float = 0.5, timeout: float = 30.0) -> None:
        self.host = host
        loopback = host.split(":")[0] in ("127.0.0.1", "localhost", "[::1]")
        self.base = f"{'http' if loopback else 'https'}://{host}/v2"
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.session = requests.Session()
        self._token: str | None = None

    def _authorize(self, challenge: str) -> bool:
        """Answer a ``Bearer realm=...,service=...,scope=...`` challenge; True when a token was obtained."""
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            return False
        auth = _docker_config_auth(self.host)
        response = self.session.get(realm, params=params, auth=auth, timeout=self.timeout)
        if response.status_code != 200:
            return False
        body = response.json()
        self._token = body.get("token") or body.get("access_token")
        return bool(self._token)

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One call of the distribution API, retried on connection errors, 429 and 5xx; a registry
        that never answers raises Unavailable in one readable line."""
        url = f"{self.base}{path}"
        last = ""
        authorized = False
        for attempt in range(self.retries + 1):
            headers = dict(kwargs.pop("headers", {}) or {})
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            try:
                response = self.session.request(method, url, headers=headers, timeout=self.timeout, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = cause(exc)
            else:
                if response.status_code == 401 and not authorized:
                    authorized = True
                    if self._authorize(response.headers.get("WWW-Authenticate", "")):
                        kwargs["headers"] = headers
                        continue
                if response.status_code == 429 or response.status_code >= 500:
                    last = http_failure(response.status_code, response.content)
                else:
                    return response
            kwargs["headers"] = headers
            if attempt < self.retries:
                time.sleep(self.backoff * 2**attempt)
        what = path.lstrip("/").split("/")[-2] if path.count("/") >= 2 else path  # manifests, blobs, tags, ...
        raise Unavailable(f"{registry_failure(self.host, last)} ({method} {what}, {self.retries + 1} attempts)")

    def get_manifest(self, repository: str, reference: str) -> Manifest | None:
        response = self.request("GET", f"/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise PublishFailed(
                f"registry {self.host}: reading {repository}:{reference} gave {http_failure(response.status_code, response.content)}"
            )
        body = response.content
        digest = response.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        media_type = response.headers.get("Content-Type", "").split(";")[0] or json.loads(body).get("mediaType", "")
        return Manifest(digest, media_type, len(body), body)

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        return (
            self.put_manifest_response(repository, reference, body, media_type).headers.get("Docker-Content-Digest")
            or "sha256:" + hashlib.sha256(body).hexdigest()
        )

    def put_manifest_response(self, repository: str, reference: str, body: bytes, media_type: str) -> requests.Response:
        response = self.request("PUT", f"/{repository}/manifests/{reference}", data=body, headers={"Content-Type": media_type})
        if response.status_code not in (200, 201):
            raise PublishFailed(
                f"registry {self.host}: writing {repository}:{reference} gave {http_failure(response.status_code, response.content)}"
            )
        return response

    def get_blob(self, repository: str, digest: str) -> bytes | None:
        response = self.request("GET", f"/{repository}/blobs/{digest}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            failure = http_failure(response.status_code, response.content)
            raise PublishFailed(f"registry {self.host}: reading blob {digest[:19]} of {repository} gave {failure}")
        if "sha256:" + hashlib.sha256(response.content).hexdigest() != digest:
            raise PublishFailed(f"registry {self.host}: blob {digest[:19]} of {repository} does not match its digest")
        return response.content

    def put_blob(self, repository: str, data: bytes) -> str:
        """Upload ``data`` (monolithic POST-then-PUT) unless the registry has it; returns its digest."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if self.request("HEAD", f"/{repository}/blobs/{digest}").status_code == 200:
            return digest
        started = self.request("POST", f"/{repository}/blobs/uploads/")
        location = started.headers.get("Location", "")
        if started.status_code != 202 or not location:
            failure = http_failure(started.status_code, started.content)
            raise PublishFailed(f"registry {self.host}: starting an upload to {repository} gave {failure}")
        if location.startswith("/"):
            location = self.base.removesuffix("/v2") + location
        separator = "&" if "?" in location else "?"
        done = self.session.put(
            f"{location}{separator}digest={digest}",
            data=data,
            headers={"Content-Type": "application/octet-stream", **({"Authorization": f"Bearer {self._token}"} if self._token else {})},
            timeout=self.timeout,
        )
        if done.status_code != 201:
            failure = http_failure(done.status_code, done.content)
            raise PublishFailed(f"registry {self.host}: uploading blob {digest[:19]} to {repository} gave {failure}")
        return digest

    def referrers(self, repository: str, digest: str, artifact_type: str) -> list[dict[str, Any]] | None:
        """The OCI 1.1 referrers of ``digest`` with ``artifact_type``; None when the registry has no referrers API."""
        response = self.request("GET", f"/{repository}/referrers/{digest}", params={"artifactType": artifact_type})
        if response.status_code != 200 or not response.headers.get("Content-Type", "").startswith(OCI_INDEX):
            return None
        manifests = response.json().get("manifests", [])
        return [m for m in manifests if isinstance(m, dict) and m.get("artifactType") == artifact_type]
