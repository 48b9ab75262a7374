"""Layer compression on every core gives the same bytes whatever the core count, and whatever the
pieces the layer arrives in: a layer's digest must not depend on the machine that published it."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from pathlib import Path

import pytest
import zstandard

from buildkit.errors import InputError
from buildkit.ship.layers.compressors import BLOCK, GZIP, ZSTD, Compression, compress_threads


def _layer() -> bytes:
    """About 9 MiB that compresses the way a layer does: this package's own files (text and
    bytecode), then pseudo-random bytes, then a long run: more than one zstd job and many gzip blocks."""
    root = Path(__file__).resolve().parent.parent
    text = b"".join(p.read_bytes() for p in sorted((root / "buildkit").rglob("*.py")))
    noise = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range((2 * BLOCK) // 32))
    layer = (text * (1 + (6 * BLOCK) // len(text)))[: 6 * BLOCK] + noise + b"\0" * BLOCK + b"tail" * 999
    return layer


LAYER = _layer()


def _compressed(compression: Compression, threads: int, piece: int) -> bytes:
    out = io.BytesIO()
    sink = compression.sink(out, threads)
    for start in range(0, len(LAYER), piece):
        sink.write(LAYER[start : start + piece])
    sink.close()
    return out.getvalue()


@pytest.mark.parametrize("compression", [GZIP, ZSTD], ids=["gzip", "zstd"])
def test_the_same_bytes_with_one_two_or_three_threads_and_any_pieces(compression: Compression) -> None:
    one = _compressed(compression, 1, BLOCK)
    assert _compressed(compression, 2, BLOCK) == one
    assert _compressed(compression, 3, 77_777) == one, "pieces of another size, another thread count"
    assert _compressed(compression, 2, 3 * BLOCK + 5) == one
    decompressed = (
        gzip.decompress(one) if compression.name == "gzip" else zstandard.ZstdDecompressor().stream_reader(io.BytesIO(one)).read()
    )
    assert decompressed == LAYER
    assert len(one) < 0.7 * len(LAYER), "it compresses"


def test_gzip_has_no_name_and_no_time_and_zstd_a_checksum() -> None:
    header = _compressed(GZIP, 2, BLOCK)[:10]
    assert header[:4] == b"\x1f\x8b\x08\x00" and header[4:8] == b"\0\0\0\0", "no flags (no file name), mtime 0"
    frame = zstandard.get_frame_parameters(_compressed(ZSTD, 2, BLOCK))
    assert frame.has_checksum


def test_the_key_names_the_library_so_an_upgrade_compresses_again() -> None:
    assert GZIP.key.startswith("gzip-2-zlib-ng2.") and ZSTD.key.startswith("zstd-9-zstd1.")


@pytest.mark.parametrize("size", [0, 1, 5, 32 * 1024, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK])
def test_gzip_is_one_member_that_every_reader_takes_at_any_size(size: int) -> None:
    """Blocks joined into one deflate stream: Python's zlib (as Go's reader and zran) reads one member to
    its end, with nothing after it, the CRC and size checked."""
    data = LAYER[:size]
    out = io.BytesIO()
    GZIP.compress(io.BytesIO(data), out, 2)
    reader = zlib.decompressobj(31)
    assert reader.decompress(out.getvalue()) == data
    assert reader.eof and reader.unused_data == b"", "one gzip member, nothing after it"
    assert gzip.decompress(out.getvalue()) == data


def test_the_thread_count_comes_from_the_environment_or_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASCENDKIT_COMPRESS_THREADS", raising=False)
    assert compress_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("ASCENDKIT_COMPRESS_THREADS", "3")
    assert compress_threads() == 3
    monkeypatch.setenv("ASCENDKIT_COMPRESS_THREADS", "0")
    with pytest.raises(InputError, match="ASCENDKIT_COMPRESS_THREADS='0'"):
        compress_threads()
