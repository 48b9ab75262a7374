"""The zTOC of a gzip layer: what a SOCI snapshotter needs to read one file of the layer out of
the registry without pulling the rest (soci-snapshotter, awslabs; format 0.9, as its 0.4 line reads
and writes it: tests/fixtures/upstream/soci/).

A zTOC holds two things. The *TOC*: every entry of the layer's tar with where its bytes start in
the uncompressed stream (the tar's own header fields, as Go's archive/tar reads them). The
*zinfo*: checkpoints about every 4 MiB of uncompressed data at which inflating can start again,
each the compressed offset of a deflate block's start (and the bits of its first byte that belong
to the previous block), the uncompressed offset, and the 32 KiB of output before it (the
dictionary the block may refer back to); and the sha256 of each span of compressed bytes between
two checkpoints, which the snapshotter checks every fetched span against.

Checkpoints are found the way zlib's zran example (and soci's C code after it) finds them: the
layer is inflated with ``Z_BLOCK``, which stops at each block's end, and a checkpoint is taken at
the first block end more than a span past the last. Python's zlib does not stop at blocks, so the
inflate calls go to the system's libz through ctypes. The flatbuffer is written in the order
soci's Go marshaller writes it, so the same layer gives the same bytes as ``soci create``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from buildkit.errors import PublishFailed
from buildkit.ship.lazy.tarindex import TarEntry, TarIndex

if TYPE_CHECKING:  # imported where a zTOC is written: flatbuffers imports numpy, 50 ms every build and publish paid
    import flatbuffers

VERSION = "0.9"  # the zTOC format soci-snapshotter 0.4 writes (ztoc.Version09)
SPAN = 1 << 22  # uncompressed bytes between checkpoints: soci's default (4 MiB)
WINDOW = 32768  # deflate's window: the dictionary each checkpoint keeps
_CHUNK_IN = 1 << 16
_CHUNK_OUT = 1 << 20
_Z_BLOCK, _Z_STREAM_END, _Z_NEED_DICT, _Z_DATA_ERROR, _Z_MEM_ERROR = 5, 1, 2, -3, -4


class _ZStream(ctypes.Structure):
    _fields_ = [  # zlib.h's z_stream
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint),
        ("total_in", ctypes.c_ulong),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint),
        ("total_out", ctypes.c_ulong),
        ("msg", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("zalloc", ctypes.c_void_p),
        ("zfree", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("data_type", ctypes.c_int),
        ("adler", ctypes.c_ulong),
        ("reserved", ctypes.c_ulong),
    ]


@functools.cache
def _libz() -> ctypes.CDLL:
    """The system's libz, its functions typed: loaded once, whatever the layers."""
    name = ctypes.util.find_library("z") or "libz.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise PublishFailed(f"a SOCI index needs the system's zlib (libz.so.1): {exc}") from None
    lib.zlibVersion.restype = ctypes.c_char_p
    lib.inflateInit2_.argtypes = [ctypes.POINTER(_ZStream), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.inflate.argtypes = [ctypes.POINTER(_ZStream), ctypes.c_int]
    lib.inflateEnd.argtypes = [ctypes.POINTER(_ZStream)]
    return lib


@dataclass(frozen=True)
class Checkpoint:
    compressed: int  # offset of the first whole byte of the block
    uncompressed: int
    bits: int  # of the byte before ``compressed`` that belong to this block (0-7)
    window: bytes  # the WINDOW bytes of output before ``uncompressed``, zeros where there were fewer

    def packed(self) -> bytes:
        return struct.pack("<qqB", self.compressed, self.uncompressed, self.bits) + self.window


@dataclass
class Ztoc:
    """One layer's zTOC, before it is written as a flatbuffer."""

    compressed_size: int
    uncompressed_size: int
    entries: list[TarEntry]
    checkpoints: list[Checkpoint]
    span_digests: list[str] = field(default_factory=list)
    span: int = SPAN
    tool: str = "ascendkit"

    def zinfo(self) -> bytes:
        """soci's gzip zinfo blob, version 2: the count, the span, then every checkpoint packed."""
        return struct.pack("<iq", len(self.checkpoints), self.span) + b"".join(c.packed() for c in self.checkpoints)

    def span_bounds(self) -> list[tuple[int, int]]:
        """The compressed bytes of each span, as soci digests them: from a checkpoint's first byte
        (the byte before, when the block starts mid-byte) to the next checkpoint's first whole byte."""
        starts = [c.compressed - (1 if c.bits else 0) for c in self.checkpoints]
        ends = [c.compressed for c in self.checkpoints[1:]] + [self.compressed_size]
        return list(zip(starts, ends, strict=True))


Opener = Callable[[int], IO[bytes]]  # a fresh reader of the layer's compressed bytes from an offset


def build_ztoc(open_layer: Opener, compressed_size: int, *, span: int = SPAN, tool: str = "ascendkit") -> Ztoc:
    """The zTOC of the gzip layer ``open_layer`` reads: one inflate for the checkpoints and the TOC,
    then one read of the compressed bytes for the span digests."""
    tar = TarIndex()
    with open_layer(0) as stream:
        checkpoints = _checkpoints(stream, span, tar.feed)
    tar.close()
    ztoc = Ztoc(compressed_size, tar.archive_size, tar.entries, checkpoints, span=span, tool=tool)
    with open_layer(0) as stream:
        ztoc.span_digests = _span_digests(stream, ztoc.span_bounds())
    return ztoc


def _checkpoints(stream: IO[bytes], span: int, sink: Callable[[bytes], None]) -> list[Checkpoint]:
    """zran's walk over a gzip stream: inflate to each block end, a checkpoint after the header and
    at the first block end more than ``span`` past the last one (never after the last block)."""
    lib = _libz()
    strm = _ZStream()
    version = lib.zlibVersion()
    if lib.inflateInit2_(ctypes.byref(strm), 47, version, ctypes.sizeof(_ZStream)) != 0:  # 47: gzip or zlib header
        raise PublishFailed("zlib's inflate could not start")
    inbuf = ctypes.create_string_buffer(_CHUNK_IN)
    outbuf = ctypes.create_string_buffer(_CHUNK_OUT)
    in_addr, out_addr = ctypes.addressof(inbuf), ctypes.addressof(outbuf)
    points: list[Checkpoint] = []
    tail = bytes(WINDOW)
    total_in = total_out = last = 0
    ret = 0
    try:
        strm.avail_out = 0
        while ret != _Z_STREAM_END:
            data = stream.read(_CHUNK_IN)
            if not data:
                raise PublishFailed("the layer ends before its gzip stream does")
            ctypes.memmove(inbuf, data, len(data))
            strm.next_in, strm.avail_in = in_addr, len(data)
            while True:
                if strm.avail_out == 0:
                    strm.next_out, strm.avail_out = out_addr, _CHUNK_OUT
                had_in, had_out = strm.avail_in, strm.avail_out
                ret = lib.inflate(ctypes.byref(strm), _Z_BLOCK)
                total_in += had_in - strm.avail_in
                made = had_out - strm.avail_out
                if made:
                    chunk = ctypes.string_at(out_addr + _CHUNK_OUT - had_out, made)
                    total_out += made
                    tail = (tail + chunk)[-WINDOW:] if made < WINDOW else chunk[-WINDOW:]
                    sink(chunk)
                if ret in (_Z_NEED_DICT, _Z_DATA_ERROR, _Z_MEM_ERROR):
                    message = strm.msg.decode(errors="replace") if strm.msg else f"zlib error {ret}"
                    raise PublishFailed(f"the layer is not a valid gzip stream: {message}")
                if ret == _Z_STREAM_END:
                    break
                at_block_end = strm.data_type & 128 and not strm.data_type & 64
                if at_block_end and (total_out == 0 or total_out - last > span):
                    points.append(Checkpoint(total_in, total_out, strm.data_type & 7, tail))
                    last = total_out
                if strm.avail_in == 0:
                    break
    finally:
        lib.inflateEnd(ctypes.byref(strm))
    return points


def _span_digests(stream: IO[bytes], bounds: list[tuple[int, int]]) -> list[str]:
    """The sha256 of each span's compressed bytes; spans follow one another, overlapping by at most
    the one byte a block shares with the one before it."""
    digests = []
    position = 0
    carry = b""  # the last byte read, for a span that starts one byte back
    for start, end in bounds:
        digest = hashlib.sha256()
        if start < position:  # the byte shared with the span before
            digest.update(carry[start - position :])
        while position < start:  # the gzip header, before the first span: read past (a registry's stream cannot seek)
            skipped = stream.read(min(_CHUNK_OUT, start - position))
            if not skipped:
                raise PublishFailed("the layer ends before its first span")
            position += len(skipped)
        while position < end:
            data = stream.read(min(_CHUNK_OUT, end - position))
            if not data:
                raise PublishFailed("the layer ends before its last span does")
            digest.update(data)
            position += len(data)
            carry = data[-1:]
        digests.append(f"sha256:{digest.hexdigest()}")
    return digests


# ---- the flatbuffer ---------------------------------------------------------------------------------
# Tables and slots are ztoc.fbs's (tests check them against the vendored schema); calls come in the
# order soci's ztocToFlatbuffer makes them, for the same bytes.


def marshal(ztoc: Ztoc) -> bytes:
    """The zTOC as soci writes it (ztoc_marshaler.go)."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    version = b.CreateString(VERSION)
    tool = b.CreateString(ztoc.tool)
    entries = [_entry(b, e) for e in reversed(ztoc.entries)][::-1]
    metadata = _vector(b, entries)
    b.StartObject(1)  # TOC
    b.PrependUOffsetTRelativeSlot(0, metadata, 0)
    toc = b.EndObject()
    checkpoints = b.CreateByteVector(ztoc.zinfo())
    spans = _vector(b, [b.CreateString(d) for d in ztoc.span_digests])
    b.StartObject(4)  # CompressionInfo; the algorithm is left at the schema's default, Gzip
    b.PrependInt32Slot(1, len(ztoc.checkpoints) - 1, 0)
    b.PrependUOffsetTRelativeSlot(2, spans, 0)
    b.PrependUOffsetTRelativeSlot(3, checkpoints, 0)
    info = b.EndObject()
    b.StartObject(6)  # Ztoc
    b.PrependUOffsetTRelativeSlot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(1, tool, 0)
    b.PrependUOffsetTRelativeSlot(4, toc, 0)
    b.PrependInt64Slot(2, ztoc.compressed_size, 0)
    b.PrependInt64Slot(3, ztoc.uncompressed_size, 0)
    b.PrependUOffsetTRelativeSlot(5, info, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def _vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return int(b.EndVector())


def _entry(b: flatbuffers.Builder, e: TarEntry) -> int:
    name, kind, link = b.CreateString(e.name), b.CreateString(e.kind), b.CreateString(e.linkname)
    uname, gname, mtime = b.CreateString(e.uname), b.CreateString(e.gname), b.CreateString(e.mod_time)
    pairs = []
    for key in sorted(e.xattrs):
        k, v = b.CreateString(key), b.CreateString(e.xattrs[key])
        b.StartObject(2)  # Xattr
        b.PrependUOffsetTRelativeSlot(0, k, 0)
        b.PrependUOffsetTRelativeSlot(1, v, 0)
        pairs.append(b.EndObject())
    xattrs = _vector(b, pairs)
    b.StartObject(14)  # FileMetadata
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, kind, 0)
    b.PrependInt64Slot(2, e.offset, 0)
    b.PrependInt64Slot(3, e.size, 0)
    b.PrependUOffsetTRelativeSlot(4, link, 0)
    b.PrependInt64Slot(5, e.mode, 0)
    b.PrependUint32Slot(6, e.uid & 0xFFFFFFFF, 0)
    b.PrependUint32Slot(7, e.gid & 0xFFFFFFFF, 0)
    b.PrependUOffsetTRelativeSlot(8, uname, 0)
    b.PrependUOffsetTRelativeSlot(9, gname, 0)
    b.PrependUOffsetTRelativeSlot(10, mtime, 0)
    b.PrependInt64Slot(11, e.devmajor, 0)
    b.PrependInt64Slot(12, e.devminor, 0)
    b.PrependUOffsetTRelativeSlot(13, xattrs, 0)
    return int(b.EndObject())
