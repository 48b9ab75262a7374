"""Options of ``ascendkit k8s render``, declared once as types; the command lists them one per line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.arch import Arch
from buildkit.k8s import (
    DEFAULT_MODEL_PATH,
    KYVERNO_VERSION,
    MAX_NODES,
    POLICY_CONTROLLER_VERSION,
    K8sJob,
    NodeRuntime,
    Scheduler,
    TopologyMode,
)
from buildkit.k8s.prepull import Puller
from buildkit.run import MAX_SECONDS, MAX_STEPS

SchedulerOption = Annotated[
    Scheduler,
    typer.Option(
        "--scheduler",
        help="default: the cluster's default scheduler; volcano: gang-scheduled by Volcano (a Volcano queue; MindCluster's job label).",
    ),
]


ImageOption = Annotated[
    str,
    typer.Option("--image", help="HOST/REPO@sha256:<digest> as `ascendkit publish` printed it, or HOST/REPO:TAG (its digest is pinned)."),
]
HwOption = Annotated[str | None, typer.Option("--hw", help="SKU: {skus} (not with --policy).")]
CommandArgument = Annotated[list[str] | None, typer.Argument(help="--job train: the command to run, after `--`.")]
NodesOption = Annotated[
    int,
    typer.Option("--nodes", min=1, max=MAX_NODES, help="1: a batch/v1 Job; N > 1: a KubeRay RayJob (or a Volcano Job with --no-kuberay)."),
]
JobOption = Annotated[
    K8sJob,
    typer.Option(
        "--job",
        help=(
            "smoke or grpo (the image's GRPO smoke job), sft (verl's SFT smoke job, one node), train (your command after --), "
            "preflight (a DaemonSet checking every node of the SKU with the image: read it with `k8s preflight`), "
            "prepull (a DaemonSet pulling the image on every node of the SKU before the job lands)."
        ),
    ),
]
PullerOption = Annotated[
    Puller,
    typer.Option(
        "--puller",
        help=(
            "--job prepull: daemonset (ascendkit's DaemonSet), openkruise (an OpenKruise ImagePullJob per image of the tag) "
            "or dragonfly (Dragonfly preheat jobs for its manager's Open API, as JSON)."
        ),
    ),
]
ParallelismOption = Annotated[
    int | None,
    typer.Option("--parallelism", min=1, max=MAX_NODES, help="--puller openkruise: nodes pulling at once (default 10)."),
]
QueueOption = Annotated[str | None, typer.Option("--queue", help="Volcano queue (with --scheduler volcano; default: default).")]
KuberayOption = Annotated[
    bool,
    typer.Option(
        "--kuberay/--no-kuberay",
        help="Several nodes: a KubeRay RayJob, or (--no-kuberay, with --scheduler volcano) a Volcano Job that starts Ray itself.",
    ),
]
NpuResourceOption = Annotated[
    str | None,
    typer.Option("--npu-resource", help="The NPU resource the cluster's device plugin advertises (default: the SKU's in the matrix)."),
]
NicOption = Annotated[str, typer.Option("--nic", help="Network interface for HCCL and Gloo (HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).")]
HostNetworkOption = Annotated[
    bool | None,
    typer.Option("--host-network/--no-host-network", help="Pods on the host network (default: on for several nodes, as RoCE needs)."),
]
NodeRuntimeOption = Annotated[
    NodeRuntime,
    typer.Option(
        "--node-runtime",
        help=(
            "The NPU nodes' container runtime: ascend (Ascend Docker Runtime mounts the driver, MindCluster's default) "
            "or plain (the pods mount every driver file; `k8s preflight` says which the nodes run)."
        ),
    ),
]
NetworkTopologyOption = Annotated[
    TopologyMode | None,
    typer.Option("--network-topology", help="Volcano network-topology placement (A3 SuperPoD): hard or soft."),
]
TopologyTierOption = Annotated[
    int | None, typer.Option("--topology-tier", help="Highest network tier the pods may span (with --network-topology).")
]
NamespaceOption = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace of the objects.")]
DeviceGidOption = Annotated[
    int | None,
    typer.Option("--device-gid", help="Group owning the nodes' /dev/davinci* (`ls -ln /dev/davinci0`; default the matrix's, 1000)."),
]
PullSecretOption = Annotated[str | None, typer.Option("--pull-secret", help="imagePullSecret for a private registry.")]
NameOption = Annotated[str | None, typer.Option("--name", help="Object name (default <framework>-<job>-<sku>[-<N>n]).")]
ArchOption = Annotated[
    Arch | None, typer.Option("--arch", help="The image's architecture: selects host-arch nodes (default: the SKU's hosts').")
]
ModelPathOption = Annotated[
    str | None, typer.Option("--model-path", help=f"Model directory on every node (hostPath; default {DEFAULT_MODEL_PATH}).")
]
ModelPvcOption = Annotated[str | None, typer.Option("--model-pvc", help="Take the model from this PVC instead of --model-path.")]
StepsOption = Annotated[int, typer.Option("--steps", min=1, max=MAX_STEPS, help="Smoke job training steps.")]
DeadlineOption = Annotated[int, typer.Option("--deadline", min=1, max=MAX_SECONDS, help="activeDeadlineSeconds of the job.")]
OverrideOption = Annotated[
    list[str] | None,
    typer.Option("--override", help="Extra argument of the smoke job: KEY=VALUE (verl), --override=--name=value (OpenRLHF)."),
]
AllowTagOption = Annotated[bool, typer.Option("--allow-tag", help="Keep an image tag as it is, without pinning its digest (warns).")]
StackOption = Annotated[
    str | None,
    typer.Option("--stack", help="The stack the image was built from, when the registry cannot be asked for its labels."),
]
PolicyOption = Annotated[
    str | None,
    typer.Option(
        "--policy",
        metavar="KIND",
        help=f"kyverno: a Kyverno {KYVERNO_VERSION} ClusterPolicy; sigstore: a policy-controller {POLICY_CONTROLLER_VERSION} "
        "ClusterImagePolicy. Either admits the --image's repository only when --key signed it (instead of a job).",
    ),
]
KeyOption = Annotated[str | None, typer.Option("--key", metavar="KEY", help="With --policy: cosign.pub (a file, or env://VAR).")]
OutputOption = Annotated[Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")]

# What make_request takes under the names the command's options have (the rest it is given as it needs).
REQUEST_OPTIONS = (
    "stack", "arch", "nodes", "job", "scheduler", "queue", "kuberay", "npu_resource", "nic", "host_network", "node_runtime",
    "network_topology", "topology_tier", "namespace", "device_gid", "puller", "parallelism", "pull_secret", "name",
    "model_path", "model_pvc", "steps", "deadline", "allow_tag",
)  # fmt: skip
