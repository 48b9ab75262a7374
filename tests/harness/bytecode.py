"""The checkout's bytecode, written once before the tests run: ``make bytecode`` and the moves job's copy.

    python -m tests.harness.bytecode        # in the checkout's root

Where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) no process writes the bytecode it
compiles, though every process reads what is there. Two kinds are written here:

* each module of buildkit, tests, benchmarks and smoke_tests (compileall; not the vendored upstream
  files under tests/fixtures, held byte for byte), which every ``ascendkit`` a test starts imports;
* pytest's own for the test modules and conftest: each is compiled from its source with pytest's
  assertions rewritten, which took half of every session's collection (about 5 CPU s of 10, in each
  xdist worker and each job's pytest). Written by one collection, only when a test module is newer
  than its rewritten bytecode (pytest itself checks each file's mtime and size when it reads one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DIRS = ("buildkit", "tests", "benchmarks", "smoke_tests")
EXCLUDE = "(^|/)tests/fixtures/"


def rewritten(test_file: Path) -> Path:
    """Where pytest keeps ``test_file`` compiled with its assertions rewritten."""
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    return test_file.parent / "__pycache__" / f"{test_file.stem}.{tag}.pyc"


def stale(root: Path) -> list[Path]:
    """The test modules and conftests under ``root``/tests whose rewritten bytecode is missing or older."""
    files = [*root.glob("tests/test_*.py"), *root.glob("tests/conftest.py")]
    out = []
    for source in files:
        pyc = rewritten(source)
        if not pyc.is_file() or pyc.stat().st_mtime < source.stat().st_mtime:
            out.append(source)
    return out


def compile_all(root: Path) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", EXCLUDE, *DIRS], cwd=root, check=True)
    if stale(root):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        collected = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
            cwd=root, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if collected.returncode != 0:  # a module that does not import: the test run that follows says which, in full
            print(f"[bytecode] collecting the tests failed; their rewritten bytecode is not all written:\n{collected.stdout[-2000:]}")
        left = stale(root)
        if collected.returncode == 0 and left:
            raise SystemExit(f"[bytecode] pytest wrote no rewritten bytecode for {', '.join(p.name for p in left)}")


if __name__ == "__main__":
    compile_all(Path.cwd())
