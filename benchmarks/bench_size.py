"""Shipping at the size users have: a synthetic image with a layer of several GB, made by this script
(not committed), loaded into the engine of `make services`, then shipped side by side in one run:

* ``publish --compression zstd`` (gzip and zstd, what ``push_image`` does for ``ascendkit publish``)
  against ``skopeo copy`` from the same engine compressing gzip, and again compressing zstd (the
  tool a user would pick instead; its two pushes together are the yardstick for our one);
* ``ascendkit mirror`` against ``skopeo copy --all``, registry to registry;
* a mirror through the fault proxy cutting the connection once (tests/harness/faultproxy.py ``cut`` and
  ``cut-through``): the bytes that left against the image's.

Each row: wall time, CPU (user + system of the process and its children), peak RSS (GNU time) and
peak temporary disk (``$TMPDIR`` of the run, and skopeo's ``--tmpdir``: it keeps the engine's
whole ``docker save`` there before it reads it; sampled every 0.2 s). The layers are real files of
this machine (Python's library, shared libraries) in a new order: they compress as a layer of
binaries does. ``--quick`` (CI): the same rows on a 48 MB image. Prints a table and the goals of
issue 50; writes JSON (default benchmarks/results/size.json). Needs DOCKER_HOST, ASCENDKIT_REGISTRY
and ASCENDKIT_REGISTRY2 (`make services`), skopeo and /usr/bin/time. The image leaves the engine at
the end; the registries keep what was pushed (about 8 GB a full run, distribution frees nothing
without its garbage collector): `make services-stop` and removing its registry data directories
frees it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.harness.faultproxy import Faults, fault_proxy  # noqa: E402

# Debian 13's skopeo (1.18) where `make services` unpacked it: Debian 12's 1.9 asks the engine for API
# 1.22, which Docker 25 and later refuse ("client version 1.22 is too old"), so it cannot read the
# containerd store's images at all; 1.18 negotiates. Its temporary files go where they are measured.
SKOPEO = (os.environ.get("ASCENDKIT_SKOPEO_SIGSTORE") or "skopeo", "--tmpdir", "{tmp}", "copy")
MB = 1_000_000
MIB = 1 << 20
FULL = (3_000 * MB, 1_500 * MB, 8 * MB)  # the sizes measured in issue 50
QUICK = (32 * MB, 16 * MB, 1 * MB)


# ---- the synthetic image ------------------------------------------------------------------------


def corpus(limit: int) -> bytes:
    """Up to ``limit`` bytes of real files: Python's library and site-packages, then shared libraries."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"]), Path("/usr/lib/x86_64-linux-gnu")]
    parts: list[bytes] = []
    total = 0
    for root in roots:
        for path in sorted(root.rglob("*")):
            if total >= limit:
                return b"".join(parts)
            if path.is_file() and not path.is_symlink():
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                parts.append(data)
                total += len(data)
    return b"".join(parts)


def write_layer(path: Path, size: int, text: bytes, seed: int, salt: str) -> str:
    """A layer tar of about ``size`` bytes: files of 1-4 MiB cut from ``text`` at places ``seed``
    picks, and one naming ``salt`` (the run: no layer of an earlier run can be reused); its diff_id."""
    sha = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, out: io.BufferedWriter) -> None:
            self.out = out

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            sha.update(data)
            return self.out.write(data)

    with path.open("wb") as out, tarfile.open(fileobj=Hashing(out), mode="w|", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"opt/synthetic/{seed}/run")
        info.size = len(salt)
        tar.addfile(info, io.BytesIO(salt.encode()))
        written, index = 0, 0
        while written < size:
            length = min(size - written, MIB + (index * 7919 * 4096 + seed * 104729) % (3 * MIB))
            start = (index * 2_654_435_761 + seed * 40_503) % max(1, len(text) - length)
            info = tarfile.TarInfo(f"opt/synthetic/{seed}/{index:06d}.bin")
            info.size, info.mtime, info.mode = length, 0, 0o644
            tar.addfile(info, io.BytesIO(text[start : start + length]))
            written += length + 512
            index += 1
    return "sha256:" + sha.hexdigest()


def load_image(client: docker.APIClient, layers: list[tuple[Path, str]], tag: str) -> str:
    """The layers loaded as one image (``docker load`` of an archive streamed as it is made); its id."""
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["/bin/true"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id in layers]},
            "history": [{"created_by": f"synthetic layer {i}"} for i in range(len(layers))],
        },
        sort_keys=True,
    ).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{image_id[7:]}.json", "RepoTags": [tag], "Layers": [f"l{i}/layer.tar" for i in range(len(layers))]}]
    read_end, write_end = os.pipe()

    def produce() -> None:
        with os.fdopen(write_end, "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|") as tar:
            for i, (path, _) in enumerate(layers):
                tar.add(path, arcname=f"l{i}/layer.tar")
            for name, data in ((f"{image_id[7:]}.json", config), ("manifest.json", json.dumps(manifest).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    producer = threading.Thread(target=produce)
    producer.start()
    with os.fdopen(read_end, "rb") as pipe:
        for _ in client.load_image(pipe):
            pass
    producer.join()
    return image_id


# ---- measuring ----------------------------------------------------------------------------------


def disk_used(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file renamed or removed while counted
                total += (Path(root) / name).lstat().st_blocks * 512
    return total


def measure(label: str, argv: list[str], tmp: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``argv`` under GNU time with ``$TMPDIR`` (and ``{tmp}`` in ``argv``) a fresh directory whose peak size is sampled."""
    run_tmp = tmp / f"run-{uuid.uuid4().hex[:8]}"
    run_tmp.mkdir()
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], disk_used(run_tmp))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stats = tmp / "time.txt"
    started = time.monotonic()
    proc = subprocess.run(
        ["/usr/bin/time", "-o", str(stats), "-f", "%U %S %M", *(a.replace("{tmp}", str(run_tmp)) for a in argv)],
        env={**os.environ, **(env or {}), "TMPDIR": str(run_tmp)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench_size: {label} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    user, system, rss_kb = stats.read_text().split()[-3:]
    shutil.rmtree(run_tmp, ignore_errors=True)
    return {
        "label": label,
        "seconds": wall,
        "cpu_seconds": float(user) + float(system),
        "rss_mb": int(rss_kb) / 1024,
        "tmp_mb": peak[0] / MB,
    }


def child_publish(local: str, destination: str, compression: str) -> None:
    """What `ascendkit publish` does for one verified image (``local``: its name on the engine), in
    this process (measured from outside)."""
    from buildkit.image.archive import identify
    from buildkit.image.engine import connect
    from buildkit.imageref import RegistryRef
    from buildkit.ship.layers.compressing import PUBLISHED
    from buildkit.ship.layers.local import LocalImage
    from buildkit.ship.options import ShipOptions, Target
    from buildkit.ship.publish import push_image

    ref = RegistryRef.parse(destination, "bench")
    client = connect()
    identity = identify(client, local)  # the containerd store names it by a manifest digest, not its config's
    image = LocalImage(identity.config, "x86_64", ("x86_64",), ("bench",), None, identity.engine_id)
    options = ShipOptions(compressions=PUBLISHED[compression])
    outcome = push_image(client, image, [Target.of(ref)], options)
    print(json.dumps({"pushed": [p.describe() for p in outcome.registries[ref.name]]}))


def blob_bytes(registry: str, repository: str, tag: str) -> int:
    from buildkit.ship.oci.registry import Registry

    manifest = Registry(registry).get_manifest(repository, tag)
    assert manifest is not None, f"{registry}/{repository}:{tag} was not published"
    body = manifest.json()
    return int(body["config"]["size"]) + sum(int(layer["size"]) for layer in body["layers"])


def resumed(source: str, destination: str, size: int, through: bool) -> dict[str, Any]:
    """A mirror through a connection cut once, 60 % of the way: the bytes that left against the image's."""
    from buildkit.ship.mirror import mirror

    registry, _, rest = destination.partition("/")
    with fault_proxy(registry, Faults(cut_after=int(size * 0.6), cut_through=through)) as proxy:
        started = time.monotonic()
        mirror(source, f"{proxy.host}/{rest}")
        seconds = time.monotonic() - started
    return {
        "mode": "cut-through" if through else "cut",
        "bytes": size,
        "sent": proxy.received,
        "cuts": proxy.counts["cut"],
        "seconds": seconds,
    }


# ---- the run ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "size.json")
    parser.add_argument("--quick", action="store_true", help="CI's check that this still runs: the same rows on a 48 MB image")
    parser.add_argument("--child-publish", nargs=3, metavar=("IMAGE", "DEST", "COMPRESSION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_publish:
        return child_publish(*args.child_publish)
    registry, registry2 = os.environ.get("ASCENDKIT_REGISTRY", ""), os.environ.get("ASCENDKIT_REGISTRY2", "")
    if not (os.environ.get("DOCKER_HOST") and registry and registry2):
        raise SystemExit("bench_size: run `make services` and source its env file first")
    sizes = QUICK if args.quick else FULL
    client = docker.APIClient(base_url=os.environ["DOCKER_HOST"], timeout=3600)
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bench-size-") as tmp_name:
        tmp = Path(tmp_name)
        started = time.monotonic()
        text = corpus(min(256 * MB, 2 * max(sizes)))
        layers = [(tmp / f"layer{i}.tar", write_layer(tmp / f"layer{i}.tar", size, text, i + 1, run)) for i, size in enumerate(sizes)]
        raw = sum(path.stat().st_size for path, _ in layers)
        local = f"bench/size:{run}"
        load_image(client, layers, local)
        for path, _ in layers:
            path.unlink()
        print(
            f"synthetic image: {len(layers)} layers, {raw / MB:,.0f} MB uncompressed, made and loaded in {time.monotonic() - started:.0f} s"
        )
        try:
            rows, extra = compare(local, registry, registry2, run, tmp)
        finally:
            client.remove_image(local, force=True)
    report(rows, extra, raw, args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"quick": args.quick, "raw_bytes": raw, "rows": rows, **extra}, indent=2) + "\n")


def compare(local: str, registry: str, registry2: str, run: str, tmp: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    daemon = ["--src-daemon-host", os.environ["DOCKER_HOST"]]
    insecure = ["--dest-tls-verify=false"]
    cache = {"ASCENDKIT_CACHE": str(tmp / "cache")}  # cold: every layer compressed by this run
    ours = f"{registry2}/bench-size-ours-{run}"
    rows = [
        measure(
            "ascendkit publish --compression zstd (gzip + zstd)",
            [sys.executable, __file__, "--child-publish", local, ours, "zstd"],
            tmp,
            cache,
        ),
        measure(
            "skopeo copy, compressing gzip",
            [
                *SKOPEO,
                *daemon,
                *insecure,
                "--dest-compress-format",
                "gzip",
                f"docker-daemon:{local}",
                f"docker://{registry2}/bench-size-skopeo-gzip-{run}:t",
            ],
            tmp,
        ),
        # into the other registry: skopeo 1.9 would mount its gzip blobs, which its blob-info cache
        # knows for these layers, and call that a zstd push (its size and CPU said so)
        measure(
            "skopeo copy, compressing zstd",
            [
                *SKOPEO,
                *daemon,
                *insecure,
                "--dest-compress-format",
                "zstd",
                f"docker-daemon:{local}",
                f"docker://{registry}/bench-size-skopeo-zstd-{run}:t",
            ],
            tmp,
        ),
    ]
    sizes = {
        "ascendkit gzip": blob_bytes(registry2, f"bench-size-ours-{run}", "bench"),
        "ascendkit zstd": blob_bytes(registry2, f"bench-size-ours-{run}", "bench-zstd"),
        "skopeo gzip": blob_bytes(registry2, f"bench-size-skopeo-gzip-{run}", "t"),
        "skopeo zstd": blob_bytes(registry, f"bench-size-skopeo-zstd-{run}", "t"),
    }
    blobs = sizes["ascendkit gzip"] + sizes["ascendkit zstd"]
    ascendkit = str(Path(sys.executable).with_name("ascendkit"))
    source = f"{registry2}/bench-size-ours-{run}:bench-zstd"
    rows += [
        measure("ascendkit mirror", [ascendkit, "mirror", source, f"{registry}/bench-size-mirror-{run}"], tmp),
        measure(
            "skopeo copy --all",
            [
                *SKOPEO,
                "--all",
                "--src-tls-verify=false",
                *insecure,
                f"docker://{source}",
                f"docker://{registry}/bench-size-skopeo-all-{run}:t",
            ],
            tmp,
        ),
    ]
    zstd_bytes = blob_bytes(registry2, f"bench-size-ours-{run}", "bench-zstd")
    cuts = [
        resumed(source, f"{registry}/bench-size-cut-{mode}-{run}", zstd_bytes, through) for mode, through in (("a", False), ("b", True))
    ]
    return rows, {"compressed_bytes": blobs, "image_bytes": sizes, "resumed": cuts}


def report(rows: list[dict[str, Any]], extra: dict[str, Any], raw: int, quick: bool) -> None:
    print(f"{'':54} {'wall s':>7} {'MB/s in':>8} {'CPU s':>7} {'RSS MB':>7} {'tmp MB':>8}")
    for row in rows:
        print(
            f"  {row['label']:<52} {row['seconds']:7.1f} {raw / MB / row['seconds']:8.1f} {row['cpu_seconds']:7.1f} "
            f"{row['rss_mb']:7.0f} {row['tmp_mb']:8.0f}"
        )
    publish, gzip_push, zstd_push, mirror, skopeo_all = rows
    blobs = extra["compressed_bytes"]
    skopeo_both = gzip_push["seconds"] + zstd_push["seconds"]
    print("the images' blobs: " + ", ".join(f"{name} {size / MB:,.0f} MB" for name, size in extra["image_bytes"].items()))
    print("goals (issue 50)" + (": for the full size; at 48 MB start-up dominates, --quick only proves the rows run" if quick else ":"))
    print(f"  publish (both formats) / skopeo's two compressing pushes: {publish['seconds'] / skopeo_both:.2f}x wall (goal <= 1.0)")
    print(f"  mirror / skopeo copy --all: {mirror['seconds'] / skopeo_all['seconds']:.2f}x wall (goal <= 1.0)")
    print(f"  peak RSS: publish {publish['rss_mb']:.0f} MB, mirror {mirror['rss_mb']:.0f} MB (goal < 256)")
    print(f"  temporary disk / compressed blobs: {publish['tmp_mb'] * MB / blobs:.2f}x of {blobs / MB:,.0f} MB (goal <= 1.1)")
    for cut in extra["resumed"]:
        how = "the registry never saw the cut chunk" if cut["mode"] == "cut" else "the cut chunk's head reached distribution"
        print(
            f"  mirror through one cut ({cut['mode']}: {how}): sent {cut['sent'] / MB:,.0f} MB for {cut['bytes'] / MB:,.0f} MB"
            f" of blobs, {cut['sent'] / cut['bytes']:.2f}x, {cut['seconds']:.1f} s"
        )


if __name__ == "__main__":
    main()
