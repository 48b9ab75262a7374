"""ascendkit k8s: golden manifests per SKU, offline validation, refusals that write nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode, InputError
from buildkit.k8s.pod import host_volumes
from buildkit.k8s.render import as_documents, render
from buildkit.k8s.request import K8sRequest
from buildkit.k8s.validate import validate_documents
from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.job import ImageJob, JobFacts
from tests.conftest import Ascendkit
from tests.harness.hosttree import contract_paths

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "k8s"
SKUS = load_matrix(ROOT / DEFAULT_MATRIX).matrix.skus
DIGEST_REF = "127.0.0.1:5000/ascendkit/verl@sha256:" + "0123456789abcdef" * 4
# The goldens show the default stack's image: verl 0.6.1, which needs trainer.device=npu.
DEFAULT_IMAGE = ImageJob("cann8.3", "0.6.1")
OPENRLHF_IMAGE = ImageJob("openrlhf-cann8.1", "0.7.5", "openrlhf")
SGLANG_IMAGE = ImageJob("sglang-cann8.5", "0.8.0", rollout="sglang")
FACTS = JobFacts.of(load_matrix(ROOT / DEFAULT_MATRIX).matrix.compat)
UPDATE = os.environ.get("ASCENDKIT_UPDATE_GOLDEN") == "1"  # rewrite the golden files after a deliberate change


def _ref(image: ImageJob) -> str:
    """The image by digest, in a repository named for its framework."""
    return DIGEST_REF.replace("/verl@", f"/{image.framework}@")


def _request(sku_id: str, sku: Any, nodes: int, image: ImageJob = DEFAULT_IMAGE, **kw: Any) -> K8sRequest:
    return K8sRequest(sku_id, sku, _ref(image), nodes=nodes, image_job=image, facts=FACTS, **kw)


def docs_of(text: str) -> list[dict[str, Any]]:
    return as_documents(text)


def pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["apiVersion"] == "batch/v1":
        return [doc["spec"]["template"]]
    if doc["kind"] == "RayJob":
        cluster = doc["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    return [task["template"] for task in doc["spec"]["tasks"]]


# Every kind `k8s render` makes: (golden name, nodes, request options). Goldens for every SKU on the
# default scheduler (nodes with Ascend Docker Runtime, and without it: --node-runtime plain),
# for a3 on Volcano (the pod is the same code for every SKU); verl's SFT job on
# one node; OpenRLHF's GRPO job in each kind, on a2-box16 (its stack's SKUs are the A2 ones).
VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "job": (1, {}),
    "job-plain-runtime": (1, {"node_runtime": "plain"}),
    "rayjob": (2, {}),
    "job-volcano": (1, {"scheduler": "volcano", "queue": "rl"}),
    "rayjob-volcano": (2, {"scheduler": "volcano", "topology_mode": "hard", "topology_tier": 1}),
    "vcjob": (3, {"scheduler": "volcano", "kuberay": False}),
    "sft-job": (1, {"job": "sft"}),
    "sglang-rayjob": (2, {"image": SGLANG_IMAGE}),
    "openrlhf-job": (1, {"image": OPENRLHF_IMAGE}),
    "openrlhf-rayjob": (2, {"image": OPENRLHF_IMAGE}),
    "openrlhf-vcjob": (2, {"image": OPENRLHF_IMAGE, "scheduler": "volcano", "kuberay": False}),
}
GOLDENS = [
    (v, s)
    for v in VARIANTS
    for s in sorted(SKUS)
    if v in ("job", "rayjob", "job-plain-runtime")
    or (s == "a3" and not v.startswith("openrlhf"))
    or (s == "a2-box16" and v.startswith("openrlhf"))
]


@pytest.mark.parametrize(("variant", "sku_id"), GOLDENS)
def test_golden_manifests_are_current_and_valid(variant: str, sku_id: str) -> None:
    nodes, options = VARIANTS[variant]
    text = render(_request(sku_id, SKUS[sku_id], nodes, **options)).text
    assert text == render(_request(sku_id, SKUS[sku_id], nodes, **options)).text, "deterministic"
    golden = GOLDEN / f"{variant}-{sku_id}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.read_text() == text, f"{golden.name} is stale: rerun with ASCENDKIT_UPDATE_GOLDEN=1 after reviewing the change"
    assert validate_documents(docs_of(text)) == []


def test_validate_reads_every_golden_manifest_as_a_user_would(ascendkit: Ascendkit) -> None:
    """`ascendkit k8s validate` itself, once over all of them (each run loads the schemas anew)."""
    goldens = [GOLDEN / f"{variant}-{sku_id}.yaml" for variant, sku_id in GOLDENS]
    proc = ascendkit("k8s", "validate", *map(str, goldens))
    assert proc.returncode == 0, proc.stderr
    valid = [line.split(": ", 1)[0] for line in proc.stdout.splitlines() if ": 2 document(s) valid (Kubernetes " in line]
    assert valid == [str(g) for g in goldens]


ALL_KINDS = [
    pytest.param(sku_id, nodes, scheduler, kuberay, host_network, job, id=f"{sku_id}-{nodes}n-{scheduler}-{kr}-{hn}-{job}")
    for sku_id in sorted(SKUS)
    for nodes in (1, 3)
    for scheduler in ("default", "volcano")
    for kuberay, kr in ((True, "kuberay"), (False, "vcjob"))
    for host_network, hn in ((None, "hostnet-default"), (True, "hostnet"), (False, "podnet"))
    for job in ("smoke", "sft", "openrlhf", "train")
    if (kuberay or (scheduler == "volcano" and nodes > 1))
    and (job != "sft" or nodes == 1)
    and (job != "openrlhf" or sku_id != "a3")  # the OpenRLHF stack is A2-only
]


def volumes_of(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in spec["volumes"]}


@pytest.mark.parametrize(("sku_id", "nodes", "scheduler", "kuberay", "host_network", "job"), ALL_KINDS)
def test_every_manifest_validates_strictly_and_every_pod_takes_the_nodes_npus(
    sku_id: str, nodes: int, scheduler: str, kuberay: bool, host_network: bool | None, job: str
) -> None:
    sku = SKUS[sku_id]
    command = ("python3", "-m", "verl.trainer.main_ppo") if job == "train" else ()
    image = OPENRLHF_IMAGE if job == "openrlhf" else DEFAULT_IMAGE
    kind_job = "grpo" if job == "openrlhf" else job
    request = _request(
        sku_id, sku, nodes, image, scheduler=scheduler, kuberay=kuberay, host_network=host_network, job=kind_job, command=command
    )
    docs = docs_of(render(request).text)
    assert validate_documents(docs) == []
    *configmaps, workload = docs
    smoke = job != "train"
    assert [c["kind"] for c in configmaps] == (["ConfigMap"] if smoke else [])
    kind = (workload["apiVersion"], workload["kind"])
    assert (
        kind
        == {"Job": ("batch/v1", "Job"), "RayJob": ("ray.io/v1", "RayJob"), "VolcanoJob": ("batch.volcano.sh/v1alpha1", "Job")}[request.kind]
    )
    if request.kind == "RayJob":  # KubeRay's `ray job submit` pod: no NPU, as locked down as the rest
        submitter = workload["spec"]["submitterPodTemplate"]["spec"]
        assert submitter["automountServiceAccountToken"] is False and "supplementalGroups" not in submitter["securityContext"]
        assert submitter["securityContext"]["runAsNonRoot"] and submitter["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = submitter["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp", "/home/HwHiAiUser", "/workspace"}
    for pod in pods(workload):
        spec = pod["spec"]
        assert spec["nodeSelector"] == {
            "accelerator": sku.k8s_accelerator,
            "accelerator-type": sku.k8s_accelerator_type,
            "host-arch": "huawei-arm",
        }
        (main,) = spec["containers"]
        want = str(sku.npus_per_node)
        assert main["resources"]["requests"][sku.k8s_npu_resource] == main["resources"]["limits"][sku.k8s_npu_resource] == want
        assert spec["initContainers"][0]["resources"]["limits"] == {sku.k8s_npu_resource: want, "cpu": "1", "memory": "2Gi"}
        assert main["resources"]["limits"] == main["resources"]["requests"], "Guaranteed: limits are the requests"
        assert main["resources"]["limits"]["cpu"] == str(sku.k8s_cpu_request)
        # locked down: the image's user, its device group, no token, every container without privilege
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch",
            "supplementalGroups": [1000],
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert spec["automountServiceAccountToken"] is False
        for container in [*spec["initContainers"], *spec["containers"]]:
            security = container["securityContext"]
            assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False, container["name"]
            assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
            writable = {m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes_of(spec)[m["name"]]}
            assert {"/tmp", "/home/HwHiAiUser", "/workspace"} <= writable, container["name"]
            assert {"cpu", "memory"} <= set(container["resources"]["limits"]), container["name"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        host = host_volumes(request)
        assert {p for _, p, _ in host} <= {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
        assert all(m["readOnly"] for m in main["volumeMounts"] if m["name"] in {n for n, _, _ in host})
        assert spec["initContainers"][0]["args"] == ["ascendkit", "doctor", *(["--links"] if nodes > 1 else [])]
        assert [c["name"] for c in spec["initContainers"]] == ["doctor", *(["smoke-data"] if smoke else [])]
        assert spec.get("hostNetwork", False) is (nodes > 1 if host_network is None else host_network)
        assert (spec.get("dnsPolicy") == "ClusterFirstWithHostNet") is spec.get("hostNetwork", False)
        env = {e["name"]: e for e in main["env"]}
        assert env["HCCL_CONNECT_TIMEOUT"]["value"] == "3600" and env["HCCL_EXEC_TIMEOUT"]["value"] == "3600", "verl's multi-node values"
        if nodes > 1:
            assert env["HCCL_SOCKET_IFNAME"]["value"] == env["GLOO_SOCKET_IFNAME"]["value"] == "eth0"
            assert (
                env["HCCL_HOST_SOCKET_PORT_RANGE"]["value"] == "60000-60050" and env["HCCL_NPU_SOCKET_PORT_RANGE"]["value"] == "61000-61050"
            )
        # MindCluster: HCCL_IF_IP is the node's address, and only for a pod on the host's network
        if nodes > 1 and spec.get("hostNetwork", False):
            assert env["HCCL_IF_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        else:
            assert "HCCL_IF_IP" not in env
        volcano_pod = scheduler == "volcano"
        assert (pod["metadata"]["labels"].get("ring-controller.atlas") == sku.k8s_ring_controller) is volcano_pod
        assert spec.get("schedulerName") == ("volcano" if volcano_pod and request.kind != "RayJob" else None)
        assert {c["image"] for c in [*spec["containers"], *spec["initContainers"]]} == {_ref(image)}
        if job == "openrlhf":  # the reward function is read by the job itself: every NPU pod mounts it
            assert {"name": "smoke-files", "mountPath": "/opt/ascendkit-smoke", "readOnly": True} in main["volumeMounts"]
            assert set(configmaps[0]["data"]) == {"gsm8k_synth.py", "gsm8k_reward.py"}
        elif smoke:
            assert set(configmaps[0]["data"]) == {"gsm8k_synth.py"} and "smoke-files" not in {m["name"] for m in main["volumeMounts"]}


def test_the_volcano_job_is_a_gang_of_every_pod_with_rays_npus_declared() -> None:
    sku = SKUS["a2-box16"]
    request = _request("a2-box16", sku, 4, scheduler="volcano", kuberay=False, npu_resource="huawei.com/ascend-1980", queue="rl")
    _, vcjob = docs_of(render(request).text)
    spec = vcjob["spec"]
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "rl"
    assert spec["minAvailable"] == sum(t["replicas"] for t in spec["tasks"]) == 4, "the gang is every pod"
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("head", 1), ("worker", 3)]
    assert set(spec["plugins"]) == {"svc", "env"}
    assert {"events": ["PodEvicted", "Unknown"], "action": "RestartJob"} in spec["policies"]
    assert {"event": "PodFailed", "action": "TerminateJob"} in spec["policies"]
    assert spec["tasks"][0]["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert vcjob["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    for task in spec["tasks"]:
        (main,) = task["template"]["spec"]["containers"]
        assert main["resources"]["limits"]["huawei.com/ascend-1980"] == "16" and "huawei.com/Ascend910" not in main["resources"]["limits"]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["ASCENDKIT_RAY_NPUS"] == "16", "Ray's NPU resource is the node's NPU count"
        assert env["ASCENDKIT_RAY_NODES"] == "4" and env["ASCENDKIT_RAY_HEAD"] == "verl-smoke-a2-box16-4n-head-0.verl-smoke-a2-box16-4n"
        assert main["args"][:2] == ["bash", "-c"] and "command" not in main, "through the image's entrypoint (CANN env)"
        assert task["template"]["spec"]["activeDeadlineSeconds"] == 3600
    head = spec["tasks"][0]["template"]["spec"]["containers"][0]["args"]
    assert head[2] == (ROOT / "buildkit" / "k8s" / "files" / "ray-head.sh").read_text() and head[3] == "ray-head"
    assert head[4:7] == ["python3", "-m", "verl.trainer.main_ppo"] and "trainer.nnodes=4" in head
    assert "ray start --head" in head[2] and '--resources="{\\"NPU\\": ${ASCENDKIT_RAY_NPUS}}"' in head[2]


def test_kuberay_on_volcano_carries_the_labels_its_integration_reads() -> None:
    request = _request("a3", SKUS["a3"], 2, scheduler="volcano", queue="rl", topology_mode="hard", topology_tier=2)
    _, rayjob = docs_of(render(request).text)
    labels = rayjob["metadata"]["labels"]
    assert labels["volcano.sh/queue-name"] == "rl"
    assert labels["volcano.sh/network-topology-mode"] == "hard" and labels["volcano.sh/network-topology-highest-tier-allowed"] == "2"
    for group in (rayjob["spec"]["rayClusterSpec"]["headGroupSpec"], *rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]):
        assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {"NPU": 16}


def test_one_node_on_volcano_is_a_job_volcano_queues() -> None:
    _, job = docs_of(render(_request("900-podc", SKUS["900-podc"], 1, scheduler="volcano", queue="smoke")).text)
    template = job["spec"]["template"]
    assert job["apiVersion"] == "batch/v1" and template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "smoke"}
    assert "hostNetwork" not in template["spec"], "one node needs no host network unless asked"


def test_the_acceptance_rayjob_for_a2_box16_on_two_nodes(tmp_path: Path, ascendkit: Ascendkit) -> None:
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


def test_a_train_job_runs_the_users_command_through_the_entrypoint(ascendkit: Ascendkit) -> None:
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


def test_json_output_is_a_list_kubectl_accepts_and_validate_reads(tmp_path: Path, ascendkit: Ascendkit) -> None:
    out = tmp_path / "job.json"
    assert ascendkit("k8s", "render", "--hw", "a3", "--image", DIGEST_REF, "--stack", "cann8.3", "--json", "-o", str(out)).returncode == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "List" and [i["kind"] for i in data["items"]] == ["ConfigMap", "Job"]
    proc = ascendkit("k8s", "validate", str(out))
    assert proc.returncode == 0 and "2 document(s) valid" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hw", "a3", "--image", "ascendkit/verl:latest"], "has no digest and names no registry to resolve its tag at"),
        (["--hw", "a3", "--image", "Not An Image"], "is not an image reference"),
        (["--hw", "a3", "--image", DIGEST_REF, "--name", "Bad_Name"], "--name 'Bad_Name' is not a valid Kubernetes name"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--name", "r" * 48], "at most 47 characters"),
        (["--hw", "a3", "--image", DIGEST_REF, "--namespace", "-x"], "--namespace '-x' is not a valid Kubernetes name"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nodes", "0"], "'--nodes'"),
        (["--hw", "a9", "--image", DIGEST_REF], "a9"),
        (["--hw", "a2", "--image", DIGEST_REF], "names a chip family; pods are sized by the SKU: one of a2-box16, 900-podc"),
        (["--hw", "a3", "--image", DIGEST_REF, "--job", "train"], "--job train needs the command after `--`"),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--job", "eval"],
            "'eval' is not one of 'smoke', 'grpo', 'sft', 'train'",
        ),
        (["--hw", "a3", "--image", DIGEST_REF, "--job", "sft", "--nodes", "2"], "--job sft runs on one node"),
        (["--hw", "a3", "--image", DIGEST_REF, "--job", "sft", "--", "python3"], "a command after `--` is for --job train"),
        (["--hw", "a3", "--image", DIGEST_REF, "--arch", "riscv64"], "'riscv64' is not one of 'aarch64', 'x86_64'"),
        (["--hw", "a3", "--image", DIGEST_REF, "--model-path", "models/q"], "an absolute path on the nodes"),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--stack", "cann8.1"],
            "--stack: stack 'cann8.1' does not support SKU 'a3'; it supports: a2-box16, 900-podc (stacks for a3",
        ),
        (["--hw", "a3", "--image", DIGEST_REF, "--stack", "cann9"], "--stack: unknown stack 'cann9'"),
        (["--hw", "a3", "--image", DIGEST_REF, "--name", ""], "--name '' is not a valid Kubernetes name"),
        (["--hw", "a3", "--image", DIGEST_REF, "--model-path", "/m", "--model-pvc", "models"], "--model-path and --model-pvc both"),
        (["--hw", "a3", "--image", DIGEST_REF, "--queue", "rl"], "--queue is for Volcano: add --scheduler volcano"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--no-kuberay"], "--no-kuberay renders a Volcano Job: add --scheduler"),
        (["--hw", "a3", "--image", DIGEST_REF, "--scheduler", "volcano", "--no-kuberay"], "one node is a batch/v1 Job either way"),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--scheduler", "kube-batch"],
            "'kube-batch' is not one of 'default', 'volcano'",
        ),
        (["--hw", "a3", "--image", DIGEST_REF, "--scheduler", "volcano", "--queue", "Bad Queue"], "--queue 'Bad Queue' is not a valid"),
        (["--hw", "a3", "--image", DIGEST_REF, "--npu-resource", "Ascend910"], "--npu-resource 'Ascend910' is not an extended resource"),
        (["--hw", "a3", "--image", DIGEST_REF, "--nic", "eth0; rm -rf /"], "--nic 'eth0; rm -rf /': a network interface name"),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--scheduler", "volcano", "--network-topology", "strict"],
            "'strict' is not one of 'hard', 'soft'",
        ),
        (["--hw", "a3", "--image", DIGEST_REF, "--scheduler", "volcano", "--network-topology", "hard"], "it needs --nodes 2 or more"),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--scheduler", "volcano", "--topology-tier", "1"],
            "needs --network-topology",
        ),
        (
            ["--hw", "a3", "--image", DIGEST_REF, "--nodes", "2", "--scheduler", "volcano", "--no-kuberay", "--name", "v" * 51],
            "at most 50 characters",
        ),
    ],
)
def test_refusals_are_clear_and_write_nothing(tmp_path: Path, args: list[str], message: str, ascendkit: Ascendkit) -> None:
    out = tmp_path / "manifest.yaml"
    proc = ascendkit("k8s", "render", *args, "-o", str(out))
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
    out.write_text("kept\n")
    assert ascendkit("k8s", "render", *args, "-o", str(out)).returncode == ExitCode.INVALID_INPUT
    assert out.read_text() == "kept\n", "an earlier file is left as it was"


def test_a_tag_is_accepted_only_when_asked_and_then_warned_about(ascendkit: Ascendkit) -> None:
    proc = ascendkit("k8s", "render", "--hw", "a3", "--image", "127.0.0.1:5000/ascendkit/verl:latest", "--allow-tag", "--stack", "cann8.3")
    assert proc.returncode == 0
    assert "warning: --image 127.0.0.1:5000/ascendkit/verl:latest is a mutable tag" in proc.stderr


def test_validate_names_the_document_and_field_of_each_problem(tmp_path: Path, ascendkit: Ascendkit) -> None:
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
    rayjob_at = "document 2 (RayJob verl-smoke-a3-2n): spec."
    assert f"{rayjob_at}rayClusterSpec.workerGroupSpecs.0.replicas: 'two' is not of type 'integer'" in proc.stderr
    assert f'{rayjob_at}entrypint: unknown field "entrypint"' in proc.stderr
    assert (
        f'{rayjob_at}rayClusterSpec.headGroupSpec.template.spec.containers.0.imagePullPolcy: unknown field "imagePullPolcy"' in proc.stderr
    )
    assert "bad.yaml: 2 document(s) 4 problem(s)" in proc.stdout, "one report per mistake (the CRD's, not the pod schema's too)"


def _plant(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    planted: dict[str, Any] = json.loads(json.dumps(doc))
    node: Any = planted
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return planted


# In each kind: an undeclared field and a wrong type, where the kind's own schema (CRD or Kubernetes) must catch them.
PLANTS: dict[str, tuple[int, dict[str, Any], list[Any], list[Any], Any]] = {
    "Job": (1, {}, ["spec", "backoffLimitt"], ["spec", "backoffLimit"], "zero"),
    "RayJob": (2, {}, ["spec", "rayClusterSpec", "headGroupSpec", "rayStartParam"], ["spec", "shutdownAfterJobFinishes"], "yes"),
    "VolcanoJob": (2, {"scheduler": "volcano", "kuberay": False}, ["spec", "minAvailabe"], ["spec", "minAvailable"], "2"),
    "VolcanoJob-task": (
        2,
        {"scheduler": "volcano", "kuberay": False},
        ["spec", "tasks", 1, "replica"],
        ["spec", "tasks", 1, "replicas"],
        1.5,
    ),
    "VolcanoJob-policy": (
        2,
        {"scheduler": "volcano", "kuberay": False},
        ["spec", "policies", 0, "actions"],
        ["spec", "policies", 1, "event"],
        "PodCrashed",
    ),
    "VolcanoJob-pod": (
        2,
        {"scheduler": "volcano", "kuberay": False},
        ["spec", "tasks", 0, "template", "spec", "hostNetwrk"],
        ["spec", "tasks", 0, "template", "spec", "containers", 0, "resources", "limits", "memory"],
        ["512Gi"],
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTS))
def test_a_planted_unknown_field_and_wrong_type_are_caught_in_each_kind(case: str) -> None:
    nodes, options, unknown, typed, wrong = PLANTS[case]
    *_, workload = docs_of(render(_request("a3", SKUS["a3"], nodes, **options)).text)
    assert validate_documents([workload]) == []
    (problem,) = validate_documents([_plant(workload, unknown, 1)])
    full, parent = ".".join(map(str, unknown)), ".".join(map(str, unknown[:-1]))
    # a CRD names the field itself; the Kubernetes schemas name its parent and the field in the message
    assert (problem.path, problem.message) in ((full, f'unknown field "{unknown[-1]}"'),) or (
        problem.path == parent and f"'{unknown[-1]}' was unexpected" in problem.message
    ), problem
    (problem,) = validate_documents([_plant(workload, typed, wrong)])
    assert problem.path == ".".join(map(str, typed)), problem
    assert "not of type" in problem.message or "Unsupported value" in problem.message or "neither" in problem.message


def test_validate_refuses_a_file_with_no_objects(tmp_path: Path, ascendkit: Ascendkit) -> None:
    for text in ("", "null\n", "---\n---\n", "# only a comment\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        proc = ascendkit("k8s", "validate", str(empty))
        assert proc.returncode == ExitCode.INVALID_INPUT, text
        assert "no Kubernetes objects in it" in proc.stderr and "valid" not in proc.stdout


def test_validate_refuses_what_is_not_yaml(tmp_path: Path, ascendkit: Ascendkit) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("a: [\n")
    proc = ascendkit("k8s", "validate", str(bad))
    assert proc.returncode == ExitCode.INVALID_INPUT and "not YAML" in proc.stderr


def test_an_unreachable_registry_is_one_readable_warning_and_the_job_follows_stack(ascendkit: Ascendkit) -> None:
    image = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32  # the discard port: nothing listens
    proc = ascendkit("k8s", "render", "--hw", "a3", "--image", image, "--stack", "cann8.3")
    assert proc.returncode == 0, proc.stderr
    (warning,) = proc.stderr.splitlines()
    verl = load_matrix(ROOT / DEFAULT_MATRIX).matrix.stacks["cann8.3"].framework_version
    assert warning.startswith(f"ascendkit: warning: the job follows --stack cann8.3 (verl {verl}): could not read the image's labels: ")
    assert "registry 127.0.0.1:9: connection refused" in warning and len(warning) < 200, warning
    assert not any(noise in warning for noise in ("Errno", "Pool", "object at 0x", "Caused by"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"job": "eval"}, "--job 'eval': one of smoke, grpo, sft, train"),
        ({"scheduler": "kube-batch"}, "--scheduler 'kube-batch': one of default, volcano"),
    ],
)
def test_the_library_refuses_what_the_command_line_offers_no_choice_for(change: dict[str, Any], message: str) -> None:
    """The command line offers the choices; a caller of the library gets the same refusals from the request."""
    from buildkit.k8s.request import check_request

    a3 = load_matrix(ROOT / DEFAULT_MATRIX).matrix.skus["a3"]
    with pytest.raises(InputError, match=re.escape(message)):
        check_request(dataclasses.replace(_request("a3", a3, 1), **change))


def test_an_unreachable_registry_without_stack_exits_4_as_the_readme_promises(ascendkit: Ascendkit) -> None:
    image = "127.0.0.1:9/ascendkit/verl@sha256:" + "ab" * 32  # the discard port: nothing listens
    proc = ascendkit("k8s", "render", "--hw", "a3", "--image", image)
    assert proc.returncode == ExitCode.UNAVAILABLE, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "registry 127.0.0.1:9: connection refused" in line and "pass --stack" in line


def test_pods_run_as_the_images_user_and_the_device_group_the_nodes_give() -> None:
    from buildkit.k8s.resolve import user_of
    from buildkit.matrix.model import ImageUser

    default = ImageUser()
    label = {"io.ascendkit.user": "npu 2000:2001", "io.ascendkit.stack": "cann8.3"}
    assert user_of(label, default) == (ImageUser(name="npu", uid=2000, gid=2001), None), "the image's own user wins"
    assert user_of({}, default) == (default, None), "labels not read (--job train): the matrix's"
    user, warning = user_of({"io.ascendkit.stack": "cann8.3"}, default)
    assert user == default and warning is not None and "rebuild the image" in warning
    request = _request("a3", SKUS["a3"], 1, user=ImageUser(name="npu", uid=2000, gid=2001), device_gid=1234)
    (spec,) = [p["spec"] for p in pods(docs_of(render(request).text)[-1])]
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (2000, 2001)
    assert spec["securityContext"]["supplementalGroups"] == [1234]
    assert {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]} >= {"/home/npu", "/tmp", "/workspace"}


def test_a_bad_device_gid_is_refused_before_anything_is_asked(tmp_path: Path, ascendkit: Ascendkit) -> None:
    proc = ascendkit("k8s", "render", "--hw", "a3", "--image", _ref(DEFAULT_IMAGE), "--stack", "cann8.3", "--device-gid", "0", cwd=ROOT)
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stderr
    assert "--device-gid 0: the gid that owns the nodes' /dev/davinci*" in proc.stderr


def test_a_950_job_asks_the_950_device_plugin_and_mounts_the_ub_topology_on_several_nodes() -> None:
    """Atlas 950 nodes: resource huawei.com/npu, node label accelerator=huawei-npu, MindCluster's
    product label, HCCL_TOPO_FILE_PATH for the product's topology file; a job of several nodes mounts
    the hosts' UB files read-only, one node none."""
    sku = SKUS["950-superpod"]
    multi = set(contract_paths("a5", "multi_node"))
    assert multi == {"/lib/route.conf", "/etc/hixlep"}
    for nodes, mounted in ((1, False), (2, True)):
        docs = docs_of(render(_request("950-superpod", sku, nodes)).text)
        assert validate_documents(docs) == []
        templates = [t["spec"] for t in pods(docs[-1])]
        assert templates
        for spec in templates:
            assert spec["nodeSelector"]["accelerator"] == "huawei-npu"
            assert spec["nodeSelector"]["accelerator-type"] == "950-SuperPod-Atlas-8"
            (main,) = spec["containers"]
            assert main["resources"]["limits"]["huawei.com/npu"] == "8"
            env = {e["name"]: e.get("value") for e in main["env"]}
            assert env["HCCL_TOPO_FILE_PATH"] == f"/usr/local/Ascend/driver/topo/950/{sku.hccl_topo_file}"
            paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
            assert multi <= paths if mounted else not multi & paths
            if mounted:
                ro = {m["mountPath"] for m in main["volumeMounts"] if m.get("readOnly")}
                assert multi <= ro


def test_the_kubernetes_schemas_are_read_once_per_process() -> None:
    """kubernetes_validate parses the kind's schema and its 1.8 MB definitions for every document it
    checks; ours keeps what it read (a suite or a `k8s validate` of many manifests checks hundreds)."""
    import kubernetes_validate.utils as utils

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert validate_documents([pod]) == []
    reads = utils.schema_contents.cache_info().misses
    assert validate_documents([pod, {**pod, "spec": {"containers": "none"}}])[0].path == "spec.containers"
    assert utils.schema_contents.cache_info().misses == reads, "read again"
