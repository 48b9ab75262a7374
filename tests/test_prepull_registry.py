"""`k8s render --job prepull --puller openkruise|dragonfly` finds every image of a tag at a real
registry: the gzip index and its -zstd sibling, both multi-arch, pushed by BuildKit (Docker 26's
buildx on the containerd store) the way `publish` lays them out; each pinned by the digest the
registry serves, each platform of each index preheated."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from buildkit.image.buildx import find_buildx
from buildkit.ship.oci.registry import Registry
from tests.conftest import DockerEnv
from tests.harness.buildx_push import buildx_push

pytestmark = pytest.mark.docker


def push_index(docker_env: DockerEnv, context: Path, ref: str, compression: str) -> None:
    found = find_buildx()
    assert isinstance(found, tuple), found
    output = f"type=image,name={ref},push=true,compression={compression},force-compression=true,oci-mediatypes=true"
    argv = [
        *found[0],
        "build",
        "--platform",
        "linux/amd64,linux/arm64",
        "--provenance=false",
        "--sbom=false",
        "--output",
        output,
        str(context),
    ]
    proc = buildx_push(argv, env=docker_env.env)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def published(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """REG/REPO:1.0 and :1.0-zstd, each an index of amd64 and arm64 (FROM scratch: no emulation)."""
    context = tmp_path_factory.mktemp("prepull-context")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY layer /layer\n")
    (context / "layer").write_bytes(uuid.uuid4().bytes * 4096)
    repo = f"{docker_env.registry}/prepull-{uuid.uuid4().hex[:8]}/verl"
    push_index(docker_env, context, f"{repo}:1.0", "gzip")
    push_index(docker_env, context, f"{repo}:1.0-zstd", "zstd")
    return repo


def digest_of(docker_env: DockerEnv, repo: str, tag: str) -> str:
    host, _, repository = repo.partition("/")
    manifest = Registry(host).get_manifest(repository, tag)
    assert manifest is not None and manifest.is_index
    return manifest.digest


def test_openkruise_gets_a_job_per_published_compression_pinned(docker_env: DockerEnv, published: str, tmp_path: Path) -> None:
    argv = ["k8s", "render", "--hw", "a3", "--image", f"{published}:1.0", "--job", "prepull", "--puller", "openkruise"]
    proc = docker_env.ascendkit(*argv, "--pull-secret", "harbor-cred", "-n", "rl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    images = [d["spec"]["image"] for d in docs]
    assert images == [
        f"{published}:1.0@{digest_of(docker_env, published, '1.0')}",
        f"{published}:1.0-zstd@{digest_of(docker_env, published, '1.0-zstd')}",
    ]
    assert [d["metadata"]["labels"]["io.ascendkit/variant"] for d in docs] == ["gzip", "zstd"]
    out = tmp_path / "prepull.yaml"
    out.write_text(proc.stdout)
    assert docker_env.ascendkit("k8s", "validate", str(out), cwd=tmp_path).returncode == 0


def test_dragonfly_preheats_every_platform_of_every_image_named_from_the_zstd_tag(
    docker_env: DockerEnv, published: str, tmp_path: Path
) -> None:
    argv = ["k8s", "render", "--hw", "a3", "--image", f"{published}:1.0-zstd", "--job", "prepull", "--puller", "dragonfly"]
    proc = docker_env.ascendkit(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout)
    host, _, repository = published.partition("/")
    seen = {(j["args"]["url"], j["args"]["platform"]) for j in jobs}
    expected = {
        (f"http://{host}/v2/{repository}/manifests/{digest_of(docker_env, published, tag)}", platform)
        for tag in ("1.0", "1.0-zstd")
        for platform in ("linux/amd64", "linux/arm64")
    }
    assert seen == expected and len(jobs) == 4


def test_a_tag_without_its_other_compression_is_pulled_alone_and_said(docker_env: DockerEnv, published: str, tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY layer /layer\n")
    (context / "layer").write_bytes(uuid.uuid4().bytes)
    push_index(docker_env, context, f"{published}:2.0", "gzip")
    argv = ["k8s", "render", "--hw", "a3", "--image", f"{published}:2.0", "--job", "prepull", "--puller", "openkruise"]
    proc = docker_env.ascendkit(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list(yaml.safe_load_all(proc.stdout))) == 1
    assert f"{published}:2.0-zstd is not published" in proc.stderr
