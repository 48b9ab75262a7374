"""A local image's blobs as registries store them: its config byte for byte and each layer compressed
by us (gzip, and zstd when asked), streamed out of the engine with ``docker save``.

The engine does not push: ``docker push`` composes each manifest from what the engine remembers of
earlier pushes (a retried push wrote a manifest without two layers' ``size``, so one image got two
digests), and it compresses with gzip only. Here every layer is compressed once per run and the
same bytes go to every registry, so a manifest has one digest everywhere.

Each layer goes into its compressors as it leaves the engine, both formats at once: no
uncompressed layer is ever written to disk, so a publish needs temporary space for the compressed
blobs only (:mod:`.compressors` says how they are made).

A layer compressed before is not compressed again: the cache (``$ASCENDKIT_CACHE``, default
``~/.cache/ascendkit``) remembers the digest each (layer, compression) gave, and the layer's size;
when every registry already has that blob, the layer is not even compressed. Only what some
registry lacks is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import OutputError, PublishFailed, Unavailable
from buildkit.fsio import cache_dir, write_atomic
from buildkit.reach import engine_said
from buildkit.ship.compressors import BLOCK, GZIP, PUBLISHED, ZSTD, Compression, Sink

__all__ = ["GZIP", "PUBLISHED", "SMALL", "ZSTD", "Blob", "Compression", "CompressionCache", "export"]

SMALL = 1 << 20  # members up to this size are read into memory (configs, manifests, tiny layers)
CHUNK = BLOCK
_OCI_BLOB = re.compile(r"^blobs/sha256/(?P<hex>[0-9a-f]{64})$")  # `docker save` of engines from 25 on names layers by digest


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    path: Path | None = None  # its bytes, spooled this run; None: every registry already has it
    raw_size: int | None = None  # for a layer compressed this run: its uncompressed size

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
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries if isinstance(entries, dict) else {})

    def get(self, compression: Compression, diff_id: str) -> Blob | None:
        entry = self.entries.get(f"{compression.key} {diff_id}")
        if not isinstance(entry, dict) or not str(entry.get("digest", "")).startswith("sha256:"):
            return None
        return Blob(str(entry["digest"]), int(entry.get("size", 0)))

    def put(self, compression: Compression, diff_id: str, blob: Blob, raw_size: int | None = None) -> None:
        with self.lock:
            key = f"{compression.key} {diff_id}"
            self.entries.pop(key, None)
            self.entries[key] = {"digest": blob.digest, "size": blob.size} | ({"raw_size": raw_size} if raw_size is not None else {})

    def raw_size(self, diff_id: str) -> int | None:
        """The uncompressed size of layer ``diff_id`` when some entry recorded it."""
        for key, entry in self.entries.items():
            if key.endswith(f" {diff_id}") and isinstance(entry, dict) and isinstance(entry.get("raw_size"), int):
                return int(entry["raw_size"])
        return None

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
            kept = dict(list(self.entries.items())[-self.LIMIT :])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(kept, indent=0, sort_keys=False) + "\n")
        except (OSError, OutputError):  # a cache that cannot be written costs time next run, nothing else
            pass


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


class _Stream:
    """docker-py's chunk iterator as a file, for tarfile's stream mode (which reads 10 KB at a time:
    each read takes its slice of the current chunk, no chunk is copied twice)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.chunk = b""
        self.offset = 0

    def read(self, size: int = -1) -> bytes:
        parts = []
        wanted = size
        while wanted != 0:
            if self.offset >= len(self.chunk):
                try:
                    self.chunk, self.offset = next(self.chunks), 0
                except StopIteration:
                    break
                continue
            end = len(self.chunk) if wanted < 0 else min(len(self.chunk), self.offset + wanted)
            parts.append(self.chunk[self.offset : end])
            if wanted > 0:
                wanted -= end - self.offset
            self.offset = end
        return b"".join(parts)


class _Compressing:
    """One layer on its way through its compressors: each writes a ``.partial`` file in the spool,
    renamed to its digest when the layer ends; the layer's own digest is taken on the way."""

    def __init__(self, compressions: tuple[Compression, ...], spool: Path, serial: int) -> None:
        self.raw = hashlib.sha256()
        self.raw_size = 0
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
        self.raw.update(data)
        self.raw_size += len(data)
        for _, _, _, sink in self.parts.values():
            sink.write(data)

    @property
    def diff_id(self) -> str:
        return "sha256:" + self.raw.hexdigest()

    def finish(self, spool: Path, keep: tuple[Compression, ...]) -> dict[str, Blob]:
        """The blobs of the compressions in ``keep``; the others' files removed."""
        blobs = {}
        try:
            for name, (partial, out, hashing, sink) in list(self.parts.items()):
                sink.close()
                out.close()
                del self.parts[name]
                if any(c.name == name for c in keep):
                    final = spool / f"{hashing.digest.removeprefix('sha256:')}.blob"
                    partial.rename(final)
                    blobs[name] = Blob(hashing.digest, hashing.size, final, self.raw_size)
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


EXPORT_ATTEMPTS = 3  # an engine restarting mid-export (a daemon upgrade, an OOM kill) is waited for, twice


def export(
    client: docker.APIClient,
    image_id: str,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    *,
    known_sizes: dict[str, int] | None = None,
    tell: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bytes, dict[str, dict[str, Blob]]]:
    """The config bytes of ``image_id`` and, for each diff_id of ``wanted``, its layer compressed
    each way asked, into ``spool``, as the export streams out of the engine.

    ``known_sizes``: the uncompressed sizes of layers that are not wanted (from the cache). Engines
    before 25 name layers in their archive by an id that is not the diff_id, so a layer shows what
    it is only once read through: a layer of one of these sizes is only read, any other is
    compressed on the way and dropped if it was not wanted after all; a wanted layer that had one
    of those sizes is exported again. An export the engine cuts off is started again (after 5 s,
    then 10 s); Unavailable when the engine keeps failing."""
    skip = set((known_sizes or {}).values())
    results: dict[str, dict[str, Blob]] = {}
    config: bytes | None = None
    attempt = 0
    while True:
        try:
            config, found = _export(client, image_id, {d: w for d, w in wanted.items() if d not in results}, spool, skip, tell)
        except Unavailable as exc:
            if attempt == EXPORT_ATTEMPTS - 1:
                raise
            tell(f"{exc}; exporting again in {5 * 2**attempt} s")
            sleep(5 * 2**attempt)
            attempt += 1
            continue
        results.update(found)
        lacking = sorted(set(wanted) - set(results))
        if not lacking or not skip:
            break
        tell(f"{len(lacking)} layer(s) had the size of a layer the registries have: exporting again to compress them")
        skip = set()
    if config is None:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive has no config with that digest")
    if lacking:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive lacks layer {lacking[0]}")
    return config, results


def _export(
    client: docker.APIClient,
    image_id: str,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    skip: set[int],
    tell: Callable[[str], None],
) -> tuple[bytes | None, dict[str, dict[str, Blob]]]:
    config: bytes | None = None
    found: dict[str, dict[str, Blob]] = {}
    every_way = tuple({c.name: c for ways in wanted.values() for c in ways}.values())
    serial = 0
    layer: _Compressing | None = None
    try:
        stream = _Stream(iter(client.get_image(image_id, chunk_size=CHUNK)))
        with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]  # a readable is enough
            for member in archive:
                if not member.isfile():
                    continue
                named = _OCI_BLOB.match(member.name)
                if named and f"sha256:{named['hex']}" not in wanted and member.size > SMALL:
                    continue  # named by its digest and not wanted: not even read
                if member.size > SMALL and not named and (member.size in skip or not every_way):
                    continue  # most likely a layer every registry has: read past (a wanted one is exported again)
                source = archive.extractfile(member)
                assert source is not None
                if member.size <= SMALL:
                    data = source.read()
                    digest = "sha256:" + hashlib.sha256(data).hexdigest()
                    if digest == image_id:
                        config = data
                    elif digest in wanted and digest not in found:
                        serial += 1
                        layer = _Compressing(wanted[digest], spool, serial)
                        layer.write(data)
                        found[digest], layer = layer.finish(spool, wanted[digest]), None
                    continue
                ways = wanted[f"sha256:{named['hex']}"] if named else every_way
                tell(f"compressing a layer of {member.size / 1e6:.0f} MB as it leaves the engine: {', '.join(c.key for c in ways)}")
                serial += 1
                layer = _Compressing(ways, spool, serial)
                while chunk := source.read(CHUNK):
                    layer.write(chunk)
                digest = layer.diff_id
                keep = wanted.get(digest, ()) if digest not in found else ()
                if named and digest != f"sha256:{named['hex']}":
                    raise PublishFailed(f"exporting image {image_id[:19]}: {member.name} holds a layer whose digest is {digest}")
                blobs, layer = layer.finish(spool, keep), None
                if keep:
                    found[digest] = blobs
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"exporting image {image_id[:19]} from the engine failed: {engine_said(exc)}") from None
    except tarfile.TarError as exc:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive is unreadable ({exc})") from None
    finally:
        if layer is not None:
            layer.discard()
    return config, found
