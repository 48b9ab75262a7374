"""`k8s render --job smoke` knows the image's stack and verl from the registry, as `smoke` knows them
from the engine: the pushed test-stack image's config labels, read back from the real local registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from buildkit.errors import ExitCode
from buildkit.resources import DEFAULT_MATRIX
from tests.conftest import TEST_MATRIX, DockerEnv

pytestmark = pytest.mark.docker
SHIPPED = Path(__file__).resolve().parents[1] / DEFAULT_MATRIX


def _pushed(docker_env: DockerEnv, built: dict[str, Any]) -> str:
    return f"{docker_env.registry}/{built['repo']}@{built['digest']}"


def _args(rendered: str) -> list[str]:
    (job,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Job"]
    return list(job["spec"]["template"]["spec"]["containers"][0]["args"])


def test_the_stack_comes_from_the_images_labels(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    image = _pushed(docker_env, built)
    proc = docker_env.ascendkit(
        "k8s", "render", "--hw", "a3", "--image", image, "--arch", "x86_64", "--matrix", str(TEST_MATRIX), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, "the labels were read: nothing is guessed"
    # the test stack's verl pin is 3.7, past the first auto-detecting release: no device override
    assert not [a for a in _args(proc.stdout) if a.startswith("trainer.device")]


def test_a_stack_that_disagrees_with_the_label_is_refused(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    image = _pushed(docker_env, built)
    out = tmp_path / "job.yaml"
    proc = docker_env.ascendkit(
        "k8s", "render", "--hw", "a3", "--image", image, "--arch", "x86_64", "--matrix", str(SHIPPED), "--stack", "cann8.3", "-o", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.INVALID_INPUT
    assert "--stack cann8.3:" in proc.stderr and "is built from stack 'teststack'" in proc.stderr
    assert not out.exists()


def test_an_image_the_registry_lacks_needs_stack_and_then_follows_it(docker_env: DockerEnv, tmp_path: Path) -> None:
    image = f"{docker_env.registry}/it-missing/verl@sha256:" + "ab" * 32
    proc = docker_env.ascendkit("k8s", "render", "--hw", "a3", "--image", image, "--matrix", str(SHIPPED), cwd=tmp_path)
    assert proc.returncode == ExitCode.INVALID_INPUT and "pass --stack" in proc.stderr
    proc = docker_env.ascendkit(
        "k8s", "render", "--hw", "a3", "--image", image, "--matrix", str(SHIPPED), "--stack", "cann8.3", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "the job follows --stack cann8.3 (verl 0.6.1)" in proc.stderr
    assert "trainer.device=npu" in _args(proc.stdout), "verl 0.6.1 needs it"
