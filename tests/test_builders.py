"""Both builders on the real engine: BuildKit (buildx, the default) and the classic builder give the
same packages; BuildKit's pip cache is a mount, never a layer; its registry cache makes an engine
that has nothing cached build from the registry."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from buildkit.image.probe import run_in_image
from tests.conftest import TEST_MATRIX, DockerEnv
from tests.imagescan import saved_entries

pytestmark = pytest.mark.docker

CACHE_DIR = "var/cache/ascendkit"


def _build(env: DockerEnv, workdir: Path, *args: str) -> dict[str, Any]:
    argv = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", env.standin, "--json", "-q"]
    result: dict[str, Any] = json.loads(env.ascendkit(*argv, *args, cwd=workdir, check=True).stdout)
    return result


def _distributions(env: DockerEnv, image: str) -> list[str]:
    """`pip list --format=freeze` inside the image: every distribution and its version."""
    code, out, err = run_in_image(env.client, image, ["python3", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"])
    assert code == 0, err
    return sorted(line for line in out.splitlines() if "==" in line)


def _buildx(env: DockerEnv, *args: str) -> str:
    command = os.environ.get("ASCENDKIT_BUILDX")
    assert command, "the services name the docker-buildx the builds use (ASCENDKIT_BUILDX)"
    return subprocess.run([command, *args], env=env.env, capture_output=True, text=True, check=True, timeout=300).stdout


@pytest.mark.engine_20_10
def test_both_builders_install_the_same_packages(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """The classic builder gets the render without BuildKit's mounts: the same distributions at the
    same versions, the same labels, and each manifest names its builder."""
    assert built["builder"] == "buildkit" and built["builder_version"].startswith("buildx ")
    classic = _build(docker_env, tmp_path, "--builder", "classic", "--repo", f"classic-{uuid.uuid4().hex[:6]}/verl")
    assert classic["builder"] == "classic" and classic["notes"] == []
    buildkit_ref, classic_ref = built["tags"][0], classic["tags"][0]
    packages = _distributions(docker_env, buildkit_ref)
    assert "idna==3.7" in packages and packages == _distributions(docker_env, classic_ref)
    labels = [docker_env.client.inspect_image(ref)["Config"]["Labels"] for ref in (buildkit_ref, classic_ref)]
    assert labels[0] == labels[1]
    for result, workdir, name in ((built, built["workdir"], "buildkit"), (classic, tmp_path, "classic")):
        recorded = json.loads((workdir / result["manifest"]).read_text())["builder"]
        assert recorded["name"] == name and recorded["steps_total"] == result["steps_total"] >= 15
    assert json.loads((tmp_path / classic["manifest"]).read_text())["builder"]["version"].startswith("Docker Engine ")


def test_the_pip_cache_is_a_mount_never_a_layer(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """uv's downloads went to BuildKit's cache mount (its record holds them), and no layer of the image
    holds a file under the mount's path."""
    records = _buildx(docker_env, "du", "--verbose")
    mounts = [block for block in records.split("\n\n") if f"/{CACHE_DIR}" in block and "cache" in block.lower()]
    assert mounts, records[-2000:]
    assert any("Size:" in block and "Size:\t\t0B" not in block and "Size: 0B" not in block for block in mounts)
    inside = [entry for _, entry, _ in saved_entries(docker_env.client, built["engine_id"]) if entry.startswith(f"{CACHE_DIR}/")]
    assert inside == [], inside[:10]


def _tags(registry: str, repository: str) -> list[str]:
    with urllib.request.urlopen(f"http://{registry}/v2/{repository}/tags/list", timeout=30) as answer:
        return list(json.load(answer).get("tags") or [])


def _manifest(registry: str, repository: str, tag: str) -> dict[str, Any]:
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, Any] = json.load(answer)
    return result


def test_a_registry_cache_builds_an_engine_with_nothing_cached(docker_env: DockerEnv, tmp_path: Path) -> None:
    """A build exports its cache (mode=max) to the registry, one tag per stack, chip, OS and arch; the
    engine's build cache is then emptied, as on a fresh CI runner; the next build takes every step
    from the registry cache. Needs the containerd image store (buildx's docker driver)."""
    repository = f"cache-{uuid.uuid4().hex[:8]}/verl"
    cache = f"{docker_env.registry}/{repository}"
    first = _build(docker_env, tmp_path, "--cache-repo", cache, "--no-cache", "--repo", "cachefirst/verl")
    tag = "buildcache-teststack-a3-debian12-x86_64"
    assert first["notes"] == [f"the registry cache holds nothing for this image yet ({cache}:{tag}); this build writes it"]
    assert _tags(docker_env.registry, repository) == [tag]
    assert json.loads((tmp_path / first["manifest"]).read_text())["builder"]["cache"] == f"{cache}:{tag}"
    exported = _manifest(docker_env.registry, repository, tag)
    assert "application/vnd.buildkit.cacheconfig.v0" in json.dumps(exported)  # BuildKit's cache, not an image

    _buildx(docker_env, "prune", "--all", "--force")
    again = _build(docker_env, tmp_path, "--cache-repo", cache, "--repo", "cachesecond/verl")
    assert again["steps_cached"] == again["steps_total"] >= 15, again
    assert again["image_id"] != "" and again["notes"] == []


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
