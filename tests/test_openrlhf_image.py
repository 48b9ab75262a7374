"""The OpenRLHF-shaped test image through the whole pipeline, on the real engine and registry.

Built from the test matrix's ``teststack-openrlhf`` on the stand-in base: the framework from a git
checkout at its pinned commit (served by tests/harness/gitserver.py, as a user's --github-url mirror
serves it) with ``TARGET_DEVICE=NPU``, its requirements from the lock, DeepSpeed's stand-in from an
sdist, the patch after the vllm-ascend layer. Then verified, pushed with its SBOM, read back with
skopeo (a client ascendkit did not write), and smoke-checked: ``smoke --check`` runs OpenRLHF's
own parser (the fork's train_ppo_ray.py at the pinned commit, in the image) with the real Ray.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from buildkit.errors import ExitCode
from buildkit.image.probe import run_in_image
from buildkit.resources import DEFAULT_MATRIX
from tests.conftest import OPENRLHF_STANDIN_COMMIT as COMMIT
from tests.conftest import TEST_MATRIX, DockerEnv
from tests.harness.openrlhf_standin import REPO_PATH

pytestmark = pytest.mark.docker
MATRIX = Path(__file__).resolve().parents[1] / DEFAULT_MATRIX  # the shipped SKUs (smoke and k8s size the job by them)
FULL_TAG = "openrlhf0.7.5-cann8.3.rc1-torch_npu2.0.0-a2-debian12-py3.11-x86_64"


def _manifest(built: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(built["workdir"], built["manifest"]).read_text())
    return data


def test_the_image_is_built_from_its_pinned_source_for_npu_and_verified(openrlhf_built: dict[str, Any]) -> None:
    assert openrlhf_built["tags"][0] == f"ascendkit/openrlhf:{FULL_TAG}", "its own repository and tags, named for the framework"
    assert "ascendkit/openrlhf:teststack-openrlhf-a2-x86_64" in openrlhf_built["tags"]
    manifest = _manifest(openrlhf_built)
    assert manifest["passed"]
    checks = {c["name"]: c for c in manifest["checks"]}
    assert checks["checkout openrlhf"]["actual"] == COMMIT and checks["checkout openrlhf"]["status"] == "ok"
    assert checks["package openrlhf"]["actual"] == "0.7.5", "the checkout's own version file"
    assert checks["openrlhf requirements"]["status"] == "ok", "built with TARGET_DEVICE=NPU: none of the CUDA-only packages"
    patch = checks["patch iniconfig iniconfig/__init__.py"]
    assert patch["status"] == "ok" and patch["actual"].startswith("commented out at line 25 of 2.0.0")
    assert checks["lock"]["status"] == "ok" and checks["package docopt"]["actual"] == "0.6.2"
    assert manifest["labels"]["io.ascendkit.framework"] == "openrlhf"
    assert manifest["labels"]["io.ascendkit.commit.openrlhf"] == COMMIT


def test_what_the_build_installed_and_patched_is_what_runs(docker_env: DockerEnv, openrlhf_built: dict[str, Any]) -> None:
    script = (
        "import importlib.metadata as m, iniconfig, json, openrlhf, ray, sys; "
        "print(json.dumps({'requires': m.requires('openrlhf'), 'source': open(iniconfig.__file__).read(), "
        "'ray': ray.__version__, 'accelerator': openrlhf.ACCELERATOR_TYPE, 'ini': hasattr(iniconfig, 'IniConfig')}))"
    )
    code, out, err = run_in_image(docker_env.client, openrlhf_built["tags"][0], ["python3", "-c", script])
    assert code == 0, err
    found = json.loads(out.strip().splitlines()[-1])
    assert "ray==2.43.0" in found["requires"] and not any(r.startswith("pynvml") for r in found["requires"])
    assert found["ray"] == "2.43.0" and found["ini"], "the patched module still imports"
    assert (
        '# ascendkit patch (see /etc/ascendkit/patches.json): __all__ = ["IniConfig", "ParseError", "COMMENTCHARS", "iscommentline"]'
        in found["source"]
    )
    code, out, _ = run_in_image(docker_env.client, openrlhf_built["tags"][0], ["cat", "/etc/ascendkit/git-revisions.txt"])
    assert out.strip() == f"openrlhf {COMMIT} {COMMIT}"


def test_its_sbom_lists_openrlhf_from_its_commit_and_the_patch(docker_env: DockerEnv, openrlhf_built: dict[str, Any]) -> None:
    document = json.loads(Path(openrlhf_built["workdir"], openrlhf_built["sbom"]).read_text())
    ref = f"{docker_env.registry}/{openrlhf_built['repo']}@{openrlhf_built['digest']}"
    proc = docker_env.ascendkit("sbom", ref, "--json", cwd=openrlhf_built["workdir"])  # as a user reads it: from the registry
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == document
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document)) is None
    components = {c["bom-ref"]: c for c in document["components"]}
    framework = components["pypi:openrlhf"]
    assert framework["version"] == "0.7.5"
    vcs = f"git%2Bhttps%3A%2F%2Fgithub.com%2F{REPO_PATH.replace('/', '%2F')}%40{COMMIT}"
    assert framework["purl"] == f"pkg:pypi/openrlhf@0.7.5?vcs_url={vcs}"
    assert components["git:openrlhf"]["version"] == COMMIT
    props = {p["name"]: p["value"] for p in document["metadata"]["component"]["properties"]}
    assert props["ascendkit:framework"] == "openrlhf"
    patched = components["pypi:iniconfig"]["pedigree"]
    assert patched["patches"][0]["type"] == "unofficial"
    diff = patched["patches"][0]["diff"]["text"]["content"]
    assert diff.startswith("--- a/iniconfig/__init__.py\n+++ b/iniconfig/__init__.py\n") and "-__all__ = [" in diff


def test_the_pushed_image_reads_back_with_skopeo(docker_env: DockerEnv, openrlhf_built: dict[str, Any]) -> None:
    """An independent client finds the image, its architecture and the labels that say what it carries."""
    ref = f"docker://{docker_env.registry}/{openrlhf_built['repo']}:{FULL_TAG.removesuffix('-x86_64')}"
    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", ref], capture_output=True, text=True, check=False)
    assert raw.returncode == 0, raw.stderr
    index = json.loads(raw.stdout)
    assert [m["platform"]["architecture"] for m in index["manifests"]] == ["amd64"], "the multi-arch index over its one arch"
    shown = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--override-arch", "amd64", ref], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    labels = json.loads(shown.stdout)["Labels"]
    assert labels["io.ascendkit.framework"] == "openrlhf" and labels["io.ascendkit.version.openrlhf"] == "0.7.5"
    assert labels["io.ascendkit.commit.openrlhf"] == COMMIT


def _smoke(env: DockerEnv, built: dict[str, Any], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a2-box16", "--image", built["tags"][0], "--out", str(out), "--timeout", "300", *extra,
        cwd=out.parent,
    )  # fmt: skip


def test_smoke_check_runs_openrlhfs_own_parser_in_the_image(docker_env: DockerEnv, openrlhf_built: dict[str, Any], tmp_path: Path) -> None:
    before = docker_env.containers()
    out = tmp_path / "check"
    proc = _smoke(docker_env, openrlhf_built, out, "--check")
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "config-check.log").read_text()[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "checked" and report["image"]["framework"] == "openrlhf"
    assert report["message"].startswith("OpenRLHF parsed the OpenRLHF GRPO job's flags in the image")
    assert report["config_check"]["command"][:3] == ["python3", "/opt/ascendkit-smoke/openrlhf_args.py", "openrlhf.cli.train_ppo_ray"]
    assert {c["name"]: c["status"] for c in report["config_check"]["checks"]} == {
        "hybrid engine": "ok",
        "colocation": "ok",
        "NPU placement": "ok",
        "batch split": "ok",
        "steps": "ok",
        "reward": "ok",
    }
    args = json.loads((out / "job-args.json").read_text())
    assert args["vllm_num_engines"] == 8 and args["actor_num_gpus_per_node"] == 8 and args["pretrain"] == "/smoke/model"
    assert docker_env.containers() == before, "the check's container was removed"


def test_a_planted_bad_flag_fails_with_openrlhfs_message(docker_env: DockerEnv, openrlhf_built: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "bad"
    proc = _smoke(docker_env, openrlhf_built, out, "--check", "--override=--vllm_num_engins=2")
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
    assert "OpenRLHF refused the job's arguments (exit 2): train_ppo_ray.py: error: unrecognized arguments: --vllm_num_engins=2" in (
        proc.stderr
    )
    assert "usage: train_ppo_ray.py" in (out / "config-check.log").read_text(), "argparse's own usage, from the image"


def test_smoke_without_npus_checks_then_doctor_then_stops(docker_env: DockerEnv, openrlhf_built: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc = _smoke(docker_env, openrlhf_built, out)
    assert proc.returncode == ExitCode.NO_DEVICES, proc.stderr
    assert "no Ascend devices on this host: the job's flags passed OpenRLHF's checks and doctor's preflight passed" in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "no-devices" and report["config_check"]["passed"]
    assert report["message"].endswith("doctor's preflight passed in the image; OpenRLHF GRPO not run")
    assert (out / "report.md").read_text().startswith("# OpenRLHF GRPO smoke test: NO-DEVICES")


def test_k8s_render_follows_the_image_labels_in_the_registry(docker_env: DockerEnv, openrlhf_built: dict[str, Any], tmp_path: Path) -> None:
    image = f"{docker_env.registry}/{openrlhf_built['repo']}@{openrlhf_built['digest']}"
    out = tmp_path / "rayjob.yaml"
    proc = docker_env.ascendkit(
        "k8s", "render", "--matrix", str(TEST_MATRIX), "--hw", "a2-box16", "--image", image, "--nodes", "2",
        "-o", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "entrypoint: python3 -m openrlhf.cli.train_ppo_ray " in text and "--actor_num_nodes=2" in text
    assert "name: openrlhf-smoke-a2-box16-2n" in text and "gsm8k_reward.py" in text
    assert docker_env.ascendkit("k8s", "validate", str(out), cwd=tmp_path).returncode == 0
