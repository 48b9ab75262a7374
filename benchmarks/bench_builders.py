"""BuildKit with a registry cache against the classic builder, on an engine with nothing cached:
what a fresh CI runner costs, side by side in one run. Prints a table and writes JSON (default
benchmarks/results/builders.json); asserts nothing.

Each measured build starts from an emptied engine: every image but the stand-in bases removed and
BuildKit's cache pruned (as on a runner that starts empty; the registry keeps what it keeps).

1. the previous release, built by BuildKit, exports its registry cache (mode=max) - not timed
   against anything, it is what the last CI run left behind;
2. **BuildKit, unchanged**: the previous release again, importing the registry cache: nothing runs;
3. **classic, cold**: the framework bumped (verl's pin), the classic builder, `--no-cache`: what
   a fresh runner does without BuildKit;
4. **BuildKit, framework bumped**, importing the registry cache: only the framework's step runs.
   (It exports its own cache over the previous release's: one tag per stack, chip, OS and arch.)

Goals (issue 59): 4 at most 0.25x of 3, 2 at most 0.1x.

The stack: the test stack with its torch_npu layer made heavy (xgboost 2.0.0, whose x86_64 wheel
is 297 MB with CUDA kernels inside, and scipy: about 0.6 GB installed, what a real stack's torch
and vllm layers are many times over); --quick keeps the test stack's small stand-ins (CI's check
that this runs, which leaves out the classic build: the ratios need it, and it costs more than the
other three together; the docker jobs' tests build with the classic builder). The registry and
this machine's PyPI mirror are near: across a network importing
the cache is slower, and downloading every wheel again slower still.

Needs DOCKER_HOST on an engine with Docker's containerd image store, ASCENDKIT_STANDIN_IMAGE and
ASCENDKIT_REGISTRY (`make services`); it empties that engine's images.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import docker

from buildkit.image.build import run_build
from buildkit.image.buildplan import BuildResult, plan_build
from buildkit.image.buildx import find_buildx
from buildkit.image.engine import CONTAINERD_STORE, connect, engine_facts
from buildkit.lock.inputs import lock_targets
from buildkit.lock.relock import index_urls_for, lock_all
from buildkit.matrix.load import load_matrix
from buildkit.settings import Mirrors, default_ca_bundle

ROOT = Path(__file__).resolve().parent.parent
TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"
STANDIN_PREFIX = "ascendkit-standin/"
# The torch_npu layer made heavy: xgboost 2.0.0's x86_64 wheel (297 MB, CUDA kernels inside) and scipy.
# Real torch cannot stand in: PyPI's x86_64 torch brings the CUDA triton, which the lock refuses
# beside triton-ascend (and the matrix's rules hold torch, torch_npu and torchvision to each other).
LIGHT_LAYER = "    torch_npu:\n      version: 2.0.0\n      package: markdown-it-py\n"
HEAVY_LAYER = "    torch_npu:\n      version: 2.0.0\n      package: xgboost\n"
FRAMEWORK_PIN = 'version: "3.7"'  # verl's stand-in (idna): the framework bump moves it to 3.6


def matrix_for(directory: Path, *, heavy: bool, bumped: bool) -> Path:
    """The test matrix (one layer made heavy, the framework bumped, as asked) with its locks current."""
    directory.mkdir(parents=True, exist_ok=True)
    text = TEST_MATRIX.read_text()
    assert LIGHT_LAYER in text and FRAMEWORK_PIN in text, "tests/fixtures/test_matrix.yaml changed: update this benchmark"
    if heavy:
        text = text.replace(LIGHT_LAYER, HEAVY_LAYER, 1)
    if bumped:
        text = text.replace(FRAMEWORK_PIN, 'version: "3.6"')
    matrix = directory / "test_matrix.yaml"
    matrix.write_text(text)
    shutil.copytree(TEST_MATRIX.parent / "locks", directory / "locks", dirs_exist_ok=True)
    if heavy or bumped:
        loaded = load_matrix(matrix)
        targets = [t for t in lock_targets(loaded) if t.stack_id == "teststack"]
        outcomes = lock_all(loaded, targets, index_urls=index_urls_for(loaded, Mirrors()), ca_bundle=default_ca_bundle())
        if any(o.status != "resolved" for o in outcomes):
            raise SystemExit(f"locking the benchmark's matrix failed: {[o.detail for o in outcomes]}")
    return matrix


def empty_engine(client: docker.APIClient, buildx: tuple[str, ...]) -> None:
    """Every image but the stand-in bases removed, BuildKit's cache pruned: a runner that starts empty.
    Passes until none is left: on the containerd store, removing an image of the classic builder
    shows its parent (the step before) as an image of its own."""
    for _ in range(200):
        images = [i for i in client.images(all=True) if not any(t.startswith(STANDIN_PREFIX) for t in i.get("RepoTags") or [])]
        if not images:
            break
        for image in images:
            for ref in image.get("RepoTags") or [image["Id"]]:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    client.remove_image(ref, force=True)
    else:
        raise SystemExit("could not empty the engine: images are left after 200 passes")
    subprocess.run([*buildx, "prune", "--all", "--force"], check=True, capture_output=True, timeout=600)


def build(matrix: Path, work: Path, standin: str, **options: Any) -> BuildResult:
    """One build with a manifest directory of its own: a fresh runner has no record of an earlier
    verification to reuse, so every build here verifies its image."""
    manifests = Path(tempfile.mkdtemp(prefix="manifests-", dir=work))
    plan = plan_build(
        load_matrix(matrix), "a3", arch="x86_64", base_image=standin, repository="bench-builders/verl", manifest_dir=manifests, **options
    )
    return run_build(connect(), plan)


def row(result: BuildResult) -> dict[str, Any]:
    return {
        "seconds": round(result.duration_s, 1),
        "builder": result.builder,
        "steps": result.steps_total,
        "cached": result.steps_cached,
        "notes": list(result.notes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "builders.json")
    parser.add_argument("--quick", action="store_true", help="the test stack's small stand-ins (CI's check that this runs)")
    args = parser.parse_args()
    standin, registry = os.environ.get("ASCENDKIT_STANDIN_IMAGE"), os.environ.get("ASCENDKIT_REGISTRY")
    if not (standin and registry):
        raise SystemExit("ASCENDKIT_STANDIN_IMAGE and ASCENDKIT_REGISTRY are not set: run `make services` and source its env file")
    client = connect()
    engine = engine_facts(client)
    if engine.image_store != CONTAINERD_STORE:
        raise SystemExit(f"this engine keeps images in its {engine.image_store} store: the registry cache needs the containerd store")
    found = find_buildx()
    if isinstance(found, str):
        raise SystemExit(f"no buildx: {found}")
    buildx = found[0]
    cache = f"{registry}/bench-builders-{uuid.uuid4().hex[:8]}/buildcache"
    stack = "test stack" + ("" if args.quick else ", torch_npu layer: xgboost 2.0.0 + scipy")
    results: dict[str, Any] = {"engine": str(engine), "buildx": found[1], "stack": stack}
    with tempfile.TemporaryDirectory() as work:
        before = matrix_for(Path(work) / "before", heavy=not args.quick, bumped=False)
        after = matrix_for(Path(work) / "after", heavy=not args.quick, bumped=True)
        manifests = Path(work)
        empty_engine(client, buildx)
        results["previous_release_export"] = row(build(before, manifests, standin, builder="buildkit", cache_repo=cache, no_cache=True))
        empty_engine(client, buildx)
        results["buildkit_cache_unchanged"] = row(build(before, manifests, standin, builder="buildkit", cache_repo=cache))
        if not args.quick:  # the most expensive row by far: on the containerd store each classic step is a commit
            empty_engine(client, buildx)
            classic = build(after, manifests, standin, builder="classic", no_cache=True)
            results["classic_cold_bumped"] = row(classic)
        empty_engine(client, buildx)
        bumped = build(after, manifests, standin, builder="buildkit", cache_repo=cache)
        results["buildkit_cache_bumped"] = row(bumped)
        results["image_bytes"] = client.inspect_image(bumped.engine_id or bumped.image_id)["Size"]
        empty_engine(client, buildx)
    if "classic_cold_bumped" in results:
        cold = results["classic_cold_bumped"]["seconds"]
        for key in ("buildkit_cache_bumped", "buildkit_cache_unchanged"):
            results[key]["vs_classic_cold"] = round(results[key]["seconds"] / cold, 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    size = results["image_bytes"] / 1e9
    print(f"engine: {results['engine']}; buildx {results['buildx']}; {results['stack']}; image {size:.2f} GB")
    print(f"{'build (engine emptied before each)':<52} {'seconds':>8} {'steps cached':>13} {'x classic cold':>15} goal")
    lines = [
        ("previous release, BuildKit, exports the cache", "previous_release_export", ""),
        ("unchanged, BuildKit + registry cache", "buildkit_cache_unchanged", "<= 0.10"),
        ("framework bumped, classic builder, cold", "classic_cold_bumped", ""),
        ("framework bumped, BuildKit + registry cache", "buildkit_cache_bumped", "<= 0.25"),
    ]
    for label, key, goal in lines:
        if key not in results:
            print(f"{label:<52} {'-':>8}  skipped with --quick (a cold classic build; the docker jobs build with the classic builder)")
            continue
        r = results[key]
        ratio = f"{r['vs_classic_cold']:.3f}" if "vs_classic_cold" in r else "1.000" if key == "classic_cold_bumped" else "-"
        print(f"{label:<52} {r['seconds']:>8.1f} {r['cached']:>6}/{r['steps']:<6} {ratio:>15} {goal}")
        for note in r["notes"]:
            print(f"    note: {note}", file=sys.stderr)


if __name__ == "__main__":
    main()
