"""What a registry says about a published image, read with no engine: the digest a tag names now,
and the labels of an image (of one arch of an index). ``k8s render`` and ``sbom`` read these."""

from __future__ import annotations

import json

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import InputError, PublishFailed
from buildkit.imageref import registry_of, split_ref
from buildkit.reach import http_failure
from buildkit.ship.oci.registry import Manifest, Registry


def pin_digest(ref: str) -> str:
    """``HOST/REPO:TAG`` -> ``HOST/REPO:TAG@sha256:...``: the digest the registry serves for the tag
    now (a multi-arch index's own digest for an index), so what runs is what was resolved here."""
    pinned = find_digest(ref)
    if pinned is None:
        name, tag, _ = split_ref(ref)
        host, repository = registry_of(ref) or ("", name)
        raise InputError(f"{ref}: the registry {host} has no tag {tag or 'latest'!r} in {repository}")
    return pinned


def find_digest(ref: str) -> str | None:
    """:func:`pin_digest`, None for a tag the registry does not have."""
    if split_ref(ref)[2]:
        return ref
    read = _pinned_manifest(ref, "its tag cannot be resolved to a digest")
    return None if read is None else read[0]


def index_platforms(ref: str) -> list[str]:
    """``os/arch`` of each image a multi-arch index holds (attestations left out); [] for a single image."""
    found = pinned_platforms(ref)
    if found is None:
        host = (registry_of(ref) or ("",))[0]
        raise InputError(f"{ref}: the registry {host} has no such image")
    return found[1]


def pinned_platforms(ref: str) -> tuple[str, list[str]] | None:
    """``ref`` pinned by digest and the platforms of its index (:func:`index_platforms`), from one
    read of its manifest; None for a tag the registry does not have."""
    read = _pinned_manifest(ref, "its digest and platforms cannot be read")
    if read is None:
        return None
    pinned, manifest = read
    if not manifest.is_index:
        return pinned, []
    found = []
    for member in manifest.json().get("manifests", []):
        platform = member.get("platform") or {}
        if platform.get("os") in (None, "unknown"):  # BuildKit's attestation manifests: not a platform
            continue
        variant = f"/{platform['variant']}" if platform.get("variant") else ""
        found.append(f"{platform['os']}/{platform.get('architecture', '')}{variant}")
    return pinned, sorted(set(found))


def _pinned_manifest(ref: str, what: str) -> tuple[str, Manifest] | None:
    """The manifest ``ref`` names, read once, with ``ref`` pinned to its digest; None for a tag the
    registry does not have. ``what`` cannot be done without a registry host in ``ref``."""
    name, tag, digest = split_ref(ref)
    where = registry_of(ref)
    if where is None:
        raise InputError(f"{ref}: no registry host in the reference, so {what}")
    host, repository = where
    manifest = Registry(host, retries=1, timeout=10.0).get_manifest(repository, digest or tag or "latest")
    if manifest is None:
        return None
    return (ref if digest else f"{name}:{tag or 'latest'}@{manifest.digest}"), manifest


def image_labels(ref: str, arch: str) -> dict[str, str]:
    """The config labels of ``HOST[:PORT]/REPO@sha256:...`` (or ``:TAG``) as the registry serves them;
    for a multi-arch index, of its ``arch`` member."""
    _, tag, digest = split_ref(ref)
    digest = digest or tag or "latest"
    where = registry_of(ref)
    if where is None:
        raise InputError(f"{ref}: no registry host in the reference, so its labels cannot be read")
    host, repository = where
    try:
        return _labels(Registry(host, retries=1, timeout=10.0), ref, repository, digest, arch)
    except ValueError as exc:  # a body that is not the JSON the distribution API promises
        raise PublishFailed(f"registry {host}: {ref}: unreadable answer ({exc})") from None


def _labels(registry: Registry, ref: str, repository: str, digest: str, arch: str) -> dict[str, str]:
    host = registry.host
    manifest = registry.get_manifest(repository, digest)
    if manifest is None:
        raise InputError(f"{ref}: the registry {host} has no such image")
    body = manifest.json()
    if manifest.is_index:
        wanted = DOCKER_ARCH.get(arch, arch)
        members = [m for m in body.get("manifests", []) if (m.get("platform") or {}).get("architecture") == wanted]
        if not members:
            raise InputError(f"{ref}: the index has no {wanted} image")
        member = registry.get_manifest(repository, members[0]["digest"])
        if member is None:
            raise InputError(f"{ref}: the index names {members[0]['digest']}, which the registry does not serve")
        body = member.json()
    config_digest = (body.get("config") or {}).get("digest")
    if not config_digest:
        raise InputError(f"{ref}: the manifest names no image config")
    response = registry.request("GET", f"/{repository}/blobs/{config_digest}")
    if response.status_code != 200:
        raise PublishFailed(f"registry {host}: reading the config of {ref} gave {http_failure(response.status_code, response.content)}")
    config = json.loads(response.content)
    return dict((config.get("config") or {}).get("Labels") or {})
