"""Publishing against the real local registry: digest round trip, index refusal, arm64 index."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.ship.registry import DOCKER_LIST, Registry
from tests.conftest import TEST_MATRIX, DockerEnv

pytestmark = pytest.mark.docker


def test_push_delete_pull_by_digest_round_trip(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    client = docker_env.client
    digest = built["pushed"][0]["digest"]
    before = client.inspect_image(built["image_id"])
    client.remove_image(built["image_id"], force=True, noprune=True)  # every local tag goes
    assert client.images(name="ascendkit/verl") == [] or all(built["image_id"] != i["Id"] for i in client.images())
    repository = f"{docker_env.registry}/{built['repo']}"
    client.pull(repository, tag=digest)
    after = client.inspect_image(f"{repository}@{digest}")
    assert after["Id"] == built["image_id"]  # same config digest
    assert after["Config"]["Labels"] == before["Config"]["Labels"]
    for ref in built["tags"]:  # put the local tags back for the other tests
        name, tag = ref.rsplit(":", 1)
        client.tag(after["Id"], name, tag)


def test_index_refused_while_an_arch_is_missing(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", f"{docker_env.registry}/{built['repo']}", cwd=built["workdir"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED
    assert "refusing to publish the multi-arch index" in proc.stderr and "no aarch64 image" in proc.stderr
    registry = Registry(docker_env.registry)
    index_name = built["tags"][0].rsplit(":", 1)[1].removesuffix("-x86_64")
    assert registry.get_manifest(built["repo"], index_name) is None
    assert registry.get_manifest(built["repo"], f"{index_name}-x86_64") is not None


def test_publish_needs_a_passed_build_manifest(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()  # a manifest folder without this image's manifest
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", f"{docker_env.registry}/other", cwd=tmp_path)
    assert proc.returncode == ExitCode.PUBLISH_FAILED
    assert "no build manifest" in proc.stderr and "only verified images are published" in proc.stderr
    proc = docker_env.ascendkit("publish", docker_env.standin, "--registry", f"{docker_env.registry}/other", cwd=tmp_path)
    assert proc.returncode == ExitCode.INVALID_INPUT
    assert "was not built by ascendkit" in proc.stderr
    assert Registry(docker_env.registry).get_manifest("other", "latest-a3-x86_64") is None


def test_definitive_push_failure_reports_nothing_published(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", "127.0.0.1:9/nowhere", cwd=built["workdir"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED
    assert "push of 127.0.0.1:9/nowhere:" in proc.stderr and "failed after" in proc.stderr
    assert "pushed " not in proc.stderr


def test_arm64_build_completes_the_multi_arch_index(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    standin_arm64 = os.environ.get("ASCENDKIT_STANDIN_IMAGE_ARM64")
    if not standin_arm64:
        pytest.skip("no arm64 stand-in: `make test` makes one when ASCENDKIT_ARM64=1 (qemu emulation)")
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "aarch64", "--matrix", str(TEST_MATRIX), "--base-image", standin_arm64,
        "--push", "--registry", f"{docker_env.registry}/{built['repo']}", "--json", "-q",
        cwd=built["workdir"], check=True,
    )  # fmt: skip
    result = json.loads(proc.stdout)
    assert result["arch"] == "aarch64" and result["index_missing"] == []
    index_refs = [p["ref"].split("@")[0].rsplit(":", 1)[1] for p in result["index"]]
    # the arch-less names: the full tag and the aliases (teststack is its matrix's default: latest too)
    assert index_refs == [
        "verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11",
        "teststack-a3-debian12",
        "teststack-a3",
        "latest-a3",
    ]
    assert len({p["digest"] for p in result["index"]}) == 1
    registry = Registry(docker_env.registry)
    index = registry.get_manifest(built["repo"], "verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11")
    assert index is not None and index.media_type == DOCKER_LIST
    platforms = {m["platform"]["architecture"]: m["digest"] for m in index.json()["manifests"]}
    assert platforms == {"amd64": built["pushed"][0]["digest"], "arm64": result["pushed"][0]["digest"]}
