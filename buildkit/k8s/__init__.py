"""Kubernetes: the smoke job and training runs as manifests (Job, KubeRay RayJob, Volcano Job), and
their offline validation against the Kubernetes schemas and the vendored upstream CRDs."""

from typing import Literal, get_args

# What `k8s render` renders and how it is placed: the choices the command offers (and completes),
# checked again by the request for callers of the library.
K8sJob = Literal["smoke", "grpo", "sft", "train", "preflight", "prepull"]
Scheduler = Literal["default", "volcano"]
TopologyMode = Literal["hard", "soft"]
# The nodes' container runtime: Ascend Docker Runtime (MindCluster installs it on every NPU node and it
# mounts the driver's base.list itself) or a plain one (the pods mount every driver file).
NodeRuntime = Literal["ascend", "plain"]
NODE_RUNTIMES: tuple[str, ...] = get_args(NodeRuntime)
K8S_JOBS: tuple[str, ...] = get_args(K8sJob)
SCHEDULERS: tuple[str, ...] = get_args(Scheduler)
TOPOLOGY_MODES: tuple[str, ...] = get_args(TopologyMode)

KUBERNETES_VERSION = "1.32.0"  # the schemas `k8s validate` checks built-in kinds against
# The releases whose CRDs are vendored in crds/ (SOURCES.json; tests/test_crd.py keeps these equal).
KUBERAY_VERSION = "v1.7.0"
VOLCANO_VERSION = "v1.15.1"
KYVERNO_VERSION = "v1.19.0"
POLICY_CONTROLLER_VERSION = "v0.15.1"
KRUISE_VERSION = "v1.9.0"  # OpenKruise: ImagePullJob and NodeImage
DEFAULT_MODEL_PATH = "/data/models/Qwen2.5-0.5B-Instruct"
MAX_NODES = 1024  # far past any cluster here, near enough that a typo is caught rather than obeyed
