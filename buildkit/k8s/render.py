"""Kubernetes manifests for published images: a ``batch/v1`` Job on one node, a KubeRay
``RayJob`` across several, from ``templates/k8s/`` and the SKU in the matrix.

Every pod takes all of its node's NPUs (``huawei.com/Ascend910``), lands on the SKU's nodes by the
Ascend device plugin's node labels, mounts the host driver read-only the way ``ascendkit smoke``
does, and runs ``ascendkit doctor`` as an init container. Images are referenced by digest.

``validate`` checks core objects against the Kubernetes OpenAPI schemas that kubernetes-validate
carries (offline), and a RayJob against the ``ray.io/v1`` fields ascendkit emits plus its pod
templates against the core schemas.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import jinja2
import yaml

from buildkit.errors import InputError
from buildkit.image.registry import IMAGE_REFERENCE
from buildkit.k8s import DEFAULT_MODEL_PATH, KUBERAY_VERSION, KUBERNETES_VERSION
from buildkit.matrix.model import Sku
from buildkit.matrix.yamlsource import YamlSourceError, load_documents
from buildkit.plan import LABEL_PREFIX
from buildkit.resources import SMOKE_DIR, TEMPLATES_DIR
from buildkit.run.devices import DRIVER_FILES_OPTIONAL, DRIVER_FILES_REQUIRED, SHM_SIZE
from buildkit.run.job import ImageJob, build_job, load_job

NPU_RESOURCE = "huawei.com/Ascend910"  # A2 and A3 alike (Ascend device plugin)
HOST_ARCH = {"aarch64": "huawei-arm", "x86_64": "huawei-x86"}
RAYJOB_NAME_MAX = 47  # KubeRay adds "-xxxxx" for the RayCluster and up to 10 for its services
APP_LABEL = "app.kubernetes.io"

_LABEL_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: what KubeRay requires, fine for Jobs too
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# The host files smoke mounts, as hostPath volumes: (volume name, path, hostPath type).
DRIVER_VOLUMES = (
    ("driver-lib64", "/usr/local/Ascend/driver/lib64", "Directory"),
    ("driver-version", "/usr/local/Ascend/driver/version.info", "File"),
    ("dcmi", "/usr/local/dcmi", "Directory"),
    ("npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("ascend-install-info", "/etc/ascend_install.info", "File"),
)
assert {p for _, p, _ in DRIVER_VOLUMES} == {*DRIVER_FILES_REQUIRED, *DRIVER_FILES_OPTIONAL}


@dataclass(frozen=True)
class K8sRequest:
    sku_id: str
    sku: Sku
    image: str
    nodes: int = 1
    job: str = "smoke"  # or "train"
    command: tuple[str, ...] = ()  # --job train -- CMD...
    namespace: str | None = None
    name: str | None = None
    pull_secret: str | None = None
    arch: str = "aarch64"
    model_path: str = DEFAULT_MODEL_PATH
    model_pvc: str | None = None
    steps: int = 5
    deadline_s: int = 3600
    allow_tag: bool = False
    overrides: tuple[str, ...] = ()
    image_job: ImageJob = field(default_factory=lambda: ImageJob(None, None))  # the image's stack and verl (its labels, or --stack)
    first_autodetect: str = field(kw_only=True)  # compat.verl_npu_autodetect of the matrix


@dataclass(frozen=True)
class Manifests:
    text: str  # YAML documents
    warnings: tuple[str, ...]  # accepted, but worth saying (a tag with --allow-tag)


def check_image(ref: str, allow_tag: bool) -> str | None:
    """A digest reference passes; a tag only with ``allow_tag`` (returns the warning)."""
    match = IMAGE_REFERENCE.match(ref)
    if not match:
        raise InputError(f"--image {ref!r} is not an image reference (e.g. 127.0.0.1:5000/ascendkit/verl@sha256:<64 hex>)")
    if match["digest"]:
        return None
    if not allow_tag:
        raise InputError(
            f"--image {ref!r} has no digest: a tag can move between render and pull. Use the digest `ascendkit publish` "
            "printed (REPO@sha256:<64 hex>) or pass --allow-tag"
        )
    return f"--image {ref} is a mutable tag: nodes may run different images (--allow-tag)"


def check_name(value: str, what: str, *, limit: int = 63, pattern: re.Pattern[str] = _LABEL_NAME) -> str:
    if len(value) > limit or not pattern.match(value):
        raise InputError(
            f"{what} {value!r} is not a valid Kubernetes name: lower-case letters, digits and '-', "
            f"starting with a letter and ending with a letter or digit, at most {limit} characters"
        )
    return value


def _default_name(request: K8sRequest) -> str:
    return f"verl-{request.job}-{request.sku_id}" + (f"-{request.nodes}n" if request.nodes > 1 else "")


def check_request(request: K8sRequest) -> tuple[str, ...]:
    """Every refusal happens here, before anything is rendered or written; returns the warnings."""
    if request.nodes < 1:
        raise InputError(f"--nodes {request.nodes}: at least 1")
    if request.job not in ("smoke", "train"):
        raise InputError(f"--job {request.job!r}: smoke or train")
    if request.job == "train" and not request.command:
        raise InputError("--job train needs the command after `--`, e.g. -- python3 -m verl.trainer.main_ppo ...")
    if request.job == "smoke" and request.command:
        raise InputError("a command after `--` is for --job train; the smoke job's command comes from smoke_tests/grpo_smoke.yaml")
    if request.arch not in HOST_ARCH:
        raise InputError(f"--arch {request.arch!r}: one of {', '.join(HOST_ARCH)}")
    warning = check_image(request.image, request.allow_tag)
    limit = RAYJOB_NAME_MAX if request.nodes > 1 else 63
    check_name(request.name or _default_name(request), "--name", limit=limit)
    if request.namespace is not None:
        check_name(request.namespace, "--namespace", pattern=_DNS_LABEL)
    if request.pull_secret is not None:
        check_name(request.pull_secret, "--pull-secret", limit=253, pattern=_DNS_SUBDOMAIN)
    if request.model_pvc is not None:
        check_name(request.model_pvc, "--model-pvc", limit=253, pattern=_DNS_SUBDOMAIN)
    if not request.model_path.startswith("/"):
        raise InputError(f"--model-path {request.model_path!r}: an absolute path on the nodes")
    return (warning,) if warning else ()


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR / "k8s"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    return env


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render(request: K8sRequest) -> Manifests:
    """The manifests as YAML documents (a ConfigMap first for the smoke job)."""
    warnings = check_request(request)
    env = _env()
    name = request.name or _default_name(request)
    sku = request.sku
    labels = [
        (f"{APP_LABEL}/name", "ascendkit-verl"),
        (f"{APP_LABEL}/instance", name),
        (f"{APP_LABEL}/managed-by", "ascendkit"),
        (f"{LABEL_PREFIX}/sku", request.sku_id),
        (f"{LABEL_PREFIX}/job", request.job),
    ]
    node_selector = [
        ("accelerator", "huawei-Ascend910"),
        ("accelerator-type", sku.k8s_accelerator_type),
        ("host-arch", HOST_ARCH[request.arch]),
    ]
    npus = {NPU_RESOURCE: str(sku.npus_per_node)}
    requests = {**npus, "cpu": str(sku.k8s_cpu_request), "memory": f"{sku.k8s_memory_gib_request}Gi"}
    limits = {**npus, "memory": f"{sku.k8s_memory_gib_request}Gi"}
    smoke = request.job == "smoke"
    data_args: list[str] = []
    if smoke:
        job = build_job(
            load_job(),
            sku,
            request.image_job,
            first_autodetect=request.first_autodetect,
            steps=request.steps,
            nnodes=request.nodes,
            extra=request.overrides,
        )
        argv, job_env, data_args = job.argv, sorted(job.env.items()), job.data_command()
    else:
        argv, job_env = list(request.command), []
    driver_mounts = [{"name": n, "path": p, "type": t} for n, p, t in DRIVER_VOLUMES]
    model = {"pvc": request.model_pvc, "host_path": request.model_path} if smoke else None
    configmap = f"{name}-smoke"
    multi = request.nodes > 1

    def pod(role: str, args: list[str]) -> str:
        return (
            env.get_template("pod.yaml.j2")
            .render(
                p={
                    "labels": [*labels, (f"{APP_LABEL}/component", role)],
                    "restart_policy": None if multi else "Never",
                    "host_network": multi,
                    "node_selector": node_selector,
                    "pull_secret": request.pull_secret,
                    "image": request.image,
                    "npu_resources": npus,
                    "driver_mounts": driver_mounts,
                    "smoke_data": smoke,
                    "data_args": data_args,
                    "container": role if multi else "verl",
                    "args": args,
                    "env": job_env,
                    "requests": requests,
                    "limits": limits,
                    "model": model,
                    "shm_size": SHM_SIZE.replace("g", "Gi"),
                    "configmap": configmap,
                }
            )
            .rstrip("\n")
        )

    title = f"verl {request.job} on {request.nodes} x {sku.product} ({request.sku_id}), {sku.npus_per_node} NPUs per node"
    docs: list[str] = []
    meta = {"name": name, "namespace": request.namespace, "labels": labels, "title": title, "kubernetes_version": KUBERNETES_VERSION}
    if smoke:
        generator = (SMOKE_DIR / "gsm8k_synth.py").read_text(encoding="utf-8")
        docs.append(env.get_template("configmap.yaml.j2").render(m={**meta, "configmap": configmap, "generator": generator}))
    if not multi:
        docs.append(env.get_template("job.yaml.j2").render(m={**meta, "deadline": request.deadline_s, "pod": pod(request.job, argv)}))
    else:
        runtime_env = yaml.safe_dump({"env_vars": dict(job_env)}, sort_keys=True) if job_env else ""
        docs.append(
            env.get_template("rayjob.yaml.j2").render(
                m={
                    **meta,
                    "kuberay_version": KUBERAY_VERSION,
                    "entrypoint": shlex.join(argv),
                    "runtime_env": runtime_env,
                    "deadline": request.deadline_s,
                    "ray_start_params": {
                        "num-cpus": str(sku.k8s_cpu_request),
                        "resources": json.dumps(json.dumps({"NPU": sku.npus_per_node})),
                    },
                    "head_pod": pod("ray-head", []),
                    "worker_pod": pod("ray-worker", []),
                    "workers": request.nodes - 1,
                    "submitter_node_selector": dict(node_selector[2:]),
                    "pull_secret": request.pull_secret,
                    "image": request.image,
                }
            )
        )
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
