"""`pip install .` (not editable) gives a working ascendkit: templates, the smoke job and the image's
scripts ship inside the package, so render and k8s render work away from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from buildkit import __version__
from buildkit.image.render import CONTEXT_FILES
from tests.conftest import MATRIX, ROOT

DIGEST = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels, target = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    # from a copy of the sources, as a release build would: setuptools' in-tree build/ folder keeps
    # modules a checkout has since deleted, and would put them in the wheel
    source = tmp_path_factory.mktemp("src") / "ascendkit"
    ignored = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "smoke-out", "manifests")
    shutil.copytree(ROOT, source, ignore=ignored)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("ascendkit_verl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(ROOT).as_posix() for d in ("crds", "files") for p in (ROOT / "buildkit" / "k8s" / d).iterdir()}
    for expected in ["buildkit/templates/Dockerfile.j2", "buildkit/smoke_tests/grpo_smoke.yaml", *data]:
        assert expected in names, expected
    assert set(CONTEXT_FILES.values()) <= names, "everything the Dockerfile COPYs from the build context"
    released = zipfile.ZipFile(wheel).read("buildkit/compat_matrix.yaml")
    assert released == MATRIX.read_bytes(), "the wheel carries the matrix it was built from, byte for byte"
    # every module of the checkout: a subpackage left out of pyproject's list would still import
    # below through the editable install's finder, so the wheel's contents are compared directly
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "buildkit").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    return target


def run(installed: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}  # ahead of the editable checkout
    return subprocess.run([sys.executable, "-m", "buildkit", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_installed_package_renders_away_from_the_checkout(installed: Path, tmp_path: Path) -> None:
    shutil.copy(MATRIX, tmp_path / "compat_matrix.yaml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    where = run(installed, tmp_path, "--version")
    assert where.returncode == 0
    probe = subprocess.run(
        [sys.executable, "-c", "import buildkit.resources as r; print(r.TEMPLATES_DIR)"],
        env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == str(installed / "buildkit" / "templates"), "the installed copy, not the checkout's"
    dockerfile = run(installed, tmp_path, "render", "--hw", "a3")
    assert dockerfile.returncode == 0, dockerfile.stderr
    assert dockerfile.stdout == (ROOT / "Dockerfile.a3").read_text()
    manifests = run(installed, tmp_path, "k8s", "render", "--hw", "a3", "--image", DIGEST, "--stack", "cann8.3")
    assert manifests.returncode == 0, manifests.stderr
    assert "gsm8k_synth.py" in manifests.stdout and "kind: Job" in manifests.stdout
    volcano = tmp_path / "volcano.yaml"
    argv = [
        "k8s",
        "render",
        "--hw",
        "a3",
        "--image",
        DIGEST,
        "--stack",
        "cann8.3",
        "--nodes",
        "2",
        "--scheduler",
        "volcano",
        "--no-kuberay",
    ]
    assert run(installed, tmp_path, *argv, "-o", str(volcano)).returncode == 0, "the Ray start scripts ship in the wheel"
    checked = run(installed, tmp_path, "k8s", "validate", str(volcano))
    assert checked.returncode == 0 and "2 document(s) valid" in checked.stdout, "the vendored CRDs ship in the wheel"


def test_the_installed_command_reads_its_released_matrix_anywhere(installed: Path, tmp_path: Path) -> None:
    """pip install, then an empty directory: the commands that only read the matrix read the one the
    wheel carries, and say which; rendering Dockerfiles (which writes beside a matrix) still wants one."""
    manifests = run(installed, tmp_path, "k8s", "render", "--hw", "a2-box16", "--image", DIGEST, "--stack", "openrlhf-cann8.1")
    assert manifests.returncode == 0, manifests.stderr
    assert f"reading the matrix released with ascendkit {__version__} ({installed / 'buildkit' / 'compat_matrix.yaml'})" in (
        manifests.stderr
    )
    assert "openrlhf.cli.train_ppo_ray" in manifests.stdout
    shown = run(installed, tmp_path, "matrix", "show", "cann8.3", "--json")
    assert shown.returncode == 0 and '"verl"' in shown.stdout, shown.stderr
    refused = run(installed, tmp_path, "render", "--hw", "a3")
    assert refused.returncode == 2 and "matrix file not found" in refused.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written in the directory"
