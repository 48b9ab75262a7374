"""``ascendkit k8s render`` and ``ascendkit k8s validate``: manifests for Ascend clusters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from buildkit.cli.base import JsonFlag, MatrixPath, app, print_json, user_errors
from buildkit.cli.k8s_options import (
    REQUEST_OPTIONS,
    AllowTagOption,
    ArchOption,
    CommandArgument,
    DeadlineOption,
    DeviceGidOption,
    HostNetworkOption,
    HwOption,
    ImageOption,
    JobOption,
    KeyOption,
    KuberayOption,
    ModelPathOption,
    ModelPvcOption,
    NameOption,
    NamespaceOption,
    NetworkTopologyOption,
    NicOption,
    NodeRuntimeOption,
    NodesOption,
    NpuResourceOption,
    OutputOption,
    OverrideOption,
    ParallelismOption,
    PolicyOption,
    PullerOption,
    PullSecretOption,
    QueueOption,
    SchedulerOption,
    StackOption,
    StepsOption,
    TopologyTierOption,
)
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import STDOUT, check_output_file, read_input_json, write_output
from buildkit.k8s import (
    KRUISE_VERSION,
    KUBERAY_VERSION,
    KUBERNETES_VERSION,
    KYVERNO_VERSION,
    MAX_NODES,
    POLICY_CONTROLLER_VERSION,
    VOLCANO_VERSION,
)
from buildkit.resources import DEFAULT_MATRIX

k8s_app = typer.Typer(
    help=(
        "Kubernetes manifests for published images (Job, KubeRay RayJob, Volcano Job, preflight and prepull DaemonSets) "
        "and the preflight verdict."
    ),
    no_args_is_help=True,
)
app.add_typer(k8s_app, name="k8s")


@k8s_app.command("render", short_help="Render a job, RayJob, Volcano Job or DaemonSet.")
@user_errors
def k8s_render(
    image: ImageOption,
    hw: HwOption = None,
    command: CommandArgument = None,
    nodes: NodesOption = 1,
    job: JobOption = "smoke",
    scheduler: SchedulerOption = "default",
    queue: QueueOption = None,
    kuberay: KuberayOption = True,
    npu_resource: NpuResourceOption = None,
    nic: NicOption = "eth0",
    host_network: HostNetworkOption = None,
    node_runtime: NodeRuntimeOption = "ascend",
    network_topology: NetworkTopologyOption = None,
    topology_tier: TopologyTierOption = None,
    namespace: NamespaceOption = None,
    device_gid: DeviceGidOption = None,
    puller: PullerOption = "daemonset",
    parallelism: ParallelismOption = None,
    pull_secret: PullSecretOption = None,
    name: NameOption = None,
    arch: ArchOption = None,
    model_path: ModelPathOption = None,
    model_pvc: ModelPvcOption = None,
    steps: StepsOption = 5,
    deadline: DeadlineOption = 3600,
    override: OverrideOption = None,
    allow_tag: AllowTagOption = False,
    stack: StackOption = None,
    policy: PolicyOption = None,
    key: KeyOption = None,
    output: OutputOption = None,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Render the Job (one node), RayJob or Volcano Job (several), or the preflight or prepull DaemonSet, for an SKU and
    an image by digest; or, with --policy, the admission policy that enforces the image's signatures."""
    given = dict(locals())  # the options by name: what the request is made of
    if policy is not None or key is not None:
        _render_policy(policy, key, image, name, output, as_json)
        return
    if hw is None:
        raise InputError("give --hw (the SKU the job runs on), or --policy kyverno|sigstore --key cosign.pub for an admission policy")
    _render_job(hw, image, given, output=output, as_json=as_json, matrix=matrix)


def _render_job(hw: str, image: str, given: dict[str, Any], *, output: Path | None, as_json: bool, matrix: Path) -> None:
    """The job (or DaemonSet) ``k8s render`` was asked for: the request refused before the registry
    is asked, then resolved against it, rendered and written."""
    from buildkit.k8s.render import as_documents, render
    from buildkit.k8s.resolve import make_request, resolve
    from buildkit.matrix.load import load_matrix

    loaded = load_matrix(matrix)
    options = {name: given[name] for name in REQUEST_OPTIONS}
    request = make_request(loaded, hw, image, overrides=given["override"] or [], command=given["command"] or [], **options)
    if output is not None and output != STDOUT:
        check_output_file(output)
    resolved = resolve(loaded, request, given["stack"])
    for note in resolved.notes:
        typer.echo(f"ascendkit: {note}", err=True)
    request, warnings = resolved.request, list(resolved.warnings)
    manifests = render(request)
    for warning in (*warnings, *manifests.warnings):
        typer.echo(f"ascendkit: warning: {warning}", err=True)
    for index, note in enumerate(manifests.notes):  # one instruction: its command lines as they are, to copy
        typer.echo(f"ascendkit: {note}" if index == 0 else note, err=True)
    text = manifests.text
    if as_json and request.puller != "dragonfly":  # the preheat jobs are JSON already
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
        list[str] | None,
        typer.Argument(
            help="kubectl logs of the preflight pods: - for stdin (kubectl logs -l ... --prefix --tail=-1), files, or directories."
        ),
    ] = None,
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
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            metavar="FILE",
            help="`kubectl get crd,daemonsets,deployments -A -o json` (a file, or -): the pre-pull engines it runs, and the one to use.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge every node from its preflight report: one row per node, the failing check and what to do (exit 1 when any fails);
    with --cluster, which pre-pull engines the cluster runs and which to use."""
    from buildkit.k8s.preflight import format_table, read_node_runtimes, read_reports, summarize
    from buildkit.k8s.pullers import detect

    sources = sources or []
    if not sources and cluster is None:
        raise InputError("give the preflight pods' logs (- for stdin), or --cluster FILE for the pre-pull engines alone")
    stdin = [s for s in (*sources, node_info, cluster) if s == "-"]
    if len(stdin) > 1:
        raise InputError("only one input can be stdin (-): give the others as files")
    listed = read_input_json(cluster, "cluster list", "ask kubectl for -o json") if cluster else None
    pullers = detect(listed, cluster) if cluster else None
    if not sources:
        assert pullers is not None
        if as_json:
            print_json(pullers.describe())
        else:
            typer.echo("\n".join(pullers.lines()))
        return
    runtimes = read_node_runtimes(node_info) if node_info else None
    verdicts, problems = summarize(read_reports(sources), expect, runtimes)
    failed = bool(problems) or any(v.verdict == "error" for v in verdicts)
    if as_json:
        described = {"passed": not failed, "nodes": [v.describe() for v in verdicts], "problems": problems}
        print_json({**described, "pullers": pullers.describe()} if pullers else described)
    else:
        typer.echo(format_table(verdicts, problems) + ("\n" + "\n".join(pullers.lines()) if pullers else ""))
    if failed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


@k8s_app.command("prepull-status", short_help="Where a pre-pull stands, node by node.")
@user_errors
def k8s_prepull_status(
    source: Annotated[
        str,
        typer.Argument(
            help=(
                "- (stdin) or a file: the DaemonSet's pods (kubectl get pods -l app.kubernetes.io/instance=NAME -o json), an "
                "OpenKruise ImagePullJob (kubectl get imagepulljob NAME -o json) or Dragonfly preheat jobs (GET /oapi/v1/jobs/ID)."
            )
        ),
    ],
    node_images: Annotated[
        str | None,
        typer.Option(
            "--node-images", metavar="FILE", help="With an ImagePullJob: kubectl get nodeimages -o json (each node's time and reason)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Nodes done, failed (with the reason the engine gave) and pending, and the p50/p99 time per node where the
    puller records it (exit 1 when a node failed; JSON's "complete" says whether every node has the image)."""
    from buildkit.k8s.prepull_status import format_table, read

    if node_images == "-" and source == "-":
        raise InputError("--node-images - and the status on - cannot both be stdin: give the NodeImages as a file")
    status = read(source, node_images)
    if as_json:
        print_json(status.describe())
    else:
        typer.echo(format_table(status))
    if status.count("failed"):
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


@k8s_app.command(
    "validate",
    short_help="Check manifests offline against the schemas and CRDs.",
    help=(
        f"Check manifests offline, strictly (unknown fields refused): built-in kinds against the Kubernetes {KUBERNETES_VERSION} "
        "OpenAPI schemas; RayJobs, Volcano Jobs, ImagePullJobs and admission policies against the CRDs of "
        f"KubeRay {KUBERAY_VERSION}, Volcano {VOLCANO_VERSION}, OpenKruise {KRUISE_VERSION}, Kyverno {KYVERNO_VERSION} "
        f"and policy-controller {POLICY_CONTROLLER_VERSION}, "
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
            f"OpenKruise {KRUISE_VERSION}, Kyverno {KYVERNO_VERSION}, policy-controller {POLICY_CONTROLLER_VERSION})"
        )
    if failed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))
