"""Kubernetes manifests for published images, built as data and dumped to YAML.

Three kinds, one pod: a ``batch/v1`` Job on one node, a KubeRay ``RayJob`` across several, or a
Volcano ``batch.volcano.sh/v1alpha1`` Job that starts Ray itself where KubeRay is not installed.
Every kind's pods come from :func:`npu_pod` (image by digest, every NPU of the node under the
cluster's resource name, the host driver read-only, ``/dev/shm``, HCCL networking, ``ascendkit
doctor`` as an init container, the smoke data generator); a kind adds only what is its own.
With ``scheduler="volcano"`` the pods are gang-scheduled by Volcano: the Job's pod names the
scheduler and queue, the RayJob carries the labels KubeRay's Volcano integration reads, the Volcano
Job has ``minAvailable`` equal to its pod count.

The manifests are dicts dumped with PyYAML: no value a user types can change the structure or
the indentation (docs/architecture.md says why this is not a template).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from buildkit.errors import InputError
from buildkit.image.registry import IMAGE_REFERENCE, registry_of
from buildkit.k8s import DEFAULT_MODEL_PATH, KUBERAY_VERSION, KUBERNETES_VERSION, VOLCANO_VERSION
from buildkit.matrix.model import EXTENDED_RESOURCE, Sku
from buildkit.matrix.yamlsource import YamlSourceError, load_documents
from buildkit.plan import LABEL_PREFIX
from buildkit.resources import SMOKE_DIR
from buildkit.run.devices import DRIVER_FILES_OPTIONAL, DRIVER_FILES_REQUIRED, SHM_SIZE
from buildkit.run.doctor import DRIVER_VERSION, HCCN_TOOL
from buildkit.run.job import REWARD_FILE, SMOKE_FILES, ImageJob, JobFacts, build_job, check_overrides, spec_for

FILES = Path(__file__).resolve().parent / "files"
HOST_ARCH = {"aarch64": "huawei-arm", "x86_64": "huawei-x86"}
RAYJOB_NAME_MAX = 47  # KubeRay adds "-xxxxx" for the RayCluster and up to 10 for its services
VOLCANO_JOB_NAME_MAX = 50  # pods are <job>-<task>-<index>: "-worker-" and an index must fit in 63
APP_LABEL = "app.kubernetes.io"
K8S_JOBS = ("smoke", "grpo", "sft", "train")
SCHEDULERS = ("default", "volcano")
TOPOLOGY_MODES = ("hard", "soft")

# MindCluster's Ascend plugin for Volcano refuses an NPU job without this label (its value per SKU
# is k8s_ring_controller in the matrix). Ascend/mind-cluster,
# component/ascend-for-volcano/common/util/type.go: JobKindKey = "ring-controller.atlas".
MINDCLUSTER_JOB_KIND = "ring-controller.atlas"
# Volcano: a plain pod's queue (volcano-sh/volcano v1.15.1,
# staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/labels.go QueueNameAnnotationKey).
VOLCANO_POD_QUEUE = "scheduling.volcano.sh/queue-name"
# KubeRay v1.7.0 ray-operator/controllers/ray/batchscheduler/volcano/volcano_scheduler.go: the
# labels it reads from a RayJob when the operator runs with --batch-scheduler=volcano.
KUBERAY_VOLCANO_QUEUE = "volcano.sh/queue-name"
KUBERAY_TOPOLOGY_MODE = "volcano.sh/network-topology-mode"
KUBERAY_TOPOLOGY_TIER = "volcano.sh/network-topology-highest-tier-allowed"

# HCCL's defaults (120 s to connect, ~30 min per op) are short for a first graph compile on many
# nodes; these are the values pods get, in seconds.
HCCL_CONNECT_TIMEOUT = 1200
HCCL_EXEC_TIMEOUT = 3600
RAY_JOIN_TIMEOUT = 1200  # Volcano Job without KubeRay: how long the head waits for its workers

_LABEL_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: what KubeRay requires, fine for Jobs too
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NIC = re.compile(r"^[\^=]?[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*$")  # HCCL_SOCKET_IFNAME: a name, a list, =exact, ^exclude
_EXTENDED_RESOURCE = re.compile(EXTENDED_RESOURCE)

# The host files smoke mounts, as hostPath volumes: (volume name, path, hostPath type). hccn_tool
# comes with the NPU driver like npu-smi; doctor reads each NPU port's link with it.
DRIVER_VOLUMES = (
    ("driver-lib64", "/usr/local/Ascend/driver/lib64", "Directory"),
    ("driver-version", DRIVER_VERSION, "File"),
    ("dcmi", "/usr/local/dcmi", "Directory"),
    ("npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("ascend-install-info", "/etc/ascend_install.info", "File"),
    ("hccn-tool", HCCN_TOOL, "File"),
)
assert {p for _, p, _ in DRIVER_VOLUMES} == {*DRIVER_FILES_REQUIRED, *DRIVER_FILES_OPTIONAL}


@dataclass(frozen=True)
class K8sRequest:
    sku_id: str
    sku: Sku
    image: str
    nodes: int = 1
    job: str = "smoke"  # a smoke job of the image's framework (smoke = grpo, or sft), or "train"
    command: tuple[str, ...] = ()  # --job train -- CMD...
    namespace: str | None = None
    name: str | None = None
    pull_secret: str | None = None
    arch: str = "aarch64"
    model_path: str | None = None  # default DEFAULT_MODEL_PATH unless model_pvc
    model_pvc: str | None = None
    steps: int = 5
    deadline_s: int = 3600
    allow_tag: bool = False
    overrides: tuple[str, ...] = ()
    image_job: ImageJob = field(default_factory=lambda: ImageJob(None, None))  # the image's stack and framework (its labels, or --stack)
    facts: JobFacts = field(kw_only=True)  # what the matrix knows of the frameworks' entry points
    scheduler: str = "default"  # or "volcano"
    queue: str | None = None  # Volcano queue (default "default")
    kuberay: bool = True  # several nodes: a RayJob (KubeRay) or, with Volcano, a Volcano Job that starts Ray itself
    npu_resource: str | None = None  # default: the SKU's k8s_npu_resource
    nic: str = "eth0"  # HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    host_network: bool | None = None  # default: on for several nodes (RoCE), off for one
    topology_mode: str | None = None  # Volcano network topology (A3 SuperPoD placement): hard or soft
    topology_tier: int | None = None  # its highest tier allowed

    @property
    def smoke_job(self) -> str | None:
        """The smoke job rendered (``smoke`` is GRPO's other name), None for ``--job train``."""
        return None if self.job == "train" else "grpo" if self.job == "smoke" else self.job

    @property
    def kind(self) -> str:
        if self.nodes == 1:
            return "Job"
        return "RayJob" if self.kuberay else "VolcanoJob"

    @property
    def volcano(self) -> bool:
        return self.scheduler == "volcano"

    @property
    def hostnet(self) -> bool:
        return self.nodes > 1 if self.host_network is None else self.host_network

    @property
    def resource(self) -> str:
        return self.npu_resource or self.sku.k8s_npu_resource

    @property
    def model(self) -> str:
        return self.model_path or DEFAULT_MODEL_PATH


@dataclass(frozen=True)
class Manifests:
    text: str  # YAML documents
    warnings: tuple[str, ...]  # accepted, but worth saying (a tag with --allow-tag)


def check_image(ref: str, allow_tag: bool, *, to_pin: bool = False) -> str | None:
    """A digest reference passes; a tag only with ``allow_tag`` (returns the warning), or, with
    ``to_pin``, when it names a registry that can be asked for its digest before rendering."""
    match = IMAGE_REFERENCE.match(ref)
    if not match:
        raise InputError(f"--image {ref!r} is not an image reference (e.g. 127.0.0.1:5000/ascendkit/verl@sha256:<64 hex>)")
    if match["digest"]:
        return None
    if allow_tag:
        return f"--image {ref} is a mutable tag: nodes may run different images (--allow-tag)"
    if to_pin and registry_of(ref) is not None:
        return None
    raise InputError(
        f"--image {ref!r} has no digest and names no registry to resolve its tag at: a tag can move between render and pull. "
        "Give HOST[:PORT]/REPO:TAG (its digest is asked for and pinned), the digest `ascendkit publish` printed "
        "(REPO@sha256:<64 hex>), or pass --allow-tag"
    )


def check_name(value: str, what: str, *, limit: int = 63, pattern: re.Pattern[str] = _LABEL_NAME) -> str:
    if len(value) > limit or not pattern.match(value):
        raise InputError(
            f"{what} {value!r} is not a valid Kubernetes name: lower-case letters, digits and '-', "
            f"starting with a letter and ending with a letter or digit, at most {limit} characters"
        )
    return value


def _default_name(request: K8sRequest) -> str:
    return f"{request.image_job.framework}-{request.job}-{request.sku_id}" + (f"-{request.nodes}n" if request.nodes > 1 else "")


def _check_scheduling(request: K8sRequest) -> None:
    if request.scheduler not in SCHEDULERS:
        raise InputError(f"--scheduler {request.scheduler!r}: one of {', '.join(SCHEDULERS)}")
    if not request.volcano:
        for given, flag in (
            (request.queue, "--queue"),
            (request.topology_mode, "--network-topology"),
            (request.topology_tier, "--topology-tier"),
        ):
            if given is not None:
                raise InputError(f"{flag} is for Volcano: add --scheduler volcano")
        if not request.kuberay:
            raise InputError("--no-kuberay renders a Volcano Job: add --scheduler volcano (without KubeRay nor Volcano nothing starts Ray)")
    if request.queue is not None:
        check_name(request.queue, "--queue", limit=253, pattern=_DNS_SUBDOMAIN)
    if request.nodes == 1 and not request.kuberay:
        raise InputError("--no-kuberay chooses how several nodes run; one node is a batch/v1 Job either way (drop it, or give --nodes)")
    if request.topology_mode is not None and request.topology_mode not in TOPOLOGY_MODES:
        raise InputError(f"--network-topology {request.topology_mode!r}: one of {', '.join(TOPOLOGY_MODES)}")
    if request.topology_tier is not None and request.topology_mode is None:
        raise InputError("--topology-tier needs --network-topology hard or soft")
    if request.topology_mode is not None and request.nodes == 1:
        raise InputError("--network-topology places several pods: it needs --nodes 2 or more")
    if request.topology_tier is not None and request.topology_tier < 1:
        raise InputError(f"--topology-tier {request.topology_tier}: at least 1")


def check_request(request: K8sRequest, *, to_pin: bool = False) -> tuple[str, ...]:
    """Every refusal happens here, before anything is rendered, asked or written; returns the warnings."""
    if request.nodes < 1:
        raise InputError(f"--nodes {request.nodes}: at least 1")
    if request.job not in K8S_JOBS:
        raise InputError(f"--job {request.job!r}: one of {', '.join(K8S_JOBS)} (smoke is the grpo smoke job)")
    if request.job == "train" and not request.command:
        raise InputError("--job train needs the command after `--`, e.g. -- python3 -m verl.trainer.main_ppo ...")
    if request.job != "train" and request.command:
        raise InputError(
            f"a command after `--` is for --job train; the {request.job} smoke job's command comes from its file in smoke_tests/"
        )
    if request.job == "sft" and request.nodes != 1:
        raise InputError("--job sft runs on one node (torchrun --standalone, as the seed's script): drop --nodes")
    if request.arch not in HOST_ARCH:
        raise InputError(f"--arch {request.arch!r}: one of {', '.join(HOST_ARCH)}")
    warning = check_image(request.image, request.allow_tag, to_pin=to_pin)
    _check_scheduling(request)
    limit = {"Job": 63, "RayJob": RAYJOB_NAME_MAX, "VolcanoJob": VOLCANO_JOB_NAME_MAX}[request.kind]
    check_name(_default_name(request) if request.name is None else request.name, "--name", limit=limit)
    if request.namespace is not None:
        check_name(request.namespace, "--namespace", pattern=_DNS_LABEL)
    if request.pull_secret is not None:
        check_name(request.pull_secret, "--pull-secret", limit=253, pattern=_DNS_SUBDOMAIN)
    if request.model_pvc is not None:
        check_name(request.model_pvc, "--model-pvc", limit=253, pattern=_DNS_SUBDOMAIN)
        if request.model_path is not None:
            raise InputError("--model-path and --model-pvc both name the model: give one (the PVC's root is the model directory)")
    if not request.model.startswith("/"):
        raise InputError(f"--model-path {request.model!r}: an absolute path on the nodes")
    if request.npu_resource is not None and not _EXTENDED_RESOURCE.match(request.npu_resource):
        raise InputError(
            f"--npu-resource {request.npu_resource!r} is not an extended resource name: DOMAIN/NAME as the device plugin "
            "advertises it, e.g. huawei.com/Ascend910 or huawei.com/ascend-1980 (see `kubectl describe node`)"
        )
    if not _NIC.match(request.nic):
        raise InputError(f"--nic {request.nic!r}: a network interface name (eth0), a comma list, or HCCL's =NAME / ^NAME forms")
    return (warning,) if warning else ()


# ---------------------------------------------------------------------------------------------
# One NPU pod


@dataclass(frozen=True)
class Pod:
    """What every NPU pod of a request shares; :func:`npu_pod` adds the role's container."""

    request: K8sRequest
    labels: dict[str, str]
    job_env: dict[str, str]
    data_args: list[str]
    configmap: str
    reads_files: bool = False  # the job itself reads smoke_tests/ files (OpenRLHF's reward function)

    @property
    def smoke(self) -> bool:
        return self.request.smoke_job is not None


def _env(pairs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in sorted(pairs.items())]


def networking_env(request: K8sRequest, *, ray: bool) -> list[dict[str, Any]]:
    """HCCL and Gloo settings of an NPU container; in a Ray pod also the NIC and the pod's IP
    (the host's under hostNetwork), so the first multi-node run picks the right interface."""
    env: list[dict[str, Any]] = []
    if ray:
        env.append({"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        env += _env({"HCCL_SOCKET_IFNAME": request.nic, "GLOO_SOCKET_IFNAME": request.nic})
    env += _env({"HCCL_CONNECT_TIMEOUT": str(HCCL_CONNECT_TIMEOUT), "HCCL_EXEC_TIMEOUT": str(HCCL_EXEC_TIMEOUT)})
    return env


def npu_pod(pod: Pod, role: str, main: dict[str, Any], *, ray: bool, restart: str | None = "Never") -> dict[str, Any]:
    """A pod template: ``main`` is the role's container (name, args, env); everything else is shared."""
    request, sku = pod.request, pod.request.sku
    npus = {request.resource: str(sku.npus_per_node)}
    memory = f"{sku.k8s_memory_gib_request}Gi"
    driver_mounts = [{"name": n, "mountPath": p, "readOnly": True} for n, p, _ in DRIVER_VOLUMES]
    labels = {**pod.labels, f"{APP_LABEL}/component": role}
    if request.volcano:
        labels[MINDCLUSTER_JOB_KIND] = sku.k8s_ring_controller
    metadata: dict[str, Any] = {"labels": labels}
    if request.volcano and request.kind == "Job":
        metadata["annotations"] = {VOLCANO_POD_QUEUE: request.queue or "default"}
    doctor_args = ["ascendkit", "doctor", *(["--links"] if request.nodes > 1 else [])]
    init = [
        {
            "name": "doctor",
            "image": request.image,
            "imagePullPolicy": "IfNotPresent",
            "args": doctor_args,
            "resources": {"requests": npus, "limits": npus},
            "volumeMounts": driver_mounts,
        }
    ]
    mounts = [*driver_mounts, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": n, "hostPath": {"path": p, "type": t}} for n, p, t in DRIVER_VOLUMES]
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.replace("g", "Gi")}})
    if pod.smoke:
        init.append(
            {
                "name": "smoke-data",
                "image": request.image,
                "imagePullPolicy": "IfNotPresent",
                "args": pod.data_args,
                "volumeMounts": [
                    {"name": "smoke-files", "mountPath": SMOKE_FILES, "readOnly": True},
                    {"name": "smoke-out", "mountPath": "/smoke/out"},
                ],
            }
        )
        mounts += [{"name": "model", "mountPath": "/smoke/model", "readOnly": True}, {"name": "smoke-out", "mountPath": "/smoke/out"}]
        if pod.reads_files:
            mounts.append({"name": "smoke-files", "mountPath": SMOKE_FILES, "readOnly": True})
        if request.model_pvc:
            volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": request.model_pvc, "readOnly": True}})
        else:
            volumes.append({"name": "model", "hostPath": {"path": request.model, "type": "Directory"}})
        volumes += [{"name": "smoke-files", "configMap": {"name": pod.configmap}}, {"name": "smoke-out", "emptyDir": {}}]
    container = {
        "name": main["name"],
        "image": request.image,
        "imagePullPolicy": "IfNotPresent",
        **({"args": main["args"]} if main.get("args") else {}),  # args, not command: the entrypoint loads CANN first
        "env": [*networking_env(request, ray=ray), *main.get("env", [])],
        "resources": {
            "requests": {**npus, "cpu": str(sku.k8s_cpu_request), "memory": memory},
            "limits": {**npus, "memory": memory},
        },
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {}
    if restart:
        spec["restartPolicy"] = restart
    if request.hostnet:
        spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    if request.volcano and request.kind != "RayJob":  # KubeRay sets it on the pods it creates
        spec["schedulerName"] = "volcano"
    spec["nodeSelector"] = {
        "accelerator": "huawei-Ascend910",
        "accelerator-type": sku.k8s_accelerator_type,
        "host-arch": HOST_ARCH[request.arch],
    }
    if request.pull_secret:
        spec["imagePullSecrets"] = [{"name": request.pull_secret}]
    spec.update(initContainers=init, containers=[container], volumes=volumes)
    return {"metadata": metadata, "spec": spec}


# ---------------------------------------------------------------------------------------------
# The kinds


def _metadata(name: str, request: K8sRequest, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if request.namespace:
        meta["namespace"] = request.namespace
    meta["labels"] = labels
    return meta


def _configmap(name: str, request: K8sRequest, labels: dict[str, str], files: tuple[str, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(name, request, labels),
        "data": {file: (SMOKE_DIR / file).read_text(encoding="utf-8") for file in files},
    }


def _job(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
    request = pod.request
    main = {"name": request.image_job.framework, "args": argv, "env": _env(pod.job_env)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(name, request, pod.labels),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": request.deadline_s,
            "ttlSecondsAfterFinished": 86400,
            "template": npu_pod(pod, request.job, main, ray=False),
        },
    }


def _ray_start_params(request: K8sRequest) -> dict[str, str]:
    # KubeRay v1.7.0 does not map huawei.com/* limits to Ray's NPU resource: declare it here.
    return {"num-cpus": str(request.sku.k8s_cpu_request), "resources": json.dumps(json.dumps({"NPU": request.sku.npus_per_node}))}


def _rayjob(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
    request = pod.request
    labels = dict(pod.labels)
    if request.volcano:
        labels[KUBERAY_VOLCANO_QUEUE] = request.queue or "default"
        if request.topology_mode:
            labels[KUBERAY_TOPOLOGY_MODE] = request.topology_mode
            if request.topology_tier is not None:
                labels[KUBERAY_TOPOLOGY_TIER] = str(request.topology_tier)
    spec: dict[str, Any] = {"entrypoint": shlex.join(argv)}
    if pod.job_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": pod.job_env}, sort_keys=True)
    workers = request.nodes - 1
    params = _ray_start_params(request)
    submitter: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"host-arch": HOST_ARCH[request.arch]},
    }
    if request.pull_secret:
        submitter["imagePullSecrets"] = [{"name": request.pull_secret}]
    small = {"cpu": "1", "memory": "1Gi"}
    submitter["containers"] = [
        {
            "name": "ray-job-submitter",
            "image": request.image,
            "imagePullPolicy": "IfNotPresent",
            "resources": {"requests": small, "limits": small},
        }
    ]
    spec.update(
        submissionMode="K8sJobMode",
        shutdownAfterJobFinishes=True,
        ttlSecondsAfterFinished=86400,
        activeDeadlineSeconds=request.deadline_s,
        backoffLimit=0,
        rayClusterSpec={
            "headGroupSpec": {"rayStartParams": params, "template": npu_pod(pod, "ray-head", {"name": "ray-head"}, ray=True, restart=None)},
            "workerGroupSpecs": [
                {
                    "groupName": "npu-workers",
                    "replicas": workers,
                    "minReplicas": workers,
                    "maxReplicas": workers,
                    "rayStartParams": params,
                    "template": npu_pod(pod, "ray-worker", {"name": "ray-worker"}, ray=True, restart=None),
                }
            ],
        },
        submitterPodTemplate={"spec": submitter},  # `ray job submit` runs here: small, on a node of the image's arch
    )
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _metadata(name, request, labels), "spec": spec}


def _volcano_job(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
    request = pod.request
    ray_env = _env(
        {
            "ASCENDKIT_RAY_HEAD": f"{name}-head-0.{name}",  # Volcano's svc plugin: hostname <job>-<task>-<i>, subdomain <job>
            "ASCENDKIT_RAY_NODES": str(request.nodes),
            "ASCENDKIT_RAY_CPUS": str(request.sku.k8s_cpu_request),
            "ASCENDKIT_RAY_NPUS": str(request.sku.npus_per_node),
            "ASCENDKIT_RAY_JOIN_TIMEOUT": str(RAY_JOIN_TIMEOUT),
            **pod.job_env,  # in every Ray node's environment, as KubeRay's runtimeEnvYAML would put it
        }
    )
    head_script = (FILES / "ray-head.sh").read_text(encoding="utf-8")
    worker_script = (FILES / "ray-worker.sh").read_text(encoding="utf-8")
    head = {"name": "ray-head", "args": ["bash", "-c", head_script, "ray-head", *argv], "env": ray_env}
    worker = {"name": "ray-worker", "args": ["bash", "-c", worker_script, "ray-worker"], "env": ray_env}
    labels = {**pod.labels, MINDCLUSTER_JOB_KIND: request.sku.k8s_ring_controller}
    head_pod = npu_pod(pod, "ray-head", head, ray=True)
    head_pod["spec"]["activeDeadlineSeconds"] = request.deadline_s
    worker_pod = npu_pod(pod, "ray-worker", worker, ray=True)
    worker_pod["spec"]["activeDeadlineSeconds"] = request.deadline_s
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "queue": request.queue or "default",
        "minAvailable": request.nodes,  # the gang: every pod placed, or none holds NPUs
        "maxRetry": 3,
        "ttlSecondsAfterFinished": 86400,
    }
    if request.topology_mode:
        spec["networkTopology"] = {"mode": request.topology_mode}
        if request.topology_tier is not None:
            spec["networkTopology"]["highestTierAllowed"] = request.topology_tier
    spec.update(
        # svc: a headless service and stable pod hostnames, so workers find the head by name
        # (published before the pods are ready: the head is not ready until it is waiting).
        plugins={"svc": ["--publish-not-ready-addresses=true"], "env": []},
        policies=[
            {"events": ["PodEvicted", "Unknown"], "action": "RestartJob"},  # a lost node: start the gang again
            {"event": "PodFailed", "action": "TerminateJob"},  # a crash fails the whole job at once
        ],
        tasks=[
            {
                "name": "head",
                "replicas": 1,
                "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],  # the job ends with the head's command
                "template": head_pod,
            },
            {"name": "worker", "replicas": request.nodes - 1, "template": worker_pod},
        ],
    )
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": _metadata(name, request, labels), "spec": spec}


# ---------------------------------------------------------------------------------------------
# YAML


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # shared values (labels, mounts) are written out each time: no &anchors for readers to chase


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def dump(doc: dict[str, Any], comments: list[str]) -> str:
    head = "".join(f"# {line}\n" for line in comments)
    return head + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


def render(request: K8sRequest) -> Manifests:
    """The manifests as YAML documents (a ConfigMap first for the smoke job)."""
    warnings = check_request(request)
    name = _default_name(request) if request.name is None else request.name
    sku = request.sku
    labels = {
        f"{APP_LABEL}/name": f"ascendkit-{request.image_job.framework}",
        f"{APP_LABEL}/instance": name,
        f"{APP_LABEL}/managed-by": "ascendkit",
        f"{LABEL_PREFIX}/sku": request.sku_id,
        f"{LABEL_PREFIX}/job": request.job,
    }
    data_args: list[str] = []
    files: tuple[str, ...] = ("gsm8k_synth.py",)
    if request.smoke_job is not None:
        job = build_job(
            spec_for(request.image_job, request.smoke_job, request.facts),
            sku,
            request.image_job,
            facts=request.facts,
            steps=request.steps,
            nnodes=request.nodes,
            extra=check_overrides(list(request.overrides), request.image_job.framework),
        )
        argv, job_env, data_args = job.argv, dict(job.env), job.data_command()
        if job.ray_npus:  # one node: a Ray head in the pod first, as `ascendkit smoke` starts it
            argv = ["bash", "-c", shlex.join(job.ray_head_command()) + ' && exec "$@"', "ray-head", *argv]
        if any(REWARD_FILE in o for o in job.overrides):  # the job reads it at run time: every pod mounts it
            files += (REWARD_FILE.removeprefix(SMOKE_FILES + "/"),)
    else:
        argv, job_env = list(request.command), {}
    pod = Pod(request, labels, job_env, data_args, f"{name}-smoke", reads_files=len(files) > 1)
    framework = request.image_job.framework
    title = f"{framework} {request.job} on {request.nodes} x {sku.product} ({request.sku_id}), {sku.npus_per_node} NPUs per node"
    scheduling = f"scheduler {request.scheduler}" + (f", queue {request.queue or 'default'}" if request.volcano else "")
    made = {
        "Job": (_job, f"batch/v1 Job; {scheduling}"),
        "RayJob": (_rayjob, f"KubeRay {KUBERAY_VERSION} RayJob (ray.io/v1); {scheduling}"),
        "VolcanoJob": (_volcano_job, f"Volcano {VOLCANO_VERSION} Job (batch.volcano.sh/v1alpha1) starting Ray itself; {scheduling}"),
    }
    build, what = made[request.kind]
    rendered = f"Rendered by `ascendkit k8s render`: {what}. Check: `ascendkit k8s validate` (Kubernetes {KUBERNETES_VERSION})."
    docs: list[str] = []
    if pod.smoke:
        what = "data generator" + (" and reward function" if len(files) > 1 else "")
        shown = ", ".join(f"smoke_tests/{f}" for f in files)
        docs.append(dump(_configmap(pod.configmap, request, labels, files), [f"The smoke job's {what} ({shown})."]))
    docs.append(dump(build(name, pod, argv), [title, rendered]))
    return Manifests("---\n".join(docs), warnings)


def as_documents(text: str, source: str = "<manifest>") -> list[dict[str, Any]]:
    try:
        docs = [d for d in load_documents(text, source) if d is not None]
    except YamlSourceError as exc:
        raise InputError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not YAML: {exc}") from None
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InputError(f"{source}: document {index + 1} is not a mapping")
    return docs
