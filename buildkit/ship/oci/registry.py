"""A client for the OCI distribution API: manifests and blobs by digest, cross-repository mounts,
tags, referrers; every call bounded and retried the way busy registries need
(:class:`~buildkit.ship.oci.session.RegistrySession` owns the transport: credentials, headers, retries).

The bound is per call: what already landed is never sent again (blobs are looked up by digest
first, and an upload cut off resumes where the registry stands: :mod:`buildkit.ship.oci.upload`), so a long push
converges however many calls fail on the way.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import requests

from buildkit.errors import InputError, PublishFailed
from buildkit.ship.oci.session import RegistrySession
from buildkit.ship.oci.upload import Opener, Upload

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_MANIFESTS = (DOCKER_MANIFEST, OCI_MANIFEST)
INDEXES = (DOCKER_LIST, OCI_INDEX)
ACCEPT = ", ".join((DOCKER_MANIFEST, DOCKER_LIST, OCI_MANIFEST, OCI_INDEX))


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


class Registry(RegistrySession):
    """The distribution API of one registry host, spoken through its :class:`RegistrySession`."""

    # ---- manifests ----------------------------------------------------------------------------

    def get_manifest(self, repository: str, reference: str) -> Manifest | None:
        response = self.request("GET", f"/{repository}/manifests/{reference}", headers={"Accept": ACCEPT})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self.failed(f"reading {repository}:{reference}", response)
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

    def put_referrer(self, repository: str, body: bytes, media_type: str, subject: str, artifact_type: str) -> tuple[str, bool]:
        """An artifact manifest naming image ``subject`` as its subject, by digest: its digest, and
        whether the registry links it by that subject (a referrers API that answered the push with
        ``OCI-Subject``). Where it does not, the caller stages the tag that finds it."""
        has_referrers = self.referrers(repository, subject, artifact_type) is not None
        digest = digest_of(body)
        response = self.put_manifest_response(repository, digest, body, media_type)
        return digest, has_referrers and response.headers.get("OCI-Subject") == subject

    def put_manifest_response(self, repository: str, reference: str, body: bytes, media_type: str) -> requests.Response:
        response = self.request("PUT", f"/{repository}/manifests/{reference}", body=body, headers={"Content-Type": media_type})
        if response.status_code not in (200, 201):
            raise self.failed(f"writing {repository}:{reference}", response)
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
                raise self.failed(f"listing the tags of {repository}", response)
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

    def get_blob(self, repository: str, digest: str) -> bytes | None:
        """A small blob (a config, an SBOM), checked against its digest."""
        response = self.request("GET", f"/{repository}/blobs/{digest}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self.failed(f"reading blob {digest[:19]} of {repository}", response)
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
            raise self.failed(f"reading blob {digest[:19]} of {repository}", response)
        return response

    def mount_blob(self, repository: str, digest: str, source: str) -> bool:
        """Link blob ``digest`` of ``source`` into ``repository`` on this registry without sending it; False when refused."""
        response = self.request("POST", f"/{repository}/blobs/uploads/", params={"mount": digest, "from": source})
        if response.status_code == 201:
            return True
        if response.status_code == 202 and response.headers.get("Location"):  # an upload was opened instead: close it
            self.request("DELETE", "", url=self.location(response.headers["Location"]))
        return False

    def _location(self, location: str) -> str:
        return self.base.removesuffix("/v2") + location if location.startswith("/") else location

    def upload_blob(self, repository: str, digest: str, size: int, opener: Opener, tell: Callable[[str], None] | None = None) -> None:
        """Upload a blob (``opener(offset)`` gives its bytes from ``offset`` on), in chunks that a
        dropped connection does not make start again (:mod:`buildkit.ship.oci.upload` says how); ``tell`` hears of
        each resumption."""
        Upload(self, repository, digest, size, opener, tell).run()

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
