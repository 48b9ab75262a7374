"""Build benchmarks on the real engine, with the test stack on the stand-in base.

Prints a table and writes JSON (default benchmarks/results/build.json); asserts nothing.

* cold build (--no-cache), no-op rebuild, rebuild after bumping only the most volatile pin (verl):
  wall time, which steps re-ran, bytes of layers reused;
* ascendkit's overhead over a raw ``docker buildx build --load`` of the same Dockerfile and context
  (both fully cached, so the difference is planning, the base-image check, verification and tagging);
* image size, and wasted bytes: files shadowed or deleted by later layers, plus leftover caches;
* a --no-cache build with BuildKit's secret mounts beside one with the secrets served (what ascendkit
  does on BuildKit v0.13 to v0.15: buildkit/image/buildx.py): wall time and the machine's CPU;
* pip against uv for the same locked install: every lock section of a stack installed by the
  image's own ``ascendkit_install`` (hashes enforced, no build isolation, bytecode compiled),
  offline from a wheelhouse, in a fresh container of the stand-in base, once with each installer.
  The test stack on x86_64 always; without --quick and with an arm64 stand-in
  (ASCENDKIT_STANDIN_IMAGE_ARM64), also the default stack's real aarch64 layers under emulation
  (its two CANN source builds left out, as in the arm64 layers test; about 15 minutes).

Needs DOCKER_HOST and ASCENDKIT_STANDIN_IMAGE (`make services`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import posixpath  # paths inside layer tarballs, not on this machine
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

from buildkit.arch import Arch
from buildkit.image.build import run_build
from buildkit.image.buildplan import BuildPlan, plan_build
from buildkit.image.buildx import SECRETS_ENV, choose_builder, find_buildx
from buildkit.image.context import write_context
from buildkit.image.engine import connect, engine_facts
from buildkit.lock.inputs import LockTarget, lock_targets
from buildkit.lock.relock import index_urls_for, lock_all
from buildkit.lock.wheelhouse import make_wheelhouse
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import INSTALLERS
from buildkit.settings import Mirrors, default_ca_bundle

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the locked-install runner the arm64 layers test uses
from tests.harness.locked_install import install_script, run_install, write_sections  # noqa: E402
from tests.harness.upstream import CACHE_ROOT  # noqa: E402

TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"
MATRIX = ROOT / "compat_matrix.yaml"
CACHE_DIRS = ("root/.cache/", "var/cache/apt/", "var/lib/apt/lists/", "tmp/", "var/tmp/")


def plan(matrix: Path, manifest_dir: Path, standin: str) -> BuildPlan:
    return plan_build(load_matrix(matrix), "a3", arch="x86_64", base_image=standin, repository="bench/verl", manifest_dir=manifest_dir)


def bumped_matrix(directory: Path) -> Path:
    """The test matrix with verl's stand-in bumped, and its locks re-resolved (PyPI) as a user would."""
    matrix = directory / "test_matrix.yaml"
    matrix.write_text(TEST_MATRIX.read_text().replace('version: "3.7"', 'version: "3.6"'))
    shutil.copytree(TEST_MATRIX.parent / "locks", directory / "locks")
    loaded = load_matrix(matrix)
    outcomes = lock_all(loaded, lock_targets(loaded), index_urls=index_urls_for(loaded, Mirrors()), ca_bundle=default_ca_bundle())
    if any(o.status != "resolved" for o in outcomes):
        raise SystemExit(f"re-locking the bumped test matrix failed: {[o.detail for o in outcomes]}")
    return matrix


def layer_ids(client: docker.APIClient, image: str) -> list[str]:
    """The image's layers by DiffID: the same on every engine and with either builder (BuildKit's
    history names no intermediate images)."""
    return list(client.inspect_image(image)["RootFS"]["Layers"])


def raw_build_seconds(client: docker.APIClient, p: BuildPlan, runs: int) -> float:
    """A user's own ``buildx build --load`` of the very context ``run_build`` sends (its build args too, and,
    where the engine's BuildKit is served its secrets, the render without secret mounts on the host's network)."""
    found = find_buildx()
    if isinstance(found, str):
        raise SystemExit(f"no buildx to compare with: {found}")
    served = choose_builder(p.builder, engine_facts(client)).serves_secrets
    samples = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as ctx:
            write_context(p, Path(ctx), served=served)
            argv = [*found[0], "build", "--load", "--progress=quiet", "--provenance=false", "--sbom=false", ctx]
            argv += ["--network", "host"] if served else []
            argv += [f"--build-arg={name}={value}" for name, value in p.buildargs]
            start = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            samples.append(time.perf_counter() - start)
            if proc.returncode != 0:
                raise SystemExit(f"raw buildx build failed: {proc.stderr[-2000:]}")
    return statistics.median(samples)


def busy_core_seconds() -> float:
    """The machine's CPU time so far (every process, the engine's too), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (sum(fields) - fields[3]) / os.sysconf("SC_CLK_TCK")  # all but idle


def secrets_channels(client: docker.APIClient, base: BuildPlan) -> dict[str, dict[str, float]]:
    """One --no-cache build with each way of giving BuildKit the secrets (the CA bundle): the committed
    render's secret mounts, and the render without them with the secrets served (what ascendkit picks on
    BuildKit v0.13 to v0.15, which hash every step's root filesystem for a secret mount): wall time and
    the machine's CPU, the engine's included. Run on the engine being measured, nothing else busy."""
    out = {}
    for channel in ("mounts", "served"):
        os.environ[SECRETS_ENV] = channel
        try:
            cpu, start = busy_core_seconds(), time.perf_counter()
            built = run_build(client, BuildPlan(**{**base.__dict__, "no_cache": True}))
            out[channel] = {"seconds": round(time.perf_counter() - start, 1), "cpu_core_s": round(busy_core_seconds() - cpu, 1)}
            if built.steps_cached:
                raise SystemExit(f"the --no-cache build with the secrets {channel} took {built.steps_cached} step(s) from the cache")
        finally:
            del os.environ[SECRETS_ENV]
    return out


def installers(
    client: docker.APIClient, loaded: LoadedMatrix, stack_id: str, arch: Arch, base: str, drop: frozenset[str]
) -> dict[str, Any]:
    """Seconds each installer takes for the same locked install (see the module docstring)."""
    wheelhouse = CACHE_ROOT / "wheelhouse" / f"{stack_id}-{arch}"
    urls = index_urls_for(loaded, Mirrors())
    report = make_wheelhouse(loaded, LockTarget(stack_id, arch), wheelhouse, urls, ca_bundle=default_ca_bundle())
    result: dict[str, Any] = {"stack": stack_id, "arch": arch, "wheelhouse_bytes": report.total_bytes}
    with tempfile.TemporaryDirectory() as sections:
        written = write_sections(loaded, stack_id, arch, Path(sections), drop)
        result["packages"] = sum(1 for path in written for line in path.read_text().splitlines() if "==" in line and line[0].isalnum())
        for installer in INSTALLERS:
            done = run_install(client, base, install_script(loaded, stack_id, arch, installer), Path(sections), wheelhouse)
            client.remove_container(done.container, force=True)
            if done.exit_code != 0:
                raise SystemExit(f"the {installer} install of {stack_id}/{arch} failed:\n{done.log[-3000:]}")
            result[f"{installer}_s"] = done.seconds
    result["speedup"] = round(result["pip_s"] / result["uv_s"], 2)
    return result


def waste(client: docker.APIClient, image: str, base_layers: int) -> dict[str, int]:
    """Bytes in layers that the final filesystem does not show, and cache files it still holds.

    Waste is split by where the hidden bytes were written: the base image's layers (not ours to
    fix) or the layers ascendkit's Dockerfile added.
    """
    blob = b"".join(client.get_image(image))
    seen: dict[str, tuple[int, int]] = {}  # path -> (layer index, size) of the newest copy so far
    hidden = {"base": 0, "ascendkit": 0}
    shadowed = deleted = 0

    def owner(layer: int) -> str:
        return "base" if layer < base_layers else "ascendkit"

    with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for index, layer_name in enumerate(manifest[0]["Layers"]):
            with tarfile.open(fileobj=outer.extractfile(layer_name)) as layer:
                for entry in layer.getmembers():
                    path = entry.name.removeprefix("./")
                    base = posixpath.basename(path)
                    if base.startswith(".wh."):
                        target = posixpath.join(posixpath.dirname(path), base.removeprefix(".wh."))
                        for old in [p for p in seen if p == target or p.startswith(target + "/")]:
                            where, size = seen.pop(old)
                            deleted += size
                            hidden[owner(where)] += size
                        continue
                    if entry.isfile():
                        if path in seen:
                            where, size = seen[path]
                            shadowed += size
                            hidden[owner(where)] += size
                        seen[path] = (index, entry.size)
    leftover = sum(size for path, (_, size) in seen.items() if path.startswith(CACHE_DIRS))
    return {
        "files_bytes": sum(size for _, size in seen.values()),
        "shadowed_bytes": shadowed,
        "deleted_bytes": deleted,
        "wasted_in_base_layers": hidden["base"],
        "wasted_in_ascendkit_layers": hidden["ascendkit"],
        "leftover_cache_bytes": leftover,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "build.json")
    parser.add_argument("--runs", type=int, default=3, help="runs of each cached measurement (median)")
    parser.add_argument(
        "--quick", action="store_true", help="CI's check that this still runs: one run each, no --no-cache build, no re-lock and bump"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    standin = os.environ.get("ASCENDKIT_STANDIN_IMAGE")
    if not standin:
        raise SystemExit("ASCENDKIT_STANDIN_IMAGE is not set: run `make services` and source its env file")
    client = connect()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as manifests, tempfile.TemporaryDirectory() as bump_dir:
        base = plan(TEST_MATRIX, Path(manifests), standin)
        cold = run_build(client, BuildPlan(**{**base.__dict__, "no_cache": not args.quick}))
        results["cold"] = {"seconds": round(cold.duration_s, 2), "steps": cold.steps_total, "cached": cold.steps_cached}
        verified = run_build(client, BuildPlan(**{**base.__dict__, "reverify": True}))  # cached, verified again (the old no-op)
        results["noop_reverify"] = {"seconds": round(verified.duration_s, 2)}
        noop = [run_build(client, base) for _ in range(args.runs)]
        ascendkit_noop = statistics.median(r.duration_s for r in noop)
        results["noop"] = {
            "seconds": round(ascendkit_noop, 2),
            "steps": noop[0].steps_total,
            "cached": noop[0].steps_cached,
            "verification": noop[0].verification,
        }
        if not args.quick:
            before = layer_ids(client, cold.engine_id or cold.image_id)
            bumped = plan(bumped_matrix(Path(bump_dir)), Path(manifests), standin)
            bump = run_build(client, bumped)
            after = layer_ids(client, bump.engine_id or bump.image_id)
            results["bump_verl"] = {
                "seconds": round(bump.duration_s, 2),
                "steps_rerun": bump.steps_total - bump.steps_cached,
                "steps": bump.steps_total,
                "layers_reused": sum(1 for layer in after if layer in before),
                "layers_new": sum(1 for layer in after if layer not in before),
            }
            results["secrets"] = secrets_channels(client, base)
        raw = raw_build_seconds(client, base, args.runs)
        results["overhead"] = {
            "ascendkit_noop_s": round(ascendkit_noop, 2),
            "raw_buildx_noop_s": round(raw, 2),
            "overhead_s": round(ascendkit_noop - raw, 2),
        }
        results["installers"] = [installers(client, load_matrix(TEST_MATRIX), "teststack", "x86_64", standin, frozenset())]
        standin_arm64 = os.environ.get("ASCENDKIT_STANDIN_IMAGE_ARM64")
        if standin_arm64 and not args.quick:
            loaded = load_matrix(MATRIX)
            default = next(name for name, stack in loaded.matrix.stacks.items() if stack.default)
            results["installers"].append(installers(client, loaded, default, "aarch64", standin_arm64, frozenset({"vllm", "vllm-ascend"})))
        info = client.inspect_image(cold.engine_id or cold.image_id)
        base_layers = len(client.inspect_image(standin)["RootFS"]["Layers"])
        results["image"] = {"size_bytes": info["Size"], **waste(client, cold.engine_id or cold.image_id, base_layers)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    mb = 1024 * 1024
    bumped_result = results.get("bump_verl")
    rows = [
        (
            "build, the engine's cache as found" if args.quick else "cold build (--no-cache)",
            f"{results['cold']['seconds']:.1f}s",
            f"{results['cold']['cached']}/{results['cold']['steps']} cached",
        ),
        ("no-op rebuild, --reverify", f"{results['noop_reverify']['seconds']:.2f}s", "cached; verified again"),
        (
            "no-op rebuild",
            f"{results['noop']['seconds']:.2f}s",
            f"{results['noop']['cached']}/{results['noop']['steps']} cached; verification {results['noop']['verification']}",
        ),
        (
            "bump verl only",
            f"{bumped_result['seconds']:.1f}s" if bumped_result else "-",
            f"{bumped_result['steps_rerun']} step(s) re-ran, {bumped_result['layers_reused']} layers reused, "
            f"{bumped_result['layers_new']} new"
            if bumped_result
            else "skipped with --quick (it re-locks against PyPI and builds again)",
        ),
        (
            "--no-cache build, secret mounts",
            f"{results['secrets']['mounts']['seconds']:.1f}s" if "secrets" in results else "-",
            f"{results['secrets']['mounts']['cpu_core_s']:.0f} core-s of CPU, the engine's included"
            if "secrets" in results
            else "skipped with --quick (two --no-cache builds)",
        ),
        (
            "--no-cache build, secrets served",
            f"{results['secrets']['served']['seconds']:.1f}s" if "secrets" in results else "-",
            f"{results['secrets']['served']['cpu_core_s']:.0f} core-s: what BuildKit v0.13-v0.15 get (moby/buildkit#5251)"
            if "secrets" in results
            else "",
        ),
        (
            "raw buildx build --load, no-op",
            f"{raw:.2f}s",
            f"ascendkit overhead {results['overhead']['overhead_s']:.2f}s (plan, base-image check, tag; verification reused)",
        ),
        ("image size", f"{results['image']['size_bytes'] / mb:.0f} MiB", ""),
        (
            "wasted bytes",
            f"{(results['image']['shadowed_bytes'] + results['image']['deleted_bytes']) / 1024:.0f} KiB",
            f"shadowed {results['image']['shadowed_bytes'] / 1024:.0f} KiB, deleted {results['image']['deleted_bytes'] / 1024:.0f} KiB; "
            f"written by ascendkit's layers {results['image']['wasted_in_ascendkit_layers'] / 1024:.0f} KiB, "
            f"by the base {results['image']['wasted_in_base_layers'] / 1024:.0f} KiB; "
            f"leftover caches {results['image']['leftover_cache_bytes'] / 1024:.0f} KiB",
        ),
    ]
    for run in results["installers"]:
        rows.append(
            (
                f"install {run['stack']} {run['arch']}",
                f"{run['uv_s']:.1f}s",
                f"uv; pip {run['pip_s']:.1f}s ({run['speedup']}x): {run['packages']} locked packages from a wheelhouse",
            )
        )
    for name, value, note in rows:
        print(f"{name:<28} {value:>10}  {note}")
    print(f"(JSON: {args.out})")


if __name__ == "__main__":
    main()
