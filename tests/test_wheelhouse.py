"""`ascendkit wheelhouse` against PyPI, and the completeness check `build --offline` runs first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import sha256_of
from buildkit.lock.inputs import LockTarget
from buildkit.lock.lockfile import read_lock
from buildkit.lock.wheelhouse import current_lock, missing_from
from buildkit.matrix.load import load_matrix
from tests.conftest import TEST_MATRIX, write_unresolved_locks

LOCK = TEST_MATRIX.parent / "locks" / "teststack-x86_64.txt"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheelhouse")
    result = CliRunner().invoke(
        app, ["wheelhouse", "--stack", "teststack", "--arch", "x86_64", "-o", str(directory), "--matrix", str(TEST_MATRIX), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["files"] == len(read_lock(LOCK).packages) == report["reused"] + len(report["downloaded"])
    return directory


@pytest.mark.network
def test_every_locked_package_is_there_with_a_locked_hash(wheelhouse: Path) -> None:
    lock = read_lock(LOCK)
    assert missing_from(wheelhouse, lock) == []
    files = {p.name for p in wheelhouse.iterdir()}
    # the target's files: a wheel where one fits x86_64 / CPython 3.11, the sdist for source builds
    assert "MarkupSafe-2.0.1.tar.gz" in files and "iniconfig-2.0.0.tar.gz" in files
    assert "six-1.16.0-py2.py3-none-any.whl" in files
    for path in wheelhouse.iterdir():
        package = next(p for _, p in lock.packages if path.name.lower().replace("_", "-").startswith(f"{p.key}-{p.version}"))
        assert f"sha256:{sha256_of(path)}" in package.hashes


@pytest.mark.network
def test_a_second_run_reuses_what_is_there(wheelhouse: Path, runner: CliRunner) -> None:
    argv = ["wheelhouse", "--stack", "teststack", "--arch", "x86_64", "-o", str(wheelhouse), "--matrix", str(TEST_MATRIX), "--json"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["downloaded"] == []


@pytest.mark.network
def test_missing_and_tampered_files_are_named(wheelhouse: Path, tmp_path: Path) -> None:
    copy = tmp_path / "w"
    shutil.copytree(wheelhouse, copy)
    (copy / "six-1.16.0-py2.py3-none-any.whl").unlink()
    (copy / "idna-3.7-py3-none-any.whl").write_bytes(b"not the wheel the lock names")
    assert missing_from(copy, read_lock(LOCK)) == [  # in the lock's (install) order
        "six==1.16.0 (layer transformers): no file",
        "idna==3.7 (layer verl): idna-3.7-py3-none-any.whl with a hash the lock does not allow",
    ]


def test_needs_a_current_resolved_lock(tmp_path: Path) -> None:
    matrix = tmp_path / "test_matrix.yaml"
    shutil.copy2(TEST_MATRIX, matrix)
    with pytest.raises(InputError, match=r"locks/teststack-x86_64.txt is missing: run `ascendkit lock"):
        current_lock(load_matrix(matrix), LockTarget("teststack", "x86_64"))
    write_unresolved_locks(matrix, "index pypi-again could not be reached")
    with pytest.raises(
        InputError, match=r"is unresolved \(index pypi-again could not be reached\); an offline build needs a resolved lock"
    ):
        current_lock(load_matrix(matrix), LockTarget("teststack", "x86_64"))


def test_bad_arch(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["wheelhouse", "--stack", "teststack", "--arch", "riscv64", "-o", str(tmp_path), "--matrix", str(TEST_MATRIX)]
    )
    assert result.exit_code == ExitCode.INVALID_INPUT and "'riscv64' is not one of 'aarch64', 'x86_64'" in result.stderr
