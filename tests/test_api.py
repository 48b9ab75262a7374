"""The library API (``import buildkit``): the same pipeline as the CLI, without Typer, typed values back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import buildkit
from buildkit.errors import InputError
from buildkit.image.verify import failures
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import plan_image, plan_target, stack_layers
from buildkit.ship.oci.registry import Registry
from tests.conftest import MATRIX, ROOT, TEST_MATRIX, Ascendkit, DockerEnv, default_tag


def test_import_buildkit_loads_none_of_the_pipeline() -> None:
    probe = "import sys, buildkit; print(sorted(m for m in ('docker', 'pydantic', 'jinja2', 'typer', 'buildkit.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_plan_and_render_match_the_cli_and_the_committed_files(loaded: LoadedMatrix) -> None:
    plan = buildkit.plan_image(MATRIX, "a3")
    assert plan == plan_image(loaded, plan_target(loaded, "a3", None, None), "aarch64"), "the A3 hosts' arch by default"
    assert plan.tags[0] == default_tag(loaded) + "-aarch64"
    assert plan.layers == stack_layers(plan.stack, loaded.matrix.installer) and plan.layers.names[-1] == "verl"
    assert dict(plan.lock_sections())["verl"] == f"locks/{loaded.default_stack()}/verl-aarch64.txt"
    assert buildkit.render(MATRIX, "a3") == (ROOT / "Dockerfile.a3").read_text()
    assert buildkit.render(loaded, "a2", stack="cann9.1") == buildkit.render(str(MATRIX), "900-podc", stack="cann9.1")


def test_errors_are_the_clis_errors() -> None:
    with pytest.raises(InputError, match="unknown --hw 'a9'"):
        buildkit.plan_image(MATRIX, "a9")
    with pytest.raises(InputError, match="not built for --arch 'riscv64'"):  # the command line offers two; the library checks
        buildkit.plan_image(MATRIX, "a3", arch="riscv64")
    with pytest.raises(AttributeError):
        buildkit.nonexistent  # noqa: B018


@pytest.mark.parametrize(
    ("options", "argv", "message"),
    [
        ({"steps": 0}, ["--steps", "0"], "--steps 0: from 1 to 100000"),
        ({"stack": "cann8.3"}, ["--stack", "cann8.3"], "--image and --stack exclude each other"),
        ({"check_only": True, "config_check": False}, ["--check", "--no-config-check"], "--check and --no-config-check exclude"),
        ({"env": ["NOEQUALS"]}, ["--env", "NOEQUALS"], "--env 'NOEQUALS': expected KEY=VALUE"),
        ({"devices": "99"}, ["--devices", "99"], "--devices"),
    ],
)
def test_the_api_and_the_command_refuse_a_smoke_run_alike(
    tmp_path: Path, options: dict[str, Any], argv: list[str], message: str, ascendkit: Ascendkit
) -> None:
    """One front door: `ascendkit smoke` and buildkit.smoke build the request in one place, so the
    same options meet the same refusal (the command's own ranges may say it first, in its words)."""
    image = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32
    with pytest.raises(InputError, match=re.escape(message)):
        buildkit.smoke(image, MATRIX, "a3", tmp_path / "out", **options)
    cli = ["smoke", "--hw", "a3", "--image", image, "--out", str(tmp_path / "out"), *argv, "--matrix", str(MATRIX)]
    proc = ascendkit(*cli, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr or "invalid value for '--steps'" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_k8s_render_through_the_api_is_the_commands_output(tmp_path: Path, ascendkit: Ascendkit) -> None:
    """One front door: the same request and the same resolution (the registry unreachable, the job
    follows the stack given, and says so) give byte-identical manifests."""
    image = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32
    manifests = buildkit.k8s_render(image, MATRIX, "a3", stack="cann8.3", nodes=2, namespace="rl")
    argv = ["k8s", "render", "--hw", "a3", "--image", image, "--stack", "cann8.3", "--nodes", "2", "-n", "rl"]
    proc = ascendkit(*argv, "--matrix", str(MATRIX), "-o", str(tmp_path / "m.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m.yaml").read_text() == manifests.text and "kind: RayJob" in manifests.text
    assert any("the job follows --stack cann8.3" in w for w in manifests.warnings)
    with pytest.raises(InputError, match="--job sft runs on one node"):  # the request's own refusals, as the command's
        buildkit.k8s_render(image, MATRIX, "a3", stack="cann8.3", nodes=2, job="sft")
    for option, value in (("nodes", 5000), ("steps", 0), ("deadline", 10**9)):  # the command's ranges hold here too
        with pytest.raises(InputError, match=f"--{option} {value}: from 1 to"):
            buildkit.k8s_render(image, MATRIX, "a3", stack="cann8.3", **{option: value})


REG = "127.0.0.1:9/x"  # never contacted: every request below is refused first


@pytest.mark.parametrize(
    ("images", "registries", "more", "argv", "message"),
    [
        (["ascendkit/verl:x"], [], {}, ["ascendkit/verl:x"], "give --registry HOST[:PORT]/REPO"),
        (["ascendkit/verl:x"], [REG, REG], {}, ["ascendkit/verl:x", "--registry", REG, "--registry", REG], "same repository twice"),
        (["Not A Ref"], [REG], {}, ["Not A Ref", "--registry", REG], "'Not A Ref' is not an image reference"),
        (["ascendkit/verl:x"], [REG], {"compression": "zstd", "media_types": "docker"},
         ["ascendkit/verl:x", "--registry", REG, "--compression", "zstd", "--media-types", "docker"], "zstd"),
        (["ascendkit/verl:x"], [REG], {"manifest_dir": "{tmp}/missing"},
         ["ascendkit/verl:x", "--registry", REG, "--manifest-dir", "{tmp}/missing"], "--manifest-dir {tmp}/missing: no such directory"),
    ],
)  # fmt: skip
def test_the_api_and_the_command_refuse_a_publish_alike(
    tmp_path: Path, images: list[str], registries: list[str], more: dict[str, Any], argv: list[str], message: str, ascendkit: Ascendkit
) -> None:
    """One front door: `ascendkit publish` and buildkit.publish make the request in ship/request.py,
    so the same request meets the same refusal, before any engine or registry is asked."""
    options = {"manifest_dir": str(tmp_path), **{k: v.replace("{tmp}", str(tmp_path)) for k, v in more.items()}}
    message = message.replace("{tmp}", str(tmp_path))
    with pytest.raises(InputError, match=re.escape(message)):
        buildkit.publish(images, registries, **{**options, "manifest_dir": Path(options["manifest_dir"])})
    cli = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--manifest-dir" not in cli:
        cli += ["--manifest-dir", str(tmp_path)]
    proc = ascendkit("publish", *cli, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert proc.returncode == 2 and message in proc.stderr, (cli, proc.stderr)


@pytest.mark.parametrize(
    ("api", "argv", "message"),
    [
        ({"registry": []}, ["--push"], "--push needs --registry"),
        ({"registry": ["127.0.0.1:9/x"] * 2}, ["--push", "--registry", "127.0.0.1:9/x", "--registry", "127.0.0.1:9/x"], "twice"),
        (
            {"compression": "zstd", "media_types": "docker"},
            ["--push", "--registry", "127.0.0.1:9/x", "--compression", "zstd", "--media-types", "docker"],
            "zstd",
        ),
    ],
)
def test_the_api_and_the_command_refuse_a_build_push_alike(
    tmp_path: Path, api: dict[str, Any], argv: list[str], message: str, ascendkit: Ascendkit
) -> None:
    """`build --push` and buildkit.build_and_push check the push in ship/request.py before building."""
    options = {"registry": [REG], **api}
    with pytest.raises(InputError, match=re.escape(message)):
        buildkit.build_and_push(TEST_MATRIX, "a3", options.pop("registry"), manifest_dir=tmp_path, **options)
    cli = ["build", "--hw", "a3", *argv, "--matrix", str(TEST_MATRIX), "--manifest-dir", str(tmp_path)]
    proc = ascendkit(*cli, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.docker
def test_build_verify_publish_through_the_api(docker_env: DockerEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_env.env.get("DOCKER_HOST", os.environ.get("DOCKER_HOST", "")))
    result = buildkit.build(
        TEST_MATRIX, "a3", arch="x86_64", base_image=docker_env.standin, repository="ascendkit-api/verl", manifest_dir=tmp_path
    )
    assert result.refs[0].startswith("ascendkit-api/verl:") and result.manifest_json.is_file()
    checks = buildkit.verify(result.refs[0], TEST_MATRIX, "a3", arch="x86_64", base_image=docker_env.standin)
    assert checks and not failures(checks)
    repo = f"api-{uuid.uuid4().hex[:8]}"
    published = buildkit.publish([result.refs[0]], f"{docker_env.registry}/{repo}", manifest_dir=tmp_path, index=False)
    digest = published[0].digest
    manifest = Registry(docker_env.registry).get_manifest(repo, digest)
    assert manifest is not None and manifest.digest == digest
    again, pushed = buildkit.build_and_push(  # build --push through the API: the build is reused, the push lands
        TEST_MATRIX, "a3", f"{docker_env.registry}/{repo}-bp", arch="x86_64", base_image=docker_env.standin,
        repository="ascendkit-api/verl", manifest_dir=tmp_path, index=False,
    )  # fmt: skip
    assert again.image_id == result.image_id and again.verification == "reused"
    assert {p.digest for p in pushed} == {digest}, "the same image, the same manifest (under each tag), in another repository"
