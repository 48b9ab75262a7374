"""zTOCs and SOCI indexes (buildkit/ship/lazy/ztoc.py, tarindex.py, lazy.py) without an engine.

Held to soci-snapshotter 0.4.1's own sources (tests/fixtures/upstream/soci/): the flatbuffer's slots
and types are read from its ztoc.fbs, the index's media types and annotations from soci_index.go.
Every checkpoint is proven by restarting zlib's inflate there. The real soci (its `soci create` and
its snapshotter) judges the published result in tests/test_lazy_pull.py.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import random
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import flatbuffers
import pytest
from flatbuffers import number_types
from flatbuffers.table import Table

from buildkit.errors import InputError, PublishFailed
from buildkit.ship.layers.compressors import GZIP
from buildkit.ship.lazy import soci as lazy
from buildkit.ship.lazy import ztoc
from buildkit.ship.lazy.tarindex import TarIndex, UnsupportedTar
from buildkit.ship.oci.registry import OCI_INDEX, OCI_MANIFEST, Manifest, Registry
from buildkit.ship.options import ship_options
from tests.harness.fake_registry import fake_registry
from tests.harness.upstream_sources import vendored

SOCI = vendored("soci")


def _tar(members: Sequence[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, **extra: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, 0o644, 1_700_000_000
    for key, value in extra.items():
        setattr(info, key, value)
    return info


def _sample_tar(fmt: int = tarfile.PAX_FORMAT) -> bytes:
    rng = random.Random(7)
    long_name = "usr/lib/python3/dist-packages/" + "x" * 120 + "/module.py"
    body = bytes(rng.getrandbits(8) for _ in range(70_000))
    return _tar(
        [
            (_info("usr/", tarfile.DIRTYPE, mode=0o755), None),
            (_info("usr/bin/python3", size=len(body), uid=0, gid=0, uname="root", gname="root"), body),
            (_info("usr/bin/python", tarfile.SYMTYPE, linkname="python3"), None),
            (_info("usr/bin/py", tarfile.LNKTYPE, linkname="usr/bin/python3"), None),
            (_info(long_name, size=11, uid=1000, gid=1000), b"print('hi')"),
            (_info("etc/fifo", tarfile.FIFOTYPE), None),
            (_info("opt/cap", size=3, pax_headers={"SCHILY.xattr.security.capability": "\x01\x02", "mtime": "1700000000.25"}), b"cap"),
        ],
        fmt,
    )


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_tar_entries_start_where_tarfile_says_and_keep_gos_fields(fmt: int) -> None:
    data = _sample_tar(fmt)
    index = TarIndex()
    for start in range(0, len(data), 1000):  # in pieces that cut headers anywhere
        index.feed(data[start : start + 1000])
    index.close()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = archive.getmembers()
        end = archive.offset  # where the end-of-archive blocks start
    assert [e.offset for e in index.entries] == [m.offset_data for m in members]
    assert [e.size for e in index.entries] == [m.size for m in members]
    assert [e.kind for e in index.entries] == ["dir", "reg", "symlink", "hardlink", "reg", "fifo", "reg"]
    assert index.entries[0].name == b"usr/"  # as Go reads it: the slash kept (tarfile strips it)
    assert index.entries[4].name.decode() == members[4].name and len(index.entries[4].name) > 100
    assert index.entries[2].linkname == b"python3" and index.entries[1].uname == b"root"
    assert index.entries[1].mod_time == "2023-11-14T22:13:20Z"
    assert index.archive_size == end + 1024  # Go's reader stops after the two zero blocks, before the padding
    if fmt == tarfile.PAX_FORMAT:
        cap = index.entries[6]
        assert cap.xattrs[b"SCHILY.xattr.security.capability"] == b"\x01\x02" and cap.mod_time == "2023-11-14T22:13:20.25Z"


@pytest.mark.parametrize("zero_blocks", [0, 1, 2])
def test_an_archive_ends_where_gos_reader_stops(zero_blocks: int) -> None:
    data = _sample_tar()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.getmembers()
        end = archive.offset
    index = TarIndex()
    index.feed(data[: end + 512 * zero_blocks])
    index.close()
    assert len(index.entries) == 7 and index.archive_size == end + 512 * zero_blocks
    cut = TarIndex()
    cut.feed(data[: index.entries[1].offset + 100])  # inside python3's data
    with pytest.raises(UnsupportedTar, match="ends inside an entry"):
        cut.close()


def test_a_global_pax_header_is_refused_as_soci_refuses_it() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as archive:
        archive.addfile(_info("a", size=1), io.BytesIO(b"a"))
    with pytest.raises(UnsupportedTar, match="global PAX header"):
        TarIndex().feed(buffer.getvalue())


def _gzip(data: bytes, how: str) -> bytes:
    if how == "ascendkit":  # what publish writes: ISA-L in 1 MiB blocks
        out = io.BytesIO()
        GZIP.compress(io.BytesIO(data), out)
        return out.getvalue()
    import gzip

    return gzip.compress(data, compresslevel=6, mtime=0)  # zlib: blocks end mid-byte


def _layer(size: int) -> bytes:
    """A tar of about ``size`` bytes, half text-like, half random: blocks of every kind."""
    rng = random.Random(size)
    words = [bytes(rng.choice(b"abcdefghij ") for _ in range(8)) for _ in range(500)]
    members = []
    for i in range(8):
        text = b" ".join(rng.choice(words) for _ in range(size // 16 // 9))
        noise = rng.randbytes(size // 16)
        members += [(_info(f"f/{i}.txt", size=len(text)), text), (_info(f"f/{i}.bin", size=len(noise)), noise)]
    return _tar(members)


def _restart(compressed: bytes, point: ztoc.Checkpoint, length: int) -> bytes:
    """What zlib inflates from ``point`` alone: raw inflate, primed with its bits, its window as the dictionary."""
    lib = ztoc._libz()
    lib.inflatePrime.argtypes = [ctypes.POINTER(ztoc._ZStream), ctypes.c_int, ctypes.c_int]
    lib.inflateSetDictionary.argtypes = [ctypes.POINTER(ztoc._ZStream), ctypes.c_char_p, ctypes.c_uint]
    strm = ztoc._ZStream()
    assert lib.inflateInit2_(ctypes.byref(strm), -15, lib.zlibVersion(), ctypes.sizeof(ztoc._ZStream)) == 0
    start = point.compressed
    if point.bits:
        assert lib.inflatePrime(ctypes.byref(strm), point.bits, compressed[start - 1] >> (8 - point.bits)) == 0
    assert lib.inflateSetDictionary(ctypes.byref(strm), point.window, len(point.window)) == 0
    source = ctypes.create_string_buffer(compressed[start : start + length * 2 + 65536])
    out = ctypes.create_string_buffer(length)
    strm.next_in, strm.avail_in = ctypes.addressof(source), len(source) - 1
    strm.next_out, strm.avail_out = ctypes.addressof(out), length
    lib.inflate(ctypes.byref(strm), 0)
    made = length - strm.avail_out
    lib.inflateEnd(ctypes.byref(strm))
    return out.raw[:made]


@pytest.mark.parametrize("how", ["ascendkit", "zlib"])
def test_every_checkpoint_restarts_inflate_and_every_span_is_digested(how: str) -> None:
    data = _layer(6 << 20)
    compressed = _gzip(data, how)
    built = ztoc.build_ztoc(lambda offset: io.BytesIO(compressed[offset:]), len(compressed), span=1 << 20)
    assert len(built.checkpoints) >= 5 and built.checkpoints[0].uncompressed == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.getmembers()
        assert built.uncompressed_size == archive.offset + 1024 and len(built.entries) == 16
    for point in built.checkpoints:
        assert point.window == (bytes(ztoc.WINDOW) + data[: point.uncompressed])[-ztoc.WINDOW :]
        piece = _restart(compressed, point, 50_000)
        assert piece and piece == data[point.uncompressed : point.uncompressed + len(piece)], point.uncompressed
    gaps = [b.uncompressed - a.uncompressed for a, b in zip(built.checkpoints[1:], built.checkpoints[2:], strict=False)]
    assert all(gap > 1 << 20 for gap in gaps)  # a checkpoint only past a whole span
    if how == "zlib":
        assert any(p.bits for p in built.checkpoints), "zlib's blocks end mid-byte: the bits path must be taken"
    for (start, end), digest in zip(built.span_bounds(), built.span_digests, strict=True):
        assert digest == "sha256:" + hashlib.sha256(compressed[start:end]).hexdigest()
    assert built.span_bounds()[-1][1] == len(compressed)


def _fields(schema: str) -> dict[str, list[tuple[str, str]]]:
    """Each table of ztoc.fbs with its fields in order (a field's slot is its place) and types."""
    tables = {}
    for name, body in re.findall(r"table (\w+) \{(.*?)\}", schema, re.S):
        fields = re.findall(r"^\s*(\w+)\s*:\s*([\w\[\]]+)", re.sub(r"//[^\n]*", "", body), re.M)
        tables[name] = [(field, kind) for field, kind in fields]
    return tables


class _Reader:
    """A table of a flatbuffer read by ztoc.fbs's field names (slot = the field's place in the schema)."""

    FLAGS: ClassVar[dict[str, Any]] = {
        "long": number_types.Int64Flags,
        "int": number_types.Int32Flags,
        "uint32": number_types.Uint32Flags,
    }

    def __init__(self, tables: dict[str, list[tuple[str, str]]], table: str, buf: bytes, pos: int) -> None:
        self.tables, self.table, self.tab = tables, table, Table(buf, pos)

    def _offset(self, field: str) -> tuple[int, str]:
        names = [f for f, _ in self.tables[self.table]]
        return self.tab.Offset(4 + 2 * names.index(field)), dict(self.tables[self.table])[field]

    def __getitem__(self, field: str) -> Any:
        offset, kind = self._offset(field)
        if offset == 0:
            return None
        if kind == "string":
            return self.tab.String(offset + self.tab.Pos)
        if kind in self.FLAGS:
            return self.tab.Get(self.FLAGS[kind], offset + self.tab.Pos)
        if kind == "[ubyte]":
            return bytes(self.tab.Bytes[self.tab.Vector(offset) : self.tab.Vector(offset) + self.tab.VectorLen(offset)])
        if kind == "[string]":
            return [self.tab.String(self.tab.Vector(offset) + 4 * i) for i in range(self.tab.VectorLen(offset))]
        if kind.startswith("["):
            element = kind.strip("[]")
            return [
                _Reader(self.tables, element, self.tab.Bytes, self.tab.Indirect(self.tab.Vector(offset) + 4 * i))
                for i in range(self.tab.VectorLen(offset))
            ]
        return _Reader(self.tables, kind, self.tab.Bytes, self.tab.Indirect(offset + self.tab.Pos))


def test_the_flatbuffer_reads_back_by_socis_schema() -> None:
    tables = _fields(SOCI["ztoc/fbs/ztoc.fbs"].read_text())
    assert [f for f, _ in tables["Ztoc"]] == [
        "version", "build_tool_identifier", "compressed_archive_size", "uncompressed_archive_size", "toc", "compression_info",
    ]  # fmt: skip
    data = _sample_tar()
    compressed = _gzip(data, "ascendkit")
    built = ztoc.build_ztoc(lambda offset: io.BytesIO(compressed[offset:]), len(compressed), tool="test tool")
    buf = ztoc.marshal(built)
    root = _Reader(tables, "Ztoc", buf, flatbuffers.encode.Get(number_types.UOffsetTFlags.packer_type, buf, 0))
    assert root["version"] == b"0.9" and root["build_tool_identifier"] == b"test tool"
    assert (root["compressed_archive_size"], root["uncompressed_archive_size"]) == (len(compressed), built.uncompressed_size)
    entries = root["toc"]["metadata"]
    assert [(e["name"], e["type"], e["uncompressed_offset"] or 0) for e in entries] == [
        (x.name, x.kind.encode(), x.offset) for x in built.entries
    ]
    cap = entries[6]
    assert [(x["key"], x["value"]) for x in cap["xattrs"]] == sorted(built.entries[6].xattrs.items())
    assert cap["mod_time"] == b"2023-11-14T22:13:20.25Z" and entries[1]["uname"] == b"root" and entries[0]["mode"] == 0o755
    info = root["compression_info"]
    assert info["compression_algorithm"] is None  # left at the schema's default: Gzip
    assert "compression_algorithm : CompressionAlgorithm = Gzip" in SOCI["ztoc/fbs/ztoc.fbs"].read_text()
    assert info["max_span_id"] in (None, len(built.checkpoints) - 1)
    assert info["span_digests"] == [d.encode() for d in built.span_digests]
    assert info["checkpoints"] == built.zinfo()


def test_the_zinfo_blob_is_laid_out_as_soci_reads_it() -> None:
    header = SOCI["ztoc/compression/gzip_zinfo.h"].read_text()
    assert "#define PACKED_CHECKPOINT_SIZE (8 + 8 + 1 + WINSIZE)" in header and "#define BLOB_HEADER_SIZE (4 + 8)" in header
    assert "#define WINSIZE 32768U" in header and ztoc.WINDOW == 32768
    compressed = _gzip(_layer(3 << 20), "zlib")
    built = ztoc.build_ztoc(lambda offset: io.BytesIO(compressed[offset:]), len(compressed), span=1 << 20)
    blob = built.zinfo()
    assert len(blob) == 12 + len(built.checkpoints) * (17 + 32768)
    assert int.from_bytes(blob[:4], "little") == len(built.checkpoints) and int.from_bytes(blob[4:12], "little") == 1 << 20
    second = blob[12 + 17 + 32768 :]
    assert int.from_bytes(second[:8], "little") == built.checkpoints[1].compressed  # compressed offset first
    assert int.from_bytes(second[8:16], "little") == built.checkpoints[1].uncompressed


def test_the_index_speaks_socis_constants() -> None:
    source = SOCI["soci/soci_index.go"].read_text()
    for constant, value in (
        ("SociIndexArtifactType", lazy.SOCI_INDEX),
        ("SociLayerMediaType", lazy.ZTOC),
        ("IndexAnnotationImageLayerMediaType", lazy.LAYER_MEDIA_TYPE),
        ("IndexAnnotationImageLayerDigest", lazy.LAYER_DIGEST),
        ("IndexAnnotationBuildToolIdentifier", lazy.TOOL_ANNOTATION),
    ):
        assert re.search(rf'\b{constant}\s*=\s*"{re.escape(value)}"', source), constant
    assert "defaultSpanSize            = int64(1 << 22)" in source and ztoc.SPAN == 1 << 22
    assert "defaultMinLayerSize        = 10 << 20" in source and lazy.MIN_LAYER == 10 << 20
    assert f'emptyJSONObjectDigest = "sha256:{hashlib.sha256(lazy.EMPTY_CONFIG).hexdigest()}"' in source


def _push_image(registry: Registry, layers: list[bytes]) -> Any:
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    descriptors = [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": registry.put_blob("ml/verl", layer), "size": len(layer)}
        for layer in layers
    ]
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": registry.put_blob("ml/verl", config),
            "size": len(config),
        },
        "layers": descriptors,
    }
    digest = registry.put_manifest("ml/verl", "v1", json.dumps(body).encode(), OCI_MANIFEST)
    return registry.get_manifest("ml/verl", digest)


@pytest.mark.parametrize("referrers", [True, False])
def test_the_index_is_linked_by_its_subject_or_listed_under_the_referrers_tag(
    referrers: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASCENDKIT_CACHE", str(tmp_path))
    big = _gzip(_layer(24 << 20), "ascendkit")
    small = _gzip(_tar([(_info("etc/hostname", size=3), b"ai\n")]), "ascendkit")
    assert len(big) >= lazy.MIN_LAYER
    with fake_registry(referrers=referrers) as (host, store):
        registry = Registry(host, retries=0)
        subject = _push_image(registry, [small, big])
        said: list[str] = []
        ztocs = lazy.image_ztocs(subject, lazy.from_registry(registry, "ml/verl"), said.append)
        assert list(ztocs.files) == [subject.json()["layers"][1]["digest"]] and "fetched whole" in next(iter(ztocs.skipped.values()))
        tag = subject.digest.replace(":", "-", 1)
        other = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "e" * 64, "size": 9}
        if not referrers:  # something else already refers to the image
            registry.put_manifest(
                "ml/verl", tag, json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [other]}).encode(), OCI_INDEX
            )
        index, staged = lazy.stage_lazy_index(registry, "ml/verl", subject, ztocs)
        body = json.loads(store.manifests[index.digest][1])
        assert body["subject"] == {"mediaType": OCI_MANIFEST, "digest": subject.digest, "size": len(subject.body)}
        assert body["config"]["mediaType"] == lazy.SOCI_INDEX and [layer["annotations"] for layer in body["layers"]] == [
            {lazy.LAYER_DIGEST: subject.json()["layers"][1]["digest"], lazy.LAYER_MEDIA_TYPE: "application/vnd.oci.image.layer.v1.tar+gzip"}
        ]
        with ztocs.files[subject.json()["layers"][1]["digest"]].open() as cached:
            assert store.blobs[body["layers"][0]["digest"]] == cached.read()
        if referrers:
            assert index.how == "referrer" and staged is None
        else:
            assert index.how == f"tag {tag}" and staged is not None
            staged.write()
            listed = json.loads(registry.get_manifest("ml/verl", tag).body)["manifests"]  # type: ignore[union-attr]
            assert [m["digest"] for m in listed] == [index.digest, "sha256:" + "e" * 64]  # soci takes the first
            assert listed[0]["artifactType"] == lazy.SOCI_INDEX
        again = lazy.image_ztocs(subject, lambda digest: pytest.fail("a zTOC is built once per layer"), said.append)
        assert again == ztocs and len([s for s in said if "zTOC of" in s]) == 1


def test_lazy_soci_is_refused_with_docker_media_types_and_anything_else_named() -> None:
    with pytest.raises(InputError, match="a SOCI index is an OCI manifest"):
        ship_options("docker", "gzip", lazy="soci")
    with pytest.raises(InputError, match="--lazy 'estargz': give soci"):
        ship_options(None, "gzip", lazy="estargz")
    assert ship_options("oci", "zstd", lazy="soci").lazy == "soci"


class _Cut(io.BytesIO):
    """A layer's bytes whose connection drops half-way."""

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() > len(self.getvalue()) // 2:
            raise ConnectionResetError("connection reset by peer")
        return super().read(size)


def test_a_layer_read_that_breaks_fails_the_publish_and_caches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_CACHE", str(tmp_path))
    big = _gzip(_layer(24 << 20), "ascendkit")
    digest = "sha256:" + hashlib.sha256(big).hexdigest()
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": len(big)}
    body = json.dumps({"schemaVersion": 2, "layers": [layer]}).encode()
    manifest = Manifest("sha256:" + "f" * 64, OCI_MANIFEST, len(body), body)
    with pytest.raises(PublishFailed, match=rf"layer {digest[:19]}: reading it for its zTOC failed: connection reset"):
        lazy.image_ztocs(manifest, lambda _: lambda offset: _Cut(big[offset:]), lambda _: None)
    assert not lazy.ztoc_path(digest).exists() and not list(tmp_path.rglob("*.ztoc"))
