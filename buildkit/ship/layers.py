"""A local image's blobs as registries store them: its config byte for byte and each layer compressed
by us (gzip, and zstd when asked), read out of the engine with ``docker save``.

The engine does not push: ``docker push`` composes each manifest from what the engine remembers of
earlier pushes (a retried push wrote a manifest without two layers' ``size``, so one image got two
digests), and it compresses with gzip only. Here every layer is compressed once per run and the
same bytes go to every registry, so a manifest has one digest everywhere.

A layer compressed before is not compressed again: the cache (``$ASCENDKIT_CACHE``, default
``~/.cache/ascendkit``) remembers the digest each (layer, compression) gave; when every registry
already has that blob, the layer is not even read. Only what some registry lacks is exported.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import OutputError, PublishFailed, Unavailable
from buildkit.fsio import cache_dir, write_atomic
from buildkit.plan import variant_tag
from buildkit.reach import engine_said

GZIP_LEVEL = 6  # docker push's (Go's gzip.DefaultCompression): the gzip images are what the engine would have pushed
# zstd level 9, chosen by measurement (`make bench`, benchmarks/bench_ship.py): on the test image's
# 707 MB base layer, beside gzip -6 (248 MB, 24 s), -3 gives 0.93x the bytes in 3 s, -9 0.80x in 11 s,
# -19 0.70x in 227 s. Pulling costs the same at any level: -9 is the smallest that still compresses
# faster than gzip, where -19 would add hours to a 30 GB image.
ZSTD_LEVEL = 9
SMALL = 1 << 20  # members up to this size are kept in memory (configs, manifests, tiny layers)
CHUNK = 1 << 20


@dataclass(frozen=True)
class Compression:
    """How an image's layers are compressed: the one type from ``--compression`` to the wire (its
    name picks the layer media type in :mod:`.compose`, its tags come from :meth:`tag`)."""

    name: str  # gzip | zstd
    level: int

    @property
    def key(self) -> str:
        return f"{self.name}-{self.level}"

    def tag(self, name: str) -> str:
        """``name`` as this compression's variant is tagged (the grammar is plan's: :func:`buildkit.plan.variant_tag`)."""
        return variant_tag(name, self.name)

    def compress(self, source: IO[bytes], dest: IO[bytes]) -> None:
        if self.name == "gzip":
            # wbits 31: a gzip member with mtime 0 and no file name, so the same tar gives the same bytes
            compressor = zlib.compressobj(self.level, zlib.DEFLATED, 31)
            while chunk := source.read(CHUNK):
                dest.write(compressor.compress(chunk))
            dest.write(compressor.flush())
            return
        import zstandard

        zstandard.ZstdCompressor(level=self.level, write_checksum=True).copy_stream(source, dest, read_size=CHUNK, write_size=CHUNK)


GZIP = Compression("gzip", GZIP_LEVEL)
ZSTD = Compression("zstd", ZSTD_LEVEL)
# What --compression NAME publishes: gzip always (every runtime pulls it), zstd beside it on request.
PUBLISHED = {"gzip": (GZIP,), "zstd": (GZIP, ZSTD)}


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    path: Path | None = None  # its bytes, spooled this run; None: every registry already has it

    def open(self) -> IO[bytes]:
        if self.path is None:
            raise PublishFailed(f"blob {self.digest[:19]}: its bytes were not exported this run (internal error)")
        return self.path.open("rb")


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

    def put(self, compression: Compression, diff_id: str, blob: Blob) -> None:
        with self.lock:
            key = f"{compression.key} {diff_id}"
            self.entries.pop(key, None)
            self.entries[key] = {"digest": blob.digest, "size": blob.size}

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


def _compress_file(raw: Path, compression: Compression, spool: Path) -> Blob:
    partial = spool / f"{raw.name}.{compression.name}.partial"
    with raw.open("rb") as source, partial.open("wb") as out:
        hashing = _Hashing(out)
        compression.compress(source, hashing)  # type: ignore[arg-type]  # a writer is all it needs
    final = spool / f"{hashing.digest.removeprefix('sha256:')}.blob"
    partial.rename(final)
    return Blob(hashing.digest, hashing.size, final)


EXPORT_ATTEMPTS = 3  # an engine restarting mid-export (a daemon upgrade, an OOM kill) is waited for, twice


def export(
    client: docker.APIClient,
    image_id: str,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    *,
    tell: Callable[[str], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bytes, dict[str, dict[str, Blob]]]:
    """The config bytes of ``image_id`` and, for each diff_id of ``wanted``, its layer compressed
    each way asked, spooled in ``spool``. Layers are compressed on all cores while the export goes on;
    at most two uncompressed layers wait on disk at a time. An export the engine cuts off is started
    again (after 5 s, then 10 s); Unavailable when the engine keeps failing."""
    for attempt in range(EXPORT_ATTEMPTS):
        try:
            return _export(client, image_id, wanted, spool, tell)
        except Unavailable as exc:
            if attempt == EXPORT_ATTEMPTS - 1:
                raise
            tell(f"{exc}; exporting again in {5 * 2**attempt} s")
            sleep(5 * 2**attempt)
    raise AssertionError("unreachable")


def _export(
    client: docker.APIClient,
    image_id: str,
    wanted: dict[str, tuple[Compression, ...]],
    spool: Path,
    tell: Callable[[str], None],
) -> tuple[bytes, dict[str, dict[str, Blob]]]:
    config: bytes | None = None
    found: dict[str, dict[str, Future[Blob]]] = {}
    pending = threading.Semaphore(2)
    workers = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
    raw_index = 0
    try:
        stream = _Stream(iter(client.get_image(image_id, chunk_size=CHUNK)))
        with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]  # a readable is enough
            for member in archive:
                if not member.isfile():
                    continue
                source = archive.extractfile(member)
                assert source is not None
                if member.size <= SMALL:
                    data = source.read()
                    digest = "sha256:" + hashlib.sha256(data).hexdigest()
                    if digest == image_id:
                        config = data
                        continue
                    if digest in wanted and digest not in found:
                        raw = spool / f"raw-{raw_index}"
                        raw_index += 1
                        raw.write_bytes(data)
                        found[digest] = _submit(workers, raw, wanted[digest], spool, None)
                    continue
                pending.acquire()
                raw = spool / f"raw-{raw_index}"
                raw_index += 1
                with raw.open("wb") as out:
                    hashing = _Hashing(out)
                    while chunk := source.read(CHUNK):
                        hashing.write(chunk)
                if hashing.digest in wanted and hashing.digest not in found:
                    ways = ", ".join(c.key for c in wanted[hashing.digest])
                    tell(f"compressing layer {hashing.digest[:19]} ({hashing.size / 1e6:.0f} MB): {ways}")
                    found[hashing.digest] = _submit(workers, raw, wanted[hashing.digest], spool, pending)
                else:
                    raw.unlink()
                    pending.release()
        results = {diff_id: {name: future.result() for name, future in futures.items()} for diff_id, futures in found.items()}
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"exporting image {image_id[:19]} from the engine failed: {engine_said(exc)}") from None
    except tarfile.TarError as exc:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive is unreadable ({exc})") from None
    finally:
        workers.shutdown(wait=True, cancel_futures=True)
    if config is None:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive has no config with that digest")
    lacking = sorted(set(wanted) - set(results))
    if lacking:
        raise PublishFailed(f"exporting image {image_id[:19]}: the engine's archive lacks layer {lacking[0]}")
    return config, results


def _submit(
    workers: ThreadPoolExecutor, raw: Path, compressions: tuple[Compression, ...], spool: Path, pending: threading.Semaphore | None
) -> dict[str, Future[Blob]]:
    futures = {c.name: workers.submit(_compress_file, raw, c, spool) for c in compressions}
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_: Future[Blob]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        raw.unlink(missing_ok=True)
        if pending is not None:
            pending.release()

    for future in futures.values():
        future.add_done_callback(done)
    return futures
