"""Where the data files ascendkit reads live: in the installed package, or in a checkout.

A wheel carries ``templates/`` and ``smoke_tests/`` inside the package (pyproject maps them in),
and the matrix it was released with (setup.py copies it in); an editable install or a plain
checkout reads them from the repository root beside ``buildkit/``.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = PACKAGE_DIR / name
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


TEMPLATES_DIR = _data_dir("templates")
SMOKE_DIR = _data_dir("smoke_tests")


def released_matrix() -> Path | None:
    """The matrix this ascendkit was released with: the wheel's copy, or a checkout's own file."""
    for candidate in (PACKAGE_DIR / "compat_matrix.yaml", PACKAGE_DIR.parent / "compat_matrix.yaml"):
        if candidate.is_file():
            return candidate
    return None


# Defaults the CLI shows in --help: kept here, so `ascendkit --help` loads none of the pipeline.
DEFAULT_MATRIX = Path("compat_matrix.yaml")
REPOSITORY_PREFIX = "ascendkit"  # `ascendkit build` tags images locally as ascendkit/<framework>


def default_repository(framework: str) -> str:
    """Where ``ascendkit build`` tags an image of ``framework`` locally: ascendkit/verl, ascendkit/openrlhf."""
    return f"{REPOSITORY_PREFIX}/{framework}"
