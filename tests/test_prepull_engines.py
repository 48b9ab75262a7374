"""Pre-pulling with the engines clusters run: OpenKruise's ImagePullJob checked against its vendored
CRD, Dragonfly's preheat jobs against the request types its manager binds them into (read from
Dragonfly's own vendored Go source, with their binding rules), and `k8s prepull-status` reading
status documents whose shape is the pullers' own (the CRDs' status schemas, Kubernetes' Pod
schema, Dragonfly's result structs)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from buildkit.k8s.crd import crd_for
from buildkit.k8s.crd import validate as crd_validate
from buildkit.k8s.prepull import PrepullImage
from buildkit.k8s.prepull_status import read
from buildkit.k8s.render import as_documents, render
from buildkit.k8s.request import K8sRequest
from buildkit.k8s.validate import validate_documents
from buildkit.run.job import JobFacts
from tests.harness.upstream_sources import vendored
from tests.test_preflight import IMAGE, LOADED

ROOT = Path(__file__).resolve().parent
DRAGONFLY = ROOT / "fixtures" / "upstream" / "dragonfly"
GZIP = PrepullImage("harbor.example.com/rl/verl:1.0@sha256:" + "a" * 64, "gzip", ("linux/amd64", "linux/arm64"))
ZSTD = PrepullImage("harbor.example.com/rl/verl:1.0-zstd@sha256:" + "b" * 64, "zstd", ("linux/arm64",))


def rendered(sku_id: str, puller: str, images: tuple[PrepullImage, ...] = (GZIP, ZSTD), **kw: Any) -> tuple[str, tuple[str, ...]]:
    m = LOADED.matrix
    request = K8sRequest(
        sku_id, m.skus[sku_id], IMAGE, job="prepull", facts=JobFacts.of(m.compat), user=m.image_user, puller=puller,
        prepull_images=images, **kw,
    )  # fmt: skip
    out = render(request)
    return out.text, out.notes


# ---------------------------------------------------------------------------------------------
# Dragonfly's request and result types, read from its vendored source


def test_the_vendored_dragonfly_sources_are_the_ones_recorded() -> None:
    sources = json.loads((DRAGONFLY / "SOURCES.json").read_text())
    assert sources["tag"] == "v2.5.1" and len(sources["commit"]) == 40
    assert set(vendored("dragonfly")) == {entry["path"] for entry in sources["files"]}  # each sha256 checked


def go_struct(file: str, name: str) -> dict[str, tuple[str, str]]:
    """json name -> (Go type, binding/validate rule) of struct ``name`` in a vendored file."""
    text = (DRAGONFLY / file).read_text()
    body = re.search(r"^type " + name + r" struct \{\n(.*?)^\}", text, re.M | re.S)
    assert body, f"{name} is not in {file}"
    fields = {}
    for line in body.group(1).splitlines():
        match = re.match(r"\s*\w+\s+(\S+)\s+`([^`]*)`", line)
        json_name = re.search(r'json:"([^",]+)', match.group(2)) if match else None
        if match and json_name:
            rule = re.search(r'(?:binding|validate):"([^"]*)"', match.group(2))
            fields[json_name.group(1)] = (match.group(1), rule.group(1) if rule else "")
    assert fields, f"no fields read from {name}"
    return fields


def binding_problems(value: dict[str, Any], struct: dict[str, tuple[str, str]], where: str) -> list[str]:
    """What gin's binding would refuse in ``value``, by the struct's types and rules (the subset the rules use)."""
    problems = [f"{where}.{key}: not a field of the Go struct (the manager would drop it)" for key in value if key not in struct]
    for key, (go_type, rule) in struct.items():
        rules = dict(r.partition("=")[::2] for r in rule.split(",") if r)
        if key not in value:
            if "required" in rules:
                problems.append(f"{where}.{key}: required")
            continue
        item = value[key]
        kind = go_type.lstrip("*")
        if kind == "string" and not isinstance(item, str):
            problems.append(f"{where}.{key}: a {go_type}, got {item!r}")
        if kind in ("int64", "uint", "uint32", "uint64", "time.Duration") and (isinstance(item, bool) or not isinstance(item, int)):
            problems.append(f"{where}.{key}: a {go_type} (a JSON integer), got {item!r}")
        if "oneof" in rules and item not in rules["oneof"].split():
            problems.append(f"{where}.{key}: one of {rules['oneof']}, got {item!r}")
        if isinstance(item, int) and "gte" in rules and item < int(rules["gte"]):
            problems.append(f"{where}.{key}: gte {rules['gte']}, got {item}")
        if isinstance(item, int) and "lte" in rules and item > int(rules["lte"]):
            problems.append(f"{where}.{key}: lte {rules['lte']}, got {item}")
    return problems


def scopes() -> set[str]:
    return set(re.findall(r'Scope = "(\w+)"', (DRAGONFLY / "manager_types_job.go").read_text()))


def test_the_preheat_jobs_are_what_the_manager_binds_a_preheat_into() -> None:
    text, notes = rendered("a3", "dragonfly", pull_secret="harbor-cred", namespace="rl")
    jobs = json.loads(text)
    request, args = go_struct("manager_types_job.go", "CreatePreheatJobRequest"), go_struct("manager_types_job.go", "PreheatArgs")
    for job in jobs:
        assert binding_problems(job, request, "job") == []
        assert binding_problems(job["args"], args, "args") == []
        assert job["args"]["scope"] in scopes() and job["args"]["scope"] == "all_peers"
    # one job per image and platform: a manifest list is preheated one platform at a time
    assert [(j["args"]["url"].rsplit("/", 1)[1][-4:], j["args"]["platform"]) for j in jobs] == [
        ("aaaa", "linux/amd64"), ("aaaa", "linux/arm64"), ("bbbb", "linux/arm64"),
    ]  # fmt: skip
    assert jobs[0]["args"]["url"] == "https://harbor.example.com/v2/rl/verl/manifests/sha256:" + "a" * 64
    assert "password" not in text and "username" not in text, "no credential is rendered"
    said = "\n".join(notes)
    assert "kubectl get secret harbor-cred -n rl" in said and "/oapi/v1/jobs" in said


def test_the_binding_check_refuses_what_the_manager_would() -> None:
    args = go_struct("manager_types_job.go", "PreheatArgs")
    assert binding_problems({"type": "blob", "url": "x"}, args, "args") == ["args.type: one of image file, got 'blob'"]
    assert binding_problems({"type": "image", "concurrent_peer_count": 5000}, args, "args") == [
        "args.concurrent_peer_count: lte 1000, got 5000"
    ]
    assert binding_problems({"type": "image", "timeout": "2h"}, args, "args")[0].startswith("args.timeout: a time.Duration")
    assert binding_problems({"url": "x"}, args, "args") == ["args.type: required"]
    assert binding_problems({"type": "image", "platfrom": "linux/arm64"}, args, "args")[0].startswith("args.platfrom: not a field")


# ---------------------------------------------------------------------------------------------
# OpenKruise ImagePullJob


@pytest.mark.parametrize("sku_id", sorted(LOADED.matrix.skus))
def test_an_imagepulljob_per_image_validates_against_openkruises_crd(sku_id: str) -> None:
    text, _ = rendered(sku_id, "openkruise", namespace="rl", pull_secret="harbor-cred", parallelism=25)
    docs = as_documents(text)
    assert validate_documents(docs) == []
    sku = LOADED.matrix.skus[sku_id]
    assert [d["metadata"]["name"] for d in docs] == [f"ascendkit-prepull-{sku_id}", f"ascendkit-prepull-{sku_id}-zstd"]
    for doc, image in zip(docs, (GZIP, ZSTD), strict=True):
        assert (doc["apiVersion"], doc["kind"]) == ("apps.kruise.io/v1alpha1", "ImagePullJob")
        spec = doc["spec"]
        assert spec["image"] == image.ref and spec["pullSecrets"] == ["harbor-cred"] and spec["parallelism"] == 25
        assert spec["selector"]["matchLabels"]["accelerator-type"] == sku.k8s_accelerator_type
        assert spec["pullPolicy"]["timeoutSeconds"] > 600, "OpenKruise's default 600 s is shorter than a cold 25 GB pull"
        assert doc["metadata"]["labels"]["io.ascendkit/variant"] == image.variant
    assert "kubectl apply -f FILE -l io.ascendkit/variant=gzip" in text


def test_the_crd_refuses_a_misspelt_imagepulljob() -> None:
    (doc, _) = as_documents(rendered("a3", "openkruise")[0])
    doc["spec"]["pullPolicy"]["timeout"] = 10
    doc["spec"]["parallelism"] = True
    found = validate_documents([doc])
    assert any("timeout" in p.path or "timeout" in p.message for p in found), found
    assert any("parallelism" in p.path for p in found), found


def test_one_image_gets_one_job_and_refusals_are_clear() -> None:
    (doc,) = as_documents(rendered("a3", "openkruise", images=(ZSTD,))[0])
    assert doc["metadata"]["name"] == "ascendkit-prepull-a3"
    m = LOADED.matrix
    base: dict[str, Any] = {"facts": JobFacts.of(m.compat), "user": m.image_user}
    from buildkit.k8s.request import check_request

    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({"job": "smoke", "puller": "openkruise"}, "goes with --job prepull"),
        ({"job": "prepull", "parallelism": 4}, "goes with --puller openkruise"),
        ({"job": "prepull", "puller": "kraken"}, "one of daemonset, openkruise, dragonfly"),
    )
    for kw, said in cases:
        with pytest.raises(InputError, match=said):
            check_request(K8sRequest("a3", m.skus["a3"], IMAGE, **base, **kw))


# ---------------------------------------------------------------------------------------------
# k8s prepull-status, on status documents of the pullers' own shape

T0 = "2026-11-20T10:00:00Z"


def at(seconds: int) -> str:
    return f"2026-11-20T{10 + seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"


def node_images() -> dict[str, Any]:
    def node(name: str, phase: str, took: int | None, message: str = "", progress: int | None = None) -> dict[str, Any]:
        tag: dict[str, Any] = {"tag": GZIP.ref.split("@")[1], "phase": phase, "startTime": T0, "version": 1}
        if took is not None:
            tag["completionTime"] = at(took)
        if message:
            tag["message"] = message
        if progress is not None:
            tag["progress"] = progress
        return {
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "NodeImage",
            "metadata": {"name": name},
            "spec": {"images": {"harbor.example.com/rl/verl": {"tags": [{"tag": tag["tag"], "version": 1}]}}},
            "status": {"desired": 1, "imageStatuses": {"harbor.example.com/rl/verl": {"tags": [tag]}}},
        }

    items = [node(f"npu-{i:02d}", "Succeeded", 100 + 10 * i) for i in range(10)]
    items.append(node("npu-10", "Failed", 600, "failed to pull: rpc error: code = Unknown desc = no space left on device"))
    items.append(node("npu-11", "Pulling", None, progress=40))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def imagepulljob_status() -> dict[str, Any]:
    (doc, _) = as_documents(rendered("a3", "openkruise", namespace="rl")[0])
    doc["status"] = {
        "startTime": T0, "desired": 12, "active": 1, "succeeded": 10, "failed": 1, "failedNodes": ["npu-10"],
        "message": "job is running, progress 11/12",
    }  # fmt: skip
    return doc


def test_status_documents_have_the_crds_shape() -> None:
    """The fixtures are what OpenKruise would hold: their status validates against the vendored CRDs."""
    job = imagepulljob_status()
    crd, schema = crd_for(job["apiVersion"], job["kind"])
    assert crd is not None and schema is not None and crd_validate(job, schema) == []
    for item in node_images()["items"]:
        crd, schema = crd_for(item["apiVersion"], item["kind"])
        assert crd is not None and schema is not None and crd_validate(item, schema) == [], item["metadata"]["name"]


def test_an_imagepulljob_status_names_the_failed_node_its_reason_and_the_times(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps(imagepulljob_status()))
    (tmp_path / "nodeimages.json").write_text(json.dumps(node_images()))
    status = read(str(tmp_path / "job.json"), str(tmp_path / "nodeimages.json"))
    d = status.describe()
    assert (d["desired"], d["done"], d["failed"], d["pending"], d["complete"]) == (12, 10, 1, 1, False)
    assert d["p50_seconds"] == pytest.approx(145) and 188 < d["p99_seconds"] <= 190
    (failed,) = [n for n in status.nodes if n.state == "failed"]
    assert failed.node == "npu-10" and "no space left on device" in failed.reason
    # without the NodeImages: the job's own counts, the failed node named
    alone = read(str(tmp_path / "job.json")).describe()
    assert (alone["done"], alone["failed"], alone["pending"]) == (10, 1, 1) and alone["nodes"][0]["node"] == "npu-10"


def pod(node: str, *, took: int | None = None, waiting: tuple[str, str] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": at(took)}} if took is not None else {}
    if waiting:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"ascendkit-prepull-a3-{node}", "namespace": "rl"},
        "spec": {"nodeName": node, "containers": [{"name": "prepull", "image": IMAGE}]},
        "status": {
            "phase": "Running" if took is not None else "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": T0}],
            "containerStatuses": [
                {"name": "prepull", "image": IMAGE, "imageID": "", "ready": took is not None, "restartCount": 0, "state": state}
            ],
        },
    }


def test_the_daemonsets_pods_give_each_nodes_pull(tmp_path: Path) -> None:
    from buildkit.k8s.validate import validate_documents as kube

    pods = [pod("npu-a", took=300), pod("npu-b", took=420), pod("npu-c", waiting=("ImagePullBackOff", "Back-off pulling image"))]
    pods.append(pod("npu-d", waiting=("ContainerCreating", "")))
    assert kube(pods) == [], "the fixture pods are valid Pods"
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    d = read(str(path)).describe()
    assert (d["done"], d["failed"], d["pending"], d["desired"]) == (2, 1, 1, 4)
    assert d["p50_seconds"] == 360
    assert [n["reason"] for n in d["nodes"] if n["state"] == "failed"] == ["ImagePullBackOff: Back-off pulling image"]


def dragonfly_job(job_id: int, state: str, ok: list[str], failed: list[tuple[str, str]]) -> dict[str, Any]:
    response = {
        "success_tasks": [{"url": "u", "hostname": h, "ip": "10.0.0.1"} for h in ok],
        "failure_tasks": [{"url": "u", "hostname": h, "ip": "10.0.0.2", "description": why} for h, why in failed],
        "scheduler_cluster_id": 1,
    }
    group = {"group_uuid": "g", "state": state, "created_at": T0, "updated_at": at(60), "job_states": [
        {"task_uuid": "t", "task_name": "preheat", "state": state, "results": [response], "error": "", "created_at": T0, "ttl": 0}
    ]}  # fmt: skip
    return {"id": job_id, "task_id": "group_g", "bio": "", "type": "preheat", "state": state, "args": {"url": "u"}, "result": group}


def test_dragonfly_results_have_the_managers_shape_and_name_failed_peers(tmp_path: Path) -> None:
    jobs = [dragonfly_job(1, "SUCCESS", ["npu-a", "npu-b"], []), dragonfly_job(2, "FAILURE", ["npu-a"], [("npu-c", "disk full")])]
    models = go_struct("manager_models_job.go", "Job")
    group, task = go_struct("internal_job_job.go", "GroupJobState"), go_struct("internal_job_job.go", "jobState")
    response = go_struct("internal_job_types.go", "PreheatResponse")
    ok, bad = go_struct("internal_job_types.go", "PreheatSuccessTask"), go_struct("internal_job_types.go", "PreheatFailureTask")
    for job in jobs:  # every key a fixture holds is one the manager writes
        assert set(job) - {"id"} <= set(models)
        assert set(job["result"]) <= set(group) and set(job["result"]["job_states"][0]) <= set(task)
        result = job["result"]["job_states"][0]["results"][0]
        assert set(result) <= set(response)
        assert all(set(t) <= set(ok) for t in result["success_tasks"]) and all(set(t) <= set(bad) for t in result["failure_tasks"])
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    d = read(str(path)).describe()
    assert (d["done"], d["failed"]) == (2, 1)
    assert [n["reason"] for n in d["nodes"] if n["state"] == "failed"] == ["disk full"]


def test_prepull_status_cli_exits_1_on_a_failed_node_and_refuses_what_is_not_a_status(tmp_path: Path, runner: CliRunner) -> None:
    def cli(*argv: str) -> Any:
        return runner.invoke(app, list(argv))

    (tmp_path / "job.json").write_text(json.dumps(imagepulljob_status()))
    (tmp_path / "ni.json").write_text(json.dumps(node_images()))
    result = cli("k8s", "prepull-status", str(tmp_path / "job.json"), "--node-images", str(tmp_path / "ni.json"))
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert "npu-10" in result.output and "no space left on device" in result.output and "p50 145 s" in result.output
    (tmp_path / "bad.json").write_text('{"kind": "Deployment"}')
    result = cli("k8s", "prepull-status", str(tmp_path / "bad.json"))
    assert result.exit_code == ExitCode.INVALID_INPUT and "a Deployment" in result.output
    (tmp_path / "cut.json").write_text('{"kind": "ImagePullJob",')
    result = cli("k8s", "prepull-status", str(tmp_path / "cut.json"))
    assert result.exit_code == ExitCode.INVALID_INPUT and "line 1" in result.output


# ---------------------------------------------------------------------------------------------
# Which engines a cluster runs: k8s preflight --cluster


def workload(kind: str, namespace: str, name: str, image: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": name, "image": image}]}},
        },
    }


def cluster_list(*, kruise: bool, dragonfly: bool) -> dict[str, Any]:
    import yaml

    items: list[dict[str, Any]] = [workload("Deployment", "kube-system", "coredns", "registry.k8s.io/coredns/coredns:v1.11.3")]
    if kruise:  # the CRD as OpenKruise ships it, and its daemon
        items.append(yaml.safe_load((ROOT.parent / "buildkit" / "k8s" / "crds" / "apps.kruise.io_imagepulljobs.yaml").read_text()))
        items.append(workload("DaemonSet", "kruise-system", "kruise-daemon", "openkruise/kruise-manager:v1.9.0"))
    if dragonfly:
        items.append(workload("Deployment", "dragonfly-system", "dragonfly-manager", "dragonflyoss/manager:v2.5.1"))
        items.append(workload("DaemonSet", "dragonfly-system", "dragonfly-client", "dragonflyoss/client:v1.1.9"))
    return {"apiVersion": "v1", "kind": "List", "items": items}


@pytest.mark.parametrize(
    ("kruise", "dragonfly", "recommended"),
    [(False, False, "daemonset"), (True, False, "openkruise"), (False, True, "dragonfly"), (True, True, "dragonfly")],
)
def test_preflight_names_the_clusters_pre_pull_engines_and_recommends_one(
    tmp_path: Path, runner: CliRunner, kruise: bool, dragonfly: bool, recommended: str
) -> None:
    listed = cluster_list(kruise=kruise, dragonfly=dragonfly)
    assert validate_documents([i for i in listed["items"] if i["kind"] != "CustomResourceDefinition"]) == [], "valid workloads"
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(listed))
    result = runner.invoke(app, ["k8s", "preflight", "--cluster", str(path), "--json"])
    assert result.exit_code == 0, result.output
    said = json.loads(result.output)
    assert said["recommended"] == recommended
    if kruise:
        assert said["openkruise"] == {"imagepulljob_versions": ["v1alpha1", "v1beta1"], "release": "v1.9.0"}
    if dragonfly:
        assert said["dragonfly"] == {"manager": "v2.5.1", "peers": "dragonfly-system/dragonfly-client"}
    text = runner.invoke(app, ["k8s", "preflight", "--cluster", str(path)]).output
    assert f"--puller {recommended}" in text


def test_preflight_without_logs_or_cluster_says_what_to_give(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["k8s", "preflight"])
    assert result.exit_code == ExitCode.INVALID_INPUT and "--cluster" in result.output
    (tmp_path / "x.json").write_text('{"kind": "Pod"}')
    result = runner.invoke(app, ["k8s", "preflight", "--cluster", str(tmp_path / "x.json")])
    assert result.exit_code == ExitCode.INVALID_INPUT and "kubectl get crd,daemonsets,deployments -A -o json" in result.output


def test_malformed_status_is_refused_or_read_past_never_a_traceback(tmp_path: Path, runner: CliRunner) -> None:
    (tmp_path / "job.json").write_text(json.dumps(imagepulljob_status()))
    (tmp_path / "ni.json").write_text("[1, 2]")
    result = runner.invoke(app, ["k8s", "prepull-status", str(tmp_path / "job.json"), "--node-images", str(tmp_path / "ni.json")])
    assert result.exit_code == ExitCode.INVALID_INPUT and "kubectl get nodeimages -o json" in result.output
    odd = dragonfly_job(3, "SUCCESS", ["npu-a"], [])
    odd["result"]["job_states"].append("not a state")
    odd["result"]["job_states"][0]["results"].append(None)
    (tmp_path / "df.json").write_text(json.dumps([odd, {**odd, "result": "gone"}]))
    result = runner.invoke(app, ["k8s", "prepull-status", str(tmp_path / "df.json"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["done"] == 1
