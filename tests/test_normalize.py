"""Publishing normalizes what the engine cannot: two builds of the same inputs, their files written at
other moments, publish the same layers and config. Times later than the epoch are clamped and nothing
else changes; the base's layers are published as the engine has them; every engine's archive layout
gives the same result (tests/harness/saved_layouts.py)."""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from buildkit.image.archive import ImageIdentity
from buildkit.ship.layers.compressing import GZIP, ZSTD, Compression
from buildkit.ship.layers.export import Exported, export
from buildkit.ship.layers.layertar import Listing, TarClamp, clamp_tar
from buildkit.ship.layers.normalize import Normalization, normalize_config, unchanged_entries
from tests.harness.saved_layouts import Image, SavingEngine, classic, containerd, digest, overlay2_oci, podman

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
    kept = [m for m in old if ".wh." not in m[0]]
    assert [m[:1] + m[2:] for m in kept] == [m[:1] + m[2:] for m in new if ".wh." not in m[0]], "names, modes, owners, links, contents"
    assert [m for m in new if ".wh." in m[0]] == [("etc/.wh.removed", 0, 0, 0, "", b"")], "a whiteout is its name alone"
    assert {m[0]: m[1] for m in new} == {m[0]: (1_000_000_000 if m[0] == "etc/old.conf" else 0 if ".wh." in m[0] else EPOCH) for m in old}
    with tarfile.open(fileobj=io.BytesIO(after)) as tar:
        for member in tar:
            for key in ("mtime", "atime", "ctime"):
                if key in member.pax_headers and member.name != "etc/old.conf":
                    assert member.pax_headers[key] == str(EPOCH), (member.name, member.pax_headers)
            if pax and ".wh." not in member.name:
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
    once = clamp_tar(untouched, EPOCH)
    assert [m for m in members(once) if ".wh." not in m[0]] == [m for m in members(untouched) if ".wh." not in m[0]]
    assert clamp_tar(once, EPOCH) == once, "a normalized layer is its own normalization"


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


@pytest.mark.parametrize("ordered", [True, False], ids=["image-order-known", "image-order-unknown"])
@pytest.mark.parametrize("layout", ["docker-20.10", "docker-25-overlay2", "containerd-gzip", "podman"])
def test_every_layout_publishes_the_clamped_layers_and_keeps_the_base(tmp_path: Path, layout: str, ordered: bool) -> None:
    published: dict[int, list[dict[str, tuple[str, str]]]] = {}
    for run, moment in enumerate((LATER, LATER + 7200)):
        image = image_at(moment)
        archive, identity = layouts(image)[layout]
        engine = SavingEngine(archive, 5000, identity.engine_id)
        spool = tmp_path / str(run)
        spool.mkdir()
        clamp = {d: EPOCH for d in image.diff_ids[1:]}
        order = image.diff_ids if ordered else []
        wanted = {d: (GZIP, ZSTD) for d in image.diff_ids}
        exported = export(engine, identity, wanted, spool, clamp=clamp, order=order)  # type: ignore[arg-type]
        base = exported.layers[image.diff_ids[0]]["gzip"]
        assert base.diff_id == image.diff_ids[0] and gzip.decompress(base.path.read_bytes()) == BASE  # type: ignore[union-attr]
        for diff_id, original in zip(image.diff_ids[1:], image.layers[1:], strict=True):
            blob = exported.layers[diff_id]["gzip"]
            assert blob.diff_id == digest(clamp_tar(original, EPOCH)) != diff_id
            assert gzip.decompress(blob.path.read_bytes()) == clamp_tar(original, EPOCH)  # type: ignore[union-attr]
        # where a member's name does not say its layer (Docker 20.10's ids, the containerd store's compressed blobs
        # seen for the first time), the base is read clamped, then read again as it is; unless the image's order
        # is known: the containerd store's manifest says which blob is which (the layers before it wait on disk),
        # and Docker 20.10's first layer is the one whose json names no parent
        exports = 2 if layout in ("docker-20.10", "containerd-gzip") and not ordered else 1
        assert engine.exports == exports
        assert sorted(p.name for p in spool.iterdir()) == sorted(
            {f"{b.digest[7:]}.blob" for w in exported.layers.values() for b in w.values()}
        )
        published[run] = [{n: (b.digest, b.diff_id) for n, b in exported.layers[d].items()} for d in image.diff_ids]
    assert published[0] == published[1], "two builds two hours apart publish the same blobs"


def test_the_containerd_store_s_layers_before_the_manifest_wait_on_disk_and_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wherever the manifest falls among the blobs (they come in the order of their digests), each layer is read
    once, as the manifest says it is (the base as it is, the others clamped), and nothing is left in the spool."""
    small = 8192  # the in-memory limit lowered: 16 KiB layers stand for large ones, seconds less
    monkeypatch.setattr("buildkit.ship.layers.archivepass.SMALL", small)
    base = go_tar([*BASE_ROWS, ("opt", D, 0o755, OLD, b""), ("opt/base.bin", F, 0o644, LATER, random.Random(1).randbytes(2 * small))])
    waited = set()
    for seed in range(40):
        rng = random.Random(seed)
        steps = [go_tar([("srv", D, 0o755, LATER, b""), ("srv/step.bin", F, 0o644, LATER, rng.randbytes(2 * small))]) for _ in range(2)]
        image = Image.of([base, *steps])
        store = containerd(image, "gzip")
        engine = SavingEngine(store.archive, 5000, store.engine_id)
        said: list[str] = []
        spool = tmp_path / str(seed)
        spool.mkdir()
        clamp = {d: EPOCH for d in image.diff_ids[1:]}
        identity = ImageIdentity(image.config_digest, store.engine_id)
        wanted = {d: (GZIP,) for d in image.diff_ids}
        exported = export(engine, identity, wanted, spool, clamp=clamp, order=image.diff_ids, tell=said.append)  # type: ignore[arg-type]
        assert engine.exports == 1
        assert exported.layers[image.diff_ids[0]]["gzip"].diff_id == image.diff_ids[0]
        for diff_id, original in zip(image.diff_ids[1:], image.layers[1:], strict=True):
            assert exported.layers[diff_id]["gzip"].diff_id == digest(clamp_tar(original, EPOCH))
        assert not [p for p in spool.iterdir() if p.name.startswith("held-")]
        manifest = json.loads(_member(store.archive, "blobs/sha256/" + store.engine_id[7:]))["manifests"][0]["digest"][7:]
        with tarfile.open(fileobj=io.BytesIO(store.archive)) as archive:
            before = [m.name for m in archive if m.name.startswith("blobs/sha256/") and m.size > small and m.name[13:] < manifest]
        held = [line for line in said if line.startswith("keeping a layer")]
        assert len(held) == len(before)
        waited.add(bool(before))
        if waited == {True, False}:
            break
    assert waited == {True, False}, "the manifest came before every layer in one image and after some in another"


def _member(archive: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        found = tar.extractfile(name)
        assert found is not None
        return found.read()


# ---- what the engines' differs write differently ----------------------------------------------------


Row = tuple[str, bytes, int, float, str | bytes]


def go_tar(entries: Sequence[Row], *, names: str = "") -> bytes:
    """A layer as Go's archive/tar writes one for an engine (PAX where needed): (name, kind, mode, mtime, link or bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mode, mtime, extra in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode, mtime
            info.uname = info.gname = names
            data = extra if isinstance(extra, bytes) else b""
            if isinstance(extra, str):
                info.linkname = extra
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


D, F, H = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.LNKTYPE
OLD = 1_600_000_000  # when the base was made
BASE_ROWS: list[Row] = [
        ("etc", D, 0o755, OLD, b""), ("etc/.pwd.lock", F, 0o600, OLD, b""), ("etc/passwd", F, 0o644, OLD, b"root\n"),
        ("tmp", D, 0o1777, OLD, b""), ("var", D, 0o755, OLD, b""), ("var/cache", D, 0o755, OLD, b""),
        ("var/cache/debconf", D, 0o755, OLD, b""), ("var/cache/debconf/config.dat-old", F, 0o644, OLD, b"x"),
        ("usr", D, 0o755, OLD, b""), ("usr/bin", D, 0o755, OLD, b""), ("usr/bin/tool", F, 0o755, OLD, b"#!/bin/sh\n"),
        ("var/lib", D, 0o755, OLD, b""), ("var/lib/dpkg", D, 0o755, OLD, b""), ("var/lib/dpkg/lock", F, 0o640, OLD, b""),
        ("var/log", D, 0o755, OLD, b""), ("var/log/btmp", F, 0o600, OLD, b""), ("var/log/dpkg.log", F, 0o644, OLD, b"installed\n"),
]  # fmt: skip
BASE_ROOT = go_tar(BASE_ROWS)
# the same base with a file that makes it larger than what an archive's reader keeps in memory
LARGE_ROOT = go_tar([*BASE_ROWS, ("opt", D, 0o755, OLD, b""), ("opt/big.bin", F, 0o644, OLD, random.Random(7).randbytes((1 << 20) + 99))])


def step(moment: float, *, overlay2: bool) -> bytes:
    """One build step (useradd, apt), as each differ writes it: moby's overlay2 differ tars the upper
    directory (the lock files and directories it copied up unchanged, whiteouts hard-linked to the
    first one, mode 0600); containerd's writes what changed, its parent directories and empty whiteouts."""
    whiteouts: list[Row]
    copied: list[Row]
    dirs: list[Row]
    changed: list[Row] = [("etc/passwd", F, 0o644, moment, b"root\nHwHiAiUser\n"), ("var/lib/dpkg/status", F, 0o644, moment, b"ok\n")]
    if overlay2:
        whiteouts = [
            ("var/cache/debconf/.wh.config.dat-old", F, 0o600, moment, b""),
            ("var/log/.wh.dpkg.log", H, 0o600, moment, "var/cache/debconf/config.dat-old"),
        ]
        # tmp: a file made and removed there moved its time, and nothing else
        copied = [
            ("etc/.pwd.lock", F, 0o600, OLD, b""),
            ("tmp", D, 0o1777, moment, b""),
            ("var/lib/dpkg/lock", F, 0o640, OLD, b""),
            ("usr", D, 0o755, OLD, b""),
            ("usr/bin", D, 0o755, OLD, b""),
            ("usr/bin/tool", F, 0o755, OLD, b"#!/bin/sh\n"),
        ]
        dirs = [("etc", D, 0o755, OLD, b""), ("var", D, 0o755, OLD, b""), ("var/cache", D, 0o755, OLD, b""),
                ("var/cache/debconf", D, 0o755, moment, b""), ("var/lib", D, 0o755, OLD, b""), ("var/lib/dpkg", D, 0o755, moment, b""),
                ("var/log", D, 0o755, moment, b"")]  # fmt: skip
    else:
        whiteouts = [("var/cache/debconf/.wh.config.dat-old", F, 0, 0, b""), ("var/log/.wh.dpkg.log", F, 0, 0, b"")]
        copied = []
        dirs = [("etc", D, 0o755, OLD, b""), ("var", D, 0o755, OLD, b""), ("var/cache", D, 0o755, OLD, b""),
                ("var/cache/debconf", D, 0o755, moment, b""), ("var/lib", D, 0o755, OLD, b""), ("var/lib/dpkg", D, 0o755, moment, b""),
                ("var/log", D, 0o755, moment, b"")]  # fmt: skip
    return go_tar(sorted(dirs + changed + whiteouts + copied, key=lambda e: e[0]))


def listing_of(data: bytes, piece: int = 0) -> Listing:
    """A layer's listing as a clamp that writes it out takes it (``piece``: fed in pieces of that size, else whole)."""
    return _listed(TarClamp(2**62, lambda _: None, listing=True), data, piece)


def _listed(lister: TarClamp, data: bytes, piece: int) -> Listing:
    for start in range(0, len(data), piece or len(data) or 1):
        lister.write(data[start : start + (piece or len(data))])
    lister.close()
    assert lister.listing is not None
    return lister.listing


@pytest.mark.parametrize("piece", [0, 1, 511, 4096, 65537])
def test_a_listing_taken_alone_is_the_listing_a_clamp_takes(piece: int) -> None:
    """A layer read for its listing alone (no output, no header rewritten) lists what the clamp lists: PAX and GNU
    headers, long names, links, whiteouts (hard-linked ones too), xattrs, contents, in any pieces."""
    layers = [step(LATER, overlay2=True), step(LATER, overlay2=False), BASE_ROOT]
    if piece > 1:  # the 1 MiB layers byte by byte would take a minute for nothing more
        layers += [layer(LATER), layer(LATER, pax=True, seed=4)]
    for data in layers:
        quiet = _listed(TarClamp(2**62, None, listing=True), data, piece)
        assert quiet == listing_of(data, piece) and quiet


def published(layers: list[bytes], keep: int = 1) -> list[bytes]:
    """The layers as publishing writes them: the base (the first ``keep``) as it is, the others normalized."""
    drops = unchanged_entries([listing_of(data) for data in layers], keep)
    out = layers[:keep]
    for data, drop in zip(layers[keep:], drops[keep:], strict=True):
        parts: list[bytes] = []
        clamp = TarClamp(EPOCH, functools.partial(_keep, parts), drop=drop)
        clamp.write(data)
        clamp.close()
        out.append(b"".join(parts))
    return out


def test_both_differs_layers_publish_as_the_same_bytes() -> None:
    moby, containerd_step = step(LATER, overlay2=True), step(LATER + 60, overlay2=False)
    assert moby != containerd_step
    drops = unchanged_entries([listing_of(BASE_ROOT), listing_of(moby)], 1)
    assert drops[1] == {"etc/.pwd.lock", "tmp", "var/lib/dpkg/lock", "usr", "usr/bin", "usr/bin/tool"}, "as the base left it"
    assert unchanged_entries([listing_of(BASE_ROOT), listing_of(containerd_step)], 1)[1] == set(), "containerd wrote only changes"
    assert published([BASE_ROOT, moby]) == published([BASE_ROOT, containerd_step])
    with tarfile.open(fileobj=io.BytesIO(published([BASE_ROOT, moby])[1])) as tar:
        whiteouts = {m.name: (m.type, m.mode, m.uid, m.mtime, m.linkname, m.size) for m in tar if ".wh." in m.name}
    assert set(whiteouts.values()) == {(F, 0, 0, 0, "", 0)} and len(whiteouts) == 2


def test_a_change_the_layers_below_do_not_have_is_kept() -> None:
    """A file or a directory differing from below in any field (mode, owner, time, kind, a file's bytes), or absent below, stays."""
    moments = [("etc/.pwd.lock", F, 0o644, OLD, b""), ("tmp", D, 0o755, OLD, b""), ("var/lib/dpkg/lock", F, 0o640, OLD + 1, b""),
               ("var/cache", F, 0o755, OLD, b""), ("srv", D, 0o755, OLD, b""), ("srv/new", F, 0o644, OLD, b""),
               ("usr/bin/tool", F, 0o755, OLD, b"#!/bin/ok\n")]  # fmt: skip
    changed = go_tar(moments)
    assert unchanged_entries([listing_of(BASE_ROOT), listing_of(changed)], 1)[1] == set()
    assert published([BASE_ROOT, changed])[1] == clamp_tar(changed, EPOCH)


def test_what_a_layer_removed_is_not_there_to_be_unchanged() -> None:
    """A whiteout or an opaque directory below takes the base's entries away: the same entry written
    again above is a change, kept; an unknown layer below stops every judgement above it."""
    gone = go_tar([("var", D, 0o755, OLD, b""), ("var/.wh.lib", F, 0, 0, b"")])
    opaque = go_tar([("var", D, 0o755, LATER, b""), ("var/log", D, 0o755, OLD, b""), ("var/log/.wh..wh..opq", F, 0, 0, b"")])
    again = go_tar([("var", D, 0o755, OLD, b""), ("var/lib", D, 0o755, OLD, b""), ("var/lib/dpkg", D, 0o755, OLD, b""),
                    ("var/lib/dpkg/lock", F, 0o640, OLD, b""), ("var/log", D, 0o755, OLD, b""),
                    ("var/log/btmp", F, 0o600, OLD, b"")])  # fmt: skip
    base, lifted, reopened, top = (listing_of(d) for d in (BASE_ROOT, gone, opaque, again))
    everything = {"var", "var/lib", "var/lib/dpkg", "var/lib/dpkg/lock", "var/log", "var/log/btmp"}
    assert unchanged_entries([base, top], 1)[1] == everything
    assert unchanged_entries([base, lifted, top], 1)[2] == {"var/log", "var/log/btmp"}, "var/lib was removed: all of it is new again"
    assert unchanged_entries([base, reopened, top], 1)[2] == {"var/lib", "var/lib/dpkg", "var/lib/dpkg/lock"}, (
        "var/log was made opaque: btmp is new again, var/log stays as its parent, and var (dated later there) differs"
    )
    assert unchanged_entries([base, None, top], 1)[2] == set()


@pytest.mark.parametrize("layout", ["docker-20.10", "docker-25-overlay2", "containerd-gzip"])
def test_the_export_reads_every_listing_first_then_leaves_out_what_is_unchanged(tmp_path: Path, layout: str) -> None:
    """Through each archive layout (layers in the order of their digests, or named by ids): a listing
    pass, then the export with each layer's entries left out, gives the bytes of the containerd-style layer."""
    moby = Image.of([BASE_ROOT, step(LATER, overlay2=True), layer(LATER, seed=3)])
    archive, identity = layouts(moby)[layout]
    engine = SavingEngine(archive, 5000, identity.engine_id)
    listed = export(engine, identity, {}, tmp_path, listing=set(moby.diff_ids))  # type: ignore[arg-type]
    assert set(listed.listings) == set(moby.diff_ids) and listed.layers == {}
    drops = dict(zip(moby.diff_ids, unchanged_entries([listed.listings[d] for d in moby.diff_ids], 1), strict=True))
    clamp = {d: EPOCH for d in moby.diff_ids[1:]}
    spool = tmp_path / "spool"
    spool.mkdir()
    exported = export(engine, identity, {d: (GZIP,) for d in moby.diff_ids}, spool, clamp=clamp, drops=drops)  # type: ignore[arg-type]
    expected = published([BASE_ROOT, step(LATER + 5, overlay2=False), layer(LATER, seed=3)])
    got = [gzip.decompress(exported.layers[d]["gzip"].path.read_bytes()) for d in moby.diff_ids]  # type: ignore[union-attr]
    assert got == expected


@pytest.mark.parametrize("in_memory", [True, False], ids=["kept-in-memory", "kept-on-disk"])
@pytest.mark.parametrize("base", [BASE_ROOT, LARGE_ROOT], ids=["small-base", "large-base"])
@pytest.mark.parametrize("cached", [False, True], ids=["no-listing-known", "base-listing-known"])
@pytest.mark.parametrize("layout", ["docker-20.10", "docker-25-overlay2", "podman"])
def test_one_export_lists_judges_and_publishes_the_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, cached: bool, base: bytes, in_memory: bool
) -> None:
    """What the listing pass and the export give, one export gives (``judge``): the layers above the base listed as they
    pass and kept (in memory, or compressed on disk) until every listing is in, then published as they need; nothing
    left on disk."""
    if not in_memory:
        monkeypatch.setattr("buildkit.ship.layers.archivepass.IN_MEMORY", 0)
    moby = Image.of([base, step(LATER, overlay2=True), layer(LATER, seed=3)])
    archive, identity = layouts(moby)[layout]
    engine = SavingEngine(archive, 5000, identity.engine_id)
    known = {moby.diff_ids[0]: listing_of(base)} if cached else {}
    listing = set(moby.diff_ids) - set(known)
    said: list[str] = []
    exported, got = _judged_in_one_export(engine, identity, moby, tmp_path, 1, known, said)
    assert got == published([base, step(LATER + 5, overlay2=False), layer(LATER, seed=3)])
    assert exported.drops[moby.diff_ids[1]] == {"etc/.pwd.lock", "tmp", "var/lib/dpkg/lock", "usr", "usr/bin", "usr/bin/tool"}
    assert listing <= set(exported.listings)  # (an archive naming layers by ids lists whatever it kept on disk)
    kept = [
        line
        for line in said
        if line.startswith("listing a layer") and line.endswith(("in memory", "on disk")[not in_memory] + " until every listing is in")
    ]
    # the base's DiffID is in its name, or (Docker 20.10's ids) its json names no parent: it alone is read as it passes
    assert len(kept) == sum(len(x) > (1 << 20) for x in moby.layers[1:])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{b['gzip'].digest[7:]}.blob" for b in exported.layers.values())


@pytest.mark.parametrize("layout", ["docker-20.10", "docker-25-overlay2"])
def test_a_base_of_two_layers_is_published_as_it_is_when_judged_in_the_export(tmp_path: Path, layout: str) -> None:
    """A base of two layers (CANN's have many): in Docker 20.10's archive only the first is known before it is read;
    the second waits with the layers above it and is still published as the engine has it, unclamped, nothing left out."""
    second = layer(LATER, seed=5)  # newer than the epoch, and large: it would be clamped and kept on disk if taken for a step
    moby = Image.of([BASE_ROOT, second, step(LATER, overlay2=True), layer(LATER, seed=3)])
    archive, identity = layouts(moby)[layout]
    engine = SavingEngine(archive, 5000, identity.engine_id)
    exported, got = _judged_in_one_export(engine, identity, moby, tmp_path, 2, {}, [])
    assert got[:2] == [BASE_ROOT, second], "the base's layers as the engine has them"
    assert got == published(list(moby.layers), keep=2)
    assert exported.drops[moby.diff_ids[2]], "the step above the base still leaves out what it copied up"


def _judged_in_one_export(
    engine: SavingEngine, identity: ImageIdentity, image: Image, spool: Path, keep: int, known: dict[str, Listing], said: list[str]
) -> tuple[Exported, list[bytes]]:
    """``image`` exported once with every layer above ``keep`` judged on the way (``known``: the listings the cache
    holds), as one export of the engine's archive: what it gave, and each layer as published, uncompressed."""
    wanted: dict[str, tuple[Compression, ...]] = {d: (GZIP,) for d in image.diff_ids}
    clamp = {d: EPOCH for d in image.diff_ids[keep:]}
    listing = set(image.diff_ids) - set(known)
    exported = export(
        engine,  # type: ignore[arg-type]
        identity,
        wanted,
        spool,
        clamp=clamp,
        order=image.diff_ids,
        judge=keep,
        listings=known,
        listing=listing,
        tell=said.append,
    )
    assert engine.exports == 1
    return exported, [gzip.decompress(exported.layers[d]["gzip"].path.read_bytes()) for d in image.diff_ids]  # type: ignore[union-attr]


def test_docker_20_10s_file_type_bits_and_owner_names_leave_the_layer() -> None:
    """Docker 20.10's archive writes a mode with its file type's bits (0o40755 for a directory) and the
    owner's names: the published mode is the permissions alone and the owner its ids, as BuildKit's
    differs write them, and the listing compares them so."""
    classic_layer = go_tar(
        [("etc", D, 0o40755, OLD, b""), ("etc/.pwd.lock", F, 0o100600, OLD, b""), ("etc/new", F, 0o100644, LATER, b"x")], names="root"
    )
    buildkit_layer = go_tar([("etc", D, 0o755, OLD, b""), ("etc/.pwd.lock", F, 0o600, OLD, b""), ("etc/new", F, 0o644, LATER, b"x")])
    assert published([BASE_ROOT, classic_layer]) == published([BASE_ROOT, buildkit_layer])
    assert unchanged_entries([listing_of(BASE_ROOT), listing_of(classic_layer)], 1)[1] == {"etc/.pwd.lock"}
