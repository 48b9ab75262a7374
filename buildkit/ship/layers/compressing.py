"""A local image's blobs as registries store them: its config byte for byte and each layer compressed
by us (gzip, and zstd when asked); what :mod:`buildkit.ship.layers.export` fills as it reads the engine's archive.

The engine does not push: ``docker push`` composes each manifest from what the engine remembers of
earlier pushes (a retried push wrote a manifest without two layers' ``size``, so one image got two
digests), and it compresses with gzip only. Here every layer is compressed once per run and the
same bytes go to every registry, so a manifest has one digest everywhere.

Each layer goes into its compressors as it leaves the engine, both formats at once: no
uncompressed layer is ever written to disk, so a publish needs temporary space for the compressed
blobs only (:mod:`buildkit.ship.layers.compressors` says how they are made).

A layer compressed before is not compressed again: the cache (``$ASCENDKIT_CACHE``, default
``~/.cache/ascendkit``) remembers the digest each (layer, compression) gave, and the layer's size;
when every registry already has that blob, the layer is not even compressed. Only what some
registry lacks is. The cache also remembers which layer each blob of an engine's store holds (a
compressed blob is named by its own digest, not the layer's), so such a blob is read past next time.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from buildkit.errors import OutputError, PublishFailed
from buildkit.fsio import cache_dir, read_cache, write_atomic, write_cache
from buildkit.ship.layers.compressors import BLOCK, GZIP, PUBLISHED, ZSTD, Compression, Sink
from buildkit.ship.layers.layertar import LISTING_FORMAT, Listing, TarClamp

__all__ = ["CHUNK", "GZIP", "PUBLISHED", "ZSTD", "Blob", "Compressing", "Compression", "CompressionCache"]

CHUNK = BLOCK


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    path: Path | None = None  # its bytes, spooled this run; None: every registry already has it
    raw_size: int | None = None  # for a layer compressed this run: its uncompressed size
    diff_id: str = ""  # the published layer's DiffID where publishing changed the engine's layer (its times clamped)

    def open(self, offset: int = 0) -> IO[bytes]:
        """Its bytes from ``offset`` on (an upload resumed where the registry stands)."""
        if self.path is None:
            raise PublishFailed(f"blob {self.digest[:19]}: its bytes were not exported this run (internal error)")
        stream = self.path.open("rb")
        stream.seek(offset)
        return stream


@dataclass
class CompressionCache:
    """(compression, diff_id) -> the blob it gave, and the repositories of each registry known to hold a blob."""

    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    LIMIT = 4000  # entries kept (the newest): a cache, not a record

    @classmethod
    def load(cls, path: Path | None = None) -> CompressionCache:
        path = path or cache_dir() / "compressed-layers.json"
        return cls(path, read_cache(path))

    @staticmethod
    def _key(compression: Compression, diff_id: str, clamp: str) -> str:
        """``clamp``: the normalization the layer went through (:attr:`.normalize.Normalization.key`), or none."""
        return f"{compression.key}{' ' + clamp if clamp else ''} {diff_id}"

    def get(self, compression: Compression, diff_id: str, clamp: str = "") -> Blob | None:
        entry = self.entries.get(self._key(compression, diff_id, clamp))
        if not isinstance(entry, dict) or not str(entry.get("digest", "")).startswith("sha256:"):
            return None
        published = str(entry.get("diff_id", ""))
        if clamp and not published.startswith("sha256:"):
            return None
        return Blob(str(entry["digest"]), int(entry.get("size", 0)), diff_id=published)

    def put(self, compression: Compression, diff_id: str, blob: Blob, raw_size: int | None = None, clamp: str = "") -> None:
        with self.lock:
            key = self._key(compression, diff_id, clamp)
            self.entries.pop(key, None)
            self.entries[key] = (
                {"digest": blob.digest, "size": blob.size}
                | ({"raw_size": raw_size} if raw_size is not None else {})
                | ({"diff_id": blob.diff_id} if clamp else {})
            )

    def config(self, clamp: str, image_id: str) -> bytes | None:
        """The published config of engine image ``image_id`` normalized by ``clamp``, as made before."""
        entry = self.entries.get(f"config {clamp} {image_id}")
        return str(entry["json"]).encode() if isinstance(entry, dict) and isinstance(entry.get("json"), str) else None

    def put_config(self, clamp: str, image_id: str, config: bytes) -> None:
        with self.lock:
            key = f"config {clamp} {image_id}"
            self.entries.pop(key, None)
            self.entries[key] = {"json": config.decode()}

    def _listing_path(self, diff_id: str) -> Path:
        return self.path.parent / "layer-listings" / f"v{LISTING_FORMAT}" / f"{diff_id.removeprefix('sha256:')}.json.gz"

    def listing(self, diff_id: str) -> Listing | None:
        """What each entry of layer ``diff_id`` was, as an earlier publish read it; None when unknown."""
        try:
            data = json.loads(gzip.decompress(self._listing_path(diff_id).read_bytes()))
            return [(str(name), tuple(entry)) for name, entry in data]
        except (OSError, ValueError, TypeError, EOFError):
            return None

    def put_listing(self, diff_id: str, listing: Listing) -> None:
        path = self._listing_path(diff_id)
        with contextlib.suppress(OSError, OutputError):  # a cache: a publish that cannot keep it reads the layer again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, gzip.compress(json.dumps(listing, separators=(",", ":")).encode(), 6, mtime=0))

    def raw_size(self, diff_id: str) -> int | None:
        """The uncompressed size of layer ``diff_id`` when some entry recorded it."""
        for key, entry in self.entries.items():
            if key.endswith(f" {diff_id}") and isinstance(entry, dict) and isinstance(entry.get("raw_size"), int):
                return int(entry["raw_size"])
        return None

    def stored_layers(self) -> dict[str, str]:
        """Every blob digest of an engine's store seen before -> the DiffID of the layer it holds."""
        found = {}
        for key, entry in self.entries.items():
            if key.startswith("blob ") and isinstance(entry, dict) and str(entry.get("diff_id", "")).startswith("sha256:"):
                found[key.removeprefix("blob ")] = str(entry["diff_id"])
        return found

    def stored_as(self, stored: str, diff_id: str) -> None:
        with self.lock:
            key = f"blob {stored}"
            self.entries.pop(key, None)
            self.entries[key] = {"diff_id": diff_id}

    def seen(self, host: str, digest: str) -> list[str]:
        """Repositories of ``host`` that held ``digest`` when last pushed (mount sources)."""
        entry = self.entries.get(f"at {host} {digest}")
        return [str(r) for r in entry.get("repositories", [])] if isinstance(entry, dict) else []

    def saw(self, host: str, digest: str, repository: str) -> None:
        with self.lock:
            key = f"at {host} {digest}"
            repositories = [r for r in self.seen(host, digest) if r != repository][-7:]
            self.entries.pop(key, None)
            self.entries[key] = {"repositories": [*repositories, repository]}

    def save(self) -> None:
        with self.lock:
            entries = dict(self.entries)
        write_cache(self.path, entries, self.LIMIT)


class _Hashing:
    """A writer that hashes and counts what passes through it."""

    def __init__(self, dest: IO[bytes]) -> None:
        self.dest = dest
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.dest.write(data)

    def flush(self) -> None:
        self.dest.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


class Compressing:
    """One layer on its way through its compressors: each writes a ``.partial`` file in the spool,
    renamed to its digest when the layer ends; the layer's own digest is taken on the way."""

    def __init__(
        self,
        compressions: tuple[Compression, ...],
        spool: Path,
        serial: int,
        epoch: int | None = None,
        *,
        drop: frozenset[str] = frozenset(),
        listing: bool = False,
    ) -> None:
        """``epoch``: normalize the layer (:class:`.normalize.TarClamp`), leaving out the entries in
        ``drop``; ``listing``: keep what each entry was (:attr:`listing`), normalized or not."""
        self.raw = hashlib.sha256()
        self.raw_size = 0
        self.engine = hashlib.sha256()  # the layer as the engine gave it, before any clamp
        self.lister = TarClamp(2**62, None, listing=True) if listing and epoch is None else None
        self.clamp = TarClamp(epoch, self._compress, drop=drop, listing=listing) if epoch is not None else None
        self.parts: dict[str, tuple[Path, IO[bytes], _Hashing, Sink]] = {}
        try:
            for compression in compressions:
                partial = spool / f"layer-{serial}.{compression.name}.partial"
                out = partial.open("wb")
                hashing = _Hashing(out)
                self.parts[compression.name] = (partial, out, hashing, compression.sink(hashing))
        except BaseException:
            self.discard()
            raise

    def write(self, data: bytes) -> None:
        self.engine.update(data)
        if self.lister is not None:
            self.lister.write(data)
        if self.clamp is not None:
            self.clamp.write(data)
        else:
            self._compress(data)

    def _compress(self, data: bytes | memoryview) -> None:
        if self.clamp is not None:  # else the layer goes out as it came in: its digest is the engine's, taken once
            self.raw.update(data)
        self.raw_size += len(data)
        for _, _, _, sink in self.parts.values():
            sink.write(data)  # type: ignore[arg-type]  # the sinks take any bytes-like piece

    @property
    def engine_diff_id(self) -> str:
        """The DiffID of the layer as the engine stored it (what its config lists)."""
        return "sha256:" + self.engine.hexdigest()

    def end(self) -> None:
        """The layer has been written whole: what the clamp still holds goes to the compressors."""
        if self.clamp is not None:
            self.clamp.close()

    @property
    def listing(self) -> Listing | None:
        """Each entry's fields as the engine wrote them, when asked for."""
        reader = self.lister or self.clamp
        return reader.listing if reader is not None else None

    @property
    def diff_id(self) -> str:
        """The DiffID of the layer as it is published (its times clamped, where it was normalized); once it has ended."""
        return "sha256:" + (self.raw if self.clamp is not None else self.engine).hexdigest()

    def finish(self, spool: Path, keep: tuple[Compression, ...]) -> dict[str, Blob]:
        """The blobs of the compressions in ``keep``; the others' files removed."""
        blobs = {}
        self.end()
        try:
            for name, (partial, out, hashing, sink) in list(self.parts.items()):
                sink.close()
                out.close()
                del self.parts[name]
                if any(c.name == name for c in keep):
                    final = spool / f"{hashing.digest.removeprefix('sha256:')}.blob"
                    partial.rename(final)
                    blobs[name] = Blob(hashing.digest, hashing.size, final, self.raw_size, self.diff_id)
                else:
                    partial.unlink(missing_ok=True)
        finally:
            self.discard()
        return blobs

    def discard(self) -> None:
        for partial, out, _, sink in self.parts.values():
            with contextlib.suppress(Exception):  # the layer is abandoned; its first error is the one that counts
                sink.close()
            out.close()
            partial.unlink(missing_ok=True)
        self.parts.clear()
