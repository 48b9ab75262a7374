"""`ascendkit rebuild` of a team image: its inputs read from its provenance, and the team repository at hand held to
them before anything is built (the rebuild itself runs on the real engines: tests/test_team_docker.py)."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.settings import Mirrors
from buildkit.ship.rebuild import Original, recorded_inputs
from buildkit.team.build import index_args_of
from buildkit.team.dockerfile import files_digest, version_label
from buildkit.team.rebuild import TeamRecorded, check_team_inputs, team_recorded
from buildkit.team.resolve import TeamBase, TeamResolution, lock_file, team_base, write_team_lock
from buildkit.team.spec import LoadedTeam, load_team
from buildkit.trust.provenance import statement
from tests.conftest import TEST_MATRIX
from tests.test_team import GOOD, pkg, team_repo

WHERE = "registry.example/acme/verl-math@sha256:" + "a" * 64
SOURCE = {"repository": "https://git.example/acme/team", "commit": "f" * 40, "dirty": False}


@pytest.fixture(scope="module")
def test_matrix() -> LoadedMatrix:
    return load_matrix(TEST_MATRIX)


def _locked(root: Path, loaded: LoadedMatrix) -> tuple[LoadedTeam, TeamBase]:
    team = load_team(team_repo(root), loaded)
    base = team_base(loaded, team, "x86_64")
    write_team_lock(team, base, TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")]))
    return team, base


def _record(team: LoadedTeam, base: TeamBase, **build: Any) -> dict[str, Any]:
    """A team build record as `team build` writes it, as far as the provenance reads it."""
    lock = lock_file(team, "x86_64")
    lock_sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    section = {"name": team.spec.name, "lock_sha256": lock_sha, "files_sha256": files_digest(team), "framework": None}
    return {
        "stack": "teststack", "chip": "a2", "arch": "x86_64", "os": "debian12", "skus": ["a2-box16"], "passed": True,
        "image": {"id": "sha256:" + "b" * 64}, "builder": {"name": "buildkit"},
        "build": {
            "source": SOURCE,
            "base_image": {"ref": "registry.example/ascendkit/verl", "digest": "sha256:" + "c" * 64, "from_registry": True},
            "lock_files": {lock.name: lock_sha},
            "reproducible": {"source_date_epoch": 1735689600, "label": "io.ascendkit.source-date-epoch"},
            "build_args": dict(index_args_of(base, dict(base.indexes))[0]),
            "team": section,
        } | build,
    }  # fmt: skip


def _recorded(team: LoadedTeam, base: TeamBase, **build: Any) -> TeamRecorded:
    return team_recorded(Original(statement("registry.example/acme/verl-math", WHERE, _record(team, base, **build)), WHERE, None, None))


def _version(team: LoadedTeam) -> str:
    lock_sha = hashlib.sha256(lock_file(team, "x86_64").read_bytes()).hexdigest()
    return version_label(team, lock_sha, files_digest(team))


def test_a_team_images_inputs_come_from_its_provenance(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    team, base = _locked(tmp_path, test_matrix)
    recorded = _recorded(team, base)
    assert (recorded.name, recorded.stack, recorded.arch, recorded.builder) == ("acme/verl-math", "teststack", "x86_64", "buildkit")
    assert recorded.base_ref == "registry.example/ascendkit/verl@sha256:" + "c" * 64, "the base by its registry digest"
    assert (recorded.lock, recorded.epoch, recorded.fork_commit) == ("ascendkit-team-x86_64.lock", 1735689600, "")
    assert recorded.source == f"git+https://git.example/acme/team@{'f' * 40}"
    assert recorded.build_args["PIP_INDEX_URL"] == base.indexes[0][1]
    loaded = {"ref": "sha256:" + "d" * 64, "digest": "sha256:" + "d" * 64, "from_registry": False}
    assert _recorded(team, base, base_image=loaded).base_ref == "sha256:" + "d" * 64, "a base loaded here: by its config digest"
    check_team_inputs(recorded, team, base, dict(base.indexes), _version(team))  # the repository it was built from
    with pytest.raises(InputError, match="no epoch"):
        _recorded(team, base, reproducible=None)
    with pytest.raises(InputError, match="a team image: it is rebuilt from its team file"):
        recorded_inputs(statement("r", WHERE, _record(team, base)), WHERE, None)  # never as a reference image


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("files", r"the team's files \(rewards\) are not the ones it was built from \(sha256 [0-9a-f]{12}\.\.\.\)"),
        ("lock", r"ascendkit-team-x86_64\.lock is not the lock it was built from \(ascendkit-team-x86_64\.lock, sha256"),
        ("env", r"ascendkit-team\.yaml is not the team file it was built from \(the image's version is team-acme-verl-math-"),
        ("name", r"ascendkit-team\.yaml is team acme/other; the image is acme/verl-math's"),
        ("mirror", r"it was built with PIP_INDEX_URL=\S+; this rebuild would name PIP_INDEX_URL=https://mirror\.example/simple"),
    ],
)
def test_a_team_repository_that_is_not_the_one_built_from_is_refused_before_anything_is_built(
    tmp_path: Path, test_matrix: LoadedMatrix, change: str, said: str
) -> None:
    team, base = _locked(tmp_path, test_matrix)
    recorded, version, urls = _recorded(team, base), _version(team), dict(base.indexes)
    path = tmp_path / "ascendkit-team.yaml"
    if change == "files":
        (tmp_path / "rewards" / "math.py").write_text("def compute_score(*args, **kwargs):\n    return 1.0\n")
    elif change == "lock":
        lock = lock_file(team, "x86_64")
        lock.write_text(lock.read_text() + "\n")
    elif change == "env":
        path.write_text(path.read_text().replace("math.py", "other.py"))
    elif change == "name":
        path.write_text(path.read_text().replace("acme/verl-math", "acme/other"))
    else:
        urls[base.indexes[0][0]] = "https://mirror.example/simple"
    with pytest.raises(InputError) as refused:
        check_team_inputs(recorded, load_team(path, test_matrix), base, urls, version)
    message = str(refused.value)
    assert message.startswith(
        f"{WHERE}: not rebuilt, its inputs are not the ones at hand; it was built from git+https://git.example/acme/team@"
    )
    assert re.search(said, message), message


def test_a_team_image_outside_its_repository_is_refused_with_where_to_rebuild_it(tmp_path: Path, test_matrix: LoadedMatrix) -> None:
    from buildkit.cli.team_cmd import rebuild_team_image

    team, base = _locked(tmp_path / "team", test_matrix)
    original = Original(statement("registry.example/acme/verl-math", WHERE, _record(team, base)), WHERE, None, None)
    with pytest.raises(InputError, match=r"a team image \(acme/verl-math\): rebuild it in the team's repository, where its team file is"):
        rebuild_team_image(original, tmp_path / "ascendkit-team.yaml", TEST_MATRIX, Mirrors(), "127.0.0.1:5000/x", tmp_path, print)


@pytest.mark.network
def test_a_forks_wheel_missing_from_the_checkout_is_built_again_and_kept_only_when_the_lock_names_it(
    tmp_path: Path, test_matrix: LoadedMatrix
) -> None:
    """The fork's wheel not committed beside the lock: `rebuild` builds it again from its commit (setuptools from PyPI,
    the fixed epoch) and it is the same bytes the lock names; a lock naming other bytes leaves nothing behind, exit 2."""
    from buildkit.team.fork import WHEELS_DIR, build_fork
    from buildkit.team.rebuild import fork_wheel_again
    from buildkit.team.resolve import base_constraints
    from tests.harness.gitserver import make_repository

    tree = tmp_path / "fork-tree"
    (tree / "idna").mkdir(parents=True)
    (tree / "idna" / "__init__.py").write_text('__version__ = "3.7+acme.1"\nACME_FORK = True\n')
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "idna"\nversion = "3.7+acme.1"\n\n[tool.setuptools]\npackages = ["idna"]\n'
    )
    commit = make_repository(tree, tmp_path / "git" / "verl.git", "the team's fork")
    fork = f"framework:\n  git: {(tmp_path / 'git' / 'verl.git').as_uri()}\n  commit: {commit}\n  replaces: verl\nenv:"
    team = load_team(team_repo(tmp_path / "team", GOOD.replace("env:", fork, 1)), test_matrix)
    base = team_base(test_matrix, team, "x86_64")
    urls = dict(base.indexes)
    first = build_fork(team, urls[base.indexes[0][0]], base_constraints(team, base))
    write_team_lock(team, base, TeamResolution([pkg("tabulate", "0.9.0", "-r team.in")], fork=first))
    original = first.path.read_bytes()
    shutil.rmtree(tmp_path / "team" / ".ascendkit")
    said: list[str] = []
    fork_wheel_again(team, base, urls, said.append)
    assert first.path.read_bytes() == original, "built again from its commit: the same bytes"
    assert said == [f"{tmp_path / 'team' / WHEELS_DIR} has no wheel of the fork: building it again from {fork.split()[2]}@{commit}"]
    fork_wheel_again(team, base, urls, said.append)
    assert len(said) == 1, "a wheel at hand is not built again"
    lock = lock_file(team, "x86_64")
    lock.write_text(lock.read_text().replace(first.sha256, "0" * 64))
    shutil.rmtree(tmp_path / "team" / ".ascendkit")
    with pytest.raises(InputError, match=f"built again to {re.escape(first.path.name)} of sha256 {first.sha256}, which"):
        fork_wheel_again(team, base, urls)
    assert not (tmp_path / "team" / ".ascendkit").exists(), "the wheel the lock does not name is not left behind"
