"""What `k8s render` is asked for, and every refusal of it: the request, its names, its image
reference and its scheduling options are checked here before anything is rendered or asked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from buildkit.errors import InputError
from buildkit.imageref import IMAGE_REFERENCE, registry_of
from buildkit.k8s import DEFAULT_MODEL_PATH, K8S_JOBS, MAX_NODES, NODE_RUNTIMES, SCHEDULERS, TOPOLOGY_MODES, NodeRuntime
from buildkit.k8s.prepull import PULLERS, PrepullImage, the_image
from buildkit.matrix.model import EXTENDED_RESOURCE, ImageUser, Sku
from buildkit.run import MAX_SECONDS, MAX_STEPS
from buildkit.run.job import ImageJob, JobFacts

FILES = Path(__file__).resolve().parent / "files"
HOST_ARCH = {"aarch64": "huawei-arm", "x86_64": "huawei-x86"}
RAYJOB_NAME_MAX = 47  # KubeRay adds "-xxxxx" for the RayCluster and up to 10 for its services
VOLCANO_JOB_NAME_MAX = 50  # pods are <job>-<task>-<index>: "-worker-" and an index must fit in 63
APP_LABEL = "app.kubernetes.io"
NODE_JOBS = ("preflight", "prepull")  # a DaemonSet: one pod on every node of the SKU, not a job of N nodes
PREFLIGHT_NAME_MAX = 57  # DaemonSet pods are <name>-<5 random characters>: within the 63 of a label value

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
# checkov's finding on hostNetwork (CKV_K8S_19), skipped on the workloads and pods that use the
# host's network and only there (checkov/kubernetes/kubernetes_utils.py reads "checkov.io/skip*"
# annotations as "<check>=<reason>"; the reason may hold no "=").
HOSTNET_SKIP = {
    "checkov.io/skip1": "CKV_K8S_19=host network asked for (several nodes or --host-network): "
    "Ray and HCCL set up their connections over the NPU hosts' own interfaces"
}
KUBERAY_TOPOLOGY_TIER = "volcano.sh/network-topology-highest-tier-allowed"

RAY_JOIN_TIMEOUT = 1200  # Volcano Job without KubeRay: how long the head waits for its workers

_LABEL_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: what KubeRay requires, fine for Jobs too
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NIC = re.compile(r"^[\^=]?[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*$")  # HCCL_SOCKET_IFNAME: a name, a list, =exact, ^exclude
_EXTENDED_RESOURCE = re.compile(EXTENDED_RESOURCE)


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
    node_runtime: NodeRuntime = "ascend"  # the nodes' container runtime: "ascend" (Ascend Docker Runtime mounts the driver) or "plain"
    topology_mode: str | None = None  # Volcano network topology (A3 SuperPoD placement): hard or soft
    topology_tier: int | None = None  # its highest tier allowed
    user: ImageUser = field(default_factory=ImageUser)  # the image's non-root user (the matrix's image_user)
    device_gid: int | None = None  # the nodes' /dev/davinci* group (default the matrix's device_gid)
    puller: str = "daemonset"  # --job prepull: daemonset, openkruise (ImagePullJob) or dragonfly (preheat jobs)
    parallelism: int | None = None  # openkruise: nodes pulling at once (default DEFAULT_PARALLELISM)
    prepull_images: tuple[PrepullImage, ...] = ()  # every image of the tag (resolve finds them); default: the image alone

    @property
    def images_to_pull(self) -> tuple[PrepullImage, ...]:
        return self.prepull_images or (the_image(self.image),)

    @property
    def device_group(self) -> int:
        return self.user.device_gid if self.device_gid is None else self.device_gid

    @property
    def smoke_job(self) -> str | None:
        """The smoke job rendered (``smoke`` is GRPO's other name), None for ``--job train``, ``preflight`` and ``prepull``."""
        return None if self.job in ("train", *NODE_JOBS) else "grpo" if self.job == "smoke" else self.job

    @property
    def kind(self) -> str:
        if self.job in NODE_JOBS:
            return "DaemonSet"
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
    text: str  # YAML documents (Dragonfly preheat jobs: a JSON list)
    warnings: tuple[str, ...]  # accepted, but worth saying (a tag with --allow-tag)
    notes: tuple[str, ...] = ()  # what to do with it, where a comment cannot say it (JSON)


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


def default_name(request: K8sRequest) -> str:
    if request.job in NODE_JOBS:
        return f"ascendkit-{request.job}-{request.sku_id}"
    return f"{request.image_job.framework}-{request.job}-{request.sku_id}" + (f"-{request.nodes}n" if request.nodes > 1 else "")


def check_scheduling(request: K8sRequest) -> None:
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
    for value, option, high in (
        (request.nodes, "--nodes", MAX_NODES),
        (request.steps, "--steps", MAX_STEPS),
        (request.deadline_s, "--deadline", MAX_SECONDS),
    ):
        if not 1 <= value <= high:
            raise InputError(f"{option} {value}: from 1 to {high}")
    if request.job not in K8S_JOBS:
        raise InputError(f"--job {request.job!r}: one of {', '.join(K8S_JOBS)} (smoke is the grpo smoke job)")
    if request.job == "train" and not request.command:
        raise InputError("--job train needs the command after `--`, e.g. -- python3 -m verl.trainer.main_ppo ...")
    if request.job != "train" and request.command:
        raise InputError(
            f"a command after `--` is for --job train; the {request.job} smoke job's command comes from its file in smoke_tests/"
        )
    if request.job in NODE_JOBS and request.nodes != 1:
        raise InputError(f"--job {request.job} runs on every node of the SKU the scheduler offers (a DaemonSet): drop --nodes")
    if request.job in NODE_JOBS and (request.overrides or request.model_pvc or request.model_path):
        raise InputError(f"--job {request.job} trains nothing: drop --override, --model-path and --model-pvc")
    if request.job == "prepull" and (request.npu_resource or request.device_gid is not None or request.host_network):
        raise InputError("--job prepull takes no NPU and no network of the node: drop --npu-resource, --device-gid and --host-network")
    if request.puller not in PULLERS:
        raise InputError(f"--puller {request.puller!r}: one of {', '.join(PULLERS)}")
    if request.puller != "daemonset" and request.job != "prepull":
        raise InputError(f"--puller {request.puller} pre-pulls an image: it goes with --job prepull")
    if request.parallelism is not None and request.puller != "openkruise":
        raise InputError("--parallelism is the nodes an OpenKruise ImagePullJob pulls on at once: it goes with --puller openkruise")
    if request.parallelism is not None and not 1 <= request.parallelism <= MAX_NODES:
        raise InputError(f"--parallelism {request.parallelism}: 1 to {MAX_NODES} nodes at once")
    if request.job == "sft" and request.nodes != 1:
        raise InputError("--job sft runs on one node (torchrun --standalone, as the seed's script): drop --nodes")
    if request.arch not in HOST_ARCH:
        raise InputError(f"--arch {request.arch!r}: one of {', '.join(HOST_ARCH)}")
    warning = check_image(request.image, request.allow_tag, to_pin=to_pin)
    check_scheduling(request)
    limit = {"Job": 63, "RayJob": RAYJOB_NAME_MAX, "VolcanoJob": VOLCANO_JOB_NAME_MAX, "DaemonSet": PREFLIGHT_NAME_MAX}[request.kind]
    check_name(default_name(request) if request.name is None else request.name, "--name", limit=limit)
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
    if request.device_gid is not None and not 0 < request.device_gid < 2**31:
        raise InputError(
            f"--device-gid {request.device_gid}: the gid that owns the nodes' /dev/davinci* (1 or more; `ls -ln /dev/davinci0`)"
        )
    if not _NIC.match(request.nic):
        raise InputError(f"--nic {request.nic!r}: a network interface name (eth0), a comma list, or HCCL's =NAME / ^NAME forms")
    if request.node_runtime not in NODE_RUNTIMES:
        raise InputError(f"--node-runtime {request.node_runtime!r}: one of {', '.join(NODE_RUNTIMES)}")
    return (warning,) if warning else ()
