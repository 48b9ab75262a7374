"""`pip install .` (not editable) gives a working ascendkit: templates, the smoke job and the image's
scripts ship inside the package, so render and k8s render work away from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from buildkit import __version__
from tests.conftest import MATRIX, ROOT, run_installed

DIGEST = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32


def test_the_installed_package_renders_away_from_the_checkout(installed: Path, tmp_path: Path) -> None:
    shutil.copy(MATRIX, tmp_path / "compat_matrix.yaml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    where = run_installed(installed, tmp_path, "--version")
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
    dockerfile = run_installed(installed, tmp_path, "render", "--hw", "a3")
    assert dockerfile.returncode == 0, dockerfile.stderr
    assert dockerfile.stdout == (ROOT / "Dockerfile.a3").read_text()
    manifests = run_installed(installed, tmp_path, "k8s", "render", "--hw", "a3", "--image", DIGEST, "--stack", "cann8.3")
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
    assert run_installed(installed, tmp_path, *argv, "-o", str(volcano)).returncode == 0, "the Ray start scripts ship in the wheel"
    checked = run_installed(installed, tmp_path, "k8s", "validate", str(volcano))
    assert checked.returncode == 0 and "2 document(s) valid" in checked.stdout, "the vendored CRDs ship in the wheel"


def test_the_installed_command_reads_its_released_matrix_anywhere(installed: Path, tmp_path: Path) -> None:
    """pip install, then an empty directory: the commands that only read the matrix read the one the
    wheel carries, and say which; rendering Dockerfiles (which writes beside a matrix) still wants one."""
    manifests = run_installed(installed, tmp_path, "k8s", "render", "--hw", "a2-box16", "--image", DIGEST, "--stack", "openrlhf-cann8.1")
    assert manifests.returncode == 0, manifests.stderr
    assert f"reading the matrix released with ascendkit {__version__} ({installed / 'buildkit' / 'compat_matrix.yaml'})" in (
        manifests.stderr
    )
    assert "openrlhf.cli.train_ppo_ray" in manifests.stdout
    shown = run_installed(installed, tmp_path, "matrix", "show", "cann8.3", "--json")
    assert shown.returncode == 0 and '"verl"' in shown.stdout, shown.stderr
    refused = run_installed(installed, tmp_path, "render", "--hw", "a3")
    assert refused.returncode == 2 and "matrix file not found" in refused.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written in the directory"
