"""Attach an SBOM to an image digest in a registry, and find it again, through the distribution API.

In the default and the OCI form the SBOM travels as an OCI 1.1 artifact: an image manifest with
``artifactType`` set, the empty config, one layer (the CycloneDX JSON) and ``subject`` naming the
image. A registry with the referrers API links it to the image by that subject (it answers the
push with ``OCI-Subject``). A registry without it (CNCF distribution 2.8, and many mirrors) gets
the same manifest under the tag ``sha256-<hex>.sbom``, the scheme cosign uses, so any client can
find it from the digest alone. In the Docker form (``--media-types docker``, for registries that
refuse OCI media types) it is a Docker image manifest under that tag: see ``compose``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import InputError
from buildkit.fsio import read_input_bytes
from buildkit.image.archive import identify
from buildkit.image.engine import ascendkit_image
from buildkit.image.sbom import MEDIA_TYPE, loads, sbom_path
from buildkit.imageref import IMAGE_REFERENCE, registry_of, split_ref
from buildkit.ship.layers.compose import Form, sbom_artifact, sbom_layer, sbom_of_layer
from buildkit.ship.oci.registry import DOCKER_MANIFEST, Manifest, Registry, digest_of
from buildkit.ship.oci.staged import StagedTag


def fallback_tag(digest: str, kind: str = "sbom") -> str:
    """The tag an attachment of ``digest`` gets where the registry has no referrers API (cosign's scheme)."""
    return digest.replace(":", "-", 1) + f".{kind}"


@dataclass(frozen=True)
class Attached:
    subject: str  # the image digest
    digest: str  # of the artifact manifest
    how: str  # "referrer" or "tag <name>"

    def describe(self) -> dict[str, str]:
        return {"subject": self.subject, "sbom": self.digest, "attached_as": self.how}


def stage_sbom(registry: Registry, repository: str, subject: Manifest, sbom: bytes, form: Form = None) -> tuple[Attached, StagedTag | None]:
    """Push ``sbom`` by digest as the SBOM of ``subject`` in ``form``; idempotent (same bytes, same digest).
    Where the registry does not link it by its subject, the tag that will is staged, not written."""
    platform = ("amd64", "linux")
    if form == "docker":  # the Docker form is an image: it says the platform of the image it describes
        config = json.loads(registry.get_blob(repository, str((subject.json().get("config") or {}).get("digest"))) or b"{}")
        platform = (str(config.get("architecture") or "amd64"), str(config.get("os") or "linux"))
    body, media_type, blobs = sbom_artifact(subject, sbom, form, platform)
    for blob in blobs:
        registry.put_blob(repository, blob)
    if form == "docker":  # a Docker image manifest names no subject: only its tag finds it
        digest, linked = digest_of(body), False
        registry.put_manifest_response(repository, digest, body, media_type)
    else:
        digest, linked = registry.put_referrer(repository, body, media_type, subject.digest, MEDIA_TYPE)
    if linked:
        return Attached(subject.digest, digest, "referrer"), None
    # No referrers API, or one that did not take the subject: the spec's answer is a tag the client can find.
    tag = fallback_tag(subject.digest)
    return Attached(subject.digest, digest, f"tag {tag}"), StagedTag(registry, repository, tag, body, media_type)


def attach_sbom(registry: Registry, repository: str, subject: Manifest, sbom: bytes, form: Form = None) -> Attached:
    """Attach ``sbom`` to ``subject`` now, its tag included (see :func:`stage_sbom`)."""
    attached, staged = stage_sbom(registry, repository, subject, sbom, form)
    if staged is not None:
        staged.write()
    return attached


def fetch_sbom(registry: Registry, repository: str, digest: str) -> bytes | None:
    """The SBOM attached to image ``digest``, in either form: by the referrers API where there is
    one, else by the referrers tag (``sha256-<hex>``) or its own tag (``sha256-<hex>.sbom``)."""
    listed = registry.referrers(repository, digest, MEDIA_TYPE)
    if listed is None:  # no referrers API: the OCI referrers tag (an index of them), where a copy wrote one
        index = registry.get_manifest(repository, digest.replace(":", "-", 1))
        listed = [m for m in index.json().get("manifests", []) if isinstance(m, dict)] if index is not None and index.is_index else []
    candidates = [str(m["digest"]) for m in listed if m.get("artifactType") in (None, MEDIA_TYPE)]
    candidates.append(fallback_tag(digest))
    for reference in candidates:
        manifest = registry.get_manifest(repository, reference)
        if manifest is None:
            continue
        config = None
        if manifest.media_type == DOCKER_MANIFEST:
            config = registry.get_blob(repository, str((manifest.json().get("config") or {}).get("digest")))
        layer = sbom_layer(manifest, digest, config)
        if layer is not None:
            data = registry.get_blob(repository, layer)
            return None if data is None else sbom_of_layer(manifest, data)
    return None


def image_digest(registry: Registry, repository: str, reference: str, arch: str | None) -> str:
    """The digest of the per-arch image ``reference`` names; for a multi-arch index, its ``arch`` member."""
    manifest = registry.get_manifest(repository, reference)
    if manifest is None:
        raise InputError(f"{registry.host}/{repository}@{reference}: the registry has no such image")
    return member_digest(manifest, arch, f"{registry.host}/{repository}@{reference}")


def member_digest(manifest: Manifest, arch: str | None, where: str) -> str:
    """The digest of ``manifest`` itself, or for a multi-arch index that of its ``arch`` member."""
    if not manifest.is_index:
        return manifest.digest
    members = {
        str((m.get("platform") or {}).get("architecture")): str(m["digest"])
        for m in manifest.json().get("manifests", [])
        if isinstance(m, dict) and "digest" in m
    }
    if arch is None:
        arches = ", ".join(sorted(members))
        raise InputError(f"{where} is a multi-arch index ({arches}): give --arch")
    wanted = DOCKER_ARCH.get(arch, arch)
    if wanted not in members:
        raise InputError(f"{where}: the index has no {wanted} image (it has {', '.join(sorted(members))})")
    return members[wanted]


def check_sbom_ref(ref: str) -> None:
    """Refuse a reference that can name neither a registry image by digest nor a local image (no contact made)."""
    match = IMAGE_REFERENCE.match(ref)
    if not match:
        raise InputError(
            f"{ref!r} is not an image reference: NAME[:TAG] (a local image), HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<64 hex>"
        )
    if match["digest"] and not re.match(r"^[^/]+[.:][^/]*/|^localhost/", match["name"]):
        raise InputError(f"{ref!r}: a digest reference is read from its registry: give HOST[:PORT]/REPO@sha256:<64 hex>")


def registry_sbom(ref: str, arch: str | None) -> tuple[dict[str, Any], str]:
    """The SBOM attached to ``HOST/REPO@sha256:...`` or ``HOST/REPO:TAG`` (for an index, to its
    ``arch`` member), and where it was found."""
    _, tag, digest = split_ref(ref)
    where_ref = registry_of(ref)
    if where_ref is None:
        raise InputError(f"{ref}: no registry host in the reference")
    host, repository = where_ref
    registry = Registry(host, retries=1, timeout=20.0)
    member = image_digest(registry, repository, digest or tag or "latest", arch)
    found = fetch_sbom(registry, repository, member)
    where = f"{host}/{repository}@{member}"
    if found is None:
        raise InputError(f"{where}: no SBOM is attached (images pushed by `ascendkit build --push` or `publish` carry one)")
    return loads(found, where), where


def local_sbom(client: docker.APIClient, ref: str, manifest_dir: Path) -> tuple[dict[str, Any], str]:
    """The SBOM the build of local image ``ref`` wrote beside its build manifest."""
    inspect, name = ascendkit_image(client, ref, "for a pushed image give HOST/REPO@sha256:...")
    path = sbom_path(manifest_dir, name)
    if not path.is_file():
        raise InputError(f"{ref}: no SBOM at {path} (--manifest-dir: where its build wrote the manifest)")
    document = loads(read_input_bytes(path, "SBOM"), str(path))
    props = {p.get("name"): p.get("value") for p in document.get("metadata", {}).get("component", {}).get("properties", [])}
    config = identify(client, ref, inspect).config  # the SBOM names the image by its config digest, on every engine
    if props.get("ascendkit:image-id") != config:
        raise InputError(f"{path} describes image {props.get('ascendkit:image-id')}, not {ref} ({config[:19]}): rebuild it")
    return document, str(path)
