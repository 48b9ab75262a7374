"""Wall time of the CLI's hot paths beside the interpreter's own start-up, measured in one run.

`ascendkit --help` should stay near `python -c pass` plus Typer (target: median <= 0.2 s; it
imports no command module, see buildkit/cli/commands.py) and
`render --check` (every generated file re-rendered in memory) under 0.6 s; the import times of
the heavy libraries show what a command would pay if it imported them at start.
Prints numbers (median, min, max of several runs); asserts nothing. Usage:
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
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
    "ascendkit --help": [ASCENDKIT, "--help"],
    "ascendkit --version": [ASCENDKIT, "--version"],
    "ascendkit render --check": [ASCENDKIT, "render", "--check"],
    "ascendkit matrix validate": [ASCENDKIT, "matrix", "validate"],
    "ascendkit render --hw a3": [ASCENDKIT, "render", "--hw", "a3"],
}
TARGETS = {"ascendkit --help": 0.2, "ascendkit render --check": 0.6}
# What each would add to every command if the CLI imported it at start.
HEAVY = ("docker", "requests", "jsonschema", "matplotlib.pyplot", "kubernetes_validate", "pydantic", "jinja2")


def time_command(argv: list[str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(f"{'command':<34} {'median':>9} {'min':>9} {'max':>9} {'target':>8}   ({args.runs} runs each)")
    for name, argv in CASES.items():
        time_command(argv, 1)  # warm the page cache and .pyc files
        samples = time_command(argv, args.runs)
        target = TARGETS.get(name)
        verdict = "" if target is None else f"{'<=' if statistics.median(samples) <= target else '> '} {target * 1000:.0f}ms"
        print(
            f"{name:<34} {statistics.median(samples) * 1000:>7.0f}ms {min(samples) * 1000:>7.0f}ms "
            f"{max(samples) * 1000:>7.0f}ms {verdict:>8}"
        )
    print()
    print(f"{'import (alone, on top of python)':<34} {'median':>9}")
    base = statistics.median(time_command([sys.executable, "-c", "pass"], 5))
    for module in HEAVY:
        cost = statistics.median(time_command([sys.executable, "-c", f"import {module}"], 5)) - base
        print(f"{module:<34} {cost * 1000:>7.0f}ms")


if __name__ == "__main__":
    main()
