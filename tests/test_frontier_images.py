"""The images of the frontier lines through build, verification and publishing, on the real engine
and registry and the stand-in base: the SGLang-shaped stack (teststack-sglang) and the test stack
for an Ascend 950 SKU (its chip a5).

teststack-sglang's SGLang is an sdist whose own pyproject.toml is a CUDA build and whose
pyproject_npu.toml is the NPU build, its kernels wheels in a release archive per chip
(tests/harness/sglang_standin.py), served from this host as a user's mirrors of Ascend's index and GitHub
would serve them. The image must hold the NPU build, the archive's wheels, and say which rollout it
carries, so that `k8s render` gives the job SGLang's settings from the image alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildkit.image.probe import run_in_image
from tests.conftest import TEST_MATRIX, DockerEnv, bridge_gateway, build_and_push
from tests.harness.sglang_standin import DIST, populate, serve

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def mirror(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve(populate(tmp_path_factory.mktemp("sglang-standin")), host=bridge_gateway(docker_env)) as url:
        yield url


@pytest.fixture(scope="module")
def sglang_built(docker_env: DockerEnv, mirror: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("sglang-build")
    repo = f"it-sglang-{uuid.uuid4().hex[:8]}"
    return build_and_push(
        docker_env,
        workdir,
        repo,
        "--hw",
        "a3",
        "--stack",
        "teststack-sglang",
        "--ascend-index-url",
        f"{mirror}/simple",
        "--github-url",
        mirror,
    )


def _manifest(built: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(built["workdir"], built["manifest"]).read_text())
    return data


def test_the_sglang_image_is_built_from_the_npu_project_and_the_chips_archive(docker_env: DockerEnv, sglang_built: dict[str, Any]) -> None:
    assert sglang_built["tags"][0].startswith("ascendkit/verl:verl3.7-sglang0.5.10-cann8.3.rc1-"), "the tag names the rollout engine"
    manifest = _manifest(sglang_built)
    assert manifest["passed"]
    checks = {c["name"]: c for c in manifest["checks"]}
    assert checks["lock"]["status"] == "ok", "every layer hash-locked, the archive's sha256 known"
    assert checks[f"package {DIST}"]["actual"] == "0.5.10"
    for wheel in ("ak_kernel_memory_saver", "ak_kernel_ops"):
        assert checks[f"package {wheel}"]["status"] == "ok" and checks[f"package {wheel}"]["actual"] == "1.0"
    assert manifest["labels"]["io.ascendkit.rollout"] == "sglang"
    script = (
        "import importlib.util as u, json, ak_sglang_npu, ak_kernel_ops, ak_kernel_memory_saver, six; "
        "print(json.dumps({'engine': ak_sglang_npu.ENGINE, 'cuda': u.find_spec('ak_sglang_cuda') is not None}))"
    )
    code, out, err = run_in_image(docker_env.client, sglang_built["tags"][0], ["python3", "-c", script])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"engine": "npu", "cuda": False}, (
        "built with pyproject_npu.toml, not its CUDA project"
    )


def test_k8s_render_gives_the_sglang_image_sglangs_rollout_from_its_labels(docker_env: DockerEnv, sglang_built: dict[str, Any]) -> None:
    ref = f"{docker_env.registry}/{sglang_built['repo']}@{sglang_built['digest']}"
    out = sglang_built["workdir"] / "job.yaml"
    proc = docker_env.ascendkit(
        "k8s",
        "render",
        "--matrix",
        str(TEST_MATRIX),
        "--arch",
        "x86_64",
        "--hw",
        "a3",
        "--image",
        ref,
        "--nodes",
        "2",
        "-o",
        str(out),
        cwd=sglang_built["workdir"],
    )
    assert proc.returncode == 0, proc.stderr
    (rayjob,) = [d for d in yaml.safe_load_all(out.read_text()) if d and d["kind"] == "RayJob"]
    assert "actor_rollout_ref.rollout.name=sglang" in rayjob["spec"]["entrypoint"]
    assert "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend" in rayjob["spec"]["entrypoint"]
    runtime = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime["env_vars"]["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"


def test_an_ascend_950_image_is_built_verified_and_published(docker_env: DockerEnv, tmp_path: Path) -> None:
    """The test stack for the Atlas 350 SKU: its own image of chip a5, on the 950 base tag, with the 950 SoC."""
    built = build_and_push(docker_env, tmp_path, f"it-a5-{uuid.uuid4().hex[:8]}", "--hw", "350")
    assert built["tags"][0].endswith("-a5-debian12-py3.11-x86_64") and "ascendkit/verl:teststack-a5-x86_64" in built["tags"]
    manifest = _manifest(built)
    assert manifest["passed"]
    labels = manifest["labels"]
    assert labels["io.ascendkit.chip"] == "a5" and labels["io.ascendkit.skus"] == "350"
    assert labels["io.ascendkit.soc-version"] == "ascend950dt_9582"
    code, out, err = run_in_image(docker_env.client, built["tags"][0], ["cat", "/etc/ascendkit/image.json"])
    assert code == 0, err
    info = json.loads(out)
    assert info["soc_family"] == "Ascend950" and info["chip"] == "a5"
    ref = f"{docker_env.registry}/{built['repo']}@{built['digest']}"
    job = tmp_path / "job.yaml"
    proc = docker_env.ascendkit(
        "k8s", "render", "--matrix", str(TEST_MATRIX), "--arch", "x86_64", "--hw", "350", "--image", ref, "--nodes", "2", "-o", str(job),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = job.read_text()
    assert "huawei.com/npu: 8" in text or "huawei.com/npu: '8'" in text
    assert "path: /lib/route.conf" in text and "path: /etc/hixlep" in text, "several nodes of a 950: the UB files between nodes"
    assert "/usr/local/Ascend/driver/topo/950/atlas_350_3.json" in text, "HCCL_TOPO_FILE_PATH for the SKU's product"
