"""Shipping as the CI workflow does it, on the real engine and registry: each arch built and pushed by
digest on its own, the local images removed, the index assembled from the build manifests through
the registry alone, and each member's SBOM read back and diffed."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from buildkit.errors import ExitCode
from buildkit.image.archive import identify
from buildkit.ship.oci.registry import DOCKER_LIST, Registry
from buildkit.trust.keys import generate
from tests.conftest import TEST_MATRIX, DockerEnv, arm64_standin, edit, run_installed, set_aside
from tests.harness import skopeo
from tests.test_workflow import command_lines

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def shipped(docker_env: DockerEnv, built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The test stack built for x86_64 and aarch64 and pushed by digest with --no-index, as the build jobs do."""
    workdir = tmp_path_factory.mktemp("ship")
    repo = f"{docker_env.registry}/ship-{uuid.uuid4().hex[:8]}"
    results = {}
    for arch, base in (("x86_64", docker_env.standin), ("aarch64", arm64_standin())):
        proc = docker_env.ascendkit(
            "build", "--hw", "a3", "--arch", arch, "--matrix", str(TEST_MATRIX), "--base-image", base,
            "--push", "--no-index", "--registry", repo, "--repo", "ascendkit-ship/verl", "--json", "--quiet",
            cwd=workdir, check=True,
        )  # fmt: skip
        results[arch] = json.loads(proc.stdout)
    return {"workdir": workdir, "repo": repo, "results": results, "manifests": workdir / "manifests"}


def _registry(repo: str) -> tuple[Registry, str]:
    host, _, repository = repo.partition("/")
    return Registry(host), repository


def index_name(shipped: dict[str, Any]) -> str:
    return str(shipped["results"]["x86_64"]["tags"][0].rsplit(":", 1)[1].removesuffix("-x86_64"))


def test_build_jobs_push_by_digest_and_leave_the_index(shipped: dict[str, Any]) -> None:
    registry, repository = _registry(shipped["repo"])
    for arch, result in shipped["results"].items():
        assert result["index"] is None and result["digest"]
        manifest = json.loads(Path(shipped["workdir"], result["manifest"]).read_text())
        assert manifest["published"]["digest"] == result["digest"] and manifest["published"]["repository"] == shipped["repo"]
        assert manifest["published"]["sbom"]["attached_as"].startswith("tag sha256-"), arch  # distribution 2.8: no referrers API
    assert registry.get_manifest(repository, index_name(shipped)) is None


SIGNING_PASSWORD = "index job"
SIGNING_KEY, SIGNING_PUB = generate(SIGNING_PASSWORD.encode())  # the registry environment's secrets, as the workflow passes them


def _index_only(docker_env: DockerEnv, manifests: Path, repo: str, *extra: str) -> Any:
    """The index job's own command line from the generated workflow, pointed at this run, with its signing key in env."""
    (line,) = {tuple(argv) for argv in command_lines() if argv[0] == "publish" and "registry.example.com/ml/verl" in argv}
    argv = [str(manifests) if w == "manifests" else repo if w == "registry.example.com/ml/verl" else w for w in line]
    assert "--index-only" in argv and str(manifests) in argv and repo in argv and "env://COSIGN_PRIVATE_KEY" in argv
    env = {**docker_env.env, "COSIGN_PRIVATE_KEY": SIGNING_KEY.decode(), "COSIGN_PASSWORD": SIGNING_PASSWORD}
    return dataclasses.replace(docker_env, env=env).ascendkit(*argv, *extra, cwd=manifests.parent)


def test_index_only_refuses_a_missing_arch_or_a_wrong_digest(docker_env: DockerEnv, shipped: dict[str, Any], tmp_path: Path) -> None:
    registry, repository = _registry(shipped["repo"])
    missing = tmp_path / "missing" / "manifests"
    shutil.copytree(shipped["manifests"], missing)
    for path in missing.glob("*-aarch64.*"):
        path.unlink()
    proc = _index_only(docker_env, missing, shipped["repo"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED and "no aarch64 build manifest" in proc.stderr, proc.stderr
    wrong = tmp_path / "wrong" / "manifests"
    shutil.copytree(shipped["manifests"], wrong)
    (x86,) = [p for p in wrong.glob("*-x86_64.json")]
    data = json.loads(x86.read_text())
    arm_digest = shipped["results"]["aarch64"]["digest"]
    data["published"]["digest"] = arm_digest
    x86.write_text(json.dumps(data))
    proc = _index_only(docker_env, wrong, shipped["repo"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED and "records" in proc.stderr and "publish it again" in proc.stderr, proc.stderr
    for entry in data["published"]["registries"].values():  # every record says the arm64 digest: the registry is asked
        entry["digest"] = entry["gzip"]["digest"] = arm_digest
    x86.write_text(json.dumps(data))
    proc = _index_only(docker_env, wrong, shipped["repo"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED and "holds image" in proc.stderr, proc.stderr
    assert registry.get_manifest(repository, index_name(shipped)) is None  # nothing was pushed


def test_index_only_with_the_images_gone_from_the_engine(docker_env: DockerEnv, shipped: dict[str, Any], tmp_path: Path) -> None:
    client = docker_env.client
    registry, repository = _registry(shipped["repo"])
    results = shipped["results"]
    # A cached build of the same stack is the same image as other tests' (the session's `built`):
    # the very images come back afterwards, with every tag they had.
    with set_aside(client, [r["tags"][0] for r in results.values()], tmp_path):
        assert not {i["Id"] for i in client.images()} & {r["engine_id"] for r in results.values()}
        proc = _index_only(docker_env, shipped["manifests"], shipped["repo"], "--dry-run")
        assert proc.returncode == 0, proc.stderr
        assert "nothing pushed" in proc.stderr and registry.get_manifest(repository, index_name(shipped)) is None
        proc = _index_only(docker_env, shipped["manifests"], shipped["repo"])
        assert proc.returncode == 0, proc.stderr
        (outcome,) = json.loads(proc.stdout)
        assert outcome["members"] == {arch: r["digest"] for arch, r in results.items()}
        assert [p["ref"].split("@")[0].rsplit(":", 1)[1] for p in outcome["index"]] == [
            "verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11",
            "teststack-a3-debian12",
            "teststack-a3",
            "latest-a3",
        ]
        index = registry.get_manifest(repository, index_name(shipped))
        assert index is not None and index.media_type == DOCKER_LIST
        platforms = {m["platform"]["architecture"]: m["digest"] for m in index.json()["manifests"]}
        assert platforms == {"amd64": results["x86_64"]["digest"], "arm64": results["aarch64"]["digest"]}
        assert SIGNING_KEY.decode() not in proc.stdout + proc.stderr and SIGNING_PASSWORD not in proc.stdout + proc.stderr
        # the index job signed the index and both members and attached their provenance: verify with no engine
        pub = shipped["workdir"] / "index-job.pub"
        pub.write_bytes(SIGNING_PUB)
        ref = f"{shipped['repo']}:{index_name(shipped)}"
        checked = docker_env.ascendkit("verify", ref, "--key", str(pub), "--matrix", str(TEST_MATRIX), "--json", cwd=shipped["workdir"])
        assert checked.returncode == 0, checked.stdout + checked.stderr
        names = [c["name"].split()[0] for c in json.loads(checked.stdout)["checks"]]
        assert names.count("signature") == 3 and names.count("provenance") == names.count("matrix") == names.count("sbom") == 2


def test_sbom_of_each_member(docker_env: DockerEnv, shipped: dict[str, Any]) -> None:
    validator = JsonStrictValidator(SchemaVersion.V1_6)
    standin_ids = {"x86_64": identify(docker_env.client, docker_env.standin).config}  # the containerd store's ID is not it
    standin_ids["aarch64"] = identify(docker_env.client, arm64_standin()).config
    for arch, result in shipped["results"].items():
        proc = docker_env.ascendkit("sbom", f"{shipped['repo']}@{result['digest']}", "--json", cwd=shipped["workdir"])
        assert proc.returncode == 0, proc.stderr
        assert validator.validate_str(proc.stdout) is None
        document = json.loads(proc.stdout)
        by_ref = {c["bom-ref"]: c for c in document["components"]}
        torch = [c for c in document["components"] if {"name": "ascendkit:component", "value": "torch"} in c.get("properties", [])]
        assert [(c["name"], c["version"]) for c in torch] == [("tomli", "2.0.0")]  # the test stack's torch pin
        assert torch[0]["hashes"], "the lock's hashes"
        assert by_ref["base:image"]["version"] == standin_ids[arch]  # an imported base: its config digest
        manifest = json.loads(Path(shipped["workdir"], result["manifest"]).read_text())
        assert by_ref["cann:toolkit"]["version"] == manifest["cann"]["version"] == "8.3.RC1"
        assert any(ref.startswith("deb:") for ref in by_ref), "the Debian stand-in's dpkg packages"
    registry, repository = _registry(shipped["repo"])
    index = registry.get_manifest(repository, index_name(shipped))
    assert index is not None
    proc = docker_env.ascendkit("sbom", f"{shipped['repo']}@{index.digest}", "--arch", "aarch64", cwd=shipped["workdir"])
    assert proc.returncode == 0 and "tomli" in proc.stdout and "components" in proc.stdout, proc.stderr
    proc = docker_env.ascendkit("sbom", f"{shipped['repo']}@{index.digest}", cwd=shipped["workdir"])
    assert proc.returncode == 2 and "give --arch" in proc.stderr


def test_sbom_diff_lists_exactly_the_changed_pin(docker_env: DockerEnv, shipped: dict[str, Any], tmp_path: Path) -> None:
    shutil.copytree(TEST_MATRIX.parent, tmp_path / "fixtures")
    matrix = tmp_path / "fixtures" / TEST_MATRIX.name
    matrix.write_text(edit(matrix.read_text(), 'version: "3.7"\n      package: idna', 'version: "3.6"\n      package: idna'))
    docker_env.ascendkit("lock", "--matrix", str(matrix), "--stack", "teststack", cwd=tmp_path, check=True)  # only the changed pin moves
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin,
        "--repo", "ascendkit-diff/verl",  # its own local tags: the other tests' images keep theirs
        "--push", "--no-index", "--registry", shipped["repo"], "--json", "--quiet",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    after = json.loads(proc.stdout)["digest"]
    before = shipped["results"]["x86_64"]["digest"]
    proc = docker_env.ascendkit("sbom", "diff", f"{shipped['repo']}@{before}", f"{shipped['repo']}@{after}", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    change = json.loads(proc.stdout)
    assert change["changed"] == [{"kind": "python", "name": "idna", "from": "3.7", "to": "3.6", "pin": "verl"}]
    assert change["added"] == [] and change["removed"] == []
    proc = docker_env.ascendkit("sbom", "diff", f"{shipped['repo']}@{before}", f"{shipped['repo']}@{after}", cwd=tmp_path)
    assert proc.returncode == 0 and "idna" in proc.stdout and "1 changed" in proc.stdout


def test_sbom_of_a_local_image(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    proc = docker_env.ascendkit("sbom", built["tags"][0], "--json", cwd=built["workdir"])
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["metadata"]["component"]["properties"][0] == {"name": "ascendkit:image-id", "value": built["image_id"]}
    proc = docker_env.ascendkit("sbom", built["tags"][0], cwd=Path(built["workdir"]).parent)
    assert proc.returncode == 2 and "no SBOM at manifests/" in proc.stderr


def _without_engine(docker_env: DockerEnv) -> DockerEnv:
    """The same environment with DOCKER_HOST at a socket nothing listens on."""
    return dataclasses.replace(docker_env, env={**docker_env.env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})


def test_a_registry_tag_is_read_from_the_registry_with_no_engine(docker_env: DockerEnv, shipped: dict[str, Any], tmp_path: Path) -> None:
    """`sbom HOST/REPO:TAG` reads the registry (an index needs --arch) and needs no Docker engine;
    `k8s render --image HOST/REPO:TAG` pins the digest the tag names now."""
    offline = _without_engine(docker_env)
    tag = f"{shipped['repo']}:{index_name(shipped)}"
    proc = offline.ascendkit("sbom", tag, "--arch", "aarch64", cwd=tmp_path)
    assert proc.returncode == 0 and "tomli" in proc.stdout, proc.stderr
    assert shipped["results"]["aarch64"]["digest"] in proc.stdout, "the index's arm64 member, named in the title"
    proc = offline.ascendkit("sbom", tag, cwd=tmp_path)
    assert proc.returncode == 2 and "multi-arch index" in proc.stderr and "give --arch" in proc.stderr
    single = f"{shipped['repo']}:{index_name(shipped)}-x86_64"
    proc = offline.ascendkit("sbom", "diff", single, f"{tag}", "--arch", "x86_64", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["changed"] == [], "the x86_64 tag and the index's x86_64 member are the same image"
    missing = offline.ascendkit("sbom", f"{shipped['repo']}:no-such-tag", cwd=tmp_path)
    assert missing.returncode == 2 and "no such image" in missing.stderr

    registry, repository = _registry(shipped["repo"])
    index = registry.get_manifest(repository, index_name(shipped))
    assert index is not None
    out = tmp_path / "smoke.yaml"
    k8s = ["k8s", "render", "--hw", "a3", "--matrix", str(TEST_MATRIX)]
    proc = offline.ascendkit(*k8s, "--image", tag, "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pinned = f"{tag}@{index.digest}"
    assert f"the manifests pin {pinned}" in proc.stderr
    images = {line.split("image: ", 1)[1].strip() for line in out.read_text().splitlines() if "image: " in line}
    assert images == {pinned}, "every container runs the digest the tag named at render time"
    gone = offline.ascendkit(*k8s, "--image", f"{shipped['repo']}:no-such-tag", cwd=tmp_path)
    assert gone.returncode == 2 and "has no tag 'no-such-tag'" in gone.stderr
    kept = offline.ascendkit(*k8s, "--image", tag, "--allow-tag", cwd=tmp_path)
    assert kept.returncode == 0 and f"image: {tag}\n" in kept.stdout and "mutable tag" in kept.stderr


def test_the_installed_command_in_an_empty_directory_pins_and_reads_a_registry_tag(
    docker_env: DockerEnv, shipped: dict[str, Any], installed: Path, tmp_path: Path
) -> None:
    """As a user with only `pip install` and a published tag: no checkout, no matrix, no Docker engine."""
    env = {**_without_engine(docker_env).env}
    tag = f"{shipped['repo']}:{index_name(shipped)}"
    registry, repository = _registry(shipped["repo"])
    index = registry.get_manifest(repository, index_name(shipped))
    assert index is not None
    out = tmp_path / "train.yaml"
    argv = ["k8s", "render", "--hw", "a3", "--image", tag, "--job", "train", "-o", str(out), "--", "true"]
    proc = run_installed(installed, tmp_path, *argv, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "reading the matrix released with ascendkit" in proc.stderr
    assert f"image: {tag}@{index.digest}\n" in out.read_text()
    table = run_installed(installed, tmp_path, "sbom", tag, "--arch", "aarch64", env=env)
    assert table.returncode == 0 and "tomli" in table.stdout, table.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"], "nothing else written"


def test_index_only_in_two_registries_with_zstd(docker_env: DockerEnv, shipped: dict[str, Any], tmp_path: Path) -> None:
    """The workflow's shape with two registries and zstd: each arch's build job pushes to both (no
    index), the index job publishes both indexes (gzip and -zstd) in both; byte for byte the same."""
    workdir = tmp_path / "two"
    workdir.mkdir()
    repository = f"ship2-{uuid.uuid4().hex[:8]}"
    targets = [f"{docker_env.registry}/{repository}", f"{docker_env.registry2}/{repository}"]
    registries = [w for target in targets for w in ("--registry", target)]
    for arch, base in (("x86_64", docker_env.standin), ("aarch64", arm64_standin())):
        docker_env.ascendkit(
            "build", "--hw", "a3", "--arch", arch, "--matrix", str(TEST_MATRIX), "--base-image", base,
            "--push", "--no-index", *registries, "--compression", "zstd", "--repo", "ascendkit-ship/verl", "--quiet",
            cwd=workdir, check=True,
        )  # fmt: skip
    recorded = json.loads(next((workdir / "manifests").glob("*-aarch64.json")).read_text())["published"]["registries"]
    assert sorted(recorded) == sorted(targets) and all(r["zstd"]["digest"] for r in recorded.values())
    proc = docker_env.ascendkit(
        "publish", "--index-only", "--manifest-dir", "manifests", *registries, "--compression", "zstd", "--json", cwd=workdir
    )
    assert proc.returncode == 0, proc.stderr
    (outcome,) = json.loads(proc.stdout)
    assert [r["registry"] for r in outcome["registries"]] == targets
    name = index_name(shipped)
    for suffix in ("", "-zstd"):
        first, second = (skopeo.raw(f"{target}:{name}{suffix}") for target in targets)
        assert first == second, f"the {name}{suffix} index is byte for byte the same in both registries"
        index = json.loads(first)
        assert index["mediaType"] == (DOCKER_LIST if not suffix else "application/vnd.oci.image.index.v1+json")
        assert {m["platform"]["architecture"] for m in index["manifests"]} == {"amd64", "arm64"}
        assert skopeo.copy_whole(f"{targets[1]}:{name}{suffix}", tmp_path / f"all{suffix}", all_arches=True).returncode == 0
    assert "published to 2 registries" in proc.stderr
