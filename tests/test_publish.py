"""Publishing against the real local registries: digest round trip, index refusal, arm64 index, several
registries at once, zstd, and the media types registries that refuse OCI need; read back with skopeo."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.image.archive import identify
from buildkit.ship.oci.registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_MANIFEST, Registry
from tests.conftest import TEST_MATRIX, DockerEnv, published_config, set_aside
from tests.harness import skopeo

pytestmark = pytest.mark.docker


@pytest.mark.engine_20_10
def test_push_delete_pull_by_digest_round_trip(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    client = docker_env.client
    digest = built["pushed"][0]["digest"]
    before = client.inspect_image(built["tags"][0])
    with set_aside(client, [built["tags"][0]], tmp_path):  # every local tag goes; the image comes back after
        assert client.images(name="ascendkit/verl") == [] or all(before["Id"] != i["Id"] for i in client.images())
        repository = f"{docker_env.registry}/{built['repo']}"
        client.pull(repository, tag=digest)
        after = client.inspect_image(f"{repository}@{digest}")
        assert identify(client, f"{repository}@{digest}").config == published_config(built)  # the image published: its config
        assert after["Config"]["Labels"] == before["Config"]["Labels"]
        client.remove_image(f"{repository}@{digest}", force=True)
    assert client.inspect_image(built["tags"][0])["Id"] == before["Id"]


def test_index_refused_while_an_arch_is_missing(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", f"{docker_env.registry}/{built['repo']}", cwd=built["workdir"])
    assert proc.returncode == ExitCode.PUBLISH_FAILED
    assert "refusing to publish the multi-arch index" in proc.stderr and "no aarch64 image" in proc.stderr
    registry = Registry(docker_env.registry)
    index_name = built["tags"][0].rsplit(":", 1)[1].removesuffix("-x86_64")
    assert registry.get_manifest(built["repo"], index_name) is None
    assert registry.get_manifest(built["repo"], f"{index_name}-x86_64") is not None


@pytest.mark.engine_20_10
def test_publish_needs_a_passed_build_manifest(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()  # a manifest folder without this image's manifest
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", f"{docker_env.registry}/other", cwd=tmp_path)
    assert proc.returncode == ExitCode.PUBLISH_FAILED
    assert "no build manifest" in proc.stderr and "only verified images are published" in proc.stderr
    proc = docker_env.ascendkit("publish", docker_env.standin, "--registry", f"{docker_env.registry}/other", cwd=tmp_path)
    assert proc.returncode == ExitCode.INVALID_INPUT
    assert "was not built by ascendkit" in proc.stderr
    assert Registry(docker_env.registry).get_manifest("other", "latest-a3-x86_64") is None


def test_an_unreachable_registry_is_exit_4_in_one_line_and_nothing_is_published(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    proc = docker_env.ascendkit("publish", built["tags"][0], "--registry", "127.0.0.1:9/nowhere", cwd=built["workdir"])
    assert proc.returncode == ExitCode.UNAVAILABLE, proc.stderr
    (last,) = [line for line in proc.stderr.splitlines() if line.startswith("ascendkit: ")]
    assert last.startswith("ascendkit: registry 127.0.0.1:9: connection refused"), last
    assert "pushed " not in proc.stderr


def test_arm64_build_completes_the_multi_arch_index(docker_env: DockerEnv, built: dict[str, Any], built_arm64: dict[str, Any]) -> None:
    result = built_arm64
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


def test_build_push_of_inputs_a_registry_holds_tags_that_image_and_builds_nothing(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """The session's image was published under its inputs' tag too; `build --push` of the same inputs to
    that repository finds it and tags it (no build, no verification, no upload); to a repository that
    lacks it, it builds, and the rebuild publishes the very same digest."""
    registry = Registry(docker_env.registry)
    held = registry.get_manifest(built["repo"], built["inputs_tag"])
    assert built["inputs_tag"].startswith("inputs-") and held is not None and held.digest == built["digest"]

    def build_push(repo: str) -> tuple[dict[str, Any], str]:
        proc = docker_env.ascendkit(
            "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
            "--repo", "ascendkit-elsewhere/verl",  # its own local tags (not part of the inputs): the session's image keeps its
            "--push", "--no-index", "--registry", f"{docker_env.registry}/{repo}", "--json", "--quiet",
            cwd=tmp_path, check=True,
        )  # fmt: skip
        return json.loads(proc.stdout), proc.stderr

    again, said = build_push(built["repo"])
    assert again["built"] is False and again["reused"] == built["inputs_tag"] and again["digest"] == built["digest"], again
    assert "not built: " in said and "building " not in said and "verified" not in said, said
    assert [p["digest"] for p in again["pushed"]] == [built["digest"]] * len(built["pushed"])
    elsewhere, said = build_push(f"{built['repo']}-elsewhere")
    assert "built" not in elsewhere and "building " in said, "a registry that lacks it: built (from the cache), verified, pushed"
    assert elsewhere["digest"] == built["digest"] and elsewhere["inputs_tag"] == built["inputs_tag"], "the same image, rebuilt"
    assert identify(docker_env.client, built["tags"][0]).config == built["image_id"], "the session's local tags stay on its image"


# ---- several registries, zstd, media types: read back with skopeo and pulled with containerd's ctr ----


def _publish(docker_env: DockerEnv, built: dict[str, Any], *args: str) -> dict[str, Any]:
    proc = docker_env.ascendkit("publish", built["tags"][0], *args, "--no-index", "--json", cwd=built["workdir"])
    assert proc.returncode == 0, proc.stderr
    (outcome,) = json.loads(proc.stdout)
    outcome["stderr"] = proc.stderr
    return dict(outcome)


@pytest.fixture(scope="module")
def two_registries(docker_env: DockerEnv, built: dict[str, Any]) -> dict[str, Any]:
    """The test image published to both registries at once, gzip and zstd."""
    repo = f"two-{uuid.uuid4().hex[:8]}"
    targets = [f"{docker_env.registry}/{repo}", f"{docker_env.registry2}/{repo}"]
    outcome = _publish(docker_env, built, "--registry", targets[0], "--registry", targets[1], "--compression", "zstd")
    return {"targets": targets, "outcome": outcome}


@pytest.mark.engine_20_10
@pytest.mark.engine_overlay2
def test_several_registries_get_byte_identical_manifests(
    docker_env: DockerEnv, built: dict[str, Any], two_registries: dict[str, Any]
) -> None:
    outcome, targets = two_registries["outcome"], two_registries["targets"]
    assert [r["registry"] for r in outcome["registries"]] == targets
    names = [t.rsplit(":", 1)[1] for t in built["tags"]]
    for entry in outcome["registries"]:
        listed = {p["ref"].split("@")[0].rsplit(":", 1)[1]: p["digest"] for p in entry["pushed"]}
        assert sorted(listed) == sorted([*names, *(f"{n}-zstd" for n in names)])
        for tag, expected in listed.items():
            assert skopeo.digest(f"{entry['registry']}:{tag}") == expected, "skopeo reads the digest the summary names"
    gzip = {p["digest"] for e in outcome["registries"] for p in e["pushed"] if p["compression"] == "gzip"}
    zstd = {p["digest"] for e in outcome["registries"] for p in e["pushed"] if p["compression"] == "zstd"}
    assert len(gzip) == 1 and len(zstd) == 1, "one digest per image, in every registry and under every tag"
    assert gzip == {built["pushed"][0]["digest"]}, "the same manifest the build's own push composed: digests do not drift"
    assert raw_equal(f"{targets[0]}:{names[0]}", f"{targets[1]}:{names[0]}")
    for target in targets:
        assert target in outcome["stderr"], "the summary lists every registry"
        for digest in (*gzip, *zstd):
            proc = docker_env.ascendkit("sbom", f"{target}@{digest}", "--json", cwd=built["workdir"])
            assert proc.returncode == 0, f"the SBOM of {digest} in {target}: {proc.stderr}"


def raw_equal(a: str, b: str) -> bool:
    return skopeo.raw(a) == skopeo.raw(b)


@pytest.mark.engine_20_10
@pytest.mark.engine_overlay2
def test_the_zstd_variant_is_the_same_image_in_oci_media_types(
    docker_env: DockerEnv, built: dict[str, Any], two_registries: dict[str, Any], tmp_path: Path
) -> None:
    target = two_registries["targets"][1]
    name = built["tags"][0].rsplit(":", 1)[1]
    gzip, zstd = skopeo.manifest(f"{target}:{name}"), skopeo.manifest(f"{target}:{name}-zstd")
    assert gzip["mediaType"] == DOCKER_MANIFEST and zstd["mediaType"] == OCI_MANIFEST
    assert {layer["mediaType"] for layer in gzip["layers"]} == {"application/vnd.docker.image.rootfs.diff.tar.gzip"}
    assert {layer["mediaType"] for layer in zstd["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    assert gzip["config"]["digest"] == zstd["config"]["digest"] == published_config(built), "the same image: the same config"
    assert sum(layer["size"] for layer in zstd["layers"]) < sum(layer["size"] for layer in gzip["layers"])
    copied = skopeo.copy_whole(f"{target}:{name}-zstd", tmp_path / "zstd")
    assert copied.returncode == 0, copied.stderr.decode()
    # containerd (>= 1.5) pulls and unpacks zstd layers: the client a Kubernetes node runs
    assert docker_env.containerd, "ASCENDKIT_CONTAINERD: `make test` names the engine's containerd"
    ctr = ["ctr", "--address", docker_env.containerd, "--namespace", f"ascendkit-test-{uuid.uuid4().hex[:6]}"]
    pulled = subprocess.run([*ctr, "images", "pull", "--plain-http", f"{target}:{name}-zstd"], capture_output=True, text=True, check=False)
    try:
        assert pulled.returncode == 0, pulled.stderr
        listed = subprocess.run([*ctr, "images", "check"], capture_output=True, text=True, check=True).stdout
        assert f"{name}-zstd" in listed and "complete" in listed
    finally:
        subprocess.run([*ctr, "images", "rm", "--sync", f"{target}:{name}-zstd"], capture_output=True, check=False)


def test_docker_media_types_leave_nothing_oci_in_the_repository(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    target = f"{docker_env.registry2}/docker-{uuid.uuid4().hex[:8]}"
    outcome = _publish(docker_env, built, "--registry", target, "--media-types", "docker")
    tags = skopeo.tags(target)
    # the image's tags, its inputs' (buildkit/image/inputs.py), its SBOM's and its provenance's (unsigned: no key)
    assert len(tags) == len(built["tags"]) + 3 and built["inputs_tag"] in tags, tags
    for tag in tags:
        text = skopeo.raw(f"{target}:{tag}").decode()
        assert "application/vnd.oci" not in text, f"{tag} carries an OCI media type"
        if tag.endswith(".att"):  # cosign's Docker form of an attestation: a DSSE layer, which skopeo copies from OCI manifests only
            assert json.loads(text)["layers"][0]["mediaType"] == "application/vnd.dsse.envelope.v1+json"
            continue
        assert skopeo.copy_whole(f"{target}:{tag}", tmp_path / tag).returncode == 0, f"skopeo reads {tag} whole"
    shown = docker_env.ascendkit("sbom", f"{target}@{outcome['pushed'][0]['digest']}", "--provenance", "--json", cwd=built["workdir"])
    assert json.loads(shown.stdout)["subject"][0]["digest"]["sha256"] == outcome["pushed"][0]["digest"].removeprefix("sha256:")
    (sbom_tag,) = [t for t in tags if t.endswith(".sbom")]
    config = json.loads((tmp_path / sbom_tag / skopeo.manifest(f"{target}:{sbom_tag}")["config"]["digest"].split(":")[1]).read_bytes())
    assert config["config"]["Labels"]["io.ascendkit.sbom.subject"] == outcome["pushed"][0]["digest"]
    proc = docker_env.ascendkit("sbom", f"{target}@{outcome['pushed'][0]['digest']}", "--json", cwd=built["workdir"])
    assert proc.returncode == 0 and json.loads(proc.stdout)["bomFormat"] == "CycloneDX", proc.stderr
    argv = ["publish", built["tags"][0], "--registry", target, "--media-types", "docker", "--compression", "zstd"]
    refused = docker_env.ascendkit(*argv, cwd=built["workdir"])
    assert refused.returncode == ExitCode.INVALID_INPUT and "zstd needs OCI media types" in refused.stderr


def test_oci_media_types_make_everything_oci(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    target = f"{docker_env.registry}/oci-{uuid.uuid4().hex[:8]}"
    outcome = _publish(docker_env, built, "--registry", target, "--media-types", "oci")
    for tag in skopeo.tags(target):
        body = skopeo.manifest(f"{target}:{tag}")
        assert body["mediaType"] == OCI_MANIFEST, tag
        assert "docker" not in skopeo.raw(f"{target}:{tag}").decode(), f"{tag} carries a Docker media type"
        assert skopeo.copy_whole(f"{target}:{tag}", tmp_path / tag).returncode == 0, f"skopeo reads {tag} whole"
    # the engine pulls the OCI image and gets the same image back
    digest = outcome["pushed"][0]["digest"]
    docker_env.client.pull(target, tag=digest)
    assert identify(docker_env.client, f"{target}@{digest}").config == published_config(built)
