"""Both builders on the real engine: BuildKit (buildx, the default) and the classic builder give the
same packages; BuildKit's pip cache is a mount, never a layer; its registry cache makes an engine
that has nothing cached build from the registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from buildkit.image.buildplan import plan_build
from buildkit.image.context import write_context
from buildkit.image.probe import run_in_image
from buildkit.matrix.load import load_matrix
from tests.conftest import TEST_MATRIX, DockerEnv, SecretBuild
from tests.harness.imagescan import saved_entries

pytestmark = pytest.mark.docker

CACHE_DIR = "var/cache/ascendkit"


def _build(env: DockerEnv, workdir: Path, *args: str, matrix: Path = TEST_MATRIX) -> dict[str, Any]:
    argv = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", env.standin, "--json", "-q"]
    result: dict[str, Any] = json.loads(env.ascendkit(*argv, *args, cwd=workdir, check=True).stdout)
    return result


def _distributions(env: DockerEnv, image: str) -> list[str]:
    """`pip list --format=freeze` inside the image: every distribution and its version."""
    code, out, err = run_in_image(env.client, image, ["python3", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"])
    assert code == 0, err
    return sorted(line for line in out.splitlines() if "==" in line)


@pytest.mark.engine_20_10
@pytest.mark.engine_20_10_only  # the classic build is the secrets test's, made on Docker 20.10 alone (tests/test_build.py)
def test_both_builders_install_the_same_packages(
    docker_env: DockerEnv, built: dict[str, Any], secret_builds: Callable[[str], SecretBuild]
) -> None:
    """The classic builder gets the render without BuildKit's mounts: the same distributions at the
    same versions, the same labels, and each manifest names its builder. The classic build is the
    secrets test's (tests/test_build.py: a CA bundle and credentials served to it, from clean): what
    it is given to reach the index changes nothing it installs or records."""
    assert built["builder"] == "buildkit" and built["builder_version"].startswith("buildx ")
    build = secret_builds("classic")
    classic = build.result
    assert classic["builder"] == "classic" and classic["notes"] == []
    buildkit_ref, classic_ref = built["tags"][0], classic["tags"][0]
    packages = _distributions(docker_env, buildkit_ref)
    assert "idna==3.7" in packages and packages == _distributions(docker_env, classic_ref)
    labels = [docker_env.client.inspect_image(ref)["Config"]["Labels"] for ref in (buildkit_ref, classic_ref)]
    assert labels[0] == labels[1]
    for result, workdir, name in ((built, built["workdir"], "buildkit"), (classic, build.workdir, "classic")):
        recorded = json.loads((workdir / result["manifest"]).read_text())["builder"]
        assert recorded["name"] == name and recorded["steps_total"] == result["steps_total"] >= 15
    assert json.loads((build.workdir / classic["manifest"]).read_text())["builder"]["version"].startswith("Docker Engine ")


def test_a_render_builds_with_a_plain_docker_build(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """What the committed Dockerfile.a2/a3 promise: `docker build` (Docker 23+: BuildKit through
    the CLI's buildx) builds a render with no ascendkit around it and no cache given. The test
    stack's render, by Docker 26's own CLI with its buildx plugin. These machines reach PyPI through a
    TLS-inspecting egress proxy whose CA only the host trusts, so the build is given the host's bundle
    as the render's own secret (`--secret id=ascendkit-ca`), as a user behind such a proxy gives it.
    It shares no step with ascendkit's build of the same render on this engine (Docker 26's BuildKit:
    served secrets, the host's network; buildkit/image/buildx.py): every step runs."""
    cli, plugin = os.environ.get("ASCENDKIT_DOCKER_CLI"), os.environ.get("ASCENDKIT_BUILDX")
    assert cli and plugin, "the services unpack Docker 26's CLI and buildx (ASCENDKIT_DOCKER_CLI, ASCENDKIT_BUILDX)"
    config = tmp_path / "docker-config"
    (config / "cli-plugins").mkdir(parents=True)
    (config / "cli-plugins" / "docker-buildx").symlink_to(plugin)  # where the CLI looks for its plugins
    plan = plan_build(load_matrix(TEST_MATRIX), "a3", arch="x86_64", base_image=docker_env.standin, use_default_ca=False)
    context = tmp_path / "context"
    context.mkdir()
    write_context(plan, context)
    assert "RUN --mount=type=cache" in (context / "Dockerfile").read_text()
    tag = f"plain-{uuid.uuid4().hex[:8]}/verl:latest"
    bundle = docker_env.env.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    argv = [cli, "build", "--build-arg", f"BASE_IMAGE={docker_env.standin}", "--secret", f"id=ascendkit-ca,src={bundle}", "-t", tag]
    argv.append(str(context))
    env = {**docker_env.env, "DOCKER_CONFIG": str(config)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DEPRECATED: The legacy builder" not in proc.stderr  # BuildKit built it, not the classic builder
    try:
        assert _distributions(docker_env, tag) == _distributions(docker_env, built["tags"][0])
    finally:
        docker_env.client.remove_image(tag, noprune=True)


@dataclass(frozen=True)
class UniqueBuild:
    """One BuildKit build of a variant of the test stack no engine holds a cache of, its cache exported."""

    matrix: Path
    workdir: Path
    marker: str  # the names of its own: cache-<marker>/verl, cachefirst-<marker>/verl
    cache: str  # the registry cache's repository, with its registry
    repository: str
    result: dict[str, Any]
    stderr: str


@pytest.fixture(scope="module")
def unique_build(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> UniqueBuild:
    """The build both tests below look at: every step runs (a stack variable of its own, set before every
    RUN), through the pip cache mount, and writes the registry cache. One build, not two: each is a
    minute of the engine's CPU, and neither test's subject changes what the other's sees."""
    workdir = tmp_path_factory.mktemp("unique")
    matrix = _unique_matrix(workdir)
    marker = uuid.uuid4().hex[:12]
    repository = f"cache-{marker}/verl"
    cache = f"{docker_env.registry}/{repository}"
    argv = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin, "--json"]
    proc = docker_env.ascendkit(*argv, "--cache-repo", cache, "--repo", f"cachefirst-{marker}/verl", cwd=workdir, check=True)
    return UniqueBuild(matrix, workdir, marker, cache, repository, json.loads(proc.stdout), proc.stderr)


def test_the_pip_cache_is_a_mount_never_a_layer(docker_env: DockerEnv, unique_build: UniqueBuild) -> None:
    """Every installing step of a BuildKit build finds the cache mount and installs through it, and no
    layer holds a file under its path; the image is one image, not an index with BuildKit's
    attestations (its cache exported to a registry or not)."""
    result = unique_build.result
    assert result["steps_cached"] == 0 and result["builder"] == "buildkit"
    said = unique_build.stderr.count("ascendkit: pip and uv keep their downloads in BuildKit's cache mount /var/cache/ascendkit")
    assert said >= 5, unique_build.stderr[-3000:]  # once per installing step
    saved = list(saved_entries(docker_env.client, result["engine_id"]))
    inside = [entry for _, entry, _ in saved if entry.startswith(f"{CACHE_DIR}/")]
    assert inside == [], inside[:10]
    # one image, not an index with BuildKit's attestations (asked off: ascendkit writes its own SBOM and provenance)
    documents = b" ".join(body for member, entry, body in saved if not entry)
    assert b"vnd.docker.reference.type" not in documents and b"attestation-manifest" not in documents


def _unique_matrix(directory: Path) -> Path:
    """The test matrix with a stack variable of its own, set before every RUN: an image no engine
    holds a cache of, with the test matrix's locks (the variable is not a lock input)."""
    text = TEST_MATRIX.read_text()
    assert 'ASCENDKIT_TEST_STACK: "1"' in text
    matrix = directory / "matrix.yaml"
    matrix.write_text(text.replace('ASCENDKIT_TEST_STACK: "1"', f'ASCENDKIT_TEST_STACK: "{uuid.uuid4().hex[:12]}"', 1))
    shutil.copytree(TEST_MATRIX.parent / "locks", directory / "locks")
    return matrix


def _tags(registry: str, repository: str) -> list[str]:
    with urllib.request.urlopen(f"http://{registry}/v2/{repository}/tags/list", timeout=30) as answer:
        return list(json.load(answer).get("tags") or [])


def _manifest(registry: str, repository: str, tag: str) -> dict[str, Any]:
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, Any] = json.load(answer)
    return result


def test_a_registry_cache_builds_an_engine_with_nothing_cached(docker_env: DockerEnv, unique_build: UniqueBuild) -> None:
    """A build exports its cache (mode=max) to the registry, one tag per stack, chip, OS and arch.
    Another engine that has never built this image (Docker 26 on overlay2: a fresh runner) then
    takes every step from the registry cache, importing only (--cache-import-only: buildx's
    docker driver exports a cache only from the containerd store). The image is made unique by a
    stack variable set before every RUN, so no engine holds a local cache of it, and no engine's
    own cache is pruned under the other tests."""
    first, cache, repository = unique_build.result, unique_build.cache, unique_build.repository
    tag = "buildcache-teststack-a3-debian12-x86_64"
    assert first["steps_cached"] == 0, "nothing of this image was cached anywhere"
    assert first["notes"] == [f"the registry cache holds nothing for this image yet ({cache}:{tag}); this build writes it"]
    assert _tags(docker_env.registry, repository) == [tag]
    recorded = json.loads((unique_build.workdir / first["manifest"]).read_text())["builder"]
    assert recorded["cache"] == f"{cache}:{tag}" and recorded["cache_exported"] is True
    assert "application/vnd.buildkit.cacheconfig.v0" in json.dumps(_manifest(docker_env.registry, repository, tag))

    hosts = dict(pair.split("=", 1) for pair in os.environ.get("ASCENDKIT_ENGINE_HOSTS", "").split(",") if "=" in pair)
    assert "docker-overlay2" in hosts, "the services start Docker 26 on overlay2 (ASCENDKIT_ENGINE_HOSTS)"
    fresh = DockerEnv(
        docker_env.client, docker_env.standin, docker_env.registry, {**docker_env.env, "DOCKER_HOST": hosts["docker-overlay2"]}
    )
    second = unique_build.workdir / "second"
    second.mkdir()
    repo = f"cachesecond-{unique_build.marker}/verl"
    again = _build(fresh, second, "--cache-repo", cache, "--cache-import-only", "--repo", repo, matrix=unique_build.matrix)
    assert again["steps_cached"] == again["steps_total"] >= 15, again
    assert again["notes"] == [] and again["image_id"] != ""
    assert json.loads((second / again["manifest"]).read_text())["builder"]["cache_exported"] is False
    assert _tags(docker_env.registry, repository) == [tag]  # nothing more was exported


def test_an_unreachable_cache_registry_does_not_fail_the_build(docker_env: DockerEnv, tmp_path: Path) -> None:
    """The cache is an optimisation: with its registry down the image is built, verified and tagged,
    and the user is told the cache was neither read nor written."""
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--cache-repo", "127.0.0.1:9/nothing/here", "--repo", "cachedown/verl", "-q",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    assert "ascendkit: note: the registry cache was not read" in proc.stderr
    assert "ascendkit: note: the registry cache was not written" in proc.stderr
    assert "tagged cachedown/verl:" in proc.stderr
