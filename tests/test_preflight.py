"""The cluster preflight: a DaemonSet that runs `ascendkit doctor --json --links` with the job's
image on every node of the SKU, and `ascendkit k8s preflight`, which turns what the pods printed
into one verdict per node. The nodes here are stand-in filesystem roots (no NPU exists on these
machines) judged by the real doctor; their reports are fed back as `kubectl logs --prefix` prints them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from buildkit.doctor.base import HCCN_CONF, NODE_ENV, Environment
from buildkit.doctor.contract import contract_for
from buildkit.doctor.report import run as run_doctor
from buildkit.errors import ExitCode
from buildkit.k8s.pod import PREFLIGHT_DONE
from buildkit.k8s.render import as_documents, render
from buildkit.k8s.request import K8sRequest
from buildkit.k8s.validate import validate_documents
from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.job import JobFacts
from tests.conftest import DockerEnv
from tests.test_doctor import GOOD_ENV, INFO, FakeTorch, FakeTorchNpu, _hccn_tool, image_root

ROOT = Path(__file__).resolve().parents[1]
LOADED = load_matrix(ROOT / DEFAULT_MATRIX)
IMAGE = "127.0.0.1:5000/ascendkit/verl@sha256:" + "0123456789abcdef" * 4


def node_daemonset(sku_id: str, job: str, **kw: Any) -> dict[str, Any]:
    """The DaemonSet `k8s render --job preflight|prepull` gives for the shipped matrix's SKU."""
    m = LOADED.matrix
    request = K8sRequest(sku_id, m.skus[sku_id], IMAGE, job=job, facts=JobFacts.of(m.compat), user=m.image_user, **kw)
    (doc,) = as_documents(render(request).text)
    return doc


def daemonset_pod_spec(doc: dict[str, Any], sku_id: str, job: str) -> dict[str, Any]:
    """What every node DaemonSet is: its name, its selector within its pods' labels, the SKU's nodes; its pod spec."""
    sku = LOADED.matrix.skus[sku_id]
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("apps/v1", "DaemonSet", f"ascendkit-{job}-{sku_id}")
    pod = doc["spec"]["template"]
    assert doc["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spec: dict[str, Any] = pod["spec"]
    assert spec["nodeSelector"] == {
        "accelerator": sku.k8s_accelerator,
        "accelerator-type": sku.k8s_accelerator_type,
        "host-arch": "huawei-arm",
    }
    return spec


def preflight(sku_id: str, **kw: Any) -> dict[str, Any]:
    return node_daemonset(sku_id, "preflight", **kw)


@pytest.mark.parametrize("scheduler", ["default", "volcano"])
@pytest.mark.parametrize("sku_id", sorted(LOADED.matrix.skus))
def test_the_preflight_daemonset_validates_strictly_for_every_sku_and_scheduler(sku_id: str, scheduler: str) -> None:
    doc = preflight(sku_id, scheduler=scheduler, namespace="rl")
    assert validate_documents([doc]) == []
    sku = LOADED.matrix.skus[sku_id]
    pod = doc["spec"]["template"]
    spec = daemonset_pod_spec(doc, sku_id, "preflight")
    (container,) = spec["containers"]
    assert container["image"] == IMAGE and container["args"][:2] == ["bash", "-c"]
    assert container["args"][2].startswith("ascendkit doctor --json --links; ") and PREFLIGHT_DONE in container["args"][2]
    assert container["resources"]["limits"][sku.k8s_npu_resource] == str(sku.npus_per_node), (
        "every NPU of the node: held ones keep it Pending"
    )
    assert container["env"] == [{"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    lent = {p.path for p in contract_for(sku.chip).paths if p.in_pod(ascend_runtime=True, nodes=1)}
    assert lent | {HCCN_CONF} <= mounted and "/usr/local/Ascend/driver/version.info" in lent
    assert spec["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    if scheduler == "volcano":
        assert spec["schedulerName"] == "volcano" and pod["metadata"]["labels"]["ring-controller.atlas"] == sku.k8s_ring_controller
    else:
        assert "schedulerName" not in spec


def test_preflight_refuses_what_it_does_not_use() -> None:
    from buildkit.errors import InputError

    for kw, said in (({"nodes": 2}, "drop --nodes"), ({"model_pvc": "models"}, "trains nothing")):
        with pytest.raises(InputError, match=said):
            preflight("a3", **kw)


def _node(tmp_path: Path, name: str, *, driver: str = "package_version=25.3.rc1\n", links: dict[int, str] | None = None) -> str:
    """One node's preflight log: the real doctor on a stand-in root with four NPUs, as the pod prints it."""
    root = image_root(tmp_path / name, devices=4, driver=driver)
    (root / "etc/ascendkit/image.json").write_text(
        json.dumps({**INFO, "cann": "8.3.RC1", "drivers": {"hdk": ["25.2.X", "25.3.RC1"], "source": "stand-in"}})
    )
    _hccn_tool(root, links or dict.fromkeys(range(4), "UP"))
    code, report = run_doctor(Environment(root, {**GOOD_ENV, NODE_ENV: name}), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    return json.dumps(report, indent=2) + f"\n{PREFLIGHT_DONE} (doctor exit {code})\n"


def _kubectl_logs(logs: dict[str, str]) -> str:
    """`kubectl logs -l ... --prefix`: every line of every pod behind [pod/NAME/CONTAINER]."""
    return "".join(f"[pod/ascendkit-preflight-a3-{pod}/preflight] {line}\n" for pod, log in logs.items() for line in log.splitlines())


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, str]:
    """Three good nodes and two bad ones: an old driver, a port down."""
    return {
        "x7k2p": _node(tmp_path, "node-a"),
        "m3q9z": _node(tmp_path, "node-b"),
        "c8v1w": _node(tmp_path, "node-c", driver="Version=7.6.t8.0.b050\npackage_version=25.2.1\n"),
        "d4n6r": _node(tmp_path, "node-d", driver="Version=24.1.0\n"),
        "h2s5t": _node(tmp_path, "node-e", links={0: "UP", 1: "UP", 2: "DOWN", 3: "UP"}),
    }


def ascendkit(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("ascendkit")
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True, check=False)


def test_the_summary_names_each_bad_node_its_failing_check_and_what_to_do(cluster: dict[str, str]) -> None:
    proc = ascendkit("k8s", "preflight", "-", stdin=_kubectl_logs(cluster))
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["node", "verdict", "check", "detail"]
    rows = [line.split()[:3] for line in lines[1:] if line.startswith("node-")]
    assert rows == [
        ["node-d", "ERROR", "driver"],
        ["node-e", "ERROR", "NPU"],  # "NPU links"
        ["node-a", "OK", "-"],
        ["node-b", "OK", "-"],
        ["node-c", "OK", "-"],
    ], "failed first, then by name"
    text = proc.stdout
    assert "driver 24.1.0 is older than CANN 8.3.RC1 supports (Ascend HDK 25.2.X, 25.3.RC1)" in text
    assert "NPU 2 link DOWN" in text and "what to do: hccn_tool -i N -link -g on the node" in text
    assert "what to do: upgrade the node's NPU driver and firmware (Ascend HDK)" in text
    assert lines[-1] == "ascendkit k8s preflight: 5 node(s) reported, 2 failed, 0 warned"


def test_the_summary_reads_a_directory_of_logs_and_prints_json(cluster: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for pod, log in cluster.items():
        if pod not in ("d4n6r", "h2s5t"):
            (logs / f"{pod}.log").write_text(log)  # kubectl logs POD > DIR/POD.log: no prefixes
    proc = ascendkit("k8s", "preflight", str(logs), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["passed"] and [n["node"] for n in data["nodes"]] == ["node-a", "node-b", "node-c"]
    assert all(n["verdict"] == "ok" for n in data["nodes"])
    short = ascendkit("k8s", "preflight", str(logs), "--expect", "5")
    assert short.returncode == 1 and "! 3 of 5 nodes reported: the others' preflight pods are Pending" in short.stdout


def test_the_node_list_says_which_nodes_pull_the_zstd_tags(cluster: dict[str, str], tmp_path: Path) -> None:
    """`kubectl get nodes -o json` beside the logs: each node's container runtime, judged for zstd."""
    runtimes = {"node-a": "containerd://1.6.20", "node-b": "docker://20.10.24", "node-c": "containerd://1.7.13"}
    nodes = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"kind": "Node", "metadata": {"name": name}, "status": {"nodeInfo": {"containerRuntimeVersion": runtime}}}
            for name, runtime in runtimes.items()
        ],
    }
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    good = {pod: log for pod, log in cluster.items() if pod not in ("d4n6r", "h2s5t")}
    proc = ascendkit("k8s", "preflight", "-", "--node-info", str(tmp_path / "nodes.json"), stdin=_kubectl_logs(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("node-")}
    assert rows == {"node-b": ["WARN", "zstd"], "node-a": ["OK", "-"], "node-c": ["OK", "-"]}
    assert "docker 20.10.24 cannot pull zstd layers (docker >= 23.0)" in proc.stdout
    assert "zstd: 2 of 3 node(s) pull the -zstd tags; these need the gzip tags: node-b (docker://20.10.24)" in proc.stdout
    data = json.loads(
        ascendkit("k8s", "preflight", "-", "--node-info", str(tmp_path / "nodes.json"), "--json", stdin=_kubectl_logs(good)).stdout
    )
    assert {n["node"]: (n["runtime"], n["zstd"]) for n in data["nodes"]} == {
        "node-a": ("containerd://1.6.20", True),
        "node-b": ("docker://20.10.24", False),
        "node-c": ("containerd://1.7.13", True),
    }
    engines = {n["node"]: n["engine"] for n in data["nodes"]}
    assert engines["node-b"]["product"] == "Docker Engine" and engines["node-b"]["api_version"] == "1.41"
    assert engines["node-a"]["image_store"] == "containerd" and engines["node-a"]["version"] == "1.6.20"
    assert (
        "engine: Docker Engine 20.10.24 (API 1.41), image store: not in the node list: run `ascendkit doctor` on the node: 1 node(s)"
        in proc.stdout
    )
    assert "engine: containerd 1.6.20 (API CRI), image store: containerd: 1 node(s)" in proc.stdout
    (tmp_path / "pods.json").write_text('{"kind": "List", "items": []}')
    bad = ascendkit("k8s", "preflight", "-", "--node-info", str(tmp_path / "pods.json"), stdin=_kubectl_logs(good))
    assert bad.returncode == ExitCode.INVALID_INPUT and "no node with status.nodeInfo.containerRuntimeVersion" in bad.stderr


def test_a_log_without_a_report_is_an_input_error(tmp_path: Path) -> None:
    empty = tmp_path / "nothing.log"
    empty.write_text("[pod/x/preflight] Error: ImagePullBackOff\n")
    proc = ascendkit("k8s", "preflight", str(empty))
    assert proc.returncode == ExitCode.INVALID_INPUT and "no `ascendkit doctor --json` report found" in proc.stderr


@pytest.mark.docker
def test_the_rendered_preflight_container_runs_in_the_image_and_its_log_is_judged(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """The preflight pod's container as rendered (its args through the image's entrypoint, its env,
    as the image's user, read-only root with a writable /tmp and home), on this machine: no NPUs, so
    doctor reports none and the pod idles; its log, as `kubectl logs --prefix` would show it, is a
    failing node for the summary."""
    doc = preflight("a3")
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    env = {"ASCENDKIT_NODE_NAME": "node-x"}  # what the downward API gives the pod
    assert [e["name"] for e in container["env"]] == list(env)
    client = docker_env.client
    config = client.create_host_config(read_only=True, tmpfs={"/tmp": "", "/home/HwHiAiUser": "", "/workspace": ""})
    created = client.create_container(
        built["tags"][0], command=container["args"], environment=env, host_config=config, network_disabled=True
    )
    try:
        client.start(created)
        deadline = time.monotonic() + 120
        log = ""
        while PREFLIGHT_DONE not in log and time.monotonic() < deadline:
            time.sleep(0.5)
            log = client.logs(created, stdout=True, stderr=False).decode()
        assert PREFLIGHT_DONE + " (doctor exit 10)" in log, log
        assert client.inspect_container(created)["State"]["Running"], "it idles so that the DaemonSet does not restart it"
    finally:
        client.remove_container(created, force=True)
    proc = ascendkit("k8s", "preflight", "-", stdin=_kubectl_logs({"p1x2y": log}))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("node-x"))
    assert row.split()[:3] == ["node-x", "ERROR", "NPUs"] and "no /dev/davinci* in the pod" in row
