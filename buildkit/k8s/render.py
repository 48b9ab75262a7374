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

import shlex
from typing import Any

import yaml

from buildkit.errors import InputError
from buildkit.k8s import KRUISE_VERSION, KUBERAY_VERSION, KUBERNETES_VERSION, VOLCANO_VERSION
from buildkit.k8s.kinds import batch_job, configmap, preflight_daemonset, prepull_daemonset, rayjob, volcano_job
from buildkit.k8s.pod import Pod, placement
from buildkit.k8s.prepull import (
    DEFAULT_PARALLELISM,
    KRUISE_API,
    VARIANT_LABEL,
    dump_preheat,
    imagepulljob,
    preheat_note,
    preheat_requests,
)
from buildkit.k8s.request import APP_LABEL, K8sRequest, Manifests, check_request, default_name
from buildkit.matrix.yamlsource import YamlSourceError, load_documents
from buildkit.plan import LABEL_PREFIX
from buildkit.run.job import REWARD_FILE, SMOKE_FILES, build_job, check_overrides, spec_for

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
    name = default_name(request) if request.name is None else request.name
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
    if request.job == "preflight":
        return _preflight(request, name, labels, warnings)
    if request.job == "prepull":
        return _prepull(request, name, labels, warnings)
    title = f"{framework} {request.job} on {request.nodes} x {sku.product} ({request.sku_id}), {sku.npus_per_node} NPUs per node"
    scheduling = f"scheduler {request.scheduler}" + (f", queue {request.queue or 'default'}" if request.volcano else "")
    made = {
        "Job": (batch_job, f"batch/v1 Job; {scheduling}"),
        "RayJob": (rayjob, f"KubeRay {KUBERAY_VERSION} RayJob (ray.io/v1); {scheduling}"),
        "VolcanoJob": (volcano_job, f"Volcano {VOLCANO_VERSION} Job (batch.volcano.sh/v1alpha1) starting Ray itself; {scheduling}"),
    }
    build, what = made[request.kind]
    rendered = f"Rendered by `ascendkit k8s render`: {what}. Check: `ascendkit k8s validate` (Kubernetes {KUBERNETES_VERSION})."
    docs: list[str] = []
    if pod.smoke:
        what = "data generator" + (" and reward function" if len(files) > 1 else "")
        shown = ", ".join(f"smoke_tests/{f}" for f in files)
        docs.append(dump(configmap(pod.configmap, request, labels, files), [f"The smoke job's {what} ({shown})."]))
    docs.append(dump(build(name, pod, argv), [title, rendered]))
    return Manifests("---\n".join(docs), warnings)


def _preflight(request: K8sRequest, name: str, labels: dict[str, str], warnings: tuple[str, ...]) -> Manifests:
    sku = request.sku
    labels = {f"{APP_LABEL}/name": "ascendkit-preflight", **{k: v for k, v in labels.items() if not k.endswith("/name")}}
    pod = Pod(request, labels, {}, [], "")
    scheduling = f"scheduler {request.scheduler}" + (f", queue {request.queue or 'default'}" if request.volcano else "")
    comments = [
        f"Preflight of every {sku.product} ({request.sku_id}) node the scheduler offers, with the image the job will use.",
        f"Rendered by `ascendkit k8s render --job preflight`: apps/v1 DaemonSet; {scheduling}. Check: `ascendkit k8s validate`.",
        "Each pod takes all its node's NPUs (a node whose NPUs are held stays Pending), runs `ascendkit doctor --json --links`",
        "once and idles. Read them: kubectl logs -l app.kubernetes.io/instance="
        + name
        + " --prefix --tail=-1"
        + (f" -n {request.namespace}" if request.namespace else "")
        + " | ascendkit k8s preflight - --node-info nodes.json",
        "(nodes.json: kubectl get nodes -o json > nodes.json, for each node's runtime and whether it pulls -zstd tags);",
        "then delete this DaemonSet.",
    ]
    return Manifests(dump(preflight_daemonset(name, pod), comments), warnings)


def _prepull(request: K8sRequest, name: str, labels: dict[str, str], warnings: tuple[str, ...]) -> Manifests:
    sku = request.sku
    labels = {f"{APP_LABEL}/name": "ascendkit-prepull", **{k: v for k, v in labels.items() if not k.endswith("/name")}}
    pod = Pod(request, labels, {}, [], "")
    namespace = f" -n {request.namespace}" if request.namespace else ""
    images = request.images_to_pull
    if request.puller == "openkruise":
        return _imagepulljobs(request, name, labels, warnings)
    if request.puller == "dragonfly":
        bio = f"ascendkit prepull for {sku.product} ({request.sku_id})"
        notes = tuple(preheat_note(request.pull_secret, request.namespace))
        return Manifests(dump_preheat(preheat_requests(images, bio)), warnings, notes)
    comments = [
        f"Pulls the job's image on every {sku.product} ({request.sku_id}) node before the job lands, then sleeps: no NPU, no mount.",
        "Rendered by `ascendkit k8s render --job prepull`: apps/v1 DaemonSet. Check: `ascendkit k8s validate`.",
        f"Apply it, wait until every node has the image: kubectl rollout status daemonset/{name}{namespace} --timeout=2h",
        f"then submit the job; delete this DaemonSet afterwards (kubectl delete daemonset/{name}{namespace}): the image stays cached.",
        f"Read where it stands: kubectl get pods -l {APP_LABEL}/instance={name}{namespace} -o json | ascendkit k8s prepull-status -",
    ]
    return Manifests(dump(prepull_daemonset(name, pod), comments), warnings)


def _imagepulljobs(request: K8sRequest, name: str, labels: dict[str, str], warnings: tuple[str, ...]) -> Manifests:
    """One OpenKruise ImagePullJob per image of the tag, on the SKU's nodes."""
    sku = request.sku
    namespace = f" -n {request.namespace}" if request.namespace else ""
    metadata: dict[str, Any] = {"namespace": request.namespace} if request.namespace else {}
    metadata["labels"] = labels
    node_labels = placement(request)["nodeSelector"]
    docs = []
    images = request.images_to_pull
    for image in images:
        job = name if image.variant == "gzip" or len(images) == 1 else f"{name}-{image.variant}"
        comments = [
            f"Pulls {image.ref} ({image.variant} layers) on every {sku.product} ({request.sku_id}) node,",
            f"{request.parallelism or DEFAULT_PARALLELISM} nodes at a time, through kruise-daemon and the node's CRI (no pod, no NPU).",
            f"Rendered by `ascendkit k8s render --job prepull --puller openkruise`: OpenKruise {KRUISE_VERSION} ImagePullJob "
            f"({KRUISE_API}, served by OpenKruise 1.6 to 1.9). Check: `ascendkit k8s validate`.",
            f"Follow it: kubectl get imagepulljob {job}{namespace} -o json > job.json; kubectl get nodeimages -o json > nodeimages.json;",
            "ascendkit k8s prepull-status job.json --node-images nodeimages.json",
        ]
        if len(images) > 1:
            pick = f"kubectl apply -f FILE -l {VARIANT_LABEL}=gzip (or =zstd where `k8s preflight` says the nodes pull it)"
            comments.insert(3, f"Apply only what your nodes pull: {pick}.")
        opts = {"parallelism": request.parallelism or DEFAULT_PARALLELISM, "pull_secret": request.pull_secret}
        docs.append(dump(imagepulljob(job, metadata, image, node_labels, **opts), comments))
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
