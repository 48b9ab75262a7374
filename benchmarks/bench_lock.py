"""Wall time of `ascendkit lock --all` and `ascendkit matrix verify` over the whole matrix
(5 release lines x 2 arches); the issue's goal is under 30 s for both together on a CI machine.

Runs in a scratch copy of the matrix and its locks, so the repository is never rewritten. Each
command runs in a fresh process (uv keeps its own HTTP cache between runs, as it would for a user).
Prints numbers; asserts nothing. Needs PyPI; the indexes unreachable from here answer fast.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASCENDKIT = str(Path(sys.executable).with_name("ascendkit"))


def timed(argv: list[str], cwd: Path) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    proc = subprocess.run([ASCENDKIT, *argv], cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"ascendkit {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run each, without the afresh variants (--upgrade, --fresh): CI's check")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    with tempfile.TemporaryDirectory(prefix="ascendkit-bench-lock-") as tmp:
        work = Path(tmp)
        shutil.copy2(ROOT / "compat_matrix.yaml", work / "compat_matrix.yaml")
        shutil.copytree(ROOT / "locks", work / "locks")
        commands = {
            "lock --all": ["lock", "--all", "--json"],
            "lock --all --upgrade": ["lock", "--all", "--upgrade", "--json"],
            "matrix verify": ["matrix", "verify", "--json"],
            "matrix verify --fresh": ["matrix", "verify", "--fresh", "--json"],
        }
        if args.quick:
            commands = {name: argv for name, argv in commands.items() if not name.endswith(("--upgrade", "--fresh"))}
        medians: dict[str, float] = {}
        for name, argv in commands.items():
            samples = []
            data: dict[str, object] = {}
            for _ in range(args.runs):
                elapsed, data = timed(argv, work)
                samples.append(elapsed)
            medians[name] = statistics.median(samples)
            if "locks" in data:
                statuses = [str(lock["status"]) for lock in data["locks"]]  # type: ignore[attr-defined]
                detail = ", ".join(f"{statuses.count(s)} {s}" for s in ("resolved", "unresolved", "failed"))
            else:
                detail = str(data.get("summary"))
            print(f"{name:24} median {medians[name]:5.1f}s  min {min(samples):5.1f}s  max {max(samples):5.1f}s  ({detail})")
        together = medians["lock --all"] + medians["matrix verify"]
        print(f"lock --all + matrix verify: {together:.1f}s (goal: under 30 s)", end="")
        if args.quick:
            print("; the afresh variants are left out with --quick")
        else:
            print(f"; both resolving afresh: {medians['lock --all --upgrade'] + medians['matrix verify --fresh']:.1f}s")


if __name__ == "__main__":
    main()
