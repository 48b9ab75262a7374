"""ascendkit k8s: golden manifests per SKU, offline validation, refusals that write nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.k8s.render import DRIVER_VOLUMES, K8sRequest, as_documents, render
from buildkit.k8s.validate import validate_documents
from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.job import ImageJob

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "k8s"
SKUS = load_matrix(ROOT / DEFAULT_MATRIX).matrix.skus
DIGEST_REF = "127.0.0.1:5000/ascendkit/verl@sha256:" + "0123456789abcdef" * 4
# The goldens show the default stack's image: verl 0.6.1, which needs trainer.device=npu.
DEFAULT_IMAGE = ImageJob("cann8.3", "0.6.1")
FIRST = load_matrix(ROOT / DEFAULT_MATRIX).matrix.compat.verl_npu_autodetect
UPDATE = os.environ.get("ASCENDKIT_UPDATE_GOLDEN") == "1"  # rewrite the golden files after a deliberate change


def _request(sku_id: str, sku: Any, nodes: int) -> K8sRequest:
    return K8sRequest(sku_id, sku, DIGEST_REF, nodes=nodes, image_job=DEFAULT_IMAGE, first_autodetect=FIRST)


def ascendkit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("ascendkit")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, check=False)


def docs_of(text: str) -> list[dict[str, Any]]:
    return as_documents(text)


def pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Job":
        return [doc["spec"]["template"]]
    cluster = doc["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("sku_id", sorted(SKUS))
def test_golden_manifests_per_sku_are_current_and_valid(sku_id: str, nodes: int) -> None:
    text = render(_request(sku_id, SKUS[sku_id], nodes)).text
    assert text == render(_request(sku_id, SKUS[sku_id], nodes)).text, "deterministic"
    golden = GOLDEN / f"{'job' if nodes == 1 else 'rayjob'}-{sku_id}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.read_text() == text, f"{golden.name} is stale: rerun with ASCENDKIT_UPDATE_GOLDEN=1 after reviewing the change"
    assert validate_documents(docs_of(text)) == []
    proc = ascendkit("k8s", "validate", str(golden))
    assert proc.returncode == 0 and "2 document(s) valid" in proc.stdout, proc.stderr


@pytest.mark.parametrize("sku_id", sorted(SKUS))
def test_every_pod_takes_the_skus_npus_nodes_and_driver(sku_id: str) -> None:
    sku = SKUS[sku_id]
    for nodes in (1, 3):
        configmap, workload = docs_of(render(_request(sku_id, sku, nodes)).text)
        assert configmap["kind"] == "ConfigMap"
        assert configmap["data"]["gsm8k_synth.py"] == (ROOT / "smoke_tests" / "gsm8k_synth.py").read_text()
        assert workload["kind"] == ("Job" if nodes == 1 else "RayJob")
        for pod in pods(workload):
            spec = pod["spec"]
            assert spec["nodeSelector"] == {
                "accelerator": "huawei-Ascend910",
                "accelerator-type": sku.k8s_accelerator_type,
                "host-arch": "huawei-arm",
            }
            (main,) = spec["containers"]
            want = str(sku.npus_per_node)
            assert main["resources"]["requests"]["huawei.com/Ascend910"] == main["resources"]["limits"]["huawei.com/Ascend910"] == want
            assert main["resources"]["requests"]["cpu"] == str(sku.k8s_cpu_request)
            assert main["resources"]["requests"]["memory"] == f"{sku.k8s_memory_gib_request}Gi"
            assert "securityContext" not in main, "never privileged"
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
            host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
            assert {p for _, p, _ in DRIVER_VOLUMES} <= host_paths
            assert all(m["readOnly"] for m in main["volumeMounts"] if m["name"] in {n for n, _, _ in DRIVER_VOLUMES})
            assert [c["name"] for c in spec["initContainers"]] == ["doctor", "smoke-data"]
            assert spec["initContainers"][0]["args"] == ["ascendkit", "doctor"]
            assert spec.get("hostNetwork", False) is (nodes > 1)
            images = {c["image"] for c in [*spec["containers"], *spec["initContainers"]]}
            assert images == {DIGEST_REF}


def test_the_acceptance_rayjob_for_a2_box16_on_two_nodes(tmp_path: Path) -> None:
    out = tmp_path / "rayjob.yaml"
    proc = ascendkit("k8s", "render", "--hw", "a2-box16", "--image", DIGEST_REF, "--nodes", "2", "--stack", "cann8.3", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    _, rayjob = docs_of(out.read_text())
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    (workers,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 1
    for container in workers["template"]["spec"]["containers"]:
        assert container["resources"]["requests"]["huawei.com/Ascend910"] == "16"
        assert container["resources"]["limits"]["huawei.com/Ascend910"] == "16"
    entry = rayjob["spec"]["entrypoint"]
    assert entry.startswith("python3 -m verl.trainer.main_ppo ") and "trainer.nnodes=2" in entry and "trainer.n_gpus_per_node=16" in entry
    assert "data.train_batch_size=64" in entry  # 2 prompts per NPU x 16 x 2 nodes
    assert json.loads(json.loads(workers["rayStartParams"]["resources"])) == {"NPU": 16}
    assert ascendkit("k8s", "validate", str(out)).returncode == 0


def test_a_train_job_runs_the_users_command_through_the_entrypoint() -> None:
    proc = ascendkit(
        "k8s", "render", "--hw", "900-podc", "--image", DIGEST_REF, "--job", "train", "--namespace", "rl", "--pull-secret", "swr-login",
        "--name", "grpo-7b", "--", "python3", "-m", "verl.trainer.main_ppo", "trainer.total_epochs=2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (job,) = docs_of(proc.stdout)
    assert job["metadata"] == {
        "name": "grpo-7b",
        "namespace": "rl",
        "labels": {
            "app.kubernetes.io/name": "ascendkit-verl",
            "app.kubernetes.io/instance": "grpo-7b",
            "app.kubernetes.io/managed-by": "ascendkit",
            "io.ascendkit/sku": "900-podc",
            "io.ascendkit/job": "train",
        },
    }
    spec = job["spec"]["template"]["spec"]
    (main,) = spec["containers"]
    assert "command" not in main, "args only: the image's entrypoint loads CANN first"
    assert main["args"] == ["python3", "-m", "verl.trainer.main_ppo", "trainer.total_epochs=2"]
    assert spec["imagePullSecrets"] == [{"name": "swr-login"}] and spec["restartPolicy"] == "Never"
    assert [c["name"] for c in spec["initContainers"]] == ["doctor"]
    assert main["resources"]["requests"]["huawei.com/Ascend910"] == "8"
    assert validate_documents([job]) == []


def test_json_output_is_a_list_kubectl_accepts_and_validate_reads(tmp_path: Path) -> None:
    out = tmp_path / "job.json"
    assert ascendkit("k8s", "render", "--hw", "a3", "--image", DIGEST_REF, "--stack", "cann8.3", "--json", "-o", str(out)).returncode == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "List" and [i["kind"] for i in data["items"]] == ["ConfigMap", "Job"]
    proc = ascendkit("k8s", "validate", str(out))
    assert proc.returncode == 0 and "2 document(s) valid" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hw", "a3", "--image", "127.0.0.1:5000/ascendkit/verl:latest"], "has no digest: a tag can move"),
        (["--hw", "a3", "--image", "Not An Image"], "is not an image reference"),
        (["--hw", "a3", "--image", DIGEST_REF, "--name", "Bad_Name"], "--name 'Bad_Name' is not a valid Kubernetes name"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--name", "r" * 48], "at most 47 characters"),
        (["--hw", "a3", "--image", DIGEST_REF, "--namespace", "-x"], "--namespace '-x' is not a valid Kubernetes name"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nodes", "0"], "'--nodes'"),
        (["--hw", "a9", "--image", DIGEST_REF], "a9"),
        (["--hw", "a2", "--image", DIGEST_REF], "names a chip family; pods are sized by the SKU: one of a2-box16, 900-podc"),
        (["--hw", "a3", "--image", DIGEST_REF, "--job", "train"], "--job train needs the command after `--`"),
        (["--hw", "a3", "--image", DIGEST_REF, "--job", "eval"], "--job 'eval': smoke or train"),
        (["--hw", "a3", "--image", DIGEST_REF, "--arch", "riscv64"], "--arch 'riscv64'"),
        (["--hw", "a3", "--image", DIGEST_REF, "--model-path", "models/q"], "an absolute path on the nodes"),
    ],
)
def test_refusals_are_clear_and_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "manifest.yaml"
    proc = ascendkit("k8s", "render", *args, "-o", str(out))
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
    out.write_text("kept\n")
    assert ascendkit("k8s", "render", *args, "-o", str(out)).returncode == ExitCode.INVALID_INPUT
    assert out.read_text() == "kept\n", "an earlier file is left as it was"


def test_a_tag_is_accepted_only_when_asked_and_then_warned_about() -> None:
    proc = ascendkit("k8s", "render", "--hw", "a3", "--image", "127.0.0.1:5000/ascendkit/verl:latest", "--allow-tag", "--stack", "cann8.3")
    assert proc.returncode == 0
    assert "warning: --image 127.0.0.1:5000/ascendkit/verl:latest is a mutable tag" in proc.stderr


def test_validate_names_the_document_and_field_of_each_problem(tmp_path: Path) -> None:
    configmap, rayjob = docs_of(render(_request("a3", SKUS["a3"], 2)).text)
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    rayjob["spec"]["entrypint"] = "x"
    configmap["data"] = {"a": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text("".join(f"---\n{json.dumps(d)}\n" for d in (configmap, rayjob)))
    proc = ascendkit("k8s", "validate", str(bad))
    assert proc.returncode == ExitCode.CHECK_FAILED
    assert f"{bad}: document 1 (ConfigMap verl-smoke-a3-2n-smoke): data.a:" in proc.stderr
    assert (
        "document 2 (RayJob verl-smoke-a3-2n): spec.rayClusterSpec.workerGroupSpecs.0.replicas: 'two' is not of type 'integer'"
        in proc.stderr
    )
    assert "'entrypint' was unexpected" in proc.stderr
    assert (
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers.0: Additional properties are not allowed ('imagePullPolcy'"
        in proc.stderr
    )
    assert "bad.yaml: 2 document(s) 4 problem(s)" in proc.stdout


def test_validate_refuses_what_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("a: [\n")
    proc = ascendkit("k8s", "validate", str(bad))
    assert proc.returncode == ExitCode.INVALID_INPUT and "not YAML" in proc.stderr
