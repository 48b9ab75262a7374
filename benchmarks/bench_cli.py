"""Wall time of the CLI's hot paths: `ascendkit --help` (start-up) and `render --all --check`.

Prints numbers (median of several runs); asserts nothing. Usage:
    python benchmarks/bench_cli.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASCENDKIT = str(Path(sys.executable).with_name("ascendkit"))

CASES = {
    "ascendkit --help": [ASCENDKIT, "--help"],
    "ascendkit render --all --check": [ASCENDKIT, "render", "--all", "--check"],
    "ascendkit matrix validate": [ASCENDKIT, "matrix", "validate"],
}


def time_command(argv: list[str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"{'command':<34} {'median':>9} {'min':>9} {'max':>9}   ({args.runs} runs each)")
    for name, argv in CASES.items():
        time_command(argv, 1)  # warm the page cache and .pyc files
        samples = time_command(argv, args.runs)
        print(f"{name:<34} {statistics.median(samples) * 1000:>7.0f}ms {min(samples) * 1000:>7.0f}ms {max(samples) * 1000:>7.0f}ms")


if __name__ == "__main__":
    main()
