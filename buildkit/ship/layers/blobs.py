"""Which blobs an image needs to publish, and which the registries have already: from the cache where
every registry holds them, else exported from the engine (:mod:`buildkit.ship.layers.export`) and compressed; for an
image built with an epoch, each layer normalized (:mod:`buildkit.ship.layers.normalize`) as every layer's listing says."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import PublishFailed, Unavailable
from buildkit.image.engine import CONTAINERD_STORE, engine_facts
from buildkit.reach import engine_said
from buildkit.ship.layers.compressing import GZIP, ZSTD, Blob, Compression, CompressionCache
from buildkit.ship.layers.export import export
from buildkit.ship.layers.layertar import Listing
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.layers.normalize import drop_key, normalize_config, unchanged_entries
from buildkit.ship.oci.registry import digest_of
from buildkit.ship.options import ShipOptions, Target

Say = Callable[[str], None]


# ---- which blobs an image needs, and which the registries have --------------------------------------


def has_blob(target: Target, digest: str, cache: CompressionCache) -> int | None:
    """The size of ``digest`` in the target's repository, mounted from another repository of the same
    registry the cache saw holding it where needed; None when the target still lacks it."""
    return target.registry.find_blob(target.ref.repository, digest, reversed(cache.seen(target.ref.host, digest)))


@dataclass
class ImageBlobs:
    config: Blob
    layers: dict[str, list[Blob]]  # compression name -> the image's layers in order
    present: set[tuple[str, str]]  # (target, digest) found there while gathering: not looked up again


def gather_blobs(
    client: docker.APIClient,
    image: LocalImage,
    targets: list[Target],
    options: ShipOptions,
    cache: CompressionCache,
    spool: Path,
    tell: Say,
) -> ImageBlobs:
    """The image's blobs for every variant: from the cache where every target already has them,
    else exported from the engine and compressed here. An image built with an epoch is published
    normalized (:mod:`buildkit.ship.layers.normalize`): its layers above the base with their times clamped, its config
    with theirs; the cache remembers both, so an unchanged layer is neither exported nor compressed again."""
    try:
        inspect = client.inspect_image(image.identity.engine_id)
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"reading image {image.image_id[:19]} from the engine failed: {engine_said(exc)}") from None
    diff_ids: list[str] = list((inspect.get("RootFS") or {}).get("Layers") or [])
    norm = image.normalization
    base = set(diff_ids[: norm.keep]) if norm is not None else set()
    clamp = {d: norm.epoch for d in diff_ids if d not in base} if norm is not None else {}
    stored = {d: d for d in diff_ids} | {s: d for s, d in cache.stored_layers().items() if d in diff_ids}
    drops, listings = layer_drops(client, diff_ids, norm.keep, cache) if norm is not None else ({}, {})
    judge = norm.keep if norm is not None and drops is None else None  # judged in the export, which reads the listings

    def clamp_key(diff_id: str) -> str | None:
        """How the layer is published, in the cache's keys; None while that waits on the export's judgement."""
        if norm is None or diff_id not in clamp:
            return ""
        if drops is None:
            return None
        return f"{norm.key}-{drop_key(drops[diff_id])}" if drops.get(diff_id) else norm.key

    compressions = list(options.compressions)
    known: dict[tuple[str, str], Blob] = {}
    wanted: dict[str, tuple[Compression, ...]] = {}
    present: set[tuple[str, str]] = set()

    def everywhere(digest: str) -> list[int]:
        """The sizes of ``digest`` in the targets that have it (looked up until one lacks it)."""
        sizes = []
        for target in targets:
            size = has_blob(target, digest, cache)
            if size is None:
                break
            present.add((target.name, digest))
            sizes.append(size)
        return sizes

    for diff_id in dict.fromkeys(diff_ids):
        for compression in compressions:
            key = clamp_key(diff_id)
            hit = cache.get(compression, diff_id, key) if key is not None else None
            if hit is not None and len(everywhere(hit.digest)) == len(targets):
                known[(diff_id, compression.name)] = hit
            else:
                wanted[diff_id] = (*wanted.get(diff_id, ()), compression)
    engine_config: bytes | None = None
    config_bytes = cache.config(norm.key, image.image_id) if norm is not None else None
    config_id = digest_of(config_bytes) if config_bytes is not None else image.image_id
    config_sizes = everywhere(config_id) if norm is None or config_bytes is not None else []
    if wanted or len(config_sizes) != len(targets):
        tell(f"exporting {image.image_id[:19]} from the engine ({len(wanted)} of {len(set(diff_ids))} layers to compress)")
        sizes = {d: size for d in diff_ids if d not in wanted and (size := cache.raw_size(d)) is not None}
        exported = export(
            client,
            image.identity,
            wanted,
            spool,
            known_sizes=sizes,
            stored_layers=stored,
            tell=tell,
            clamp=clamp,
            drops=drops or {},
            order=diff_ids,
            judge=judge,
            listings=listings,
            listing={d for d in diff_ids if d not in listings} if judge is not None else None,
        )
        if judge is not None:
            drops = exported.drops
            for diff_id, listing in exported.listings.items():
                cache.put_listing(diff_id, listing)
        engine_config = exported.config
        if json.loads(exported.config).get("rootfs", {}).get("diff_ids") != diff_ids:
            raise PublishFailed(f"image {image.image_id[:19]}: the engine's inspect and its exported config list different layers")
        for stored_digest, diff_id in exported.stored.items():
            if stored_digest != diff_id:
                cache.stored_as(stored_digest, diff_id)
        for diff_id, blobs in exported.layers.items():
            for name, blob in blobs.items():
                compression = GZIP if name == "gzip" else ZSTD
                known[(diff_id, name)] = blob
                cache.put(compression, diff_id, blob, blob.raw_size, clamp_key(diff_id) or "")
    layers = {c.name: [known[(diff_id, c.name)] for diff_id in diff_ids] for c in compressions}
    if norm is not None:
        if engine_config is not None:
            published = [known[(d, compressions[0].name)].diff_id or d for d in diff_ids]
            config_bytes = normalize_config(engine_config, published, norm)
            cache.put_config(norm.key, image.image_id, config_bytes)
        assert config_bytes is not None
        engine_config = config_bytes
    if engine_config is None:  # every registry holds every blob and the config as the engine has it
        return ImageBlobs(Blob(image.image_id, config_sizes[0]), layers, present)
    path = spool / "config.json"
    path.write_bytes(engine_config)
    return ImageBlobs(Blob(digest_of(engine_config), len(engine_config), path), layers, present)


def layer_drops(
    client: docker.APIClient, diff_ids: list[str], keep: int, cache: CompressionCache
) -> tuple[dict[str, frozenset[str]] | None, dict[str, Listing]]:
    """For each layer of the image, the entries its normalized layer leaves out
    (:func:`.normalize.unchanged_entries`), judged on every layer's listing, with the listings the
    cache holds; None when some listing is not there: the export judges them as it reads the layers
    (:func:`.export.export`'s ``judge``), the engine's archive read once. Nothing left out on the
    containerd image store: its differ writes what a step changed and nothing else (CI's `reproduced`
    job holds its images to overlay2's)."""
    if _writes_changes_only(client):
        return dict.fromkeys(diff_ids, frozenset()), {}
    found = {d: cache.listing(d) for d in dict.fromkeys(diff_ids)}
    listings = {d: listing for d, listing in found.items() if listing is not None}
    if len(listings) < len(found) and len(diff_ids) > keep:
        return None, listings
    drops: dict[str, frozenset[str]] = {}
    for diff_id, drop in zip(diff_ids, unchanged_entries([found[d] for d in diff_ids], keep), strict=True):
        drops[diff_id] = drop if drops.get(diff_id, drop) == drop else frozenset()  # a layer twice, judged twice: none left out
    return drops, listings


def _writes_changes_only(client: docker.APIClient) -> bool:
    """Whether the engine's differ writes only what each step changed (the containerd image store's:
    moby's graph drivers tar a step's whole upper directory)."""
    try:
        return engine_facts(client).image_store == CONTAINERD_STORE
    except (DockerException, requests.exceptions.RequestException, AttributeError, KeyError, TypeError):
        return False  # an engine that cannot say: every layer judged
