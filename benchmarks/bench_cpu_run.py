"""What a CPU run of the smoke jobs costs, per stack: seconds, peak memory, and the bytes its environment
needed beside the bytes of the image's Python packages. Read from a ``make cpu-run`` report and its work
directory; prints numbers and asserts nothing.

    python benchmarks/bench_cpu_run.py [--report cpu-run-out/cpu-report.json] [--work /tmp/ascendkit-cpu-run] [--quick]

The image's side is the sum of the wheel files its resolved lock installs on aarch64 (the hosts' arch), their
sizes asked of the index (HEAD); ``--quick`` (CI) leaves the index out. The CPU side is what the stack's CPU
environment holds on disk (installed, torch's CPU build included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tree_bytes(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            file = Path(folder) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def image_wheel_bytes(stack: str) -> tuple[int, int] | None:
    """(bytes, files) of the wheels the stack's resolved aarch64 lock installs, as the index serves them."""
    from buildkit.lock.index import IndexClient
    from buildkit.lock.lockfile import read_lock

    path = ROOT / "locks" / f"{stack}-aarch64.txt"
    if not path.is_file():
        return None
    lock = read_lock(path)
    if not lock.resolved:
        return None
    client = IndexClient()
    packages = [p for _, p in lock.packages]

    def size(package: object) -> int:
        name = getattr(package, "name", "")
        hashes = {h.removeprefix("sha256:") for h in getattr(package, "hashes", [])}
        try:
            index = lock.header.get(f"index {getattr(package, 'source', '')}", "https://pypi.org/simple")
            project = client.project(index, name)
        except Exception:
            return 0
        for file in project.files:
            if file.sha256 in hashes and file.kind == "wheel" and ("aarch64" in file.filename or "none-any" in file.filename):
                head = client.session.head(file.url, allow_redirects=True, timeout=30)
                return int(head.headers.get("content-length", 0))
        return 0

    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(size, packages))
    return sum(sizes), sum(1 for s in sizes if s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=ROOT / "cpu-run-out" / "cpu-report.json")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ascendkit-cpu-run"))
    parser.add_argument("--quick", action="store_true", help="leave the index out (the image's wheel sizes)")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    print("CPU run of the smoke jobs, per stack (seconds are this machine's, under whatever else it runs)")
    header = f"{'stack':<16} {'job':<5} {'boundary s':>10} {'boundary MiB':>12} {'step s':>7} {'step MiB':>8}"
    print(f"{header} {'env MB':>8} {'image wheels MB':>16}")
    for run in report["runs"]:
        stack = run["stack"] or "-"
        step = (run.get("step") or {}).get("result") or {}
        boundary = run.get("boundary") or {}
        venv = args.work / f"{stack}-venv"
        env_mb = f"{tree_bytes(venv) / 1e6:.0f}" if venv.is_dir() else "-"
        wheels = None if args.quick else image_wheel_bytes(stack)
        image = f"{wheels[0] / 1e6:.0f} ({wheels[1]} files)" if wheels else ("not asked" if args.quick else "no resolved lock")
        print(
            f"{stack:<16} {run['job']:<5} {boundary.get('seconds') or '-':>10} {boundary.get('peak_rss_mib') or '-':>12} "
            f"{step.get('seconds', '-'):>7} {step.get('peak_rss_mib', '-'):>8} {env_mb:>8} {image:>16}"
        )
    print("env MB: the CPU environment installed; image wheels MB: the image's locked aarch64 wheels, compressed,")
    print("before torch_npu's, vllm's and vllm-ascend's builds and the CANN base (the image itself is several GB more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
