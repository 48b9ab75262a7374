"""``ascendkit k8s render`` and ``ascendkit k8s validate``: manifests for Ascend clusters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from buildkit.arch import Arch
from buildkit.cli.base import JsonFlag, MatrixPath, app, print_json, user_errors
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import STDOUT, check_output_file, write_output
from buildkit.k8s import (
    DEFAULT_MODEL_PATH,
    KUBERAY_VERSION,
    KUBERNETES_VERSION,
    KYVERNO_VERSION,
    MAX_NODES,
    POLICY_CONTROLLER_VERSION,
    VOLCANO_VERSION,
    K8sJob,
    NodeRuntime,
    Scheduler,
    TopologyMode,
)
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run import MAX_SECONDS, MAX_STEPS

k8s_app = typer.Typer(
    help=(
        "Kubernetes manifests for published images (Job, KubeRay RayJob, Volcano Job, preflight and prepull DaemonSets) "
        "and the preflight verdict."
    ),
    no_args_is_help=True,
)
app.add_typer(k8s_app, name="k8s")


SchedulerOption = Annotated[
    Scheduler,
    typer.Option(
        "--scheduler",
        help="default: the cluster's default scheduler; volcano: gang-scheduled by Volcano (a Volcano queue; MindCluster's job label).",
    ),
]


@k8s_app.command("render", short_help="Render a job, RayJob, Volcano Job or DaemonSet.")
@user_errors
def k8s_render(
    image: Annotated[
        str,
        typer.Option(
            "--image", help="HOST/REPO@sha256:<digest> as `ascendkit publish` printed it, or HOST/REPO:TAG (its digest is pinned)."
        ),
    ],
    hw: Annotated[str | None, typer.Option("--hw", help="SKU: {skus} (not with --policy).")] = None,
    command: Annotated[list[str] | None, typer.Argument(help="--job train: the command to run, after `--`.")] = None,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", min=1, max=MAX_NODES, help="1: a batch/v1 Job; N > 1: a KubeRay RayJob (or a Volcano Job with --no-kuberay)."
        ),
    ] = 1,
    job: Annotated[
        K8sJob,
        typer.Option(
            "--job",
            help=(
                "smoke or grpo (the image's GRPO smoke job), sft (verl's SFT smoke job, one node), train (your command after --), "
                "preflight (a DaemonSet checking every node of the SKU with the image: read it with `k8s preflight`), "
                "prepull (a DaemonSet pulling the image on every node of the SKU before the job lands)."
            ),
        ),
    ] = "smoke",
    scheduler: SchedulerOption = "default",
    queue: Annotated[str | None, typer.Option("--queue", help="Volcano queue (with --scheduler volcano; default: default).")] = None,
    kuberay: Annotated[
        bool,
        typer.Option(
            "--kuberay/--no-kuberay",
            help="Several nodes: a KubeRay RayJob, or (--no-kuberay, with --scheduler volcano) a Volcano Job that starts Ray itself.",
        ),
    ] = True,
    npu_resource: Annotated[
        str | None,
        typer.Option("--npu-resource", help="The NPU resource the cluster's device plugin advertises (default: the SKU's in the matrix)."),
    ] = None,
    nic: Annotated[
        str, typer.Option("--nic", help="Network interface for HCCL and Gloo (HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).")
    ] = "eth0",
    host_network: Annotated[
        bool | None,
        typer.Option("--host-network/--no-host-network", help="Pods on the host network (default: on for several nodes, as RoCE needs)."),
    ] = None,
    node_runtime: Annotated[
        NodeRuntime,
        typer.Option(
            "--node-runtime",
            help=(
                "The NPU nodes' container runtime: ascend (Ascend Docker Runtime mounts the driver, MindCluster's default) "
                "or plain (the pods mount every driver file; `k8s preflight` says which the nodes run)."
            ),
        ),
    ] = "ascend",
    network_topology: Annotated[
        TopologyMode | None,
        typer.Option("--network-topology", help="Volcano network-topology placement (A3 SuperPoD): hard or soft."),
    ] = None,
    topology_tier: Annotated[
        int | None, typer.Option("--topology-tier", help="Highest network tier the pods may span (with --network-topology).")
    ] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace of the objects.")] = None,
    device_gid: Annotated[
        int | None,
        typer.Option("--device-gid", help="Group owning the nodes' /dev/davinci* (`ls -ln /dev/davinci0`; default the matrix's, 1000)."),
    ] = None,
    pull_secret: Annotated[str | None, typer.Option("--pull-secret", help="imagePullSecret for a private registry.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Object name (default <framework>-<job>-<sku>[-<N>n]).")] = None,
    arch: Annotated[
        Arch | None, typer.Option("--arch", help="The image's architecture: selects host-arch nodes (default: the SKU's hosts').")
    ] = None,
    model_path: Annotated[
        str | None, typer.Option("--model-path", help=f"Model directory on every node (hostPath; default {DEFAULT_MODEL_PATH}).")
    ] = None,
    model_pvc: Annotated[str | None, typer.Option("--model-pvc", help="Take the model from this PVC instead of --model-path.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, max=MAX_STEPS, help="Smoke job training steps.")] = 5,
    deadline: Annotated[int, typer.Option("--deadline", min=1, max=MAX_SECONDS, help="activeDeadlineSeconds of the job.")] = 3600,
    override: Annotated[
        list[str] | None,
        typer.Option("--override", help="Extra argument of the smoke job: KEY=VALUE (verl), --override=--name=value (OpenRLHF)."),
    ] = None,
    allow_tag: Annotated[bool, typer.Option("--allow-tag", help="Keep an image tag as it is, without pinning its digest (warns).")] = False,
    stack: Annotated[
        str | None,
        typer.Option("--stack", help="The stack the image was built from, when the registry cannot be asked for its labels."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="KIND",
            help=f"kyverno: a Kyverno {KYVERNO_VERSION} ClusterPolicy; sigstore: a policy-controller {POLICY_CONTROLLER_VERSION} "
            "ClusterImagePolicy. Either admits the --image's repository only when --key signed it (instead of a job).",
        ),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", metavar="KEY", help="With --policy: cosign.pub (a file, or env://VAR).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")] = None,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Render the Job (one node), RayJob or Volcano Job (several), or the preflight or prepull DaemonSet, for an SKU and
    an image by digest; or, with --policy, the admission policy that enforces the image's signatures."""
    from buildkit.k8s.render import as_documents, render
    from buildkit.k8s.resolve import make_request, resolve
    from buildkit.matrix.load import load_matrix

    if policy is not None or key is not None:
        _render_policy(policy, key, image, name, output, as_json)
        return
    if hw is None:
        raise InputError("give --hw (the SKU the job runs on), or --policy kyverno|sigstore --key cosign.pub for an admission policy")
    loaded = load_matrix(matrix)
    request = make_request(  # every refusal of the options before the registry is asked
        loaded,
        hw,
        image,
        stack=stack,
        arch=arch,
        overrides=override or [],
        command=command or [],
        nodes=nodes,
        job=job,
        scheduler=scheduler,
        queue=queue,
        kuberay=kuberay,
        npu_resource=npu_resource,
        nic=nic,
        host_network=host_network,
        node_runtime=node_runtime,
        network_topology=network_topology,
        topology_tier=topology_tier,
        namespace=namespace,
        device_gid=device_gid,
        pull_secret=pull_secret,
        name=name,
        model_path=model_path,
        model_pvc=model_pvc,
        steps=steps,
        deadline=deadline,
        allow_tag=allow_tag,
    )
    if output is not None and output != STDOUT:
        check_output_file(output)
    resolved = resolve(loaded, request, stack)
    for note in resolved.notes:
        typer.echo(f"ascendkit: {note}", err=True)
    request, warnings = resolved.request, list(resolved.warnings)
    manifests = render(request)
    for warning in (*warnings, *manifests.warnings):
        typer.echo(f"ascendkit: warning: {warning}", err=True)
    text = manifests.text
    if as_json:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": as_documents(text)}, indent=2) + "\n"
    if write_output(output, text):
        typer.echo(f"wrote {output}", err=True)


def _render_policy(policy: str | None, key: str | None, image: str, name: str | None, output: Path | None, as_json: bool) -> None:
    from buildkit.k8s.policy import render_policy
    from buildkit.k8s.render import dump
    from buildkit.trust.keys import load_public_key

    if policy is None or key is None:
        raise InputError("--policy and --key go together: --policy kyverno|sigstore --key cosign.pub")
    if output is not None and output != STDOUT:
        check_output_file(output)
    document = render_policy(policy, image, load_public_key(key).pem().decode(), name)
    if as_json:
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = dump(document, [f"Generated by ascendkit k8s render --policy {policy}: re-render it rather than edit it."])
    if write_output(output, text):
        typer.echo(f"wrote {output}", err=True)


@k8s_app.command("preflight", short_help="Judge every node from its preflight report.")
@user_errors
def k8s_preflight(
    sources: Annotated[
        list[str],
        typer.Argument(
            help="kubectl logs of the preflight pods: - for stdin (kubectl logs -l ... --prefix --tail=-1), files, or directories."
        ),
    ],
    expect: Annotated[
        int | None, typer.Option("--expect", min=1, max=MAX_NODES, help="Nodes that should have reported (fewer fails).")
    ] = None,
    node_info: Annotated[
        str | None,
        typer.Option(
            "--node-info",
            metavar="FILE",
            help="`kubectl get nodes -o json` (a file): each node's container runtime, and whether it pulls the -zstd tags.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge every node from its preflight report: one row per node, the failing check and what to do (exit 1 when any fails)."""
    from buildkit.k8s.preflight import format_table, read_node_runtimes, read_reports, summarize

    if node_info == "-" and "-" in sources:
        raise InputError("--node-info - and the logs on - cannot both be stdin: give the node list as a file")
    runtimes = read_node_runtimes(node_info) if node_info else None
    verdicts, problems = summarize(read_reports(sources), expect, runtimes)
    failed = bool(problems) or any(v.verdict == "error" for v in verdicts)
    if as_json:
        print_json({"passed": not failed, "nodes": [v.describe() for v in verdicts], "problems": problems})
    else:
        typer.echo(format_table(verdicts, problems))
    if failed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


@k8s_app.command(
    "validate",
    short_help="Check manifests offline against the schemas and CRDs.",
    help=(
        f"Check manifests offline, strictly (unknown fields refused): built-in kinds against the Kubernetes {KUBERNETES_VERSION} "
        f"OpenAPI schemas; RayJobs, Volcano Jobs and admission policies against the CRDs of KubeRay {KUBERAY_VERSION}, "
        f"Volcano {VOLCANO_VERSION}, Kyverno {KYVERNO_VERSION} and policy-controller {POLICY_CONTROLLER_VERSION}, "
        "pod templates against the Kubernetes schemas too (exit 1 on a problem, 2 when a file holds no object)."
    ),
)
@user_errors
def k8s_validate(
    files: Annotated[
        list[Path], typer.Argument(exists=True, dir_okay=False, readable=True, help="YAML (multi-document) or JSON List files.")
    ],
) -> None:
    from buildkit.k8s.validate import validate_file

    failed = False
    for path in files:
        count, problems = validate_file(path)
        for problem in problems:
            typer.echo(problem.format(str(path)), err=True)
        failed = failed or bool(problems)
        state = f"{len(problems)} problem(s)" if problems else "valid"
        typer.echo(
            f"{path}: {count} document(s) {state} (Kubernetes {KUBERNETES_VERSION}, KubeRay {KUBERAY_VERSION}, Volcano {VOLCANO_VERSION}, "
            f"Kyverno {KYVERNO_VERSION}, policy-controller {POLICY_CONTROLLER_VERSION})"
        )
    if failed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))
