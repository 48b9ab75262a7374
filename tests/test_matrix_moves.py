"""The matrix can move: with ``default: true`` on another stack and everything regenerated, every
unit test passes but those whose subject is the default stack itself (marked ``default_stack``).

It runs once per `make test`, as CI's ``moves`` job beside the others (marked ``matrix_moves``, which
the unit job leaves out): never nested inside the unit job. ``make moves`` runs it alone.

The repository is copied (a git checkout of its own, as CI's clone is), the default moved from the
shipped matrix's default stack to another verl stack, ``ascendkit render --all`` run, and the unit
tests run in the copy as the unit job runs them here. A test that reads today's default through a
literal (a pin, a tag, a base image) fails there: it should name the stack it is about, or read the
default from the matrix, or be marked ``default_stack``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from buildkit.matrix.load import load_matrix
from tests.conftest import MATRIX, ROOT

TARGETS = ("cann8.5", "cann8.3")  # where the default goes: the first of these that is not the default now
# A hang guard, not a speed limit: the inner suite takes 4-5 min on an idle machine and past 30 under `make test`,
# where every job shares two cores (CI11 ran out a 30-min guard); 75 min still fails a hang inside CI's 90.
INNER_TIMEOUT_S = 4500


def _copy(dest: Path) -> None:
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    if (ROOT / ".venv-checkov").is_dir():  # the scan tests' checkov, installed by `make unit`
        (dest / ".venv-checkov").symlink_to(ROOT / ".venv-checkov")
    git = ["git", "-c", "user.name=ascendkit", "-c", "user.email=ci@ascendkit.invalid", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)


def move_default(text: str, old: str, new: str) -> str:
    """The matrix text with ``default: true`` taken from stack ``old`` and given to ``new``."""
    block = re.compile(rf"^  {re.escape(old)}:\n(?:    .*\n|\s*\n)*?    default: true\n", re.MULTILINE)
    found = block.search(text)
    assert found is not None, f"stack {old} has no `default: true` line"
    text = text[: found.end() - len("    default: true\n")] + text[found.end() :]
    target = re.compile(rf"^  {re.escape(new)}:\n    description: .*\n", re.MULTILINE).search(text)
    assert target is not None, f"stack {new} does not start with its description"
    return text[: target.end()] + "    default: true\n" + text[target.end() :]


@pytest.mark.matrix_moves
def test_moving_the_default_fails_no_test_but_the_default_stacks_own(tmp_path: Path) -> None:
    old = load_matrix(MATRIX).default_stack()
    new = next(s for s in TARGETS if s != old)
    copy = tmp_path / "ascendkit"
    _copy(copy)
    matrix = copy / "compat_matrix.yaml"
    matrix.write_text(move_default(matrix.read_text(encoding="utf-8"), old, new), encoding="utf-8")
    assert load_matrix(matrix).default_stack() == new
    env = {**os.environ, "PYTHONPATH": str(copy), "COLUMNS": "250"}
    rendered = subprocess.run([sys.executable, "-m", "buildkit", "render", "--all"], cwd=copy, env=env, capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    # as `make unit` has it: the copy's modules and rewritten tests compiled once, not in each process it starts
    subprocess.run([sys.executable, "-m", "tests.harness.bytecode"], cwd=copy, env=env, check=True)
    inner_root = Path(tempfile.gettempdir()) / f"ak-moved-{os.getpid()}"
    try:
        inner = subprocess.run(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto",
                "-m", "not docker and not network and not default_stack and not matrix_moves",
                "--ignore", "tests/test_matrix_moves.py",
                f"--basetemp={inner_root}",  # its own, short (socket paths) and pruned by no other session
            ],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=INNER_TIMEOUT_S,
        )  # fmt: skip
    finally:
        shutil.rmtree(inner_root, ignore_errors=True)
    failed = [line for line in inner.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert inner.returncode == 0, f"with the default on {new}:\n" + "\n".join(failed or inner.stdout.splitlines()[-30:])


@pytest.mark.parametrize(("old", "new"), [("cann8.3", "cann8.5"), ("cann8.5", "cann8.3")])
def test_the_move_takes_the_line_from_one_stack_and_gives_it_to_the_other(old: str, new: str) -> None:
    text = MATRIX.read_text(encoding="utf-8")
    if load_matrix(MATRIX).default_stack() != old:
        text = move_default(text, load_matrix(MATRIX).default_stack(), old)
    moved = move_default(text, old, new)
    assert moved.count("    default: true\n") == 1 and len(moved) == len(text)
    assert re.search(rf"^  {re.escape(new)}:\n    description: .*\n    default: true\n", moved, re.MULTILINE)
