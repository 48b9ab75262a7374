"""Air-gapped builds for real: the test stack built from its wheelhouse with no network in the pip
steps, a wheelhouse that lacks a package, and a lock hash pip refuses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from buildkit.errors import BuildFailed, ExitCode
from buildkit.image.build import run_build
from buildkit.image.buildplan import plan_build
from buildkit.matrix.load import load_matrix
from tests.conftest import TEST_MATRIX, DockerEnv, own_repo

pytestmark = pytest.mark.docker

LOCKS = TEST_MATRIX.parent / "locks"


@pytest.fixture(scope="module")
def wheelhouse(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheelhouse")
    docker_env.ascendkit(
        "wheelhouse", "--stack", "teststack", "--arch", "x86_64", "-o", str(directory), "--matrix", str(TEST_MATRIX),
        cwd=directory, check=True,
    )  # fmt: skip
    return directory


def test_offline_build_installs_only_from_the_wheelhouse(docker_env: DockerEnv, wheelhouse: Path, tmp_path: Path) -> None:
    before = docker_env.containers()
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--offline", "--wheelhouse", str(wheelhouse), "--no-cache", "--repo", "offline/verl", "--json",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    # every pip step ran (no cache) with no index: pip installed uv from the served wheelhouse, and
    # uv every later layer, with nothing but the wheelhouse
    assert proc.stderr.count("Looking in links: http://127.0.0.1:") == 1
    uv_runs = [line for line in proc.stderr.splitlines() if " python3 -m uv pip install " in line]  # some through the entrypoint
    assert len(uv_runs) == 8 and all(" --no-index " in line for line in uv_runs)
    step_output = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("| ")]
    assert not [line for line in step_output if "Looking in indexes" in line or "pypi.org" in line]
    assert "+ markupsafe==2.0.1" in proc.stderr  # the source build, from the wheelhouse's sdist
    result = json.loads(proc.stdout)
    manifest = json.loads(Path(tmp_path, result["manifest"]).read_text())
    lock_check = next(c for c in manifest["checks"] if c["name"] == "lock")
    assert lock_check["status"] == "ok" and lock_check["actual"] == "all at their locked versions"
    # the loopback URL lived in the build's secret channel only
    image = result["engine_id"]
    recorded = json.dumps(docker_env.client.history(image)) + json.dumps(docker_env.client.inspect_image(image))
    assert "127.0.0.1" not in recorded and "PIP_NO_INDEX" not in recorded
    assert docker_env.containers() == before


def test_a_wheel_missing_from_the_wheelhouse_is_named_before_anything_runs(docker_env: DockerEnv, wheelhouse: Path, tmp_path: Path) -> None:
    partial = tmp_path / "wheels"
    shutil.copytree(wheelhouse, partial)
    (partial / "six-1.16.0-py2.py3-none-any.whl").unlink()
    before, repo = docker_env.containers(), own_repo("offline-missing")
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--offline", "--wheelhouse", str(partial), "--repo", repo, "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stderr
    assert f"--wheelhouse {partial} lacks 1 locked package(s) of locks/teststack-x86_64.txt:" in proc.stderr
    assert "    six==1.16.0 (layer transformers): no file" in proc.stderr
    assert f"ascendkit wheelhouse --stack teststack --arch x86_64 -o {partial}" in proc.stderr
    assert docker_env.client.images(name=repo) == []
    assert docker_env.containers() == before


def test_an_offline_build_names_a_wheel_that_went_missing(docker_env: DockerEnv, wheelhouse: Path, tmp_path: Path) -> None:
    """Past the check (a file removed while the build runs): uv, with no index, names what it lacks."""
    partial = tmp_path / "wheels"
    shutil.copytree(wheelhouse, partial)
    repo = own_repo("offline-gone")
    plan = plan_build(
        load_matrix(TEST_MATRIX), "a3", arch="x86_64", base_image=docker_env.standin, repository=repo,
        no_cache=True, use_default_ca=False, wheelhouse=partial, manifest_dir=tmp_path / "manifests",
    )  # fmt: skip
    (partial / "six-1.16.0-py2.py3-none-any.whl").unlink()
    before = docker_env.containers()
    with pytest.raises(BuildFailed) as failure:
        run_build(docker_env.client, plan)
    assert "six was not found in the provided package locations and you require six==1.16.0" in str(failure.value)
    assert docker_env.client.images(name=repo) == []
    assert docker_env.containers() == before


def test_the_installer_refuses_a_file_whose_hash_the_lock_does_not_allow(docker_env: DockerEnv, tmp_path: Path) -> None:
    matrix = tmp_path / "test_matrix.yaml"
    shutil.copy2(TEST_MATRIX, matrix)
    shutil.copytree(LOCKS, tmp_path / "locks")
    lock = tmp_path / "locks" / "teststack-x86_64.txt"
    text = lock.read_text()
    idna = text.index("idna==3.7")
    wrong = re.sub(r"--hash=sha256:[0-9a-f]{64}", "--hash=sha256:" + "0" * 64, text[idna:], count=1)
    lock.write_text(text[:idna] + wrong)  # still current: the lock's inputs did not change
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin,
        "--repo", (repo := own_repo("badhash")), "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.BUILD_FAILED, proc.stderr
    assert "Hash mismatch for `idna==3.7`" in proc.stderr
    assert docker_env.client.images(name=repo) == []
