"""The arm64 image built on an x86_64 machine under qemu, three ways, side by side in one run:
the classic builder (``platform=linux/arm64``, what ``build --arch aarch64`` did before BuildKit)
and BuildKit (``--platform linux/arm64``), each on Docker 20.10 (the second engine the emulated
tests run on) and on Docker 26 with the containerd store (the first engine).
Each builds the test stack for aarch64 with ``--no-cache`` (its vllm stand-in compiles a C
extension from source under emulation). Prints a table and writes JSON (default
benchmarks/results/arm64.json); asserts nothing.

Needs `make services` with ASCENDKIT_ARM64=1 (the arm64 stand-in and the emulated engine):
ASCENDKIT_STANDIN_IMAGE_ARM64, ASCENDKIT_EMULATED_DOCKER_HOST and DOCKER_HOST.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"


def build(host: str, builder: str, standin: str, work: Path) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("ascendkit")
    argv = [str(exe), "build", "--hw", "a3", "--arch", "aarch64", "--matrix", str(TEST_MATRIX), "--base-image", standin]
    argv += ["--builder", builder, "--no-cache", "--repo", f"bench-arm64-{builder}/verl", "--json", "-q"]
    with tempfile.TemporaryDirectory(dir=work) as cwd:
        proc = subprocess.run(argv, cwd=cwd, env={**os.environ, "DOCKER_HOST": host}, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the {builder} build on {host} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    return {"seconds": result["duration_s"], "builder": result["builder_version"], "steps": result["steps_total"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "arm64.json")
    args = parser.parse_args()
    standin, emulated, main_host = (
        os.environ.get("ASCENDKIT_STANDIN_IMAGE_ARM64"),
        os.environ.get("ASCENDKIT_EMULATED_DOCKER_HOST"),
        os.environ.get("DOCKER_HOST"),
    )
    if not (standin and emulated and main_host):
        raise SystemExit(
            "needs ASCENDKIT_STANDIN_IMAGE_ARM64, ASCENDKIT_EMULATED_DOCKER_HOST and DOCKER_HOST: `make services` with ASCENDKIT_ARM64=1"
        )
    runs = [
        ("classic builder, Docker 20.10 (the emulated engine)", emulated, "classic"),
        ("BuildKit, Docker 20.10 (the emulated engine)", emulated, "buildkit"),
        ("classic builder, Docker 26 (containerd store)", main_host, "classic"),
        ("BuildKit --platform linux/arm64, Docker 26 (containerd store)", main_host, "buildkit"),
    ]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        for label, host, builder in runs:
            results[label] = build(host, builder, standin, Path(work))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    first = next(iter(results.values()))["seconds"]
    print(f"{'test stack for aarch64 under qemu, --no-cache':<64} {'seconds':>8} {'x classic':>10}  builder")
    for label, r in results.items():
        print(f"{label:<64} {r['seconds']:>8.1f} {r['seconds'] / first:>10.2f}  {r['builder']}")


if __name__ == "__main__":
    main()
