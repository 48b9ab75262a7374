"""Shared fixtures: the shipped matrix, edited copies of it, and a CLI runner."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.matrix import LoadedMatrix, load_matrix

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "compat_matrix.yaml"
MATRIX_TEXT = MATRIX.read_text(encoding="utf-8")

EditMatrix = Callable[..., Path]


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    """Replace ``old`` (which must occur) the way a user editing the file would."""
    assert old in text, f"test setup: {old!r} not in the matrix"
    return text.replace(old, new, count)


@pytest.fixture(scope="session")
def loaded() -> LoadedMatrix:
    return load_matrix(MATRIX)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def matrix_copy(tmp_path: Path) -> EditMatrix:
    """Write the shipped matrix with edits applied (pairs of old, new) into tmp_path."""

    def make(*edits: tuple[str, str], text: str | None = None) -> Path:
        body = MATRIX_TEXT if text is None else text
        for old, new in edits:
            body = edit(body, old, new)
        path = tmp_path / "compat_matrix.yaml"
        path.write_text(body, encoding="utf-8")
        return path

    return make


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the files `render --all/--check` reads and writes."""
    dest = tmp_path / "repo"
    dest.mkdir()
    for name in ("compat_matrix.yaml", "README.md", "Dockerfile.a2", "Dockerfile.a3", "compat_matrix.schema.json"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "dockerfiles", dest / "dockerfiles")
    return dest


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line number of the n-th line containing ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[occurrence - 1]
