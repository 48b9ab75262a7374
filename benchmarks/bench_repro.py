"""Reproducible images, what they save a fleet: the test stack built clean, then built clean again with
nothing changed, each published, on the real engine and registry (`make services`). Prints a table and
writes JSON (default benchmarks/results/repro.json); exits 1 when the normalization costs more than
COST_BOUND of a clean build and publish (docs/architecture.md says it costs at most that; --quick, whose builds
come from the cache, measures no cost and judges none).

* the bytes a node holding the first image must pull for the second: published normalized (what
  ascendkit publishes: the goal is 0) beside the same two builds published as the engine has them
  (what it published before, and what `docker push` publishes: every layer above the base);
* what the normalization costs: each build's publish timed normalized and as the engine has it (the
  clamp of every tar header and the config, the listing and judging of each layer, against the same
  export, compression and upload), each from an empty cache, each build published each way
  --repeats times in turns that put each way first as often, the mean taken; and the builds' own
  wall time;
* what `build --push` of the same inputs costs once a registry holds the image: found by its inputs
  tag and tagged, nothing built (`buildkit/ship/reuse.py`), beside the clean build it replaces.

Needs DOCKER_HOST, ASCENDKIT_STANDIN_IMAGE and ASCENDKIT_REGISTRY2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

from buildkit.image.build import run_build
from buildkit.image.buildplan import plan_build
from buildkit.image.buildrecord import read_record
from buildkit.image.engine import connect
from buildkit.imageref import RegistryRef
from buildkit.matrix.load import load_matrix
from buildkit.ship.layers.compressing import GZIP
from buildkit.ship.layers.local import LocalImage, normalization_of
from buildkit.ship.oci.registry import Registry
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.publish import push_image
from buildkit.ship.request import PushRequest, reuse_built

ROOT = Path(__file__).resolve().parent.parent
COST_BOUND = 0.05  # of a clean build and publish: what normalizing may cost (issue 65)
TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"


def build_clean(workdir: Path, standin: str, clean: bool = True) -> tuple[LocalImage, float]:
    client = connect()
    if clean:
        client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)  # nothing cached (the stubs know two filters)
    loaded = load_matrix(TEST_MATRIX)
    plan = plan_build(loaded, "a3", arch="x86_64", base_image=standin, repository="bench/repro", manifest_dir=workdir, no_cache=clean)
    started = time.perf_counter()
    result = run_build(client, plan)
    seconds = time.perf_counter() - started
    engine_id = "" if result.engine_id in ("", result.image_id) else result.engine_id
    image = LocalImage(result.image_id, "x86_64", ("x86_64",), plan.tags, result.manifest_json, engine_id)
    return dataclasses.replace(image, normalization=normalization_of(read_record(result.manifest_json))), seconds


def reused(standin: str, registry: str, repository: str) -> float:
    """`build --push` of the test stack's unchanged inputs to ``repository``, which holds its image: the time."""
    client = connect()
    loaded = load_matrix(TEST_MATRIX)
    plan = plan_build(loaded, "a3", arch="x86_64", base_image=standin, repository="bench/repro")
    started = time.perf_counter()
    outcome = reuse_built(client, loaded, plan, PushRequest((RegistryRef(registry, repository),), ShipOptions(), index=False))
    seconds = time.perf_counter() - started
    assert outcome is not None and outcome.reused, "the registry holds the image these inputs publish"
    return seconds


def publish(image: LocalImage, registry: str, repository: str, shared: Path | None = None) -> tuple[dict[str, int], float]:
    """``image`` pushed to a repository of its own (nothing there to mount): its layers (digest -> size) and the time.
    Every layer compressed by this publish, unless ``shared`` names a cache of compressed layers to use and keep."""
    before = os.environ.get("ASCENDKIT_CACHE")
    with tempfile.TemporaryDirectory(prefix="bench-repro-cache-") as own:
        os.environ["ASCENDKIT_CACHE"] = str(shared or own)
        if shared is None:  # timed for the figures (--quick's are not):
            os.sync()  # what the builds and the publish before wrote goes to disk now, not into this publish's time
        started = time.perf_counter()
        outcome = push_image(connect(), image, [Target.of(RegistryRef(registry, repository))], ShipOptions(compressions=(GZIP,)))
        seconds = time.perf_counter() - started
    os.environ.pop("ASCENDKIT_CACHE")
    if before is not None:
        os.environ["ASCENDKIT_CACHE"] = before
    manifest = Registry(registry).get_manifest(repository, outcome.pushed[0].digest)
    assert manifest is not None
    return {str(layer["digest"]): int(layer["size"]) for layer in manifest.json()["layers"]}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "repro.json")
    parser.add_argument("--quick", action="store_true", help="both builds from the cache (seconds): the code path, not the figures")
    parser.add_argument("--repeats", type=int, default=4, help="publishes of each build each way, timed and averaged (default 4)")
    args = parser.parse_args()
    args.repeats = 1 if args.quick else max(1, args.repeats)
    standin, registry = os.environ["ASCENDKIT_STANDIN_IMAGE"], os.environ["ASCENDKIT_REGISTRY2"]
    run = uuid.uuid4().hex[:8]
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        builds = []
        for which in ("first", "second"):
            workdir = Path(tmp) / which
            workdir.mkdir()
            builds.append(build_clean(workdir, standin, clean=not args.quick))
        hows = ("normalized", "as the engine has it")
        published: dict[str, list[dict[str, int]]] = {how: [] for how in hows}
        timed: dict[str, list[list[float]]] = {how: [[], []] for how in hows}
        for index, ((image, _), which) in enumerate(zip(builds, ("first", "second"), strict=True)):
            # each build published each way REPEATS times, in turns that put each way first as often (what the engine
            # does once for an image it has just built falls on both alike; the mean of the repeats tames the noise)
            turns = (hows + hows[::-1]) * (args.repeats // 2) + hows[: args.repeats % 2 * 2]
            for turn, how in enumerate(turns if index == 0 else turns[::-1]):
                # --quick: the two builds are one image (the cache's), whose second publish would compress
                # every layer again to the same bytes: it takes the first's compressed layers instead
                shared = Path(tmp) / f"cache-{how[0]}" if args.quick else None
                chosen = image if how == "normalized" else dataclasses.replace(image, normalization=None)
                repository = f"bench/repro-{run}-{'n' if how == 'normalized' else 'e'}-{which}-{turn}"
                found, took = publish(chosen, registry, repository, shared)
                if not timed[how][index]:
                    published[how].append(found)
                timed[how][index].append(took)
        for how in hows:
            layers = published[how]
            seconds = [sum(times) / len(times) for times in timed[how]]
            pulled = {digest: size for digest, size in layers[1].items() if digest not in layers[0]}
            rows[how] = {
                "pull_bytes": sum(pulled.values()),
                "pull_layers": len(pulled),
                "layers": len(layers[1]),
                "image_bytes": sum(layers[1].values()),
                "publish_seconds": seconds,
            }
        reuse_seconds = reused(standin, registry, f"bench/repro-{run}-n-first-0")
    first, second = builds[0][1], builds[1][1]
    quick = "--quick: the code path, each second publish from the first's compressed layers; the figures need clean builds"
    how_built = f"from the cache ({quick})" if args.quick else "clean"
    print(f"the test stack built twice {how_built}, nothing changed ({first:.0f} s and {second:.0f} s); the second as a node sees it:")
    print(f"  {'published':<22} {'layers to pull':>15} {'bytes to pull':>15} {'of the image':>13} {'publish s (mean)':>18}")
    for how, row in rows.items():
        share = row["pull_bytes"] / row["image_bytes"] if row["image_bytes"] else 0.0
        timing = " / ".join(f"{s:.1f}" for s in row["publish_seconds"])
        pulls = f"{row['pull_layers']} of {row['layers']}"
        print(f"  {how:<22} {pulls:>15} {row['pull_bytes'] / 1e6:>12.1f} MB {share:>12.0%} {timing:>18}")
    normalized = sum(rows["normalized"]["publish_seconds"])
    plain = sum(rows["as the engine has it"]["publish_seconds"])
    cost = (normalized - plain) / (plain + first + second)
    print(f"normalization's cost: publishes {normalized:.1f} s against {plain:.1f} s; {cost:+.1%} of a clean build and publish")
    print(f"build --push of the same inputs, the registry holding the image: {reuse_seconds:.2f} s, nothing built ({first:.0f} s to build)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"builds_seconds": [first, second], "published": rows, "cost_share": cost, "reuse_seconds": reuse_seconds}, indent=2)
        + "\n"
    )
    if not args.quick:
        within = cost <= COST_BOUND
        print(f"{'within' if within else 'OVER'} the bound: normalizing may cost at most {COST_BOUND:.0%} of a clean build and publish")
        if not within:
            sys.exit(1)


if __name__ == "__main__":
    main()
