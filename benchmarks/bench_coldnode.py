"""Cold node to first import: how long a node with an empty content store takes from the pull of an
image to the first ``import`` of its framework, on this machine's containerd (Debian 13's 1.7.24, the
one `make services` unpacks), side by side in one run:

* gzip against zstd layers (the same image built once, pushed twice with BuildKit's forced compression);
* ``max_concurrent_downloads`` 3 (containerd's default) against 8;
* the registry on loopback, and behind a link that gives each connection 25 MB/s (a registry across a
  WAN or a busy mirror: what makes concurrent downloads matter);
* the pull taken apart: fetching the blobs (``ctr content fetch``) and unpacking them (``ctr images
  pull`` of content already there), and the first import after it (``ctr run ... python3 -c 'import
  torch'``, less the same container running ``true``).

The image is the stand-in CANN base (`make services`) with torch 2.5.1 and its CUDA libraries from
PyPI installed in three layers: 6.1 GB unpacked, 3.3 GB as gzip, 2.7 GB as zstd, and an import that
loads torch's and the CUDA libraries' shared objects, as ``import torch`` + ``torch_npu`` loads CANN's
on an Ascend image (the CUDA libraries stand in for CANN's, which cannot be had here). ``--quick``:
the base alone and ``import json``, on loopback only (the script's own check, in CI).

Every case starts containerd afresh on an empty root (the node's cold content store and snapshots).
The page cache is not dropped between pull and import: a node that has just pulled has the files in
memory too, as far as its memory goes. ``--soci``: lazily too, through Debian 13's soci-snapshotter
0.4.1: the gzip image indexed by ``soci create`` (a zTOC per layer of 10 MB or more) and pushed beside
it, each node's ``soci image rpull`` by the index's digest, the first import reading what it needs
through FUSE. A run where no layer was mounted lazily fails rather than passing an eager pull off as
lazy. Prints a table; writes JSON (default benchmarks/results/coldnode.json).
Needs `make services` (DOCKER_HOST, ASCENDKIT_REGISTRY, the stand-in base) and root (containerd).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.harness.containerd_node, buildkit: run as a script from anywhere

from tests.harness.buildx_push import buildx_push  # noqa: E402
from tests.harness.containerd_node import CACHE, ENGINE, containerd, soci_binaries, throttled, tls_for_loopback  # noqa: E402

WHEELS = CACHE / "torch-wheels"
TORCH = "torch==2.5.1"
PER_CONNECTION = 25_000_000  # bytes/s each connection gets on the "wan" link
MB = 1_000_000


# ---- the image ----------------------------------------------------------------------------------


def build_and_push(registry: str, base: str, quick: bool, work: Path) -> dict[str, str]:
    """The image pushed as ``REG/bench/coldnode:<run>-gzip`` and ``-zstd`` (BuildKit, forced compression); refs by variant."""
    context = work / "context"
    context.mkdir()
    if quick:
        (context / "Dockerfile").write_text(f"FROM {base}\nRUN echo cold > /opt/coldnode\n")
    else:
        if not any(WHEELS.glob("torch-*.whl")):
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-d", str(WHEELS), TORCH, "--only-binary=:all:", "--python-version", "3.11",
                 "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64"],
                check=True,
            )  # fmt: skip
        shutil.copytree(WHEELS, context / "wheels")
        # one RUN per large package group, as real images are layered (torch, then its CUDA libraries)
        (context / "Dockerfile").write_text(
            f"FROM {base}\n"
            "RUN --mount=type=bind,source=wheels,target=/w python3 -m pip install --no-cache-dir --no-index --find-links /w "
            "nvidia-cublas-cu12 nvidia-cudnn-cu12\n"
            "RUN --mount=type=bind,source=wheels,target=/w python3 -m pip install --no-cache-dir --no-index --find-links /w "
            "nvidia-cusparse-cu12 nvidia-cufft-cu12 nvidia-cusolver-cu12 nvidia-nccl-cu12\n"
            f"RUN --mount=type=bind,source=wheels,target=/w python3 -m pip install --no-cache-dir --no-index --find-links /w {TORCH}\n"
        )
    run = f"{int(time.time())}"
    refs = {}
    for variant in ("gzip", "zstd"):
        ref = f"{registry}/bench/coldnode:{run}-{variant}"
        output = f"type=image,name={ref},push=true,compression={variant},force-compression=true,oci-mediatypes=true"
        argv = [*buildx(), "build", "--progress=quiet", "--provenance=false", "--sbom=false", "--output", output, str(context)]
        proc = buildx_push(argv)
        if proc.returncode != 0:
            raise SystemExit(f"bench_coldnode: pushing {ref} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        refs[variant] = ref
    import docker  # the engine's copies go: the registry keeps what the nodes pull

    client = docker.APIClient(base_url=os.environ.get("DOCKER_HOST"))
    for ref in refs.values():
        with contextlib.suppress(docker.errors.APIError):
            client.remove_image(ref)
    return refs


def buildx() -> list[str]:
    """Docker 26's buildx as `make services` unpacked it (ASCENDKIT_BUILDX), against DOCKER_HOST's engine."""
    plugin = os.environ.get("ASCENDKIT_BUILDX")
    return [plugin] if plugin else ["docker", "buildx"]


# ---- the steps -----------------------------------------------------------------------------------


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_coldnode: {' '.join(argv[3:])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.monotonic() - started


# ---- the cases ------------------------------------------------------------------------------------


def import_line(quick: bool) -> str:
    return "import json" if quick else "import torch"


def case(work: Path, ref: str, mcd: int, quick: bool) -> dict[str, float]:
    """From an empty store: the pull (fetch and unpack together), then the first import and a bare start."""
    with containerd(work) as (ctr, root):
        pull = timed([*ctr, "images", "pull", "--plain-http", "--max-concurrent-downloads", str(mcd), ref])
        start = timed([*ctr, "run", "--rm", ref, "bare", "true"])
        first = timed([*ctr, "run", "--rm", ref, "first", "python3", "-c", import_line(quick)])
        stored = sum(p.stat().st_size for p in (root / "io.containerd.content.v1.content").rglob("*") if p.is_file())
    return {"pull_s": pull, "start_s": start, "import_s": max(0.0, first - start), "to_import_s": pull + first, "content_mb": stored / MB}


def index_lazily(registry: str, ref: str) -> str:
    """The gzip image's SOCI index as ``publish --lazy soci`` makes and pushes it (zTOCs of its layers
    of 10 MiB and more, listed under the referrers tag of this registry, which has no referrers API); its digest."""
    from buildkit.ship.lazy.soci import from_registry, image_ztocs, stage_lazy_index
    from buildkit.ship.oci.registry import Registry

    repository, _, tag = ref.removeprefix(registry + "/").partition(":")
    client = Registry(registry)
    subject = client.get_manifest(repository, tag)
    assert subject is not None, ref
    ztocs = image_ztocs(subject, from_registry(client, repository), lambda line: print(f"  {line}", file=sys.stderr))
    index, staged = stage_lazy_index(client, repository, subject, ztocs)
    if staged is not None:
        staged.write()
    return index.digest


def soci_case(work: Path, ref: str, quick: bool, ca: Path) -> dict[str, float]:
    """The lazy pull: rpull fetches the manifests, and the snapshotter finds the SOCI index as a node
    does (the referrers tag); layers come as the import reads them. Over https (``ca`` trusted):
    soci 0.4.1's snapshotter reaches no plain-http registry, not even on loopback, and would quietly
    fall back to an eager pull."""
    soci_dir = soci_binaries()
    with containerd(work, soci=soci_dir, ca=ca) as (ctr, root):
        soci = ["env", f"SSL_CERT_FILE={ca}", str(soci_dir / "soci"), "--address", ctr[2], "-n", "bench"]
        pull = timed([*soci, "image", "rpull", ref])
        start = timed([*ctr, "run", "--rm", "--snapshotter", "soci", ref, "bare", "true"])
        first = timed([*ctr, "run", "--rm", "--snapshotter", "soci", ref, "first", "python3", "-c", import_line(quick)])
        log = (root.parent / "soci.log").read_text()
    if "deferring to container runtime" in log:  # not lazy at all: said, not measured as lazy
        raise SystemExit(f"bench_coldnode: the SOCI snapshotter fell back to an eager pull: {log[-3000:]}")
    lazy = log.count('"msg":"preparing filesystem mount')  # a layer mounted from the registry through its zTOC
    local = log.count('"msg":"preparing snapshot as local snapshot"')  # a layer fetched whole (no zTOC: under 10 MB)
    if lazy <= local:  # every layer fetched whole: an eager pull by another name, not measured as lazy
        raise SystemExit(f"bench_coldnode: the SOCI snapshotter mounted no layer lazily: {log[-3000:]}")
    return {
        "pull_s": pull, "start_s": start, "import_s": max(0.0, first - start), "to_import_s": pull + first, "content_mb": 0.0,
        "lazy_layers": lazy - local, "whole_layers": local,
    }  # fmt: skip


def apart(work: Path, ref: str) -> dict[str, float]:
    """The pull taken apart: every blob fetched first, then the unpack of what is there."""
    with containerd(work) as (ctr, _):
        fetch = timed([*ctr, "content", "fetch", "--plain-http", ref])
        unpack = timed([*ctr, "images", "pull", "--plain-http", ref])
    return {"fetch_s": fetch, "unpack_s": unpack}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the base alone and `import json`: the script's own check")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "coldnode.json")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (the fastest is kept)")
    parser.add_argument("--soci", action="store_true", help="also lazily, through Debian 13's soci-snapshotter 0.4.1 (gzip layers)")
    args = parser.parse_args()
    registry = os.environ.get("ASCENDKIT_REGISTRY", "127.0.0.1:5000")
    base = os.environ.get("ASCENDKIT_STANDIN_IMAGE")
    if not base or not (ENGINE / "containerd").is_file():
        raise SystemExit("bench_coldnode: needs `make services` (ASCENDKIT_STANDIN_IMAGE, containerd 1.7 in " + str(ENGINE) + ")")
    # stopped (make test's jobs are stopped by SIGTERM to their group): unwind, so each node's containerd
    # stops and its mounts and the scratch directory go (killed outright, they stayed: 700 MB a time)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="coldnode-") as tmp:
        work = Path(tmp)
        refs = build_and_push(registry, base, args.quick, work)
        index = index_lazily(registry, refs["gzip"]) if args.soci else ""
        port = int(registry.rpartition(":")[2])
        context, ca = tls_for_loopback(work)
        rows: list[dict[str, Any]] = []
        wan = f"{PER_CONNECTION // MB} MB/s per connection"
        with (
            throttled(port, PER_CONNECTION) as slow,
            throttled(port, None, context) as tls_fast,
            throttled(port, PER_CONNECTION, context) as tls_slow,
        ):
            links = {"loopback": (registry, f"127.0.0.1:{tls_fast}"), wan: (f"127.0.0.1:{slow}", f"127.0.0.1:{tls_slow}")}
            concurrency: tuple[int, ...] = (3, 8)
            if args.quick:  # the rows prove they run; the capped link only repeats them slower
                del links[wan]
                concurrency = (3,)  # two layers (the base, a file): 3 and 8 concurrent downloads fetch them alike
            for link, (host, tls_host) in links.items():
                for variant, ref in refs.items():
                    moved = ref.replace(registry, host, 1)
                    for mcd in concurrency:
                        runs = [case(work, moved, mcd, args.quick) for _ in range(args.repeat)]
                        best = min(runs, key=lambda r: r["to_import_s"])
                        rows.append({"link": link, "variant": variant, "max_concurrent_downloads": mcd, **best})
                        print(json.dumps(rows[-1]), flush=True)
                if index:  # SOCI over https (the relay's TLS): its snapshotter reaches no plain-http registry
                    moved = refs["gzip"].replace(registry, tls_host, 1)
                    runs = [soci_case(work, moved, args.quick, ca) for _ in range(args.repeat)]
                    best = min(runs, key=lambda r: r["to_import_s"])
                    rows.append({"link": link, "variant": "soci (lazy)", "max_concurrent_downloads": 0, **best})
                    print(json.dumps(rows[-1]), flush=True)
        parts = {variant: apart(work, ref) for variant, ref in refs.items()}
    print_table(rows, parts, args.quick)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"quick": args.quick, "image": import_line(args.quick), "rows": rows, "apart": parts}, indent=2) + "\n")


def print_table(rows: list[dict[str, Any]], parts: dict[str, dict[str, float]], quick: bool) -> None:
    print(f"\ncold node to first `{import_line(quick)}` on containerd 1.7.24 (seconds; content as stored)")
    print(f"{'link':<28} {'layers':<6} {'mcd':>3} {'pull':>7} {'import':>7} {'total':>7} {'stored MB':>10}")
    for r in rows:
        print(
            f"{r['link']:<28} {r['variant']:<6} {r['max_concurrent_downloads']:>3} {r['pull_s']:>7.1f} {r['import_s']:>7.1f} "
            f"{r['to_import_s']:>7.1f} {r['content_mb']:>10.0f}"
        )
    print("\nthe pull taken apart, loopback (seconds)")
    for variant, p in parts.items():
        print(f"  {variant:<5} fetch {p['fetch_s']:6.1f}   unpack {p['unpack_s']:6.1f}")


if __name__ == "__main__":
    main()
