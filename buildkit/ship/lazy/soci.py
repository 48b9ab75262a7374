"""The lazy-pull variant of a published image: a SOCI index beside its gzip image (``publish
--lazy soci``), so nodes whose containerd runs the SOCI snapshotter start it after fetching the
manifests and read each file from the registry when it is first opened.

Measured on our own image (docs/kubernetes.md, benchmarks/bench_coldnode.py): a cold node reaches
its first ``import torch`` 3.8x sooner than the best eager pull on loopback, 7.2x behind a capped
link. The image itself is untouched: the index is an OCI image manifest (config media type
``application/vnd.amazon.soci.index.v1+json``, the empty config ``{}``) whose layers are the zTOCs
of the image's gzip layers of 10 MiB and more (smaller ones are fetched whole, as soci does), with
``subject`` naming the image. It is written exactly as soci-snapshotter 0.4 writes it
(soci/soci_index.go), so the snapshotter finds it the way it finds its own:

- through the OCI referrers API, where the registry has one (it answers the push with
  ``OCI-Subject``: Harbor 2.8 and later, zot);
- else through the referrers tag schema: the tag ``sha256-<hex>`` of the image digest holds an
  index of what refers to it, which soci's client (oras-go) reads when the API is missing
  (distribution 2.8, most mirrors). That tag is staged and written with the image's other tags.

A zTOC takes one inflate of its layer (about 10 s per GB of gzip on one core here; layers go on
every core at once), so zTOCs are kept in the cache directory by layer digest and built once per
layer, whatever the registries and images sharing it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import requests
import urllib3

from buildkit.errors import PublishFailed
from buildkit.fsio import cache_dir, write_atomic
from buildkit.ship.layers.compose import dump
from buildkit.ship.layers.compressing import Blob
from buildkit.ship.layers.compressors import compress_threads
from buildkit.ship.lazy.tarindex import UnsupportedTar
from buildkit.ship.lazy.ztoc import SPAN, VERSION, build_ztoc, marshal
from buildkit.ship.oci.registry import OCI_INDEX, OCI_MANIFEST, Manifest, Registry, digest_of
from buildkit.ship.oci.staged import StagedTag

SOCI_INDEX = "application/vnd.amazon.soci.index.v1+json"  # the index's config media type, its artifactType
ZTOC = "application/octet-stream"
LAYER_DIGEST = "com.amazon.soci.image-layer-digest"
LAYER_MEDIA_TYPE = "com.amazon.soci.image-layer-mediaType"
TOOL_ANNOTATION = "com.amazon.soci.build-tool-identifier"
TOOL = "ascendkit soci 1"  # in every zTOC and index: fixed, so the same image gives the same index
MIN_LAYER = 10 << 20  # soci's default: a smaller layer is fetched whole, faster than lazily
EMPTY_CONFIG = b"{}"
GZIP_LAYERS = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip")

Opener = Callable[[int], IO[bytes]]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Ztocs:
    """The zTOCs of one image's layers: each indexed layer's digest to its zTOC (a blob of the cache
    directory); each layer left to be fetched whole, to the reason."""

    files: dict[str, Blob]
    skipped: dict[str, str]


@dataclass(frozen=True)
class LazyIndex:
    subject: str
    digest: str
    how: str  # "referrer" or "tag sha256-<hex>"
    layers: int  # indexed lazily
    whole: int  # fetched whole

    def describe(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "soci_index": self.digest,
            "attached_as": self.how,
            "lazy_layers": self.layers,
            "whole_layers": self.whole,
        }


def ztoc_path(layer: str) -> Path:
    """Where the zTOC of ``layer`` is kept: keyed by everything its bytes depend on (the layer, the
    format, the span and the tool name written in it)."""
    return cache_dir() / "ztoc" / f"{layer.replace(':', '-')}-{VERSION}-{SPAN}-{TOOL.replace(' ', '_')}.ztoc"


def image_ztocs(manifest: Manifest, open_layer: Callable[[str], Opener], tell: Say) -> Ztocs:
    """A zTOC for each gzip layer of ``manifest`` of MIN_LAYER and more, from the cache or built
    from ``open_layer(digest)`` (several layers at once: inflating releases the GIL); the rest are
    named with the reason they are fetched whole."""
    wanted: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for layer in manifest.json().get("layers", []):
        digest, size, media_type = str(layer["digest"]), int(layer["size"]), str(layer.get("mediaType"))
        if media_type not in GZIP_LAYERS:
            skipped[digest] = f"{media_type}: a SOCI snapshotter indexes gzip layers"
        elif size < MIN_LAYER:
            skipped[digest] = f"{size} bytes: under {MIN_LAYER >> 20} MiB, fetched whole"
        else:
            wanted[digest] = size

    def indexed(digest: str) -> str | None:
        """Why ``digest`` gets no zTOC, or None once its zTOC is in the cache."""
        path = ztoc_path(digest)
        if path.is_file():
            return None
        tell(f"layer {digest[:19]} ({wanted[digest] / 1e6:.0f} MB): building its zTOC for lazy pulls")
        try:
            ztoc = build_ztoc(open_layer(digest), wanted[digest], tool=TOOL)
        except UnsupportedTar as exc:
            tell(f"layer {digest[:19]}: no zTOC ({exc}); it is fetched whole")
            return str(exc)
        except (OSError, requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            raise PublishFailed(f"layer {digest[:19]}: reading it for its zTOC failed: {exc}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, marshal(ztoc))
        tell(f"layer {digest[:19]}: zTOC of {len(ztoc.entries)} entries, {len(ztoc.checkpoints)} spans")
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(wanted), compress_threads()))) as pool:
        reasons = dict(zip(wanted, pool.map(indexed, wanted), strict=True))
    skipped.update({digest: reason for digest, reason in reasons.items() if reason is not None})
    return Ztocs({digest: _cached(digest) for digest, reason in reasons.items() if reason is None}, skipped)


def _cached(layer: str) -> Blob:
    path = ztoc_path(layer)
    data = path.read_bytes()
    return Blob(digest_of(data), len(data), path)


def from_registry(registry: Registry, repository: str) -> Callable[[str], Opener]:
    """Layers read from ``repository`` (those a publish did not export: every registry had them)."""

    def open_layer(digest: str) -> Opener:
        return lambda offset: cast(IO[bytes], registry.open_blob(repository, digest, offset).raw)

    return open_layer


def index_body(subject: Manifest, ztocs: Ztocs) -> bytes:
    """The SOCI index of ``subject``, as soci's MarshalIndex writes it (Go's field order, compact)."""
    layers = []
    for layer in subject.json().get("layers", []):
        ztoc = ztocs.files.get(str(layer["digest"]))
        if ztoc is None:
            continue
        layers.append(
            {
                "mediaType": ZTOC,
                "digest": ztoc.digest,
                "size": ztoc.size,
                "annotations": {LAYER_DIGEST: layer["digest"], LAYER_MEDIA_TYPE: layer["mediaType"]},
            }
        )
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": SOCI_INDEX, "digest": digest_of(EMPTY_CONFIG), "size": len(EMPTY_CONFIG)},
        "layers": layers,
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.body)},
        "annotations": {TOOL_ANNOTATION: TOOL},
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def stage_lazy_index(registry: Registry, repository: str, subject: Manifest, ztocs: Ztocs) -> tuple[LazyIndex, StagedTag | None]:
    """Push ``subject``'s SOCI index by digest (its zTOCs and config first). Where the registry does
    not link it by its subject, the referrers tag that lists it is staged, not written."""
    for ztoc in ztocs.files.values():
        registry.ensure_blob(repository, ztoc.digest, ztoc.size, ztoc.open)
    registry.put_blob(repository, EMPTY_CONFIG)
    body = index_body(subject, ztocs)
    digest, linked = registry.put_referrer(repository, body, OCI_MANIFEST, subject.digest, SOCI_INDEX)
    lazy, whole = len(ztocs.files), len(ztocs.skipped)
    if linked:
        return LazyIndex(subject.digest, digest, "referrer", lazy, whole), None
    tag = subject.digest.replace(":", "-", 1)
    listing = referrers_tag_body(registry.get_manifest(repository, tag), digest, len(body))
    return LazyIndex(subject.digest, digest, f"tag {tag}", lazy, whole), StagedTag(registry, repository, tag, listing, OCI_INDEX)


def referrers_tag_body(current: Manifest | None, digest: str, size: int) -> bytes:
    """The referrers tag's index with this SOCI index first (soci takes the first it is given),
    what it listed before kept after it (other SOCI indexes of the image included)."""
    entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": size, "artifactType": SOCI_INDEX, "annotations": {TOOL_ANNOTATION: TOOL}}
    before = current.json().get("manifests", []) if current is not None and current.is_index else []
    kept = [m for m in before if isinstance(m, dict) and m.get("digest") != digest]
    return dump({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry, *kept]})
