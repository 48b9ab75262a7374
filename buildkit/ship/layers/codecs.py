"""The layer codecs, byte for byte the same on every machine: gzip as fixed 1 MiB blocks deflated by
zlib-ng on worker threads and joined into one gzip member, zstd as zstd's own multi-threaded frame.

Standard library, zlib-ng and zstandard only, so ``python -m buildkit.ship.layers.codecs FILE`` prints a
file's digests on any interpreter that has those two wheels (CI's cross-machine test runs it under
qemu's CPU models and on arm64).

Why zlib-ng, in its own wheel: a layer's digest must not depend on the machine that compressed it.
ISA-L (what gzip layers were before) picks its deflate body by instruction set, and the same layer
gave four streams on AVX-512, AVX2, SSE4.2 and aarch64. The system's zlib depends on the
distribution (madler's zlib, zlib-ng's compat build, Chromium's): the interpreter decides which.
zlib-ng's SIMD paths (match comparison, hashing, checksums) compute what its C paths compute, and
the wheel pins its version: its deflate gives the same bytes on each of those four, which CI holds.

Why blocks: deflate is serial. Each block is compressed on its own, with the previous block's last
32 KiB as its dictionary (what pigz does), flushed to a byte boundary, and the blocks are joined
into one deflate stream with one CRC: a single gzip member that every reader takes, and bytes that
depend on the block size and the level only, never on how many threads compressed them.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import zstandard
from zlib_ng import zlib_ng

BLOCK = 1 << 20  # the gzip block (and every read's size): the bytes depend on it, so it is never changed
WINDOW = 32 * 1024  # deflate's window: the dictionary each block gets from the one before
# gzip header: no name, no mtime (0), deflate at an unspecified level (XFL 0), OS unknown (255), so the
# header depends on nothing about the machine or the moment.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
FINAL_EMPTY_BLOCK = b"\x03\x00"  # BFINAL=1, fixed Huffman, end-of-block: closes a stream of flushed blocks
# zlib-ng level 2 (deflate_fast): the bytes of ISA-L's level 3 (0.36 of a tar of Python packages), at about
# twice its CPU and a quarter of zlib -6's (benchmarks/bench_ship.py prints all three side by side).
GZIP_LEVEL = 2
# zstd level 9, chosen by measurement (`make bench`, benchmarks/bench_ship.py): on the test image's
# 707 MB base layer, beside gzip -6 (248 MB, 24 s), -3 gives 0.93x the bytes in 3 s, -9 0.80x in 11 s,
# -19 0.70x in 227 s. Pulling costs the same at any level: -9 is the smallest that still compresses
# faster than gzip, where -19 would add hours to a 30 GB image.
ZSTD_LEVEL = 9


def gzip_library() -> str:
    """What the gzip bytes depend on besides the level and block: zlib-ng's version."""
    return f"zlib-ng{zlib_ng.ZLIBNG_VERSION}"


def zstd_library() -> str:
    return f"zstd{'.'.join(map(str, zstandard.ZSTD_VERSION))}"


class Writer(Protocol):
    def write(self, data: bytes) -> int: ...


def _deflate_block(data: bytes, dictionary: bytes, level: int) -> bytes:
    if dictionary:
        compressor = zlib_ng.compressobj(level, zlib_ng.DEFLATED, -15, 8, zlib_ng.Z_DEFAULT_STRATEGY, dictionary)
    else:
        compressor = zlib_ng.compressobj(level, zlib_ng.DEFLATED, -15, 8, zlib_ng.Z_DEFAULT_STRATEGY)
    return compressor.compress(data) + compressor.flush(zlib_ng.Z_SYNC_FLUSH)  # zlib-ng releases the GIL in both


class BlockGzipSink:
    """Uncompressed bytes in, in pieces of any size; one gzip member out, the same bytes for any
    ``threads``. At most ``2 * threads`` blocks are in flight, so memory stays a few MiB a thread."""

    def __init__(self, dest: Writer, level: int, threads: int) -> None:
        self.dest, self.level = dest, level
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="gzip")
        self.in_flight: deque[Future[bytes]] = deque()
        self.limit = 2 * max(1, threads)
        self.pending = bytearray()
        self.previous = b""  # the last WINDOW bytes of the block before
        self.crc = 0
        self.size = 0
        self.dest.write(GZIP_HEADER)

    def _submit(self, block: bytes) -> None:
        self.crc = zlib_ng.crc32(block, self.crc)
        self.size += len(block)
        self.in_flight.append(self.pool.submit(_deflate_block, block, self.previous, self.level))
        self.previous = block[-WINDOW:]
        while len(self.in_flight) >= self.limit:
            self.dest.write(self.in_flight.popleft().result())

    def write(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) < BLOCK:
            return
        whole = len(self.pending) - len(self.pending) % BLOCK
        for start in range(0, whole, BLOCK):
            self._submit(bytes(self.pending[start : start + BLOCK]))
        del self.pending[:whole]

    def close(self) -> None:
        try:
            if self.pending:
                self._submit(bytes(self.pending))
                self.pending.clear()
            while self.in_flight:
                self.dest.write(self.in_flight.popleft().result())
            self.dest.write(FINAL_EMPTY_BLOCK + struct.pack("<II", self.crc & 0xFFFFFFFF, self.size & 0xFFFFFFFF))
        finally:
            self.abandon()

    def abandon(self) -> None:
        for future in self.in_flight:
            future.cancel()
        self.in_flight.clear()
        self.pool.shutdown(wait=True)


class ZstdSink:
    """zstd's multi-threaded frame: its jobs' sizes come from the level, so one worker or sixteen
    give the same frame (zstd's single-threaded mode, zero workers, gives another: never used)."""

    def __init__(self, dest: Writer, level: int, threads: int) -> None:
        compressor = zstandard.ZstdCompressor(level=level, threads=max(1, threads), write_checksum=True)
        self.writer = compressor.stream_writer(dest, closefd=False, write_size=BLOCK)  # type: ignore[arg-type]  # a writer is all it needs

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()  # type: ignore[no-untyped-call]


class _Digest:
    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return len(data)


def digests(path: str, threads: int) -> dict[str, str]:
    """The gzip and zstd digests of the file at ``path``, as a layer of those bytes is published."""
    found = {}
    for name, sink_type, level in (("gzip", BlockGzipSink, GZIP_LEVEL), ("zstd", ZstdSink, ZSTD_LEVEL)):
        out = _Digest()
        sink = sink_type(out, level, threads)
        with open(path, "rb") as source:  # noqa: PTH123  # standard library only, on purpose
            while chunk := source.read(BLOCK):
                sink.write(chunk)
        sink.close()
        found[name] = f"sha256:{out.sha.hexdigest()} {out.size}"
    return found


if __name__ == "__main__":  # python -m buildkit.ship.layers.codecs FILE [THREADS]: one line per format
    for format_name, digest in digests(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2).items():
        print(format_name, digest)
