"""What an image is, whichever engine holds it: its config's digest (and the DiffIDs that config
lists), never what the engine calls it; and how to find that in a ``docker save`` archive.

Engines write four layouts (docs/engines.md):

* Docker before 25: ``<id>/layer.tar`` per layer (uncompressed; a repeated layer a symlink to the
  first), ``<config hex>.json``;
* Docker 25+ on a graph driver (overlay2): an OCI layout, ``blobs/sha256/<hex>``, layers
  uncompressed and named by their DiffID;
* Docker's containerd image store (the default of fresh Docker 29 installs and Docker Desktop):
  an OCI layout whose blobs are **as stored**, gzip- or zstd-compressed where the image was, named
  by their own digest; its ``index.json`` may point at an index that also holds attestations;
* Podman: the docker-archive form, ``<DiffID hex>.tar`` with ``<legacy id>/layer.tar`` symlinks.

Each carries ``manifest.json`` (the config's path and the layers' paths, in order): that is what is
read. The image ID is the config digest on all but the containerd store, whose image ID is the
digest of a manifest or index; there the config digest is found by reading that manifest out of
the archive (:func:`identify`), once: a manifest digest always names the same config, so the answer
is remembered in the cache. An image BuildKit just built needs no archive: its build metadata names
both digests (:func:`remember_config`). Reading the archive costs as much as the image is large (the
test stack's 725 MB: about 30 core-seconds of the engine's CPU and ours, more than its clean build).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import Unavailable
from buildkit.fsio import cache_dir, read_cache, write_cache
from buildkit.image.engine import CONTAINERD_STORE, engine_facts
from buildkit.image.stream import ChunkReader, saved
from buildkit.reach import engine_said

SMALL = 1 << 20  # members up to this size are read into memory (configs, manifests, indexes, tiny layers)
_DIGEST_NAMED = re.compile(r"^(?:blobs/sha256/(?P<blob>[0-9a-f]{64})|(?P<tar>[0-9a-f]{64})\.tar)$")
ATTESTATION = "attestation-manifest"  # BuildKit's vnd.docker.reference.type of an index's attestation entries


class ArchiveUnreadable(ValueError):
    """A ``docker save`` archive that does not hold what every engine's layout holds."""


@dataclass(frozen=True)
class ImageIdentity:
    """An image as registries and provenance know it, and the name its engine knows it by."""

    config: str  # sha256:<hex> of the image config: what the image is, on every engine
    engine_id: str  # what this engine calls it: the config digest, or on the containerd store a manifest/index digest


def blob_digest(name: str) -> str | None:
    """``sha256:<hex>`` of a member named by its own digest (``blobs/sha256/<hex>``, Podman's ``<hex>.tar``)."""
    match = _DIGEST_NAMED.match(name)
    return None if match is None else "sha256:" + (match["blob"] or match["tar"])


def link_target(member: tarfile.TarInfo) -> str:
    """The member a symlink or hard link in the archive stands for (links are relative to their directory)."""
    if member.issym():
        return posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
    return member.linkname


def resolve(name: str, links: Mapping[str, str]) -> str:
    """``name`` with links followed (a bounded chain: a loop is an unreadable archive)."""
    for _ in range(16):
        if name not in links:
            return name
        name = links[name]
    raise ArchiveUnreadable(f"{name}: a loop of links")


@dataclass(frozen=True)
class SavedImage:
    """What ``manifest.json`` says of the one image saved: its config's and layers' members."""

    config: str
    layers: tuple[str, ...]


def saved_image(small: Mapping[str, bytes], links: Mapping[str, str]) -> SavedImage:
    """The image of an archive from its ``manifest.json`` (every layout has one)."""
    if "manifest.json" not in small:
        raise ArchiveUnreadable("no manifest.json")
    try:
        entries = json.loads(small["manifest.json"])
    except ValueError as exc:
        raise ArchiveUnreadable(f"manifest.json is not JSON ({exc})") from None
    if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
        raise ArchiveUnreadable(f"manifest.json lists {len(entries) if isinstance(entries, list) else 'no'} images, not one")
    entry = entries[0]
    config, layers = entry.get("Config"), entry.get("Layers")
    if not isinstance(config, str) or not isinstance(layers, list) or not all(isinstance(p, str) for p in layers):
        raise ArchiveUnreadable("manifest.json's entry has no Config and Layers")
    return SavedImage(resolve(config, links), tuple(resolve(p, links) for p in layers))


def _platform_child(index: dict[str, Any], platform: tuple[str, str, str]) -> str | None:
    """The digest of the manifest of ``(os, arch, variant)`` in ``index``, attestations left out."""
    images = [
        m
        for m in index.get("manifests") or []
        if isinstance(m, dict) and (m.get("annotations") or {}).get("vnd.docker.reference.type") != ATTESTATION
    ]
    if len(images) == 1:
        return str(images[0].get("digest") or "") or None
    os_name, arch, variant = platform
    for entry in images:
        given = entry.get("platform") or {}
        if given.get("os") == os_name and given.get("architecture") == arch and given.get("variant", "") in ("", variant):
            return str(entry.get("digest") or "") or None
    return None


def config_from_blobs(start: str, blobs: Mapping[str, bytes], platform: tuple[str, str, str]) -> str | None:
    """The config digest that manifest or index ``start`` leads to, through ``blobs`` (digest ->
    bytes); None while a blob on the way is not among them."""
    digest: str | None = start
    for _ in range(4):  # an index of indexes, at most a few deep
        if digest is None or digest not in blobs:
            return None
        try:
            document = json.loads(blobs[digest])
        except ValueError:
            return None
        if not isinstance(document, dict):
            return None
        if isinstance(document.get("config"), dict):
            return str(document["config"].get("digest") or "") or None
        if isinstance(document.get("manifests"), list):
            digest = _platform_child(document, platform)
            continue
        return None
    return None


def _members(chunks: Iterator[bytes]) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
    """Each member of the archive streamed in ``chunks`` with its bytes when it is small."""
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            data = None
            if member.isfile() and member.size <= SMALL:
                source = archive.extractfile(member)
                assert source is not None
                data = source.read()
            yield member, data


def config_in_archive(chunks: Iterator[bytes], engine_id: str, platform: tuple[str, str, str]) -> str:
    """The config digest of the image ``engine_id`` names, read from its ``docker save`` archive: the
    manifest (or index) blob of that digest leads to it, read as soon as it passes (large blobs are
    read past, never kept); an archive without one (a legacy layout) says it in ``manifest.json``."""
    blobs: dict[str, bytes] = {}
    small: dict[str, bytes] = {}
    links: dict[str, str] = {}
    for member, data in _members(chunks):
        if member.issym() or member.islnk():
            links[member.name] = link_target(member)
        if data is None:
            continue
        small[member.name] = data
        named = blob_digest(member.name)
        if named is not None:
            blobs[named] = data
            found = config_from_blobs(engine_id, blobs, platform)
            if found is not None:
                return found
    saved = saved_image(small, links)
    if saved.config not in small:
        raise ArchiveUnreadable(f"manifest.json names the config {saved.config}, which the archive lacks")
    return "sha256:" + hashlib.sha256(small[saved.config]).hexdigest()


class _KnownConfigs:
    """engine ID (a manifest or index digest) -> config digest, remembered across runs: both are
    digests of content, so an answer never goes stale."""

    LIMIT = 2000

    def __init__(self) -> None:
        self.path = cache_dir() / "image-configs.json"
        self.known: dict[str, str] = {str(k): str(v) for k, v in read_cache(self.path).items()}

    def remember(self, engine_id: str, config: str) -> None:
        self.known.pop(engine_id, None)
        self.known[engine_id] = config
        write_cache(self.path, dict(self.known), self.LIMIT)


def remember_config(engine_id: str, config: str) -> ImageIdentity:
    """What a builder said of the image it loaded: ``engine_id`` (on the containerd store, the digest of
    a manifest it wrote) names ``config``. Both are digests of content, so the answer holds for good, and
    :func:`identify` then need not read the image back out of the engine."""
    if engine_id != config:  # the containerd store: a graph-driver store's ID is the config digest
        _KnownConfigs().remember(engine_id, config)
    return ImageIdentity(config, engine_id)


def identify(client: docker.APIClient, ref: str, inspect: Mapping[str, Any] | None = None, store: str | None = None) -> ImageIdentity:
    """The identity of local image ``ref``: its config digest, and the ID this engine gives it.
    ``inspect`` and ``store`` (the engine's image store) where the caller has them already."""
    try:
        data = inspect if inspect is not None else client.inspect_image(ref)
        engine_id = str(data["Id"])
        if (store or engine_facts(client).image_store) != CONTAINERD_STORE:
            return ImageIdentity(engine_id, engine_id)
        known = _KnownConfigs()
        if engine_id in known.known:
            return ImageIdentity(known.known[engine_id], engine_id)
        platform = (str(data.get("Os") or "linux"), str(data.get("Architecture") or ""), str(data.get("Variant") or ""))
        with saved(client, engine_id) as chunks:  # closed as soon as the config is known
            config = config_in_archive(chunks, engine_id, platform)
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"reading image {ref} from the engine failed: {engine_said(exc)}") from None
    except (ArchiveUnreadable, tarfile.TarError) as exc:
        raise Unavailable(f"reading image {ref} from the engine: its `docker save` archive is unreadable ({exc})") from None
    known.remember(engine_id, config)
    return ImageIdentity(config, engine_id)
