"""One pass over an engine's ``docker save`` archive (:func:`.export.export` makes the passes): the small
members kept, each large layer read through its compressors as it passes, kept on disk a while, or read
past, and what each turned out to be."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from buildkit.errors import PublishFailed
from buildkit.image.archive import SMALL, ArchiveUnreadable, ImageIdentity, blob_digest, link_target, saved_image
from buildkit.ship.layers.compressing import CHUNK, Blob, Compressing, Compression
from buildkit.ship.layers.compressors import StoredLayer
from buildkit.ship.layers.layertar import Listing, TarClamp
from buildkit.ship.layers.normalize import unchanged_entries

# Why an archive's manifest.json can name a blob the archive lacks: the containerd image store keeps
# no content for layers a pull found already unpacked (the same layer compressed another way).
NO_CONTENT = (
    "; the engine's store keeps no content for it (the containerd image store does not fetch the blobs of layers it has "
    "unpacked already): publish from the engine that built the image, or remove the images sharing its layers and pull it again"
)

# How a layer waits on disk for its judgement (``judge``): zstd's fastest level, on every core. A layer up to
# IN_MEMORY waits in memory instead, as it came, while those waiting so add up to no more than IN_MEMORY_ALL.
SPOOLED = Compression("zstd", 1)
_V1_JSON = re.compile(r"^[0-9a-f]{64}/json$")
IN_MEMORY = 64 << 20
IN_MEMORY_ALL = 256 << 20


class Reading:
    """One pass over an engine's archive: the small members kept, the large layers read through
    their compressors as they pass, what each turned out to be."""

    def __init__(
        self,
        image: ImageIdentity,
        wanted: dict[str, tuple[Compression, ...]],
        spool: Path,
        found: dict[str, dict[str, Blob]],
        clamp: dict[str, int] | None = None,
        names: Mapping[str, str] | None = None,
        drops: Mapping[str, frozenset[str]] | None = None,
        listing: set[str] | None = None,
        listings: dict[str, Listing] | None = None,
        order: Sequence[str] = (),
    ) -> None:
        self.image, self.wanted, self.spool, self.found = image, wanted, spool, found
        self.clamp, self.known_names = clamp or {}, names or {}
        self.drops = drops or {}
        self.list_wanted = listing or set()
        self.listings = listings if listings is not None else {}
        # a layer read before it is known: clamped unless it turns out to be the base's (then read again)
        self.speculative = next(iter(self.clamp.values()), None)
        self.redo: dict[str, str] = {}
        # the image's DiffIDs in order; the blobs its manifest names, once met (stored digest -> DiffID)
        self.order = list(order)
        self.by_manifest: dict[str, str] | None = None
        # blobs named by their digest that came before the manifest, kept as stored while a guess
        # could be wrong (some layer is published unclamped): (member, spooled file, size)
        self.hold = self.speculative is not None and any(d not in self.clamp for d in self.order)
        self.held: list[tuple[str, Path, int]] = []
        # judging in this export (the number of base layers; None: ``drops`` given): the listings known
        # already, and the layers kept on disk until every listing is in (member, spooled file)
        self.judge: int | None = None
        self.known_listings: dict[str, Listing] = {}
        self.deferred: list[tuple[str, Path | bytes]] = []
        self.in_memory = 0
        # a legacy archive (Docker before 25) names its layers by v1 ids; the json beside each names its parent,
        # but the first layer's: that directory holds the image's first layer (DiffID order[0]), known before it is read
        self.bottom = ""

        self.every_way = tuple({c.name: c for ways in wanted.values() for c in ways}.values())
        self.small: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.names: set[str] = set()
        self.read: dict[str, str] = {}  # member -> the DiffID its (decompressed) contents have
        self.stored: dict[str, str] = {}  # stored digest -> DiffID, for blobs named by their digest
        self.serial = 0
        self.layer: Compressing | None = None

    def lacking(self) -> bool:
        return any(d not in self.found for d in self.wanted)

    def unlisted(self, known: str | None) -> bool:
        """Whether a layer (``known``: its DiffID, None while unknown) must be read for its listing."""
        if not self.list_wanted.difference(self.listings):
            return False
        return known is None or (known in self.list_wanted and known not in self.listings)

    def where(self) -> str:
        return f"exporting image {self.image.engine_id[:19]}"

    def layer_from(
        self,
        name: str,
        source: IO[bytes],
        size: int,
        ways: tuple[Compression, ...],
        expected: str | None,
        *,
        defer: bool = False,
        spooled: bool = False,
        kept: bytes | None = None,
    ) -> str:
        """Read member ``name`` (``size`` bytes as stored) as a layer through ``ways``; its DiffID,
        checked against ``expected`` (the config's) and against the digest its name gives. ``defer``:
        listed and kept (:attr:`deferred`) instead, on disk, or as ``kept`` (its bytes, read into
        memory); ``spooled``: read back from there (its name and size were checked on the way in)."""
        self.serial += 1
        epoch = self.clamp.get(expected) if expected is not None else self.speculative
        drop = self.drops.get(expected, frozenset()) if expected is not None else frozenset()
        if defer:
            ways, epoch, drop = (() if kept is not None else (SPOOLED,)), None, frozenset()
        listing = self.unlisted(expected) or (defer and expected not in self.known_listings)
        self.layer = Compressing(ways, self.spool, self.serial, epoch, drop=drop, listing=listing)
        stored = StoredLayer(source, plain_hashed=True)  # a plain tar's digest is the layer's, taken once
        try:
            while piece := stored.read():
                self.layer.write(piece)
            while stored.counted.read(CHUNK):  # a stream that ended early leaves the rest unread: counted, then refused
                pass
            self.layer.end()
        except ValueError as exc:
            raise PublishFailed(f"{self.where()}: {name}: {exc}") from None
        named = blob_digest(name)
        diff_id = self.layer.engine_diff_id
        stored_digest = stored.stored_digest or diff_id
        if spooled:
            pass
        elif stored.stored_size != size or (named is not None and stored_digest != named):
            raise PublishFailed(
                f"{self.where()}: {name} holds {stored.stored_size} bytes of digest {stored_digest}, not what its name "
                "and size say: the engine's image store is damaged (`docker image rm` it and build or pull it again)"
            )
        if expected is not None and diff_id != expected:
            raise PublishFailed(
                f"{self.where()}: {name} decompresses ({stored.format}) to layer {diff_id}, but the image's config lists {expected}"
            )
        if named is not None:
            self.stored[named] = diff_id
        self.read[name] = diff_id
        listed = self.layer.listing
        if listed is not None and (diff_id in self.list_wanted or defer):
            self.listings[diff_id] = listed
        if defer:
            if kept is None:
                blob = self.layer.finish(self.spool, (SPOOLED,))[SPOOLED.name]
                assert blob.path is not None
                self.deferred.append((name, blob.path.rename(self.spool / f"deferred-{self.serial}.zst")))  # a layer twice: kept twice
            else:
                self.layer.discard()
                self.deferred.append((name, kept))
            self.layer = None
            return diff_id
        base_clamped = diff_id not in self.clamp and self.layer.diff_id != diff_id
        undropped = expected is None and diff_id in self.clamp and bool(self.drops.get(diff_id))
        if epoch is not None and (base_clamped or undropped):
            # a base layer read clamped, or a layer read without the entries it leaves out: kept out, read again
            self.layer.discard()
            self.layer = None
            if diff_id in self.wanted and diff_id not in self.found:
                self.redo[name] = diff_id
            return diff_id
        keep = self.wanted.get(diff_id, ()) if diff_id not in self.found else ()
        blobs, self.layer = self.layer.finish(self.spool, keep), None
        if keep:
            self.found[diff_id] = blobs
        return diff_id

    def member(
        self,
        archive: tarfile.TarFile,
        member: tarfile.TarInfo,
        skip: set[int],
        stored_layers: Mapping[str, str],
        tell: Callable[[str], None],
    ) -> None:
        if member.issym() or member.islnk():
            self.links[member.name] = link_target(member)
            return
        if not member.isfile():
            return
        self.names.add(member.name)
        source = archive.extractfile(member)
        assert source is not None
        if member.size <= SMALL:
            self.small[member.name] = source.read()
            self.learn(member.name, self.small[member.name], skip, stored_layers, tell)
            if self.order and _V1_JSON.match(member.name) and not _v1_parent(self.small[member.name]):
                self.bottom = member.name.partition("/")[0]
            return
        self.large(member.name, source, member.size, skip, stored_layers, tell)

    def large(
        self, name: str, source: IO[bytes], size: int, skip: set[int], stored_layers: Mapping[str, str], tell: Callable[[str], None]
    ) -> None:
        """A member too large to keep in memory: a layer, read as it passes (or kept on disk a while, or read past)."""
        named = blob_digest(name)
        known = stored_layers.get(named, named if named in self.wanted else None) if named else None
        known = known or self.known_names.get(name) or (self.by_manifest or {}).get(named or "")  # an earlier pass, the manifest
        if known is None and self.order and name == f"{self.bottom}/layer.tar":
            known = self.order[0]  # a legacy archive's first layer (its json names no parent): the base's, at least
        if not self.unlisted(known):
            if not self.lacking() or (known is not None and (known not in self.wanted or known in self.found)):
                return  # nothing left to compress, or a layer every registry has: read past
            if named is None and size in skip:
                return  # most likely a layer every registry has: read past (a wanted one is exported again)
            if known is None and named is not None and self.by_manifest is not None:
                return  # a blob the image's manifest does not name (another platform's, an attestation's)
        if known is None and named is not None and self.hold and self.by_manifest is None:
            tell(f"keeping a layer of {size / 1e6:.0f} MB as the engine stored it until the archive says which layer it is")
            held = self.spool / f"held-{named.removeprefix('sha256:')}"
            with held.open("wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
            self.held.append((name, held, size))
            return
        pending = known is not None and known in self.wanted and known not in self.found
        if self.judge is not None and (known is None or (pending and known in self.clamp)):
            if size <= IN_MEMORY and self.in_memory + size <= IN_MEMORY_ALL:
                self.in_memory += size
                tell(f"listing a layer of {size / 1e6:.0f} MB as it leaves the engine, kept in memory until every listing is in")
                data = source.read()
                self.layer_from(name, io.BytesIO(data), size, (), known, defer=True, kept=data)
            else:
                tell(f"listing a layer of {size / 1e6:.0f} MB as it leaves the engine, kept compressed on disk until every listing is in")
                self.layer_from(name, source, size, (), known, defer=True)
            return
        ways = self.every_way if known is None else self.wanted[known] if pending else ()
        if ways:
            tell(f"compressing a layer of {size / 1e6:.0f} MB as it leaves the engine: {', '.join(c.key for c in ways)}")
        else:
            tell(f"reading a layer of {size / 1e6:.0f} MB for what its entries are")
        self.layer_from(name, source, size, ways, known)

    def learn(self, name: str, data: bytes, skip: set[int], stored_layers: Mapping[str, str], tell: Callable[[str], None]) -> None:
        """A small blob that is the image's manifest (its config the image's, as many layers as the image)
        says which layer each blob it names holds: the layers kept on disk until it came are read now."""
        if self.by_manifest is not None or not self.order or blob_digest(name) is None:
            return
        try:
            manifest = json.loads(data)
            layers = [str(layer["digest"]) for layer in manifest["layers"]]
            ours = manifest["config"]["digest"] == self.image.config and len(layers) == len(self.order)
        except (ValueError, KeyError, TypeError):
            return
        if ours:
            self.by_manifest = dict(zip(layers, self.order, strict=True))
            self.release(skip, stored_layers, tell)

    def release(self, skip: set[int], stored_layers: Mapping[str, str], tell: Callable[[str], None]) -> None:
        """The layers kept on disk, read now (as the manifest says they are, or as a guess when no manifest came)."""
        held, self.held, self.hold = self.held, [], False
        for name, path, size in held:
            with path.open("rb") as source:
                self.large(name, source, size, skip, stored_layers, tell)
            path.unlink(missing_ok=True)

    def finish(self, skip: set[int], stored_layers: Mapping[str, str], tell: Callable[[str], None]) -> bytes:
        """After the last member: the config, checked to be the image's; each layer of the archive's
        manifest checked against the config's DiffIDs, the small ones compressed now."""
        self.release(skip, stored_layers, tell)  # no manifest of the image came: read as guessed
        try:
            saved_as = saved_image(self.small, self.links)
        except ArchiveUnreadable as exc:
            raise PublishFailed(f"{self.where()}: the engine's archive is unreadable ({exc})") from None
        config = self.small.get(saved_as.config)
        if config is None or "sha256:" + hashlib.sha256(config).hexdigest() != self.image.config:
            said = f"lacks it{NO_CONTENT}" if config is None else f"holds {'sha256:' + hashlib.sha256(config).hexdigest()}"
            raise PublishFailed(
                f"{self.where()}: the engine's archive has no config with that digest ({self.image.config} was verified; it {said})"
            )
        try:
            diff_ids = list(json.loads(config)["rootfs"]["diff_ids"])
        except (ValueError, KeyError, TypeError):
            raise PublishFailed(f"{self.where()}: its config lists no layers (rootfs.diff_ids)") from None
        if len(diff_ids) != len(saved_as.layers):
            raise PublishFailed(f"{self.where()}: the archive lists {len(saved_as.layers)} layers, the config {len(diff_ids)}")
        if self.judge is not None:
            self.judged(saved_as.layers, diff_ids, tell)
        for name, diff_id in zip(saved_as.layers, diff_ids, strict=True):
            if name in self.small:
                ways = self.wanted.get(diff_id, ()) if diff_id not in self.found else ()
                data = self.small[name]
                self.layer_from(name, io.BytesIO(data), len(data), ways, diff_id)
            elif name in self.read and self.read[name] != diff_id:
                raise PublishFailed(
                    f"{self.where()}: {name} decompresses to layer {self.read[name]}, but the image's config lists {diff_id} there"
                )
            elif name not in self.names and diff_id in self.wanted and diff_id not in self.found:
                raise PublishFailed(f"{self.where()}: the engine's archive lacks layer {diff_id} ({name}){NO_CONTENT}")
        return config

    def judged(self, names: Sequence[str], diff_ids: Sequence[str], tell: Callable[[str], None]) -> None:
        """Every listing in (the small layers' taken now): what each layer leaves out, judged; then the
        layers kept on disk read from there, as they need."""
        for name, diff_id in zip(names, diff_ids, strict=True):
            if name in self.small and diff_id not in self.listings and diff_id not in self.known_listings:
                self.listings[diff_id] = _listing_of(self.small[name])
        every = self.known_listings | self.listings
        unread = [d for d in diff_ids if d not in every]
        if unread:
            tell(
                f"layer {unread[0][:19]} could not be read from the engine ({len(unread)} in all): the layers above it are "
                "published without leaving out what they did not change"
            )
        self.drops = {}
        for diff_id, drop in zip(diff_ids, unchanged_entries([every.get(d) for d in diff_ids], self.judge or 0), strict=True):
            self.drops[diff_id] = drop if self.drops.get(diff_id, drop) == drop else frozenset()  # a layer twice: none left out
        deferred, self.deferred = self.deferred, []
        for name, kept in deferred:
            diff_id = self.read[name]
            ways = self.wanted.get(diff_id, ()) if diff_id not in self.found else ()
            if ways:
                with io.BytesIO(kept) if isinstance(kept, bytes) else kept.open("rb") as source:
                    tell(f"compressing a layer kept until its judgement: {', '.join(c.key for c in ways)}")
                    self.layer_from(name, source, 0, ways, diff_id, spooled=True)
            if isinstance(kept, Path):
                kept.unlink(missing_ok=True)
        self.in_memory = 0

    def discard(self) -> None:
        if self.layer is not None:
            self.layer.discard()
        for _, path, _ in self.held:
            path.unlink(missing_ok=True)
        for _, kept in self.deferred:
            if isinstance(kept, Path):
                kept.unlink(missing_ok=True)
        self.held, self.deferred = [], []


def _v1_parent(data: bytes) -> str | None:
    """The parent a legacy archive's layer json names (None for the first layer; "?" when unreadable)."""
    try:
        found = json.loads(data)
    except ValueError:
        return "?"
    if not isinstance(found, dict):
        return "?"
    return str(found["parent"]) if found.get("parent") else None


def _listing_of(data: bytes) -> Listing:
    """What each entry of a small layer (as the engine stored it) was."""
    lister = TarClamp(2**62, None, listing=True)
    stored = StoredLayer(io.BytesIO(data))
    while piece := stored.read():
        lister.write(piece)
    lister.close()
    return lister.listing or []
