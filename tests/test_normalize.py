"""Publishing normalizes what the engine cannot: two builds of the same inputs, their files written at
other moments, publish the same layers and config. Times later than the epoch are clamped and nothing
else changes; the base's layers are published as the engine has them; every engine's archive layout
gives the same result (tests/saved_layouts.py)."""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from buildkit.image.archive import ImageIdentity
from buildkit.ship.export import export
from buildkit.ship.layers import GZIP, ZSTD
from buildkit.ship.normalize import Normalization, TarClamp, clamp_tar, normalize_config
from tests.saved_layouts import Image, SavingEngine, classic, containerd, digest, overlay2_oci, podman

EPOCH = 1735689600
LATER = EPOCH + 86400 * 700  # a build's moment


def layer(moment: float, *, pax: bool = False, seed: int = 0) -> bytes:
    """A layer as an engine writes it, every file and directory dated ``moment``: a file over 1 MiB,
    small ones, a long name, a directory, a symlink, a hard link, a whiteout, one file older than the epoch."""
    rng = random.Random(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT if pax else tarfile.GNU_FORMAT) as tar:

        def add(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, **extra: object) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mtime, info.mode, info.uid, info.gid = kind, moment, 0o644, 1000, 1000
            for key, value in extra.items():
                setattr(info, key, value)
            if pax:
                when = float(info.mtime)
                info.pax_headers = {"mtime": f"{when:.9f}", "atime": f"{when + 1:.6f}", "SCHILY.xattr.user.why": "kept"}
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("usr", kind=tarfile.DIRTYPE, mode=0o755)
        add("usr/lib/big.so", rng.randbytes((1 << 20) + 4321))
        add("usr/lib/site/" + "deep/" * 30 + "module.py", b"print('hello')\n" * 50)
        add("usr/lib/link.so", kind=tarfile.SYMTYPE, linkname="big.so")
        add("usr/lib/hard.so", kind=tarfile.LNKTYPE, linkname="usr/lib/big.so")
        add("etc/.wh.removed", b"")
        add("etc/old.conf", b"from a package built long ago\n", mtime=1_000_000_000)
    return out.getvalue()


def members(data: bytes) -> list[tuple[str, int, int, int, str, bytes]]:
    found = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            body = tar.extractfile(m).read() if m.isfile() else b""  # type: ignore[union-attr]
            found.append((m.name, int(m.mtime), m.mode, m.uid, m.linkname, body))
    return found


@pytest.mark.parametrize("pax", [False, True], ids=["gnu", "pax"])
def test_times_after_the_epoch_are_clamped_and_nothing_else_moves(pax: bool) -> None:
    before = layer(LATER + 0.5, pax=pax)
    after = clamp_tar(before, EPOCH)
    old, new = members(before), members(after)
    assert [m[:1] + m[2:] for m in old] == [m[:1] + m[2:] for m in new], "names, modes, owners, links, contents: the engine's"
    assert {m[0]: m[1] for m in new} == {m[0]: (1_000_000_000 if m[0] == "etc/old.conf" else EPOCH) for m in old}
    with tarfile.open(fileobj=io.BytesIO(after)) as tar:
        for member in tar:
            for key in ("mtime", "atime", "ctime"):
                if key in member.pax_headers and member.name != "etc/old.conf":
                    assert member.pax_headers[key] == str(EPOCH), (member.name, member.pax_headers)
            if pax:
                assert member.pax_headers["SCHILY.xattr.user.why"] == "kept"
    assert clamp_tar(after, EPOCH) == after, "clamping again changes nothing"


def _keep(into: list[bytes], piece: bytes | memoryview) -> None:
    into.append(bytes(piece))


def test_any_pieces_give_the_same_tar_and_a_tar_with_nothing_later_is_its_own() -> None:
    before = layer(LATER, pax=True)
    whole = clamp_tar(before, EPOCH)
    rng = random.Random(7)
    for _ in range(10):
        parts: list[bytes] = []
        clamp = TarClamp(EPOCH, functools.partial(_keep, parts))
        pos = 0
        while pos < len(before):
            size = rng.choice([1, 511, 512, 513, 4096, 70_000])
            clamp.write(before[pos : pos + size])
            pos += size
        clamp.close()
        assert b"".join(parts) == whole
    untouched = layer(EPOCH - 5)
    assert clamp_tar(untouched, EPOCH) == untouched


def test_two_builds_moments_apart_clamp_to_the_same_bytes() -> None:
    assert clamp_tar(layer(LATER), EPOCH) == clamp_tar(layer(LATER + 3600), EPOCH)
    assert clamp_tar(layer(LATER, pax=True), EPOCH) == clamp_tar(layer(LATER + 0.25, pax=True), EPOCH)
    assert clamp_tar(layer(LATER, seed=1), EPOCH) != clamp_tar(layer(LATER, seed=2), EPOCH), "contents still count"


def test_the_config_takes_the_clamped_layers_and_times_and_drops_the_build_container() -> None:
    config = {
        "architecture": "amd64",
        "created": "2026-11-27T10:00:00.123456789Z",
        "container": "4f1e0c",
        "container_config": {"Hostname": "4f1e0c", "Cmd": ["/bin/sh", "-c", "#(nop) LABEL a=b"]},
        "config": {"Image": "sha256:" + "1" * 64, "Labels": {"io.ascendkit.stack": "teststack"}},
        "history": [
            {"created": "2020-01-02T03:04:05Z", "created_by": "debootstrap"},
            {"created": "2026-11-27T11:00:00+08:00", "created_by": "RUN x"},
            {"created": "not a time", "created_by": "RUN y", "empty_layer": True},
        ],
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64]},
    }
    norm = Normalization(EPOCH, 1)
    out = json.loads(normalize_config(json.dumps(config).encode(), ["sha256:" + "b" * 64], norm))
    assert "container" not in out and "container_config" not in out and out["config"]["Image"] == ""
    assert out["created"] == "2025-01-01T00:00:00Z" == norm.created
    assert [h["created"] for h in out["history"]] == ["2020-01-02T03:04:05Z", norm.created, norm.created]
    assert out["rootfs"]["diff_ids"] == ["sha256:" + "b" * 64] and out["config"]["Labels"] == config["config"]["Labels"]  # type: ignore[index]


BASE = layer(LATER, seed=9)  # a base whose files are newer than the epoch: published as it is all the same


def image_at(moment: float) -> Image:
    return Image.of([BASE, layer(moment, seed=1), layer(moment, pax=True, seed=2)])


def layouts(image: Image) -> dict[str, tuple[bytes, ImageIdentity]]:
    same = ImageIdentity(image.config_digest, image.config_digest)
    store = containerd(image, "gzip")
    return {
        "docker-20.10": (classic(image), same),
        "docker-25-overlay2": (overlay2_oci(image), same),
        "containerd-gzip": (store.archive, ImageIdentity(image.config_digest, store.engine_id)),
        "podman": (podman(image), same),
    }


@pytest.mark.parametrize("layout", ["docker-20.10", "docker-25-overlay2", "containerd-gzip", "podman"])
def test_every_layout_publishes_the_clamped_layers_and_keeps_the_base(tmp_path: Path, layout: str) -> None:
    published: dict[int, list[dict[str, tuple[str, str]]]] = {}
    for run, moment in enumerate((LATER, LATER + 7200)):
        image = image_at(moment)
        archive, identity = layouts(image)[layout]
        engine = SavingEngine(archive, 5000, identity.engine_id)
        spool = tmp_path / str(run)
        spool.mkdir()
        clamp = {d: EPOCH for d in image.diff_ids[1:]}
        exported = export(engine, identity, {d: (GZIP, ZSTD) for d in image.diff_ids}, spool, clamp=clamp)  # type: ignore[arg-type]
        base = exported.layers[image.diff_ids[0]]["gzip"]
        assert base.diff_id == image.diff_ids[0] and gzip.decompress(base.path.read_bytes()) == BASE  # type: ignore[union-attr]
        for diff_id, original in zip(image.diff_ids[1:], image.layers[1:], strict=True):
            blob = exported.layers[diff_id]["gzip"]
            assert blob.diff_id == digest(clamp_tar(original, EPOCH)) != diff_id
            assert gzip.decompress(blob.path.read_bytes()) == clamp_tar(original, EPOCH)  # type: ignore[union-attr]
        # where a member's name does not say its layer (Docker 20.10's ids, the containerd store's compressed blobs
        # seen for the first time), the base is read clamped, then read again as it is
        assert engine.exports == (2 if layout in ("docker-20.10", "containerd-gzip") else 1)
        published[run] = [{n: (b.digest, b.diff_id) for n, b in exported.layers[d].items()} for d in image.diff_ids]
    assert published[0] == published[1], "two builds two hours apart publish the same blobs"
