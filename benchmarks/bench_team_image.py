"""A team image on the real engine and registry, beside what a team does today (``pip install`` on top).

The base is the test stack's image on the stand-in CANN base (built as bench_build.py builds it, then pushed). The team
adds two packages and a directory of reward code, once through ``ascendkit team`` (locked against the base, built on
it by digest, checked) and once as a plain Dockerfile a team writes (``FROM base``, ``RUN pip install ...``,
``COPY``). For each, side by side:

* the full build, and the rebuild after a change of the team's code (one reward file edited): seconds, and which
  layers were built again;
* the team's layers as the registry holds them (compressed bytes), and the bytes a node that already holds the base
  pulls for the team image (skopeo into an OCI layout holding the base: manifest, config and the blobs it lacks),
  with their ratio (the goal for ascendkit's: at most 1.02).

and how many of the base's distributions each left moved (version, files or origin).

Prints a table and writes JSON (default benchmarks/results/team.json); asserts nothing.
Needs DOCKER_HOST, ASCENDKIT_STANDIN_IMAGE and ASCENDKIT_REGISTRY (`make services`), and PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildkit.image.build import run_build  # noqa: E402
from buildkit.image.buildplan import plan_build  # noqa: E402
from buildkit.image.engine import connect  # noqa: E402
from buildkit.matrix.load import load_matrix  # noqa: E402
from buildkit.team.inimage import distributions, moved  # noqa: E402

TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"
ASCENDKIT = Path(sys.executable).with_name("ascendkit")
PACKAGES = ["swanlab==0.6.4", "math-verify==0.8.0"]  # the logger and math checker of docs/team-images.md: 50 MB of layers
QUICK_PACKAGES = ["tabulate==0.9.0", "pyfiglet==1.0.2"]  # --quick (CI's check that it still runs): 1 MB, the same steps


def team_repository(root: Path, base: str, name: str, packages: list[str]) -> None:
    (root / "rewards").mkdir(parents=True)
    for index in range(20):
        (root / "rewards" / f"reward_{index}.py").write_text(
            f"def compute_score(solution_str, ground_truth, **kw):\n    return {index}.0\n"
        )
    lines = "".join(f"  - {p}\n" for p in packages)
    (root / "ascendkit-team.yaml").write_text(
        f"schema_version: 1\nname: {name}\nbase:\n  image: {base}\npackages:\n{lines}"
        "files:\n  - {src: rewards, dest: /opt/team/rewards}\n"
    )


def pip_on_top(root: Path, base: str, packages: list[str]) -> None:
    """What a team writes today: pip on top, nothing held. Behind a TLS-intercepting proxy (a CA bundle in the
    environment, as on these CI machines) with --trusted-host, as such teams do: the CA is not copied into a layer."""
    trusted = " --trusted-host pypi.org --trusted-host files.pythonhosted.org" if os.environ.get("SSL_CERT_FILE") else ""
    (root / "Dockerfile").write_text(
        f"FROM {base}\nUSER 0:0\nRUN python3 -m pip install --no-cache-dir{trusted} {' '.join(packages)}\n"
        "COPY rewards /opt/team/rewards\nUSER 1000:1000\n"
    )


def timed(argv: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.monotonic() - started, done


def docker_build(client: docker.APIClient, root: Path, tag: str) -> float:
    """`docker build` as a team runs it today: BuildKit (the default since Docker 23) through buildx where the
    services give one, as `ascendkit team build` takes it; else the engine's classic builder."""
    started = time.monotonic()
    buildx = os.environ.get("ASCENDKIT_BUILDX")
    if buildx:
        done = subprocess.run(
            [buildx, "build", "--load", "--provenance=false", "--sbom=false", "--network", "host", "-t", tag, str(root)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"the pip-on-top build failed:\n{done.stderr[-3000:]}")
        return time.monotonic() - started
    for event in client.build(path=str(root), tag=tag, rm=True, forcerm=True, pull=False, decode=True):
        if "error" in event:
            raise SystemExit(f"the pip-on-top build failed: {event['error']}")
    return time.monotonic() - started


def push(client: docker.APIClient, local: str, remote: str) -> dict[str, Any]:
    """Push ``local`` as ``remote``; its manifest as the registry serves it."""
    repository, tag = remote.rsplit(":", 1)
    client.tag(local, repository, tag)
    for event in client.push(repository, tag, stream=True, decode=True):
        if "error" in event:
            raise SystemExit(f"push of {remote} failed: {event['error']}")
    registry, path = repository.split("/", 1)
    import requests

    answer = requests.get(
        f"http://{registry}/v2/{path}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"},
        timeout=30,
    )
    answer.raise_for_status()
    manifest: dict[str, Any] = answer.json()
    return manifest


def skopeo() -> str:
    found = os.environ.get("ASCENDKIT_SKOPEO_SIGSTORE") or shutil.which("skopeo")
    if not found:
        raise SystemExit("no skopeo: `make services` provides one (ASCENDKIT_SKOPEO_SIGSTORE)")
    return found


def pulled_bytes(base: str, image: str, node: Path) -> int:
    """Bytes a node holding ``base`` downloads to pull ``image``: skopeo (a client nobody here wrote) copies the base
    into an OCI layout, then the image into the same layout, which reuses every blob it holds; the blobs it wrote are
    what came over the wire (compressed blobs are stored as they are sent)."""
    layout = node / "node"
    copy = [skopeo(), "copy", "--quiet", "--src-tls-verify=false"]
    subprocess.run([*copy, f"docker://{base}", f"oci:{layout}:base"], check=True, capture_output=True)
    held = {p.name: p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir()}
    subprocess.run([*copy, f"docker://{image}", f"oci:{layout}:team"], check=True, capture_output=True)
    added = {p.name: p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir() if p.name not in held}
    shutil.rmtree(layout)
    return sum(added.values())


def layers_beyond(manifest: dict[str, Any], base: dict[str, Any]) -> int:
    held = {layer["digest"] for layer in base["layers"]}
    return sum(int(layer["size"]) for layer in manifest["layers"] if layer["digest"] not in held)


def measure(
    client: docker.APIClient, registry: str, base_remote: str, base_manifest: dict[str, Any], work: Path, packages: list[str]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    env_argv = ["--matrix", str(TEST_MATRIX)]
    ours = work / "team"
    team_repository(ours, base_remote, "bench/team", packages)
    lock_s, _ = timed([str(ASCENDKIT), "team", "lock", *env_argv], ours)
    full_s, done = timed([str(ASCENDKIT), "team", "build", *env_argv, "--json"], ours)
    (ref,) = json.loads(done.stdout)["tags"]
    (ours / "rewards" / "reward_3.py").write_text("def compute_score(solution_str, ground_truth, **kw):\n    return 3.5\n")
    timed([str(ASCENDKIT), "team", "lock", *env_argv], ours)  # the team file is unchanged: the lock stays fresh
    rebuild_s, again = timed([str(ASCENDKIT), "team", "build", *env_argv, "--json"], ours)
    (ref2,) = json.loads(again.stdout)["tags"]
    before, after = client.inspect_image(ref)["RootFS"]["Layers"], client.inspect_image(ref2)["RootFS"]["Layers"]
    base_dists = distributions(client, base_remote)
    ours_moved = moved(base_dists, distributions(client, ref2), set())
    remote = f"{registry}/bench/team:{ref2.rsplit(':', 1)[1]}"
    manifest = push(client, ref2, remote)
    pulled = pulled_bytes(base_remote, remote, work)
    for image in {ref, ref2, remote}:
        client.remove_image(image, force=True)
    team_bytes = layers_beyond(manifest, base_manifest)
    results["ascendkit team"] = {
        "base_distributions_moved": ours_moved,
        "lock_s": round(lock_s, 1),
        "full_build_s": round(full_s, 1),
        "rebuild_after_code_change_s": round(rebuild_s, 1),
        "layers_rebuilt": sum(1 for layer in after if layer not in before),
        "team_layers_compressed_bytes": team_bytes,
        "pulled_by_a_node_with_the_base": pulled,
        "pull_ratio": round(pulled / team_bytes, 4) if team_bytes else None,
    }
    theirs = work / "pip"
    team_repository(theirs, base_remote, "bench/pip", packages)
    pip_on_top(theirs, base_remote, packages)
    pip_full = docker_build(client, theirs, "bench/pip:1")
    (theirs / "rewards" / "reward_3.py").write_text("def compute_score(solution_str, ground_truth, **kw):\n    return 3.5\n")
    pip_rebuild = docker_build(client, theirs, "bench/pip:2")
    p_before, p_after = client.inspect_image("bench/pip:1")["RootFS"]["Layers"], client.inspect_image("bench/pip:2")["RootFS"]["Layers"]
    pip_moved = moved(base_dists, distributions(client, "bench/pip:2"), set())
    pip_manifest = push(client, "bench/pip:2", f"{registry}/bench/pip:2")
    pip_pulled = pulled_bytes(base_remote, f"{registry}/bench/pip:2", work)
    for image in ("bench/pip:1", "bench/pip:2", f"{registry}/bench/pip:2"):
        client.remove_image(image, force=True)
    pip_bytes = layers_beyond(pip_manifest, base_manifest)
    results["pip install on top"] = {
        "base_distributions_moved": pip_moved,
        "lock_s": None,
        "full_build_s": round(pip_full, 1),
        "rebuild_after_code_change_s": round(pip_rebuild, 1),
        "layers_rebuilt": sum(1 for layer in p_after if layer not in p_before),
        "team_layers_compressed_bytes": pip_bytes,
        "pulled_by_a_node_with_the_base": pip_pulled,
        "pull_ratio": round(pip_pulled / pip_bytes, 4) if pip_bytes else None,
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "team.json")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI's check that this still runs: the same steps with two small packages (1 MB) in place of the 50 MB of the example",
    )
    args = parser.parse_args()
    standin, registry = os.environ.get("ASCENDKIT_STANDIN_IMAGE"), os.environ.get("ASCENDKIT_REGISTRY")
    if not standin or not registry:
        raise SystemExit("ASCENDKIT_STANDIN_IMAGE / ASCENDKIT_REGISTRY are not set: run `make services` and source its env file")
    client = connect()
    with tempfile.TemporaryDirectory() as manifests, tempfile.TemporaryDirectory() as tmp:
        plan = plan_build(
            load_matrix(TEST_MATRIX), "a3", arch="x86_64", base_image=standin, repository="bench/verl", manifest_dir=Path(manifests)
        )
        built = run_build(client, plan)
        base_remote = f"{registry}/bench/team-base:{int(time.time())}"
        base_manifest = push(client, built.engine_id or built.image_id, base_remote)
        results = measure(client, registry, base_remote, base_manifest, Path(tmp), QUICK_PACKAGES if args.quick else PACKAGES)
    head = f"{'':22s} {'full build s':>12s} {'rebuild s':>10s} {'rebuilt':>8s} {'team layers B':>14s} {'pulled B':>10s} {'ratio':>7s}"
    print(f"{head} base moved")
    for name, row in results.items():
        print(
            f"{name:22s} {row['full_build_s']:12.1f} {row['rebuild_after_code_change_s']:10.1f} {row['layers_rebuilt']:8d} "
            f"{row['team_layers_compressed_bytes']:14d} {row['pulled_by_a_node_with_the_base']:10d} {row['pull_ratio'] or 0:7.4f} "
            f"{', '.join(row['base_distributions_moved']) or 'none'}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
