"""Shipping benchmarks on the real registries and containerd (`make services`). Prints tables, writes
JSON (default benchmarks/results/ship.json); asserts nothing.

* compression levels on the test image's biggest layer (the stand-in base): ascendkit's gzip
  (zlib-ng -2 in blocks: the same bytes on every machine), zstd -3 (skopeo's default), -9
  (ascendkit's), -19 (not with --quick: minutes), beside ISA-L -3 (ascendkit's gzip before: bytes
  that depend on the instruction set) and zlib -6 (what docker push writes): bytes and seconds, each
  beside ascendkit's gzip;
* gzip against zstd on the whole test image (a small image with --quick), published side by side (`publish
  --compression zstd`): the bytes of each, and the time containerd's `ctr` (Debian's containerd,
  what a Kubernetes node runs) takes to pull and unpack each from the local registry, alternating,
  the image and its content removed before every pull; the ratios;
* one publish through each mode of the fault proxy (tests/harness/faultproxy.py: 503, 429 with
  Retry-After, a write in four cut off, slow answers, all at once) beside a clean one, each into a
  repository of its own on the second registry: wall time, retries, faults injected. The test image
  without --quick (its layers compressed and sent whole each time), a small image with it;
* signing: the same publish unsigned, with --sign-key, and with --sign-key through every fault at
  once; then `verify`'s signature and provenance checks of each, timed.

Needs DOCKER_HOST, ASCENDKIT_STANDIN_IMAGE, ASCENDKIT_REGISTRY2 and ASCENDKIT_CONTAINERD.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import IO, Any

import docker
from isal import igzip_threaded

from buildkit.image.build import run_build
from buildkit.image.buildplan import plan_build
from buildkit.image.engine import connect
from buildkit.imageref import RegistryRef
from buildkit.matrix.load import load_matrix
from buildkit.ship.layers.compressing import GZIP, ZSTD, Compression
from buildkit.ship.layers.compressors import StoredLayer, compress_threads
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.publish import push_image
from buildkit.ship.trust.checks import verify_image
from buildkit.trust.keys import decrypt_private_key, generate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.harness.faultproxy import MODES, fault_proxy  # noqa: E402
from tests.harness.smallimage import build_small_image  # noqa: E402

TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"
FAULT_MODES = ("clean", "503", "429", "drop", "slow", "mixed")


def test_image(client: docker.APIClient, manifests: Path, standin: str) -> LocalImage:
    """The test stack's image, built (a no-op when the docker tests or bench_build built it) and verified."""
    loaded = load_matrix(TEST_MATRIX)
    plan = plan_build(loaded, "a3", arch="x86_64", base_image=standin, repository="bench/verl", manifest_dir=manifests)
    result = run_build(client, plan)
    engine_id = "" if result.engine_id == result.image_id else result.engine_id
    return LocalImage(result.image_id, "x86_64", ("x86_64",), plan.tags, result.manifest_json, engine_id)


def biggest_layer(client: docker.APIClient, image_id: str, dest: Path, limit: int | None) -> int:
    """The largest layer of the image, uncompressed (the containerd store may hold it compressed), into
    ``dest`` (its first ``limit`` bytes); its size."""
    best: tuple[int, str] = (0, "")
    chunks = client.get_image(image_id, chunk_size=1 << 20)
    with tempfile.TemporaryFile() as archive:
        for chunk in chunks:
            archive.write(chunk)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.size > best[0]:
                    best = (member.size, member.name)
            source = tar.extractfile(best[1])
            assert source is not None
            layer = StoredLayer(source)
            with dest.open("wb") as out:
                remaining = limit or (1 << 62)
                while remaining > 0 and (piece := layer.read()):
                    out.write(piece[:remaining])
                    remaining -= len(piece)
    return dest.stat().st_size


def levels(layer: Path, quick: bool) -> list[dict[str, Any]]:
    """Each compression of the layer, on every core, beside ISA-L -3 (the gzip of before, whose bytes
    depend on the instruction set: buildkit/ship/layers/codecs.py) and zlib -6 (what `docker push` writes)."""
    rows = []
    configs = [GZIP, Compression("zstd", 3), Compression("zstd", 9), *([] if quick else [Compression("zstd", 19)])]
    for compression in configs:
        out = io.BytesIO()
        started = time.perf_counter()
        with layer.open("rb") as source:
            compression.compress(source, out)
        rows.append({"compression": compression.key, "bytes": len(out.getvalue()), "seconds": time.perf_counter() - started})
    for name, write in (("isal-3 (before)", _isal), ("zlib-6 (docker push)", _zlib)):
        out = io.BytesIO()
        started = time.perf_counter()
        with layer.open("rb") as source:
            write(source, out)
        rows.append({"compression": name, "bytes": len(out.getvalue()), "seconds": time.perf_counter() - started})
    return rows


def _isal(source: IO[bytes], out: io.BytesIO) -> None:
    with igzip_threaded.open(out, "wb", compresslevel=3, threads=compress_threads(), block_size=1 << 20) as writer:  # type: ignore[no-untyped-call]
        while chunk := source.read(1 << 20):
            writer.write(chunk)


def _zlib(source: IO[bytes], out: io.BytesIO) -> None:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    while chunk := source.read(1 << 20):
        out.write(compressor.compress(chunk))
    out.write(compressor.flush())


def manifest_bytes(registry: str, ref: str) -> int:
    raw = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{registry}/{ref}"], capture_output=True, check=True
    )
    body = json.loads(raw.stdout)
    return int(body["config"]["size"]) + sum(int(layer["size"]) for layer in body["layers"])


def ctr_pull_seconds(containerd: str, ref: str) -> float:
    """One cold pull and unpack: nothing of the image left in containerd before it starts."""
    ctr = ["ctr", "--address", containerd, "--namespace", "ascendkit-bench"]
    subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, check=False)
    left = subprocess.run([*ctr, "content", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    if left:
        subprocess.run([*ctr, "content", "rm", *left], capture_output=True, check=False)
    started = time.perf_counter()
    subprocess.run([*ctr, "images", "pull", "--plain-http", ref], capture_output=True, check=True)
    seconds = time.perf_counter() - started
    subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, check=False)
    return seconds


def gzip_vs_zstd(client: docker.APIClient, image: LocalImage, registry: str, containerd: str, runs: int) -> dict[str, Any]:
    repository = f"bench-zstd-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    push_image(client, image, [Target.of(RegistryRef(registry, repository))], ShipOptions(compressions=(GZIP, ZSTD)))
    publish_s = time.perf_counter() - started
    tag = image.tag_names[0]
    refs = {"gzip": f"{registry}/{repository}:{tag}", "zstd": f"{registry}/{repository}:{tag}-zstd"}
    sizes = {kind: manifest_bytes(registry, ref.split("/", 1)[1]) for kind, ref in refs.items()}
    times: dict[str, list[float]] = {"gzip": [], "zstd": []}
    for run in range(runs):
        for kind in ("gzip", "zstd") if run % 2 == 0 else ("zstd", "gzip"):  # alternating: neither always goes first
            times[kind].append(ctr_pull_seconds(containerd, refs[kind]))
    medians = {kind: statistics.median(samples) for kind, samples in times.items()}
    return {
        "publish_seconds": publish_s,
        "bytes": sizes,
        "pull_seconds": medians,
        "pull_samples": times,
        "bytes_ratio": sizes["zstd"] / sizes["gzip"],
        "pull_ratio": medians["zstd"] / medians["gzip"],
    }


def fault_modes(client: docker.APIClient, image: LocalImage, registry: str) -> list[dict[str, Any]]:
    """One publish through each mode, one blob at a time: the proxy's cadence is then the same in every run."""
    os.environ["ASCENDKIT_UPLOAD_PARALLEL"] = "1"
    rows = []
    for mode in FAULT_MODES:
        repository = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
        with fault_proxy(registry, MODES[mode]) as proxy:
            target = Target.of(RegistryRef(proxy.host, repository))
            started = time.perf_counter()
            outcome = push_image(client, image, [target], ShipOptions())
            seconds = time.perf_counter() - started
        injected = {k: v for k, v in proxy.counts.items() if k != "requests"}
        rows.append(
            {
                "mode": mode,
                "seconds": seconds,
                "requests": proxy.counts["requests"],
                "retried": target.registry.retried,
                "injected": injected,
                "digest": outcome.pushed[0].digest,
            }
        )
    return rows


def signing(client: docker.APIClient, image: LocalImage, registry: str) -> list[dict[str, Any]]:
    """The same publish unsigned and with --sign-key (clean, and through every fault at once), then `verify`'s signature checks."""
    signer = decrypt_private_key(generate(b"bench")[0], b"bench", "bench.key")
    rows = []
    for label, mode, key in (("unsigned", "clean", None), ("signed", "clean", signer), ("signed, mixed faults", "mixed", signer)):
        repository = f"bench-sign-{uuid.uuid4().hex[:8]}"
        with fault_proxy(registry, MODES[mode]) as proxy:
            target = Target.of(RegistryRef(proxy.host, repository))
            started = time.perf_counter()
            outcome = push_image(client, image, [target], ShipOptions(signer=key))
            seconds = time.perf_counter() - started
            digest = outcome.pushed[0].digest
            started = time.perf_counter()  # through the proxy: the signature names the repository as it was pushed to
            _, checks = verify_image(f"{proxy.host}/{repository}@{digest}", signer.public, lambda _: None)
            verify_seconds = time.perf_counter() - started
        signed = [not c.failed for c in checks if c.name.startswith(("signature", "provenance"))]
        rows.append({"label": label, "seconds": seconds, "requests": proxy.counts["requests"], "verify_seconds": verify_seconds,
                     "verified": all(signed) and bool(signed), "digest": digest})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ship.json")
    parser.add_argument("--runs", type=int, default=3, help="cold pulls of each variant (median)")
    parser.add_argument(
        "--quick", action="store_true", help="CI's check that this still runs: a 16 MB sample; a small image published and pulled"
    )
    args = parser.parse_args()
    env = {name: os.environ.get(name, "") for name in ("ASCENDKIT_STANDIN_IMAGE", "ASCENDKIT_REGISTRY2", "ASCENDKIT_CONTAINERD")}
    if not all(env.values()):
        raise SystemExit("bench_ship: run `make services` and source its env file first")
    client = connect()
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory(prefix="bench-ship-") as tmp:
        os.environ["ASCENDKIT_CACHE"] = str(Path(tmp) / "cache")  # every layer compressed by this run, none remembered
        image = test_image(client, Path(tmp) / "manifests", env["ASCENDKIT_STANDIN_IMAGE"])
        size = biggest_layer(client, image.identity.engine_id, Path(tmp) / "layer.tar", 16 << 20 if args.quick else None)
        level_rows = levels(Path(tmp) / "layer.tar", args.quick)
        small = build_small_image(client, Path(tmp) / "small") if args.quick else None
        # --quick: the small image's pulls prove the rows run; the test image's (0.7 GB compressed twice, pulled twice)
        # were two core-minutes of CI's time for figures only the full run keeps
        side_by_side = gzip_vs_zstd(client, small or image, env["ASCENDKIT_REGISTRY2"], env["ASCENDKIT_CONTAINERD"], runs)
        faults = fault_modes(client, small or image, env["ASCENDKIT_REGISTRY2"])
        signed = signing(client, small or image, env["ASCENDKIT_REGISTRY2"])
        if small is not None:
            client.remove_image(small.identity.engine_id, force=True)

    gzip_row = level_rows[0]
    print(f"compression of the test image's biggest layer ({size / 1e6:.0f} MB{', a sample' if args.quick else ''}):")
    for row in level_rows:
        print(
            f"  {row['compression']:<8} {row['bytes'] / 1e6:8.1f} MB  {row['bytes'] / gzip_row['bytes']:5.2f}x bytes"
            f"  {row['seconds']:7.1f} s  {row['seconds'] / gzip_row['seconds']:5.2f}x time"
        )
    b, t = side_by_side["bytes"], side_by_side["pull_seconds"]
    which = "a small image" if args.quick else "the test image"
    print(f"{which}, gzip and zstd side by side (published both in {side_by_side['publish_seconds']:.0f} s); ctr pull + unpack:")
    print(f"  gzip  {b['gzip'] / 1e6:8.1f} MB  {t['gzip']:6.2f} s (median of {runs})")
    print(f"  zstd  {b['zstd'] / 1e6:8.1f} MB  {t['zstd']:6.2f} s (median of {runs})")
    print(f"  zstd/gzip: {side_by_side['bytes_ratio']:.2f}x the bytes, {side_by_side['pull_ratio']:.2f}x the pull time")
    clean = faults[0]["seconds"]
    print(f"one publish ({'a small image' if args.quick else 'the test image'}) through the fault proxy:")
    for row in faults:
        injected = ", ".join(f"{k} {v}" for k, v in sorted(row["injected"].items())) or "-"
        print(
            f"  {row['mode']:<6} {row['seconds']:7.1f} s  {row['seconds'] / clean:5.2f}x clean  "
            f"{row['requests']:4d} requests, {row['retried']:3d} retried; injected: {injected}"
        )
    digests = {row["digest"] for row in faults}
    print(f"  every mode published the same digest: {'yes' if len(digests) == 1 else 'NO: ' + ', '.join(sorted(digests))}")
    print("signing: the same publish without and with --sign-key, then `verify` (signature and provenance checks):")
    for row in signed:
        verdict = "signatures and provenance verified" if row["verified"] else "no valid signature"
        if not row["verified"] and row["label"] != "unsigned":
            verdict += " (WRONG: it was signed)"
        print(
            f"  {row['label']:<21} {row['seconds']:6.2f} s  {row['seconds'] / signed[0]['seconds']:5.2f}x unsigned  "
            f"{row['requests']:4d} requests; verify {row['verify_seconds']:5.2f} s: {verdict}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = {"levels": level_rows, "gzip_vs_zstd": side_by_side, "faults": faults, "signing": signed, "quick": args.quick}
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
