"""A team image on the real engine, on the test stack's image: locked against its base, built on it by digest,
checked that no base distribution moved; refusals leave no tag and no container."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import docker
import pytest
from docker.errors import ImageNotFound

from buildkit.errors import ExitCode
from buildkit.ship.oci.registry import Registry
from tests.conftest import TEST_MATRIX, DockerEnv
from tests.harness.gitserver import make_repository, serve
from tests.test_reproducible import engine_name
from tests.test_team import GOOD, team_repo
from tests.test_team_prebuild import index  # noqa: F401  # the simple index fixture (a mirror serving planted wheels)

pytestmark = pytest.mark.docker

TEAM = GOOD.replace("sku: a2-box16", "sku: a3")
RUN = uuid.uuid4().hex[:8]  # the engine outlives test runs: each run's images are its own


@pytest.fixture(autouse=True)
def _remove_team_images(docker_env: DockerEnv) -> Iterator[None]:
    """Each test's team images go when it ends: on a graph-driver engine (20.10, overlay2) they and the classic builder's
    steps are children of the shared test image, which other tests remove and push by digest."""
    yield
    for image in docker_env.client.images():
        if any(tag.startswith("acme/team-") and RUN in tag for tag in image.get("RepoTags") or []):
            for tag in image["RepoTags"]:
                with contextlib.suppress(docker.errors.NotFound):
                    docker_env.client.remove_image(tag)  # with its untagged steps


def _team(docker_env: DockerEnv, root: Path, *args: str) -> Any:
    return docker_env.ascendkit("team", *args, "--file", str(root / "ascendkit-team.yaml"), "--matrix", str(TEST_MATRIX), cwd=root)


def _tags(docker_env: DockerEnv, repository: str) -> list[str]:
    return [t for image in docker_env.client.images(name=repository) for t in image.get("RepoTags") or []]


def _python_in(docker_env: DockerEnv, image: str, program: str) -> str:
    """What ``python3 -c program`` prints in a container of ``image`` (which must exit 0); the container removed."""
    container = docker_env.client.create_container(image, ["python3", "-c", program], entrypoint=[])
    try:
        docker_env.client.start(container)
        assert docker_env.client.wait(container, timeout=120)["StatusCode"] == 0
        return str(docker_env.client.logs(container, stderr=False).decode())
    finally:
        docker_env.client.remove_container(container, force=True)


@pytest.mark.engine_20_10
@pytest.mark.engine_overlay2
def test_a_team_image_adds_its_packages_and_files_and_leaves_every_base_distribution_as_it_was(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    team_repo(tmp_path, TEAM.replace("acme/verl-math", f"acme/team-it-{RUN}"))
    locked = _team(docker_env, tmp_path, "lock")
    assert locked.returncode == 0, locked.stderr
    containers = docker_env.containers()
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert sorted(result["added"]) == ["pyfiglet==1.0.2", "tabulate==0.9.0"]
    build_record = json.loads((tmp_path / result["record"]).read_text())
    record = build_record["team"]
    assert record["checks"]["files_checked_after_the_build_only"] == result["files_checked_after_the_build_only"]
    assert record["base"]["ref"] == result["base"] and record["lock_sha256"] and record["files_sha256"]
    assert record["checks"]["imported"] == ["pyfiglet", "tabulate"] and record["replaces"] == {}
    assert record["added"] == {"pyfiglet": "1.0.2", "tabulate": "0.9.0"}
    assert build_record["passed"] and build_record["image"]["tags"] == result["tags"], "a build record as a reference build's"
    assert build_record["build"]["base_image"]["layers"] == len(docker_env.client.inspect_image(built["tags"][0])["RootFS"]["Layers"])
    sbom = json.loads((tmp_path / result["record"].replace(".json", ".cdx.json")).read_text())
    teams = {c["name"] for c in sbom["components"] if {"name": "ascendkit:component", "value": "team"} in c.get("properties", [])}
    assert teams == {"pyfiglet", "tabulate"}
    assert re.fullmatch(r".+@sha256:[0-9a-f]{64}|sha256:[0-9a-f]{64}", result["base"])
    assert not docker_env.containers() - containers, "the build and its checks leave no container"
    (ref,) = result["tags"]
    assert _tags(docker_env, f"acme/team-it-{RUN}") == [ref], "the unverified tag is gone"
    config = docker_env.client.inspect_image(ref)["Config"]
    assert config["Labels"]["io.ascendkit.team"] == f"acme/team-it-{RUN}"
    assert config["Labels"]["io.ascendkit.stack"] == "teststack", "the base's labels stay: it is still the base's stack"
    assert config["Labels"]["org.opencontainers.image.version"].startswith("team-acme-team-it-"), "its own version, not the base's"
    assert "TEAM_REWARD=/opt/team/rewards/math.py" in config["Env"]
    assert config["User"] == docker_env.client.inspect_image(built["tags"][0])["Config"]["User"]
    assert "def compute_score" in _python_in(docker_env, ref, "import tabulate, pyfiglet; print(open('/opt/team/rewards/math.py').read())")
    # a change of the team's code: a new tag, and only the files' layer is new (the packages' layer is reused)
    (tmp_path / "rewards" / "math.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    again = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    (ref2,) = json.loads(again.stdout)["tags"]
    assert ref2 != ref, "the tag names the team's files too"
    before, after = (docker_env.client.inspect_image(r)["RootFS"]["Layers"] for r in (ref, ref2))
    assert len(before) == len(after) and before[:-1] == after[:-1] and before[-1] != after[-1]


@pytest.mark.engine_20_10
@pytest.mark.engine_overlay2
def test_two_clean_builds_of_a_team_image_publish_one_image(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """The team's layers reproduce as the reference image's do: built from nothing (no cache) and published, then
    `ascendkit rebuild` in the team's repository builds it again from nothing, from what its provenance records, and
    publishes it beside: the same manifest digest; else the files that differ are named."""
    team_repo(tmp_path, TEAM.replace("acme/verl-math", f"acme/team-twice-{RUN}"))
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    # BuildKit where the engine gives it; the classic builder on Docker 20.10, where users still run it
    builder = "classic" if engine_name(docker_env) == "docker-20.10" else "buildkit"
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)  # the pip cache too
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], "--no-cache", "--builder", builder, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (ref,) = json.loads(done.stdout)["tags"]
    assert json.loads((tmp_path / json.loads(done.stdout)["record"]).read_text())["builder"]["name"] == builder
    target = f"{docker_env.registry}/team-twice-{RUN}"
    pushed = docker_env.ascendkit("publish", ref, "--registry", target, "--no-index", "--json", cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    (outcome,) = json.loads(pushed.stdout)
    docker_env.client.remove_image(ref)  # the rebuild starts from the base alone
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)
    again = f"{target}-rebuilt"
    rebuild = ["rebuild", outcome["pushed"][0]["ref"], "--to", again, "--matrix", str(TEST_MATRIX), "--json"]
    rebuilt = docker_env.ascendkit(*rebuild, cwd=tmp_path)
    assert rebuilt.returncode in (0, 1), rebuilt.stderr[-3000:]
    said = json.loads(rebuilt.stdout)
    assert said["inputs"]["team"] == f"acme/team-twice-{RUN}" and said["inputs"]["builder"] == builder, said["inputs"]
    assert said["rebuilt"].startswith(f"{again}@") and said["build"]["tags"][0].startswith(f"acme/team-twice-{RUN}-rebuilt:")
    if not said["same"]:
        pytest.fail(f"two clean builds of one team image published two images:\n{json.dumps(said['differences'], indent=1)[-4000:]}")
    assert rebuilt.returncode == 0 and said["original"] == f"{target}@{published_digest(outcome)}"


def test_a_local_team_image_is_rebuilt_from_its_record_and_a_changed_repository_is_refused_before_anything_is_built(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """A team image not yet published: rebuilt from its build record (published beside it first, as `publish` would),
    tagged apart; the original's tag and record stay. The team's files changed since: refused (exit 2), nothing built."""
    team_repo(tmp_path, TEAM.replace("acme/verl-math", f"acme/team-again-{RUN}"))
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (ref,) = json.loads(done.stdout)["tags"]
    record = (tmp_path / json.loads(done.stdout)["record"]).read_text()
    target = f"{docker_env.registry}/team-again-{RUN}"
    rebuild = ["rebuild", ref, "--to", target, "--matrix", str(TEST_MATRIX), "--json"]
    rebuilt = docker_env.ascendkit(*rebuild, cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr[-3000:]
    said = json.loads(rebuilt.stdout)
    assert said["same"] and said["zstd"][0] == said["zstd"][1], said
    assert (tmp_path / json.loads(done.stdout)["record"]).read_text() == record, "the original's record is as it was"
    assert (tmp_path / "manifests" / "rebuilt" / f"{ref.rsplit(':', 1)[1]}.json").is_file()
    assert _tags(docker_env, f"acme/team-again-{RUN}") == [ref]
    (tmp_path / "rewards" / "math.py").write_text("def compute_score(*args, **kwargs):\n    return 1.0\n")
    docker_env.client.remove_image(said["build"]["tags"][0])
    containers = docker_env.containers()
    refused = docker_env.ascendkit(*rebuild, cwd=tmp_path)
    assert refused.returncode == ExitCode.INVALID_INPUT, refused.stderr[-3000:]
    assert "the team's files (rewards) are not the ones it was built from" in refused.stderr
    assert _tags(docker_env, f"acme/team-again-{RUN}-rebuilt") == [] and docker_env.containers() == containers, "nothing built"


def test_a_team_built_for_both_arches_is_one_version_published_under_one_multi_arch_index(
    docker_env: DockerEnv, built: dict[str, Any], built_arm64: dict[str, Any], tmp_path: Path
) -> None:
    """`arches: [x86_64, aarch64]`: a lock and a build per arch (aarch64's on the test stack's arm64 image, its steps and
    checks under qemu), each image named by both locks, so both carry one version; `publish` of the two writes one
    index over both, as a reference image's. A third arch's lock missing is refused before anything is built."""
    name = f"acme/team-arches-{RUN}"
    team_repo(tmp_path, TEAM.replace("acme/verl-math", name) + "arches: [x86_64, aarch64]\n")
    refs, bases = {}, {"x86_64": built["tags"][0], "aarch64": built_arm64["tags"][0]}
    assert _team(docker_env, tmp_path, "lock", "--arch", "x86_64").returncode == 0
    early = _team(docker_env, tmp_path, "build", "--arch", "x86_64", "--base-image", bases["x86_64"])
    assert early.returncode == ExitCode.CHECK_FAILED, early.stderr[-3000:]
    assert "ascendkit-team-aarch64.lock is missing" in early.stderr, "each image is named by both locks: aarch64's is not there yet"
    locked = _team(docker_env, tmp_path, "lock", "--arch", "aarch64")
    assert locked.returncode == 0, locked.stderr[-3000:]
    for arch, base in bases.items():
        done = _team(docker_env, tmp_path, "build", "--arch", arch, "--base-image", base, "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        (refs[arch],) = json.loads(done.stdout)["tags"]
        assert docker_env.client.inspect_image(refs[arch])["Architecture"] == {"x86_64": "amd64", "aarch64": "arm64"}[arch]
    version = refs["x86_64"].rsplit(":", 1)[1].removesuffix("-x86_64")
    assert refs["aarch64"] == f"{name}:{version}-aarch64", "one version for both arches"
    target = f"{docker_env.registry}/team-arches-{RUN}"
    published = docker_env.ascendkit("publish", refs["x86_64"], refs["aarch64"], "--registry", target, "--json", cwd=tmp_path)
    assert published.returncode == 0, published.stderr[-3000:]
    outcomes = json.loads(published.stdout)
    listed = Registry(docker_env.registry).get_manifest(f"team-arches-{RUN}", version)
    assert listed is not None and listed.is_index
    platforms = {m["platform"]["architecture"]: m["digest"] for m in listed.json()["manifests"]}
    assert platforms == {"amd64": published_digest(outcomes[0]), "arm64": published_digest(outcomes[1])}
    wrong = _team(docker_env, tmp_path, "check", "--arch", "riscv64")
    assert wrong.returncode == ExitCode.INVALID_INPUT


def test_a_lock_the_base_refuses_at_install_fails_the_build_and_leaves_no_tag(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """A team lock edited by hand to move a base package (attrs, which the stand-in of torch_npu requires): the base's
    own sections, given to uv as constraints, refuse it at install; nothing is tagged, no container is left."""
    team_repo(tmp_path, TEAM.replace("acme/verl-math", f"acme/team-moved-{RUN}"))
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    lock = tmp_path / "ascendkit-team-x86_64.lock"
    text = lock.read_text()
    text = re.sub(r"tabulate==0\.9\.0 \\\n(    --hash=[^\n]+\n)+", "attrs==23.2.0 \\\\\n    --hash=sha256:" + "0" * 64 + "\n", text)
    lock.write_text(text)  # the header's inputs still match: the lock reads as fresh
    containers = docker_env.containers()
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0])
    assert done.returncode == 5, done.stderr[-3000:]
    assert "you require attrs==23.2.0 and attrs==21.4.0" in done.stderr, "refused by the base's own pins, not by the fake hash"
    assert _tags(docker_env, f"acme/team-moved-{RUN}") == []
    assert not docker_env.containers() - containers


def test_a_replace_moves_the_one_package_it_names_and_every_other_base_pin_holds(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """`replace:` tomli (a base pin nothing else needs): the team's install gets the base's sections without its entry,
    so uv installs the team's version and still holds every other pin; the base's sections stay as they were, the
    constraints doctor checks name the new version, and the record and labels carry the reason."""
    reason = "the team's config loader needs tomli 2.0.1"
    team = TEAM.replace("acme/verl-math", f"acme/team-replace-{RUN}").replace("packages:\n", "packages:\n  - tomli==2.0.1\n", 1)
    team_repo(tmp_path, team + f"replace:\n  tomli: {reason}\n")
    locked = _team(docker_env, tmp_path, "lock")
    assert locked.returncode == 0, locked.stderr[-3000:]
    assert f"# replaces: tomli 2.0.0 -> 2.0.1: {reason}" in (tmp_path / "ascendkit-team-x86_64.lock").read_text()
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    record = json.loads((tmp_path / result["record"]).read_text())
    assert record["team"]["replaces"] == {"tomli": {"base": "2.0.0", "team": "2.0.1", "reason": reason}}
    assert {c["name"]: c["status"] for c in record["doctor"]["checks"]}["pinned packages"] == "ok", "doctor in the image holds 2.0.1"
    (ref,) = result["tags"]
    assert docker_env.client.inspect_image(ref)["Config"]["Labels"]["io.ascendkit.team.replaces.tomli"] == reason
    probe = (
        "import glob, importlib.metadata as md; print(md.version('tomli'), md.version('attrs'));"
        "print(sum(open(p).read().count('tomli==2.0.0') for p in glob.glob('/etc/ascendkit/locks/*-x86_64.txt')));"
        "print(len(glob.glob('/tmp/ascendkit-held')))"
    )
    said = _python_in(docker_env, ref, probe).split()
    assert said == ["2.0.1", "21.4.0", "1", "0"], "tomli moved, attrs held, the base's section as it was, nothing left in /tmp"


def test_a_stale_lock_or_another_stacks_base_is_refused_before_anything_is_built(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    team_repo(tmp_path, TEAM.replace("acme/verl-math", f"acme/team-stale-{RUN}"))
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    (tmp_path / "requirements-team.txt").write_text("pyfiglet==1.0.1\n")
    stale = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0])
    assert stale.returncode == 1 and "is stale: run `ascendkit team lock" in stale.stderr
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    other = _team(docker_env, tmp_path, "build", "--base-image", docker_env.standin)
    assert other.returncode == 2 and f"but {docker_env.standin} is not an ascendkit image" in other.stderr
    with pytest.raises(ImageNotFound):
        docker_env.client.inspect_image(f"acme/team-stale-{RUN}")


def test_a_team_file_written_over_a_base_distribution_fails_the_check_and_the_image_goes(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """The team's files COPYed over the framework's own package (idna stands in for verl): its versions and RECORD are
    unchanged, the file on disk is not. The check names it (exit 6); nothing is tagged and the image is removed."""
    client = docker_env.client
    site = _python_in(docker_env, built["tags"][0], "import idna, os; print(os.path.dirname(idna.__file__))").strip().splitlines()[-1]
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "core.py").write_text("# the team's own idna core, written over the base's\n")
    team = TEAM.replace("acme/verl-math", f"acme/team-over-{RUN}").replace(
        "  - {src: rewards, dest: /opt/team/rewards}", f"  - {{src: evil, dest: {site}}}"
    )
    team_repo(tmp_path, team)
    assert _team(docker_env, tmp_path, "lock").returncode == 0
    images = {image["Id"] for image in client.images(all=True)}
    containers = docker_env.containers()
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0])
    assert done.returncode == 6, done.stderr[-3000:]
    assert "idna 3.7: its files differ from the base's" in done.stderr
    assert _tags(docker_env, f"acme/team-over-{RUN}") == []
    assert not docker_env.containers() - containers
    left = {image["Id"] for image in client.images(all=True)} - images
    assert not [i for i in left if client.inspect_image(i)["Config"]["Labels"].get("io.ascendkit.team") == f"acme/team-over-{RUN}"]


def _fork_repository(root: Path, *, ships: tuple[str, ...] = ()) -> str:
    """A verl fork as a team keeps one: here idna (the test stack's stand-in for verl) at a version of its own, with a
    requirement the base lacks; ``ships`` adds packages of that name to its wheel. A bare repository; its commit."""
    tree = root / "fork-tree"
    for package in ("idna", *ships):
        (tree / package).mkdir(parents=True)
        (tree / package / "__init__.py").write_text('__version__ = "3.7+acme.1"\nACME_FORK = True\n')
    packages = ", ".join(f'"{p}"' for p in ("idna", *ships))
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "idna"\nversion = "3.7+acme.1"\ndependencies = ["tabulate==0.9.0"]\n\n'
        f"[tool.setuptools]\npackages = [{packages}]\n"
    )
    return make_repository(tree, root / "acme" / "verl.git", "the team's fork of the framework")


def test_a_fork_that_ships_the_triton_ascend_stand_ins_tree_is_refused_before_anything_is_built(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """wcwidth stands in for triton-ascend in the test stack: a fork whose wheel carries a wcwidth/ tree is a fork that
    ships triton/. Refused before the build (exit 1), naming the file and its owner; nothing built, tagged or left."""
    commit = _fork_repository(tmp_path / "git", ships=("wcwidth",))
    with serve(tmp_path / "git") as url:
        fork = f"framework:\n  git: {url}/acme/verl.git\n  commit: {commit}\n  replaces: verl\nenv:"
        team_repo(tmp_path / "team", TEAM.replace("acme/verl-math", f"acme/team-triton-{RUN}").replace("env:", fork, 1))
        assert _team(docker_env, tmp_path / "team", "lock").returncode == 0
    images = {image["Id"] for image in docker_env.client.images(all=True)}
    containers = docker_env.containers()
    done = _team(docker_env, tmp_path / "team", "build", "--base-image", built["tags"][0])
    assert done.returncode == 1, done.stderr[-3000:]
    assert "refused before anything is built: the fork would write files the base owns" in done.stderr
    assert re.search(
        r"/wcwidth/__init__\.py: the fork's wheel idna-3\.7\+acme\.1-py3-none-any\.whl writes it, and the base's wcwidth", done.stderr
    )
    assert not {image["Id"] for image in docker_env.client.images(all=True)} - images, "nothing was built"
    assert not docker_env.containers() - containers


def test_a_team_package_that_ships_the_triton_ascend_stand_ins_tree_is_refused_before_anything_is_built(
    docker_env: DockerEnv,
    built: dict[str, Any],
    tmp_path: Path,
    index: tuple[str, Any],  # noqa: F811  # the fixture imported above
) -> None:
    """An index package under its own name that carries the base's wcwidth/ (triton-ascend's stand-in) tree, served
    by a simple index as a mirror would: locked by uv, then refused by the build before anything is built (exit 1),
    naming the file, the package, who asked and the owner; nothing built, tagged or left."""
    url, _ = index
    mirrors = ("--pip-index-url", url, "--pytorch-index-url", url)
    text = TEAM.replace("acme/verl-math", f"acme/team-kernels-{RUN}").replace("  - tabulate==0.9.0", "  - acme-kernels==1.0")
    team_repo(tmp_path, text.replace("requirements: [requirements-team.txt]\n", ""))
    locked = _team(docker_env, tmp_path, "lock", *mirrors)
    assert locked.returncode == 0, locked.stderr[-3000:]
    images = {image["Id"] for image in docker_env.client.images(all=True)}
    containers = docker_env.containers()
    done = _team(docker_env, tmp_path, "build", "--base-image", built["tags"][0], *mirrors)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "refused before anything is built: the team's packages would write files the base owns" in done.stderr
    assert re.search(
        r"/wcwidth/__init__\.py: acme-kernels 1\.0 \(asked for by ascendkit-team\.yaml[^;]*; wheel acme_kernels-1\.0-py3-none-any\.whl\) "
        r"writes it, and the base's wcwidth owns it",
        done.stderr,
    ), done.stderr[-2000:]
    assert not {image["Id"] for image in docker_env.client.images(all=True)} - images, "nothing was built"
    assert not docker_env.containers() - containers
    assert _tags(docker_env, f"acme/team-kernels-{RUN}") == []


def test_a_framework_fork_at_a_commit_is_built_to_a_wheel_locked_by_hash_and_replaces_the_bases_framework(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    commit = _fork_repository(tmp_path / "git")
    with serve(tmp_path / "git") as url:
        fork = f"framework:\n  git: {url}/acme/verl.git\n  commit: {'b' * 40}\n  replaces: verl\nenv:"
        team_repo(tmp_path / "team", TEAM.replace("acme/verl-math", f"acme/team-fork-{RUN}").replace("env:", fork, 1))
        missing = _team(docker_env, tmp_path / "team", "lock")
        assert missing.returncode == 2 and f"framework.commit {'b' * 40} is not in {url}/acme/verl.git" in missing.stderr
        team_repo(
            tmp_path / "team", TEAM.replace("acme/verl-math", f"acme/team-fork-{RUN}").replace("env:", fork.replace("b" * 40, commit), 1)
        )
        locked = _team(docker_env, tmp_path / "team", "lock", "--json")
    assert locked.returncode == 0, locked.stderr[-3000:]
    lock = (tmp_path / "team" / "ascendkit-team-x86_64.lock").read_text()
    (wheel,) = (tmp_path / "team" / ".ascendkit" / "wheels").glob("*.whl")
    assert wheel.name == "idna-3.7+acme.1-py3-none-any.whl"
    assert f"idna==3.7+acme.1 \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}" in lock
    assert f"@{commit}" in lock and "# replaces: idna 3.7 -> 3.7+acme.1: the team's framework fork" in lock
    done = _team(docker_env, tmp_path / "team", "build", "--base-image", built["tags"][0], "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (ref,) = json.loads(done.stdout)["tags"]
    labels = docker_env.client.inspect_image(ref)["Config"]["Labels"]
    assert labels["io.ascendkit.team.framework"] == f"idna==3.7+acme.1 from {url}/acme/verl.git@{commit}"
    record = json.loads((tmp_path / "team" / json.loads(done.stdout)["record"]).read_text())["team"]
    assert record["framework"] == {"pin": "idna==3.7+acme.1", "git": f"{url}/acme/verl.git", "commit": commit}
    assert record["replaces"] == {"idna": {"base": "3.7", "team": "3.7+acme.1", "reason": "the team's framework fork"}}
    assert "idna" in record["checks"]["imported"]
    probe = (
        "import idna, importlib.metadata as md; assert idna.ACME_FORK; print(md.version('idna'));"
        "print(open('/etc/ascendkit/constraints.txt').read().count('idna=='))"
    )
    assert _python_in(docker_env, ref, probe).split() == ["3.7+acme.1", "1"]
    _published_signed_and_verified(docker_env, built, ref, f"{url}/acme/verl.git@{commit}", tmp_path)
    _smoked(docker_env, ref, tmp_path)
    with zipfile.ZipFile(wheel) as original:  # a wheel by the same name with one file more: not the one locked
        entries = {name: original.read(name) for name in original.namelist()}
    with zipfile.ZipFile(wheel, "w") as swapped:
        for name, data in {**entries, "idna/extra.py": b"EXTRA = 1\n"}.items():
            swapped.writestr(name, data)
    other = _team(docker_env, tmp_path / "team", "build", "--base-image", built["tags"][0])
    assert other.returncode == 2 and f"{wheel.name}: not the wheel ascendkit-team-x86_64.lock locked" in other.stderr
    wheel.unlink()
    gone = _team(docker_env, tmp_path / "team", "build", "--base-image", built["tags"][0])
    assert gone.returncode == 2 and "the fork's wheel is not there" in gone.stderr


def _smoked(docker_env: DockerEnv, ref: str, tmp_path: Path) -> None:
    """`ascendkit smoke` takes the team image as it takes a reference one: the configuration check runs the job's module
    with the image's framework, which is the team's fork (the test stack's stand-in fork is idna, so it says verl is
    not there: the check ran in this image); doctor's preflight then runs in the team image, as its user, and holds
    the image's pins, the fork's replaced one among them; the team's reward function rides on the job."""
    reward = "custom_reward_function.path=/opt/team/rewards/math.py"
    smoke = ["smoke", "--matrix", str(TEST_MATRIX), "--hw", "a3", "--image", ref, "--override", reward, "--timeout", "300"]
    before = docker_env.containers()
    checked = docker_env.ascendkit(*smoke, "--out", str(tmp_path / "smoke-check"), cwd=tmp_path)
    assert checked.returncode == ExitCode.CHECK_FAILED, checked.stderr[-3000:]
    assert "config check: verl is not installed in this image (No module named 'verl')" in checked.stderr
    check = json.loads((tmp_path / "smoke-check" / "report.json").read_text())["config_check"]
    assert check["command"][:3] == ["python3", "-m", "verl.trainer.main_ppo"] and reward in check["command"], check["command"]
    preflight = docker_env.ascendkit(*smoke, "--no-config-check", "--out", str(tmp_path / "smoke"), cwd=tmp_path)
    assert preflight.returncode == ExitCode.NO_DEVICES, preflight.stderr[-3000:]
    report = json.loads((tmp_path / "smoke" / "report.json").read_text())
    doctor = {c["name"]: c for c in report["doctor"]["checks"]}
    assert doctor["pinned packages"]["status"] == "ok", doctor["pinned packages"]
    assert reward in report["job"]["command"], "the team's reward function is the job's"
    assert docker_env.containers() == before, "smoke's containers were removed"


def published_digest(outcome: dict[str, Any]) -> str:
    """The per-arch image's digest as `publish --json` said it."""
    return str(outcome["pushed"][0]["digest"])


def _published_signed_and_verified(docker_env: DockerEnv, built: dict[str, Any], ref: str, fork: str, tmp_path: Path) -> None:
    """What comes after a build takes the team image as it takes a reference one: published with its SBOM, signed with
    its provenance; `ascendkit verify`, with no engine, holds it to the matrix stack its base is, the fork named as the
    escape it is; `sbom diff` against its base lists only what the team changed."""
    env = dataclasses.replace(docker_env, env={**docker_env.env, "COSIGN_PASSWORD": "team images are signed too"})
    env.ascendkit("keygen", "-o", str(tmp_path / "keys"), cwd=tmp_path, check=True)
    target, tag = f"{docker_env.registry}/team-fork-{RUN}", ref.rsplit(":", 1)[1]
    key = str(tmp_path / "keys" / "cosign.key")
    published = env.ascendkit("publish", ref, "--registry", target, "--sign-key", key, "--json", cwd=tmp_path / "team")
    assert published.returncode == 0, published.stderr[-3000:]
    (outcome,) = json.loads(published.stdout)
    assert [p["ref"].split("@")[0] for p in outcome["index"]] == [f"{target}:{tag.removesuffix('-x86_64')}"], "its own one-arch index"
    no_engine = {**env.env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    pub = str(tmp_path / "keys" / "cosign.pub")
    verify = ["verify", f"{target}:{tag.removesuffix('-x86_64')}", "--key", pub, "--matrix", str(TEST_MATRIX), "--json"]
    verified = dataclasses.replace(env, env=no_engine).ascendkit(*verify, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    checks = {c["name"].split()[0]: c for c in json.loads(verified.stdout)["checks"]}
    assert {"signature", "provenance", "sbom", "matrix"} <= set(checks)
    assert f"team acme/team-fork-{RUN} on stack teststack" in checks["matrix"]["detail"]
    assert "replaced: idna 3.7 -> 3.7+acme.1 (the team's framework fork)" in checks["matrix"]["detail"]
    copy = f"{docker_env.registry2}/team-fork-{RUN}"
    mirrored = env.ascendkit("mirror", verify[1], copy, "--sign-key", key, cwd=tmp_path)  # signed for its new home
    assert mirrored.returncode == 0, mirrored.stderr[-3000:]
    copied = [verify[0], f"{copy}:{tag.removesuffix('-x86_64')}", *verify[2:]]
    again = dataclasses.replace(env, env=no_engine).ascendkit(*copied, cwd=tmp_path)
    assert again.returncode == 0, "the mirror's copy verifies as the original: " + again.stdout[-3000:]
    shown = env.ascendkit("sbom", f"{target}:{tag}", "--provenance", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    definition = json.loads(shown.stdout)["predicate"]["buildDefinition"]
    dependencies = {d["name"]: d for d in definition["resolvedDependencies"]}
    base_digest = "sha256:" + dependencies["base-image"]["digest"]["sha256"]
    assert base_digest in (docker_env.client.inspect_image(built["tags"][0])["Id"], built["pushed"][0]["digest"])
    assert dependencies["git:idna"]["uri"] == f"git+{fork}", "the fork at its commit"
    lock = hashlib.sha256((tmp_path / "team" / "ascendkit-team-x86_64.lock").read_bytes()).hexdigest()
    assert dependencies["lock:ascendkit-team-x86_64.lock"]["digest"] == {"sha256": lock}
    assert definition["externalParameters"]["team"]["replaces"]["idna"]["team"] == "3.7+acme.1"
    reward = "custom_reward_function.path=/opt/team/rewards/math.py"  # the team's reward function, where its files put it
    render = ["k8s", "render", "--hw", "a3", "--image", f"{target}:{tag}", "--override", reward, "--matrix", str(TEST_MATRIX)]
    rendered = env.ascendkit(*render, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    pinned = f"image: {target}:{tag}@{published_digest(outcome)}"
    assert pinned in rendered.stdout and reward in rendered.stdout, "the job runs the team image by digest, with the team's reward"
    base = f"{docker_env.registry}/{built['repo']}:{built['tags'][0].rsplit(':', 1)[1]}"
    changed = env.ascendkit("sbom", "diff", base, f"{target}:{tag}", "--json", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr[-3000:]
    found = json.loads(changed.stdout)
    assert {(a["name"], a["version"], a["pin"]) for a in found["added"]} == {("pyfiglet", "1.0.2", "team"), ("tabulate", "0.9.0", "team")}
    assert found["removed"] == []
    changes = {c["kind"]: c for c in found["changed"]}
    assert len(found["changed"]) == 2, found["changed"]
    assert (changes["python"]["name"], changes["python"]["from"], changes["python"]["to"]) == ("idna", "3.7", "3.7+acme.1")
    assert changes["base image"]["to"] == base_digest, "the base it was built on, by digest"


def test_a_published_image_is_a_base_without_any_matrix_stack_and_a_foreign_image_is_refused(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """`base: {image: REF}`: the stack, its locks, indexes and framework read from the image itself, as a team with a
    pip-installed ascendkit and no checkout has them; the same lock and the same check as from the matrix's stack."""
    image = built["tags"][0]
    team = TEAM.replace("acme/verl-math", f"acme/team-image-{RUN}").replace("  stack: teststack\n  sku: a3\n", f"  image: {image}\n")
    team_repo(tmp_path, team)
    locked = _team(docker_env, tmp_path, "lock")
    assert locked.returncode == 0, locked.stderr[-3000:]
    lock = (tmp_path / "ascendkit-team-x86_64.lock").read_text()
    assert f"# base: stack teststack, image {image}, lock sha256:" in lock
    assert "tabulate==0.9.0" in lock and "pyfiglet==1.0.2" in lock
    assert _team(docker_env, tmp_path, "check").returncode == 0
    done = _team(docker_env, tmp_path, "build", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(json.loads(done.stdout)["added"]) == ["pyfiglet==1.0.2", "tabulate==0.9.0"]
    foreign = TEAM.replace("  stack: teststack\n  sku: a3\n", f"  image: {docker_env.standin}\n")
    team_repo(tmp_path / "foreign", foreign)
    refused = _team(docker_env, tmp_path / "foreign", "lock")
    assert refused.returncode == 2 and "is not an ascendkit image" in refused.stderr
