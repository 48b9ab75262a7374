"""An image's layers out of the engine, for publishing (:mod:`buildkit.ship.layers.blobs` says which): ``docker save``
read as it streams, whatever layout the engine writes
(:mod:`buildkit.image.archive`). A layer the engine stored compressed (the containerd image store)
is decompressed on the way; every layer's DiffID is taken from the decompressed stream and
checked against the image's config, and the config against the digest the build verified. Each
layer goes into its compressors (:mod:`buildkit.ship.layers.compressing`) as it leaves the engine, so no uncompressed
layer is ever written to disk."""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import PublishFailed, Unavailable
from buildkit.image.archive import ImageIdentity
from buildkit.image.stream import ChunkReader, saved
from buildkit.reach import engine_said
from buildkit.ship.layers.archivepass import Reading
from buildkit.ship.layers.compressing import CHUNK, Blob, Compression
from buildkit.ship.layers.layertar import Listing

Say = Callable[[str], None]


# ---- one export of the image, tried again if the engine goes away (the reading itself: archivepass.py) ----


EXPORT_ATTEMPTS = 3  # an engine restarting mid-export (a daemon upgrade, an OOM kill) is waited for, twice


@dataclass
class Exported:
    """What an export gave: the config's bytes, each wanted layer's blobs (DiffID -> compression name
    -> blob), and which layer each blob of the engine's store named by its own digest holds."""

    config: bytes
    layers: dict[str, dict[str, Blob]]
    stored: dict[str, str] = field(default_factory=dict)  # stored digest -> DiffID
    names: dict[str, str] = field(default_factory=dict)  # archive member -> the engine's DiffID of the layer it holds
    listings: dict[str, Listing] = field(default_factory=dict)  # DiffID -> what each of its entries was
    drops: dict[str, frozenset[str]] = field(default_factory=dict)  # DiffID -> the entries left out, where judged in the export


def export(
    client: docker.APIClient,
    image: ImageIdentity,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    *,
    known_sizes: dict[str, int] | None = None,
    stored_layers: Mapping[str, str] | None = None,
    tell: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
    clamp: Mapping[str, int] | None = None,
    drops: Mapping[str, frozenset[str]] | None = None,
    listing: set[str] | None = None,
    order: Sequence[str] = (),
    judge: int | None = None,
    listings: Mapping[str, Listing] | None = None,
) -> Exported:
    """The config of ``image`` and, for each DiffID of ``wanted``, its layer compressed each way
    asked, into ``spool``, as the export streams out of the engine.

    What is read past unread: a blob named by a digest ``stored_layers`` (stored digest -> DiffID;
    a DiffID names itself) maps to an unwanted layer; and, in a legacy archive, whose members are
    named by ids that are not digests, a layer of one of ``known_sizes`` (the uncompressed sizes of
    unwanted layers, from the cache). Any other layer is compressed on the way and dropped if it
    was not wanted after all; a wanted layer that had one of those sizes is exported again. An
    export the engine cuts off is started again (after 5 s, then 10 s); Unavailable when the
    engine keeps failing.

    ``clamp`` (DiffID -> epoch) names the layers published with their times clamped; the others (the
    base's) are published as the engine has them. A layer whose DiffID is known only once read (a
    legacy archive's) is read clamped; one that turns out to be the base's, or to have entries in
    ``drops`` (DiffID -> the entries its normalized layer leaves out), is read again. With ``order``
    (the image's DiffIDs, in order) an archive that names its blobs by their stored digests (the
    containerd store's) says which layer each is in the image's manifest, which comes among the blobs
    in the order of its digest: a layer met before it is kept on disk as the engine stored it
    (compressed) until the manifest says which it is, then read once, as that layer needs; not read
    clamped and again from the engine.

    ``listing``: the DiffIDs whose listings to take (:attr:`Exported.listings`), each layer read
    (and decompressed) for it even when nothing is to be compressed.

    ``judge`` (the number of base layers): what each layer above them leaves out is judged in this
    same export (:func:`.normalize.unchanged_entries`, from ``listings``, the listings known already,
    and those taken on the way; :attr:`Exported.drops`), not given in ``drops``. A layer's judgement
    needs its own listing and those below it, and the archive holds the layers in the order of their
    digests: each layer above the base (and each whose DiffID its name does not say; in a legacy
    archive, the first layer's json names no parent, so that one is known) is listed as it passes and
    kept until every listing is in (in memory when small, else on disk as zstd -1, never
    uncompressed), then read from there as it needs; the engine's archive is read once."""
    skip = set((known_sizes or {}).values())
    result = Exported(b"", {})
    attempt = 0
    reread = False
    while True:
        try:
            config, stored, redo = _export(
                client,
                image,
                {d: w for d, w in wanted.items() if d not in result.layers},
                spool,
                skip,
                stored_layers or {},
                result,
                tell,
                dict(clamp or {}),
                dict(drops or {}),
                set(listing or ()),
                list(order),
                judge,
                dict(listings or {}),
            )
        except Unavailable as exc:
            if attempt == EXPORT_ATTEMPTS - 1:
                raise
            tell(f"{exc}; exporting again in {5 * 2**attempt} s")
            sleep(5 * 2**attempt)
            attempt += 1
            continue
        result.config = config
        result.stored.update(stored)
        lacking = sorted(set(wanted) - set(result.layers))
        if not lacking:
            break
        if redo and not reread:
            tell(f"{len(redo)} layer(s) were normalized before the archive said which they are: exporting again to read them as they need")
            reread = True
            continue
        if not skip:
            break
        tell(f"{len(lacking)} layer(s) had the size of a layer the registries have: exporting again to compress them")
        skip = set()
    if lacking:
        raise PublishFailed(f"exporting image {image.engine_id[:19]}: the engine's archive lacks layer {lacking[0]}")
    return result


def _export(
    client: docker.APIClient,
    image: ImageIdentity,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    skip: set[int],
    stored_layers: Mapping[str, str],
    result: Exported,
    tell: Callable[[str], None],
    clamp: dict[str, int],
    drops: dict[str, frozenset[str]],
    listing: set[str],
    order: list[str],
    judge: int | None,
    listings: dict[str, Listing],
) -> tuple[bytes, dict[str, str], dict[str, str]]:
    reading = Reading(image, wanted, spool, result.layers, clamp, result.names, drops, listing, result.listings, order)
    reading.judge, reading.known_listings = judge, listings
    try:
        with saved(client, image.engine_id, CHUNK) as chunks, tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                reading.member(archive, member, skip, stored_layers, tell)
        config = reading.finish(skip, stored_layers, tell)
        result.names.update(reading.read)
        if judge is not None:
            result.drops.update(reading.drops)
        return config, reading.stored, reading.redo
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"exporting image {image.engine_id[:19]} from the engine failed: {engine_said(exc)}") from None
    except tarfile.TarError as exc:
        raise PublishFailed(f"exporting image {image.engine_id[:19]}: the engine's archive is unreadable ({exc})") from None
    finally:
        reading.discard()
