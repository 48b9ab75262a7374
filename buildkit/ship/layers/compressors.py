"""How a layer is compressed: gzip as zlib-ng's deflate in parallel 1 MiB blocks joined into one
member, zstd with zstd's own worker threads; both on every core, and the same bytes whatever the
core count and whatever the machine (:mod:`buildkit.ship.layers.codecs` says how, and why not ISA-L any more).

Chosen by measurement (docs/shipping.md, "Compression"; ``make bench``): on real binaries and
Python trees, zlib -6 (what ``docker push`` writes) costs 24 CPU s per GB on one core; pigz -6
the same CPU spread over the cores; ISA-L level 3 costs 3 s per GB, but its bytes depend on the
instruction set (AVX-512, AVX2, SSE4.2 and aarch64 gave four streams of one layer); zlib-ng level
2 gives ISA-L's bytes for about twice its CPU, the same on each of those. zstd -9 in
multi-threaded mode splits the input into jobs whose size comes from the level alone. pigz is not
used even where Debian has it: a layer must give the same digest on every machine, and a runner
without pigz would give another.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from typing import IO, Any, Protocol, cast

import zstandard
from isal import igzip, isal_zlib

from buildkit.plan import variant_tag
from buildkit.settings import env_whole_number
from buildkit.ship.layers.codecs import BLOCK, GZIP_LEVEL, ZSTD_LEVEL, BlockGzipSink, Writer, ZstdSink, gzip_library, zstd_library

__all__ = ["BLOCK", "GZIP", "PUBLISHED", "ZSTD", "Compression", "Sink", "StoredLayer", "Writer", "compress_threads"]


def compress_threads() -> int:
    """Worker threads per compression: ``$ASCENDKIT_COMPRESS_THREADS``, default every core this
    process may use. Any count gives the same bytes; it moves only speed and memory (about 60 MB
    per zstd -9 worker)."""
    if os.environ.get("ASCENDKIT_COMPRESS_THREADS"):
        return env_whole_number("ASCENDKIT_COMPRESS_THREADS", 1, 1, 256)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Sink(Protocol):
    """One layer being compressed one way: its uncompressed bytes written in order, then closed."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Compression:
    """How an image's layers are compressed: the one type from ``--compression`` to the wire (its
    name picks the layer media type in :mod:`buildkit.ship.layers.compose`, its tags come from :meth:`tag`)."""

    name: str  # gzip | zstd
    level: int

    @property
    def key(self) -> str:
        """What the bytes depend on: the format, the level and the library that wrote them (the
        compression cache is keyed by it, so an upgrade that changes the bytes compresses again)."""
        library = gzip_library() if self.name == "gzip" else zstd_library()
        return f"{self.name}-{self.level}-{library}"

    def tag(self, name: str) -> str:
        """``name`` as this compression's variant is tagged (the grammar is plan's: :func:`buildkit.plan.variant_tag`)."""
        return variant_tag(name, self.name)

    def sink(self, dest: Writer, threads: int | None = None) -> Sink:
        """A writer of this compression into ``dest``, on ``threads`` workers (default :func:`compress_threads`)."""
        workers = threads or compress_threads()
        if self.name == "gzip":
            return BlockGzipSink(dest, self.level, workers)
        return ZstdSink(dest, self.level, workers)

    def compress(self, source: IO[bytes], dest: Writer, threads: int | None = None) -> None:
        sink = self.sink(dest, threads)
        while chunk := source.read(BLOCK):
            sink.write(chunk)
        sink.close()


GZIP = Compression("gzip", GZIP_LEVEL)
ZSTD = Compression("zstd", ZSTD_LEVEL)
# What --compression NAME publishes: gzip always (every runtime pulls it), zstd beside it on request.
PUBLISHED = {"gzip": (GZIP,), "zstd": (GZIP, ZSTD)}


# ---- reading a layer as an engine stored it --------------------------------------------------------

# What a broken stream raises (an engine's connection failing raises what requests raises, and passes).
_BROKEN: tuple[type[BaseException], ...] = (EOFError, igzip.BadGzipFile, cast(type[BaseException], isal_zlib.error), zstandard.ZstdError)
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _Counted(io.RawIOBase):
    """A readable that hashes and counts the stored bytes as the decompressor takes them, its first
    bytes (read to tell the format) handed out again first."""

    def __init__(self, source: IO[bytes], head: bytes) -> None:
        super().__init__()
        self.source, self.head = source, head
        self.sha: Any = hashlib.sha256()  # None: not hashed (a plain tar whose reader hashes what it reads)
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.head:
            data, self.head = self.head[: len(buffer)], self.head[len(buffer) :]
        else:
            data = self.source.read(len(buffer))
        buffer[: len(data)] = data
        if self.sha is not None:
            self.sha.update(data)
        self.size += len(data)
        return len(data)


class StoredLayer:
    """A layer blob as an engine's archive holds it (gzip, zstd, or its plain tar: the containerd
    image store keeps what it pulled or built compressed), read back as the layer itself in pieces
    of at most ``BLOCK`` bytes; several gzip members or zstd frames are read as one. The stored
    bytes' digest and size are taken on the way (:attr:`stored_digest`); with ``plain_hashed``, a plain
    tar's digest is left to the reader, who hashes every byte of the layer anyway (:attr:`stored_digest`
    is then None)."""

    def __init__(self, source: IO[bytes], *, plain_hashed: bool = False) -> None:
        head = source.read(4)
        self.counted = _Counted(source, head)
        reader: IO[bytes]
        if head.startswith(GZIP_MAGIC):
            self.format = "gzip"
            reader = igzip.IGzipFile(fileobj=io.BufferedReader(self.counted, BLOCK), mode="rb")  # type: ignore[no-untyped-call, assignment]
        elif head.startswith(ZSTD_MAGIC):
            self.format = "zstd"
            reader = zstandard.ZstdDecompressor().stream_reader(self.counted, read_size=BLOCK, read_across_frames=True)  # type: ignore[arg-type]
        else:
            self.format = "none"
            reader = self.counted  # type: ignore[assignment]
            if plain_hashed:
                self.counted.sha = None
        self.reader = reader

    def read(self) -> bytes:
        """The next piece of the layer; b"" at its end. A gzip stream cut short raises ValueError
        (a zstd one does not: the layer's digest, checked against the config's DiffID, catches it)."""
        try:
            return self.reader.read(BLOCK)
        except _BROKEN as exc:  # not the engine's connection failing
            raise ValueError(f"the {self.format} stream is broken ({exc})") from None

    @property
    def stored_digest(self) -> str | None:
        return "sha256:" + self.counted.sha.hexdigest() if self.counted.sha is not None else None

    @property
    def stored_size(self) -> int:
        return self.counted.size
