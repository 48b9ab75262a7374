"""Reading an image out of an engine's `docker save` stream and compressing its layers, on archives
in every engine's layout (tests/harness/saved_layouts.py: Docker 20.10's, Docker 25+'s OCI layout, the
containerd store's compressed blobs in gzip and zstd behind a nested index, Podman's docker-archive),
chunks of any size, and what is missing, broken or not the verified image named."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from docker.errors import APIError

from buildkit.errors import PublishFailed, Unavailable
from buildkit.image.archive import SMALL, ImageIdentity, config_in_archive
from buildkit.ship.layers.compressing import GZIP, ZSTD, Compression
from buildkit.ship.layers.export import Exported, export
from tests.harness.saved_layouts import Image, SavingEngine, classic, containerd, digest, members_of, overlay2_oci, podman, tar_of

BIG = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(SMALL // 16))  # 2 MiB: spooled to disk
SMALL_LAYER = b"a small layer\n" * 100
LAYERS = [tar_of({"usr/lib/big.bin": BIG}), tar_of({"etc/small": SMALL_LAYER})]
IMAGE = Image.of([*LAYERS, LAYERS[0]])  # the big layer twice: a repeated layer is a link in some layouts
CONFIG, IMAGE_ID = IMAGE.config, IMAGE.config_digest
SAME = ImageIdentity(IMAGE_ID, IMAGE_ID)  # every layout but the containerd store's names the image by its config
STORE_GZIP, STORE_ZSTD = containerd(IMAGE, "gzip"), containerd(IMAGE, "zstd")

LAYOUTS: dict[str, tuple[bytes, ImageIdentity]] = {
    "docker-20.10": (classic(IMAGE), SAME),
    "docker-25-overlay2": (overlay2_oci(IMAGE), SAME),
    "containerd-gzip": (STORE_GZIP.archive, ImageIdentity(IMAGE_ID, STORE_GZIP.engine_id)),
    "containerd-zstd": (STORE_ZSTD.archive, ImageIdentity(IMAGE_ID, STORE_ZSTD.engine_id)),
    "podman": (podman(IMAGE), SAME),
}


def _engine(layout: str, chunk: int = 4096) -> tuple[SavingEngine, ImageIdentity]:
    archive, identity = LAYOUTS[layout]
    return SavingEngine(archive, chunk, identity.engine_id), identity


def _export(engine: SavingEngine, identity: ImageIdentity, wanted: dict[str, tuple[Compression, ...]], spool: Path, **kw: Any) -> Exported:
    return export(engine, identity, wanted, spool, **kw)  # type: ignore[arg-type]  # what export asks of an engine


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("chunk", [333, 7777, 1 << 20])
def test_the_config_and_every_wanted_layer_compressed_from_every_layout(tmp_path: Path, layout: str, chunk: int) -> None:
    engine, identity = _engine(layout, chunk)
    wanted = {digest(LAYERS[0]): (GZIP, ZSTD), digest(LAYERS[1]): (GZIP,)}
    exported = _export(engine, identity, wanted, tmp_path)
    assert exported.config == CONFIG and engine.exports == 1 and engine.closed == 1
    big, small = exported.layers[digest(LAYERS[0])], exported.layers[digest(LAYERS[1])]
    assert sorted(big) == ["gzip", "zstd"] and sorted(small) == ["gzip"]
    for blob, layer, decompress in (
        (big["gzip"], LAYERS[0], gzip.decompress),
        (big["zstd"], LAYERS[0], _zstd),
        (small["gzip"], LAYERS[1], gzip.decompress),
    ):
        assert blob.path is not None
        data = blob.path.read_bytes()
        assert (blob.digest, blob.size) == (digest(data), len(data))
        assert decompress(data) == layer
    assert not list(tmp_path.glob("*.partial")), "nothing but the blobs is left"


def test_every_layout_gives_the_same_blobs(tmp_path: Path) -> None:
    """The engine's store does not show in what is published: the same image gives the same bytes."""
    made = {}
    for layout in LAYOUTS:
        engine, identity = _engine(layout)
        spool = tmp_path / layout
        spool.mkdir()
        exported = _export(engine, identity, {d: (GZIP, ZSTD) for d in IMAGE.diff_ids}, spool)
        made[layout] = {d: {n: b.digest for n, b in blobs.items()} for d, blobs in exported.layers.items()}
    assert len({json.dumps(m, sort_keys=True) for m in made.values()}) == 1, made


def test_the_containerd_store_s_blobs_are_learnt_and_read_past_next_time(tmp_path: Path) -> None:
    engine, identity = _engine("containerd-gzip")
    exported = _export(engine, identity, {digest(LAYERS[0]): (GZIP,)}, tmp_path)
    assert exported.stored == {s: d for s, d in STORE_GZIP.stored.items()}, "which layer each stored blob holds, learnt on the way"
    said: list[str] = []
    engine, identity = _engine("containerd-gzip")
    spool = tmp_path / "again"
    spool.mkdir()
    again = _export(engine, identity, {digest(LAYERS[1]): (GZIP,)}, spool, stored_layers=exported.stored, tell=said.append)
    assert list(again.layers) == [digest(LAYERS[1])]
    assert not any("compressing a layer" in s for s in said), "the big blob is known to hold a layer not wanted: read past"


def test_only_what_is_wanted_is_compressed(tmp_path: Path) -> None:
    engine, identity = _engine("docker-20.10")
    exported = _export(engine, identity, {digest(LAYERS[1]): (ZSTD,)}, tmp_path)
    assert exported.config == CONFIG and list(exported.layers) == [digest(LAYERS[1])]
    assert len(list(tmp_path.glob("*.blob"))) == 1


def test_a_layer_or_config_missing_from_the_archive_is_named(tmp_path: Path) -> None:
    missing = "sha256:" + "f" * 64
    engine, identity = _engine("docker-20.10")
    with pytest.raises(PublishFailed, match=f"lacks layer {missing}"):
        _export(engine, identity, {missing: (GZIP,)}, tmp_path)
    without_manifest = tar_of({"aaa/layer.tar": LAYERS[0]})
    with pytest.raises(PublishFailed, match=r"unreadable \(no manifest.json"):
        _export(SavingEngine(without_manifest, 4096, IMAGE_ID), SAME, {}, tmp_path)
    engine, _ = _engine("docker-25-overlay2")
    other = ImageIdentity("sha256:" + "e" * 64, IMAGE_ID)
    with pytest.raises(PublishFailed, match=f"no config with that digest .{other.config} was verified; it holds {IMAGE_ID}"):
        _export(engine, other, {}, tmp_path)


def _swap_blob(archive: bytes, name: str, body: bytes) -> bytes:
    """``archive`` with member ``name``'s bytes replaced (the other members as they were)."""
    return tar_of(members_of(archive) | {name: body}, sort=True)


def test_a_stored_blob_that_is_not_the_config_s_layer_is_refused(tmp_path: Path) -> None:
    """DiffIDs are checked against the decompressed stream: a store blob holding another layer than
    the config lists there (named by its own, right, digest) is refused, naming both."""
    other = gzip.compress(tar_of({"usr/lib/other.bin": BIG[::-1]}), mtime=0)
    stored = next(s for s, d in STORE_GZIP.stored.items() if d == digest(LAYERS[0]))
    archive = _swap_blob(STORE_GZIP.archive, f"blobs/sha256/{stored[7:]}", other)
    archive = _rename(archive, f"blobs/sha256/{stored[7:]}", f"blobs/sha256/{digest(other)[7:]}", stored, digest(other))
    with pytest.raises(PublishFailed, match=rf"decompresses .*to layer sha256:\w+, but the image's config lists {digest(LAYERS[0])}"):
        _export(
            SavingEngine(archive, 4096, STORE_GZIP.engine_id),
            ImageIdentity(IMAGE_ID, STORE_GZIP.engine_id),
            {digest(LAYERS[0]): (GZIP,)},
            tmp_path,
        )


def _rename(archive: bytes, old: str, new: str, old_digest: str, new_digest: str) -> bytes:
    """``archive`` with member ``old`` renamed ``new`` and manifest.json pointing at it."""
    members = {new if name == old else name: data for name, data in members_of(archive).items()}
    members["manifest.json"] = members["manifest.json"].replace(old_digest[7:].encode(), new_digest[7:].encode())
    return tar_of(members, sort=True)


def test_a_damaged_store_blob_is_refused(tmp_path: Path) -> None:
    stored = next(s for s, d in STORE_GZIP.stored.items() if d == digest(LAYERS[0]))
    name = f"blobs/sha256/{stored[7:]}"
    archive = _swap_blob(STORE_GZIP.archive, name, gzip.compress(LAYERS[0], mtime=1))  # the same layer, not the bytes its name says
    with pytest.raises(PublishFailed, match="not what its name and size say: the engine's image store is damaged"):
        _export(
            SavingEngine(archive, 4096, STORE_GZIP.engine_id),
            ImageIdentity(IMAGE_ID, STORE_GZIP.engine_id),
            {digest(LAYERS[0]): (GZIP,)},
            tmp_path,
        )
    cut = _swap_blob(STORE_GZIP.archive, name, gzip.compress(LAYERS[0], mtime=0)[:-9000])
    with pytest.raises(PublishFailed, match="the gzip stream is broken"):
        _export(
            SavingEngine(cut, 4096, STORE_GZIP.engine_id),
            ImageIdentity(IMAGE_ID, STORE_GZIP.engine_id),
            {digest(LAYERS[0]): (GZIP,)},
            tmp_path,
        )


def test_an_archive_cut_short_is_named(tmp_path: Path) -> None:
    engine = SavingEngine(classic(IMAGE)[:100_000], 4096, IMAGE_ID)
    with pytest.raises(PublishFailed, match="exporting image"):
        _export(engine, SAME, {digest(LAYERS[0]): (GZIP,)}, tmp_path)


class Restarting(SavingEngine):
    """An engine whose first ``losses`` exports are cut off."""

    def __init__(self, archive: bytes, chunk: int, losses: int) -> None:
        super().__init__(archive, chunk, IMAGE_ID)
        self.losses = losses

    def chunks(self) -> Iterator[bytes]:
        if self.exports <= self.losses:
            yield self.archive[:50_000]
            raise APIError("500 Server Error: the engine restarted")
        yield from super().chunks()


def test_an_export_cut_off_by_an_engine_restart_is_started_again(tmp_path: Path) -> None:
    engine, waits = Restarting(classic(IMAGE), 4096, losses=2), list[float]()
    exported = _export(engine, SAME, {digest(LAYERS[0]): (GZIP,)}, tmp_path, sleep=waits.append)
    assert exported.config == CONFIG and engine.exports == 3 and waits == [5, 10] and engine.closed == 3
    assert gzip.decompress(exported.layers[digest(LAYERS[0])]["gzip"].open().read()) == LAYERS[0]


def test_an_engine_that_stays_lost_is_unavailable(tmp_path: Path) -> None:
    engine = Restarting(classic(IMAGE), 4096, losses=3)
    with pytest.raises(Unavailable, match=r"exporting image sha256:\w+ from the engine failed"):
        _export(engine, SAME, {digest(LAYERS[0]): (GZIP,)}, tmp_path, sleep=lambda _: None)
    assert engine.exports == 3


class Watching(SavingEngine):
    """An engine that, before each chunk it sends, notes how much the spool holds."""

    def __init__(self, archive: bytes, chunk: int, spool: Path, image_id: str) -> None:
        super().__init__(archive, chunk, image_id)
        self.spool, self.most = spool, 0

    def chunks(self) -> Iterator[bytes]:
        for chunk in super().chunks():
            self.most = max(self.most, sum(p.stat().st_size for p in self.spool.iterdir()))
            yield chunk


ROUND = b"".join(b"usr/lib/python3/dist-packages/module_%05d.py 0644 root root\n" % (i % 3000) for i in range(150_000)) + b"\0" * SMALL
ROUND_LAYERS = [tar_of({"opt/big.bin": ROUND}), tar_of({"opt/other.bin": ROUND[::-1] + b"x" * 50_000})]


@pytest.mark.parametrize("store", ["docker-20.10", "containerd-gzip"])
def test_no_uncompressed_layer_is_written_to_disk(tmp_path: Path, store: str) -> None:
    """A layer of 9 MiB that compresses more than 5-fold goes through in 64 KiB chunks: the spool never
    holds more than the blobs it ends with (a raw copy would be 9 MiB), also where the engine stored it compressed."""
    image = Image.of(ROUND_LAYERS[:1])
    if store == "docker-20.10":
        archive, identity = classic(image), ImageIdentity(image.config_digest, image.config_digest)
    else:
        saved = containerd(image)
        archive, identity = saved.archive, ImageIdentity(image.config_digest, saved.engine_id)
    engine = Watching(archive, 1 << 16, tmp_path, identity.engine_id)
    wanted: dict[str, tuple[Compression, ...]] = {digest(ROUND_LAYERS[0]): (GZIP, ZSTD)}
    exported = _export(engine, identity, wanted, tmp_path)
    compressed = sum(b.size for b in exported.layers[digest(ROUND_LAYERS[0])].values())
    assert compressed < len(ROUND) / 5
    assert engine.most <= 1.1 * compressed + 65536, f"the spool held {engine.most} bytes for {compressed} bytes of blobs"


def test_a_layer_the_registries_have_is_read_past_and_one_of_its_size_exported_again(tmp_path: Path) -> None:
    """Engines before 25 do not name layers by digest: the cache's sizes say which to read past.
    A wanted layer that happens to have such a size costs a second export, not a wrong publish."""
    image = Image.of(ROUND_LAYERS)
    identity = ImageIdentity(image.config_digest, image.config_digest)
    have, want = digest(ROUND_LAYERS[0]), digest(ROUND_LAYERS[1])
    engine = Watching(classic(image), 1 << 20, tmp_path, identity.engine_id)
    exported = _export(engine, identity, {want: (GZIP,)}, tmp_path, known_sizes={have: len(ROUND_LAYERS[0])})
    assert list(exported.layers) == [want] and engine.exports == 1
    assert len(list(tmp_path.glob("*.blob"))) == 1, "the layer the registries have was not compressed"
    said: list[str] = []
    engine = Watching(classic(image), 1 << 20, tmp_path, identity.engine_id)
    exported = _export(engine, identity, {want: (GZIP,)}, tmp_path, known_sizes={have: len(ROUND_LAYERS[1])}, tell=said.append)
    assert list(exported.layers) == [want] and engine.exports == 2
    assert any("exporting again" in s for s in said)
    assert gzip.decompress(exported.layers[want]["gzip"].open().read()) == ROUND_LAYERS[1]


@pytest.mark.parametrize("layout", ["docker-25-overlay2", "podman"])
def test_a_layer_named_by_its_diff_id_and_not_wanted_is_not_compressed(tmp_path: Path, layout: str) -> None:
    engine, identity = _engine(layout)
    said: list[str] = []
    stored = {d: d for d in IMAGE.diff_ids}
    exported = _export(engine, identity, {digest(LAYERS[1]): (GZIP,)}, tmp_path, stored_layers=stored, tell=said.append)
    assert list(exported.layers) == [digest(LAYERS[1])] and len(list(tmp_path.glob("*.blob"))) == 1
    assert not any("compressing a layer" in s for s in said)


# ---- the image's identity: its config digest, read out of the archive -------------------------------


def _config_of(archive: bytes, engine_id: str, chunk: int = 4096) -> tuple[str, SavingEngine]:
    engine = SavingEngine(archive, chunk, engine_id)
    from buildkit.image.stream import saved

    with saved(engine, engine_id) as chunks:  # type: ignore[arg-type]
        return config_in_archive(chunks, engine_id, ("linux", "amd64", "")), engine


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_config_digest_is_found_in_every_layout(layout: str) -> None:
    archive, identity = LAYOUTS[layout]
    found, engine = _config_of(archive, identity.engine_id)
    assert found == IMAGE_ID and engine.closed == 1


def test_the_config_digest_is_read_as_soon_as_the_manifest_passes() -> None:
    """The containerd store names an image by an index; the index, its manifest and no more are
    read (the attestation beside the image is not taken for it), and the answer is closed there."""
    image = Image.of([tar_of({"big": BIG * 8})])
    saved = containerd(image)
    found, engine = _config_of(saved.archive, saved.engine_id, chunk=1024)
    assert found == image.config_digest and engine.closed == 1
    manifest = json.loads(_member(saved.archive, f"blobs/sha256/{saved.engine_id[7:]}"))["manifests"][0]["digest"]
    needed = max(saved.archive.find(f"blobs/sha256/{d[7:]}".encode()) for d in (saved.engine_id, manifest)) + 512 + SMALL
    assert engine.sent < len(saved.archive), "stopped before the end"
    assert engine.sent <= needed + 1024, "read no further than the chunk holding the image's manifest"


def _member(archive: bytes, name: str) -> bytes:
    return members_of(archive)[name]


def test_an_archive_whose_store_kept_no_content_says_why(tmp_path: Path) -> None:
    """The containerd store does not fetch the blobs of layers it already has unpacked: its `docker
    save` then names blobs it does not hold. Publish says so and what to do, not only that one lacks."""
    image = Image.of([LAYERS[1], tar_of({"etc/other": SMALL_LAYER[::-1]})])
    saved = containerd(image, attestation=False)
    stored = next(iter(saved.stored))
    members = {name: data for name, data in members_of(saved.archive).items() if name != f"blobs/sha256/{stored[7:]}"}
    engine = SavingEngine(tar_of(members, sort=True), 4096, saved.engine_id)
    identity = ImageIdentity(image.config_digest, saved.engine_id)
    with pytest.raises(PublishFailed, match=rf"lacks layer {saved.stored[stored]} .*keeps no content for it .*pull it again"):
        _export(engine, identity, {saved.stored[stored]: (GZIP,)}, tmp_path)
