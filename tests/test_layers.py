"""Reading an image out of an engine's `docker save` stream and compressing its layers, on archives
made here: both layouts (the classic one, with a layer repeated as a symlink, and the OCI layout newer
engines write), chunks of any size, and what is missing or broken named."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from docker.errors import APIError

from buildkit.errors import PublishFailed, Unavailable
from buildkit.ship.layers import GZIP, SMALL, ZSTD, Compression, export

BIG = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(SMALL // 16))  # 2 MiB: spooled to disk
SMALL_LAYER = b"a small layer\n" * 100


def _tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


LAYERS = [_tar_of({"usr/lib/big.bin": BIG}), _tar_of({"etc/small": SMALL_LAYER})]
CONFIG = json.dumps(
    {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [_digest(x) for x in LAYERS]}}
).encode()
IMAGE_ID = _digest(CONFIG)


def classic_archive() -> bytes:
    """`docker save` of engines before 25: a directory per layer, a repeated layer as a symlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (("aaa/layer.tar", LAYERS[0]), ("bbb/layer.tar", LAYERS[1]), (f"{IMAGE_ID[7:]}.json", CONFIG)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("ccc/layer.tar")
        link.type, link.linkname = tarfile.SYMTYPE, "../aaa/layer.tar"
        tar.addfile(link)
        manifest = json.dumps([{"Config": f"{IMAGE_ID[7:]}.json", "Layers": ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"]}])
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest.encode()))
    return out.getvalue()


def oci_archive() -> bytes:
    """`docker save` of engines from 25 on: an OCI layout, every blob under blobs/sha256/."""
    return _tar_of({f"blobs/sha256/{_digest(b)[7:]}": b for b in (*LAYERS, CONFIG)} | {"index.json": b"{}", "oci-layout": b"{}"})


class FakeEngine:
    def __init__(self, archive: bytes, chunk: int, image_id: str = IMAGE_ID) -> None:
        self.archive, self.chunk, self.image_id = archive, chunk, image_id

    def get_image(self, image: str, chunk_size: int) -> Iterator[bytes]:
        assert image == self.image_id
        for start in range(0, len(self.archive), self.chunk):
            yield self.archive[start : start + self.chunk]


@pytest.mark.parametrize("archive", [classic_archive(), oci_archive()], ids=["classic", "oci-layout"])
@pytest.mark.parametrize("chunk", [333, 7777, 1 << 20])
def test_the_config_and_every_wanted_layer_compressed(tmp_path: Path, archive: bytes, chunk: int) -> None:
    wanted = {_digest(LAYERS[0]): (GZIP, ZSTD), _digest(LAYERS[1]): (GZIP,)}
    config, blobs = export(FakeEngine(archive, chunk), IMAGE_ID, wanted, tmp_path)  # type: ignore[arg-type]
    assert config == CONFIG
    big, small = blobs[_digest(LAYERS[0])], blobs[_digest(LAYERS[1])]
    assert sorted(big) == ["gzip", "zstd"] and sorted(small) == ["gzip"]
    for blob, layer, decompress in (
        (big["gzip"], LAYERS[0], gzip.decompress),
        (big["zstd"], LAYERS[0], lambda b: zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b)).read()),
        (small["gzip"], LAYERS[1], gzip.decompress),
    ):
        assert blob.path is not None
        data = blob.path.read_bytes()
        assert (blob.digest, blob.size) == (_digest(data), len(data))
        assert decompress(data) == layer
    assert not list(tmp_path.glob("*.partial")), "nothing but the blobs is left"


def test_only_what_is_wanted_is_compressed(tmp_path: Path) -> None:
    config, blobs = export(FakeEngine(classic_archive(), 4096), IMAGE_ID, {_digest(LAYERS[1]): (ZSTD,)}, tmp_path)  # type: ignore[arg-type]
    assert config == CONFIG and list(blobs) == [_digest(LAYERS[1])]
    assert len(list(tmp_path.glob("*.blob"))) == 1


def test_a_layer_or_config_missing_from_the_archive_is_named(tmp_path: Path) -> None:
    missing = "sha256:" + "f" * 64
    with pytest.raises(PublishFailed, match=f"lacks layer {missing}"):
        export(FakeEngine(classic_archive(), 4096), IMAGE_ID, {missing: (GZIP,)}, tmp_path)  # type: ignore[arg-type]
    without_config = _tar_of({"aaa/layer.tar": LAYERS[0]})
    with pytest.raises(PublishFailed, match="no config with that digest"):
        export(FakeEngine(without_config, 4096), IMAGE_ID, {}, tmp_path)  # type: ignore[arg-type]


def test_an_archive_cut_short_is_named(tmp_path: Path) -> None:
    with pytest.raises(PublishFailed, match="exporting image"):
        export(FakeEngine(classic_archive()[:100_000], 4096), IMAGE_ID, {_digest(LAYERS[0]): (GZIP,)}, tmp_path)  # type: ignore[arg-type]


class Restarting(FakeEngine):
    """An engine whose first ``losses`` exports are cut off."""

    def __init__(self, archive: bytes, chunk: int, losses: int) -> None:
        super().__init__(archive, chunk)
        self.losses = losses
        self.exports = 0

    def get_image(self, image: str, chunk_size: int) -> Iterator[bytes]:
        self.exports += 1
        if self.exports <= self.losses:
            yield self.archive[:50_000]
            raise APIError("500 Server Error: the engine restarted")
        yield from super().get_image(image, chunk_size)


def test_an_export_cut_off_by_an_engine_restart_is_started_again(tmp_path: Path) -> None:
    engine, waits = Restarting(classic_archive(), 4096, losses=2), list[float]()
    config, blobs = export(engine, IMAGE_ID, {_digest(LAYERS[0]): (GZIP,)}, tmp_path, sleep=waits.append)  # type: ignore[arg-type]
    assert config == CONFIG and engine.exports == 3 and waits == [5, 10]
    assert gzip.decompress(blobs[_digest(LAYERS[0])]["gzip"].open().read()) == LAYERS[0]


def test_an_engine_that_stays_lost_is_unavailable(tmp_path: Path) -> None:
    engine = Restarting(classic_archive(), 4096, losses=3)
    with pytest.raises(Unavailable, match=r"exporting image sha256:\w+ from the engine failed"):
        export(engine, IMAGE_ID, {_digest(LAYERS[0]): (GZIP,)}, tmp_path, sleep=lambda _: None)  # type: ignore[arg-type]
    assert engine.exports == 3


class Watching(FakeEngine):
    """An engine that, before each chunk it sends, notes how much the spool holds."""

    def __init__(self, archive: bytes, chunk: int, spool: Path, image_id: str) -> None:
        super().__init__(archive, chunk, image_id)
        self.spool, self.most, self.exports = spool, 0, 0

    def get_image(self, image: str, chunk_size: int) -> Iterator[bytes]:
        self.exports += 1
        for chunk in super().get_image(image, chunk_size):
            self.most = max(self.most, sum(p.stat().st_size for p in self.spool.iterdir()))
            yield chunk


ROUND = b"".join(b"usr/lib/python3/dist-packages/module_%05d.py 0644 root root\n" % (i % 3000) for i in range(150_000)) + b"\0" * SMALL
ROUND_LAYERS = [_tar_of({"opt/big.bin": ROUND}), _tar_of({"opt/other.bin": ROUND[::-1] + b"x" * 50_000})]


def _archive_of(layers: list[bytes]) -> tuple[str, bytes]:
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [_digest(x) for x in layers]}}).encode()
    files = {f"{i:03d}/layer.tar": layer for i, layer in enumerate(layers)} | {f"{_digest(config)[7:]}.json": config}
    return _digest(config), _tar_of(files)


def test_no_uncompressed_layer_is_written_to_disk(tmp_path: Path) -> None:
    """A layer of 9 MiB that compresses more than 5-fold goes through in 64 KiB chunks: the spool never
    holds more than the blobs it ends with (a raw copy would be 9 MiB)."""
    image_id, archive = _archive_of(ROUND_LAYERS[:1])
    engine = Watching(archive, 1 << 16, tmp_path, image_id)
    wanted: dict[str, tuple[Compression, ...]] = {_digest(ROUND_LAYERS[0]): (GZIP, ZSTD)}
    _, blobs = _export_of(engine, wanted, tmp_path)
    compressed = sum(b.size for b in blobs[_digest(ROUND_LAYERS[0])].values())
    assert compressed < len(ROUND) / 5
    assert engine.most <= 1.1 * compressed + 65536, f"the spool held {engine.most} bytes for {compressed} bytes of blobs"


def _export_of(engine: FakeEngine, wanted: dict[str, tuple[Compression, ...]], spool: Path, **kw: Any) -> Any:
    return export(engine, engine.image_id, wanted, spool, **kw)  # type: ignore[arg-type]


def test_a_layer_the_registries_have_is_read_past_and_one_of_its_size_exported_again(tmp_path: Path) -> None:
    """Engines before 25 do not name layers by digest: the cache's sizes say which to read past.
    A wanted layer that happens to have such a size costs a second export, not a wrong publish."""
    image_id, archive = _archive_of(ROUND_LAYERS)
    have, want = _digest(ROUND_LAYERS[0]), _digest(ROUND_LAYERS[1])
    engine = Watching(archive, 1 << 20, tmp_path, image_id)
    _, blobs = _export_of(engine, {want: (GZIP,)}, tmp_path, known_sizes={have: len(ROUND_LAYERS[0])})
    assert list(blobs) == [want] and engine.exports == 1
    assert len(list(tmp_path.glob("*.blob"))) == 1, "the layer the registries have was not compressed"
    said: list[str] = []
    engine = Watching(archive, 1 << 20, tmp_path, image_id)
    _, blobs = _export_of(engine, {want: (GZIP,)}, tmp_path, known_sizes={have: len(ROUND_LAYERS[1])}, tell=said.append)
    assert list(blobs) == [want] and engine.exports == 2
    assert any("exporting again" in s for s in said)
    assert gzip.decompress(blobs[want]["gzip"].open().read()) == ROUND_LAYERS[1]


def test_an_oci_layout_layer_not_wanted_is_not_read(tmp_path: Path) -> None:
    _, blobs = export(FakeEngine(oci_archive(), 4096), IMAGE_ID, {_digest(LAYERS[1]): (GZIP,)}, tmp_path)  # type: ignore[arg-type]
    assert list(blobs) == [_digest(LAYERS[1])] and len(list(tmp_path.glob("*.blob"))) == 1
