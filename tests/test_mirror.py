"""``ascendkit mirror`` between the two real registries (quay.io and the registry inside China, as
far as this machine goes), with no engine: byte for byte, attachments included, nothing sent twice,
an interrupted copy finished by running it again; checked with skopeo."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.ship.layers.compose import index_manifest
from buildkit.ship.oci.registry import Registry
from buildkit.ship.trust.attach import fallback_tag
from tests.conftest import DockerEnv
from tests.harness import skopeo
from tests.harness.faultproxy import Faults, fault_proxy

pytestmark = pytest.mark.docker


def _without_engine(docker_env: DockerEnv) -> DockerEnv:
    return dataclasses.replace(docker_env, env={**docker_env.env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})


def _mirror(docker_env: DockerEnv, cwd: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    proc = _without_engine(docker_env).ascendkit("mirror", *argv, "--json", cwd=cwd)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else {}), proc.stderr


@pytest.fixture(scope="module")
def source(built: dict[str, Any], docker_env: DockerEnv) -> dict[str, str]:
    tag = built["tags"][0].rsplit(":", 1)[1]
    return {"repo": f"{docker_env.registry}/{built['repo']}", "tag": tag, "digest": built["pushed"][0]["digest"]}


@pytest.mark.engine_20_10
def test_dry_run_then_copy_then_nothing_left_to_send(docker_env: DockerEnv, source: dict[str, str], tmp_path: Path) -> None:
    dst = f"{docker_env.registry2}/mirror-{uuid.uuid4().hex[:8]}"
    src = f"{source['repo']}:{source['tag']}"
    code, dry, err = _mirror(docker_env, tmp_path, src, dst, "--dry-run")
    assert code == 0, err
    assert dry["dry_run"] and dry["blobs"]["sent"] and not dry["blobs"]["present"]
    assert "would send" in err and Registry(docker_env.registry2).tags(dst.split("/", 1)[1]) == [], "a dry run writes nothing"
    code, copied, err = _mirror(docker_env, tmp_path, src, dst)
    assert code == 0, err
    assert [b["digest"] for b in copied["blobs"]["sent"]] == [b["digest"] for b in dry["blobs"]["sent"]], "the dry run said it right"
    assert copied["copied_digest"] == copied["digest"] == source["digest"]
    assert skopeo.raw(f"{dst}:{source['tag']}") == skopeo.raw(src), "byte for byte"
    sbom_tag = fallback_tag(source["digest"])
    assert sbom_tag in skopeo.tags(dst) and skopeo.raw(f"{dst}:{sbom_tag}") == skopeo.raw(f"{source['repo']}:{sbom_tag}")
    assert skopeo.copy_whole(f"{dst}:{source['tag']}", tmp_path / "whole").returncode == 0
    proc = _without_engine(docker_env).ascendkit("sbom", f"{dst}@{source['digest']}", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["bomFormat"] == "CycloneDX", proc.stderr
    code, again, err = _mirror(docker_env, tmp_path, src, dst)
    assert code == 0 and again["blobs"]["sent"] == [] and again["blobs"]["bytes_sent"] == 0, err
    assert len(again["blobs"]["present"]) == len(copied["blobs"]["sent"]), "every blob looked up and found"


def test_an_interrupted_copy_is_finished_by_running_it_again(docker_env: DockerEnv, source: dict[str, str], tmp_path: Path) -> None:
    repository = f"resume-{uuid.uuid4().hex[:8]}"
    src = f"{source['repo']}:{source['tag']}"
    env = {**docker_env.env, "ASCENDKIT_REGISTRY_RETRIES": "1"}
    no_manifests = Faults(refuse=lambda method, path: method == "PUT" and "/manifests/" in path)
    with fault_proxy(docker_env.registry2, no_manifests) as proxy:
        proc = dataclasses.replace(docker_env, env=env).ascendkit("mirror", src, f"{proxy.host}/{repository}", cwd=tmp_path)
    assert proc.returncode == ExitCode.UNAVAILABLE, proc.stderr
    assert Registry(docker_env.registry2).tags(repository) == [], "no tag before its manifest and blobs are all there"
    code, finished, err = _mirror(docker_env, tmp_path, src, f"{docker_env.registry2}/{repository}")
    assert code == 0, err
    assert finished["blobs"]["sent"] == [], "the blobs that landed before the interruption are not sent again"
    assert skopeo.digest(f"{docker_env.registry2}/{repository}:{source['tag']}") == source["digest"]


def test_on_the_same_registry_blobs_are_mounted_not_sent(docker_env: DockerEnv, source: dict[str, str], tmp_path: Path) -> None:
    dst = f"{docker_env.registry}/mounted-{uuid.uuid4().hex[:8]}:renamed"
    code, copied, err = _mirror(docker_env, tmp_path, f"{source['repo']}@{source['digest']}", dst)
    assert code == 0, err
    assert copied["blobs"]["sent"] == [] and copied["blobs"]["mounted"], copied["blobs"]
    assert copied["tags"] == ["renamed"] and skopeo.digest(dst) == source["digest"]


def test_an_index_goes_with_every_member(docker_env: DockerEnv, source: dict[str, str], tmp_path: Path) -> None:
    registry = Registry(docker_env.registry)
    repository = source["repo"].split("/", 1)[1]
    member = registry.get_manifest(repository, source["digest"])
    assert member is not None
    body, media_type = index_manifest({"x86_64": member}, None, "test")
    index_tag = f"index-{uuid.uuid4().hex[:6]}"
    index_digest = registry.put_manifest(repository, index_tag, body, media_type)
    dst = f"{docker_env.registry2}/index-{uuid.uuid4().hex[:8]}"
    code, copied, err = _mirror(docker_env, tmp_path, f"{source['repo']}:{index_tag}", dst)
    assert code == 0, err
    assert skopeo.digest(f"{dst}:{index_tag}") == index_digest
    assert skopeo.digest(f"{dst}@{source['digest']}") == source["digest"], "the member, by digest"
    assert fallback_tag(source["digest"]) in copied["attachments"], "the member's SBOM"
    assert skopeo.copy_whole(f"{dst}:{index_tag}", tmp_path / "all", all_arches=True).returncode == 0


def test_into_a_registry_that_refuses_oci(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """An OCI image mirrored with --media-types docker: new digests, nothing OCI, the SBOM attached again."""
    oci_repo = f"{docker_env.registry}/oci-src-{uuid.uuid4().hex[:8]}"
    proc = docker_env.ascendkit(
        "publish", built["tags"][0], "--registry", oci_repo, "--media-types", "oci", "--no-index", "--json", cwd=built["workdir"]
    )
    assert proc.returncode == 0, proc.stderr
    oci_digest = json.loads(proc.stdout)[0]["pushed"][0]["digest"]
    tag = built["tags"][0].rsplit(":", 1)[1]
    dst = f"{docker_env.registry2}/docker-dst-{uuid.uuid4().hex[:8]}"
    code, copied, err = _mirror(docker_env, tmp_path, f"{oci_repo}:{tag}", dst, "--media-types", "docker")
    assert code == 0, err
    assert copied["digest"] == oci_digest and copied["copied_digest"] != oci_digest and "media types changed" in err
    assert copied["copied_digest"] == built["pushed"][0]["digest"], "converted back, it is the Docker manifest ascendkit composes"
    for name in skopeo.tags(dst):
        assert "application/vnd.oci" not in skopeo.raw(f"{dst}:{name}").decode(), name
        assert skopeo.copy_whole(f"{dst}:{name}", tmp_path / name).returncode == 0
    proc = _without_engine(docker_env).ascendkit("sbom", f"{dst}@{copied['copied_digest']}", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
