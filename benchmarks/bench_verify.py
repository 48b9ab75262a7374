"""Wall time of `ascendkit matrix verify` over the whole matrix (every stack, both arches).

Prints numbers (median of several runs, each in a fresh process so nothing is cached); asserts
nothing. Needs the package indexes it asks (PyPI here; unreachable ones answer fast).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASCENDKIT = str(Path(sys.executable).with_name("ascendkit"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    samples = []
    summary: dict[str, int] = {}
    for _ in range(args.runs):
        start = time.perf_counter()
        proc = subprocess.run([ASCENDKIT, "matrix", "verify", "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
        samples.append(time.perf_counter() - start)
        summary = json.loads(proc.stdout)["summary"]
    pins = sum(summary.values())
    print(f"ascendkit matrix verify (5 stacks x 2 arches, {pins} pins): median {statistics.median(samples):.1f}s, ", end="")
    print(f"min {min(samples):.1f}s, max {max(samples):.1f}s over {args.runs} runs; {summary}")


if __name__ == "__main__":
    main()
