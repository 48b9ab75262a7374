"""One NPU pod: what every pod of every kind shares (devices, driver mounts, /dev/shm, HCCL
networking, doctor as an init container, the smoke data generator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from buildkit.doctor.base import HCCN_CONF, NODE_ENV
from buildkit.doctor.contract import EVERY_POD_ENV, contract_for
from buildkit.k8s.request import (
    APP_LABEL,
    HOST_ARCH,
    HOSTNET_SKIP,
    MINDCLUSTER_JOB_KIND,
    VOLCANO_POD_QUEUE,
    K8sRequest,
)
from buildkit.plan import WORKSPACE
from buildkit.run.devices import SHM_SIZE
from buildkit.run.job import SMOKE_FILES


def host_volumes(request: K8sRequest) -> list[tuple[str, str, str]]:
    """The host paths the pod mounts itself, as hostPath volumes (volume name, path, hostPath type):
    what its chip's contract (buildkit/doctor/host_contract.json) gives the container and the
    node's Ascend Docker Runtime does not (``--node-runtime``). Devices come from the device plugin."""
    contract = contract_for(request.sku.chip)
    ascend = request.node_runtime == "ascend"
    pieces = [p for p in contract.paths if p.in_pod(ascend_runtime=ascend, nodes=request.nodes)]
    return [(_volume_name(p.path), p.path, p.host_path_type) for p in pieces]


def _volume_name(path: str) -> str:
    """``host-`` and the path's last two parts as a DNS label: /usr/local/Ascend/driver/lib64 -> host-driver-lib64."""
    name = "-".join(part for part in path.strip("/").split("/")[-2:]).replace("_", "-").replace(".", "-").lower()
    return f"host-{name}"[:63].rstrip("-")


# Every container runs locked down: as the image's user, without privilege escalation, with a
# read-only root filesystem and no Linux capability at all. None is needed: HCCL reaches the other
# nodes through the NPUs' own RoCE ports, driven through the device nodes the device plugin gives
# the pod (not through the pod's network stack), and Ray and Gloo use plain TCP on ports above 1024.
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
# What a read-only root filesystem leaves a job to write to, each an emptyDir: Ray's session
# directory and torch's compile caches (/tmp), the caches of Hugging Face, Triton, vLLM and CANN's
# logs (the home), and what a job writes beside itself (the workdir: checkpoints, kernel_meta).
WRITABLE = (("tmp", "/tmp"), ("home", None), ("workspace", WORKSPACE))
# Init containers check and generate small things: bounded small.
INIT_RESOURCES = {"cpu": "1", "memory": "2Gi"}

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


def env_list(pairs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in sorted(pairs.items())]


def networking_env(request: K8sRequest, *, ray: bool) -> list[dict[str, Any]]:
    """HCCL and Gloo settings of an NPU container, from its chip's contract: HCCL's timeouts everywhere;
    in a Ray pod (several nodes) also the port ranges and the NIC, as verl's multi-node docs set them;
    HCCL_IF_IP (the node's address) only where the pod uses the host's network, as MindCluster says;
    and the environment the SKU gives (an Ascend 950's HCCL_TOPO_FILE_PATH)."""
    contract = contract_for(request.sku.chip)
    multi = {e.name: e.value.format(nic=request.nic) for e in contract.multi_node_env}
    pairs = {k: v for k, v in multi.items() if k in EVERY_POD_ENV or ray}
    pairs.update(contract.env_for(request.sku.hccl_topo_file))
    env: list[dict[str, Any]] = []
    if ray and request.hostnet:
        env += [{"name": e.name, "valueFrom": {"fieldRef": {"fieldPath": e.field}}} for e in contract.host_network_env]
    return env + env_list(pairs)


def writable(request: K8sRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The mounts and the emptyDir volumes of WRITABLE, for the request's user."""
    mounts = [{"name": n, "mountPath": p or request.user.home} for n, p in WRITABLE]
    return mounts, [{"name": n, "emptyDir": {}} for n, _ in WRITABLE]


def locked_down(request: K8sRequest, *, devices: bool) -> dict[str, Any]:
    """What every pod spec gets: no service-account token (nothing in the pods talks to the API
    server) and the pod's securityContext, as the image's user; with ``devices`` also the group
    that opens /dev/davinci* (HwHiAiUser's, mode 0660) as a supplemental group."""
    user = request.user
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": user.uid,
        "runAsGroup": user.gid,
        "fsGroup": user.gid,  # the emptyDirs and the PVC are the user's
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    if devices:
        security["supplementalGroups"] = [request.device_group]
    security["seccompProfile"] = {"type": "RuntimeDefault"}
    return {"automountServiceAccountToken": False, "securityContext": security}


def npu_pod(pod: Pod, role: str, main: dict[str, Any], *, ray: bool, restart: str | None = "Never") -> dict[str, Any]:
    """A pod template: ``main`` is the role's container (name, args, env); everything else is shared."""
    request, sku = pod.request, pod.request.sku
    npus = {request.resource: str(sku.npus_per_node)}
    memory = f"{sku.k8s_memory_gib_request}Gi"
    host = host_volumes(request)
    driver_mounts = [{"name": n, "mountPath": p, "readOnly": True} for n, p, _ in host]
    metadata = pod_metadata(pod, role)
    doctor_args = ["ascendkit", "doctor", *(["--links"] if request.nodes > 1 else [])]
    writable_mounts, writable_volumes = writable(request)
    init_limits = {**npus, **INIT_RESOURCES}
    init = [
        {
            "name": "doctor",
            "image": request.image,
            "imagePullPolicy": "IfNotPresent",
            "args": doctor_args,
            "resources": {"requests": init_limits, "limits": init_limits},
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [*driver_mounts, *writable_mounts],
        }
    ]
    mounts = [*driver_mounts, {"name": "dshm", "mountPath": "/dev/shm"}, *writable_mounts]
    volumes: list[dict[str, Any]] = [{"name": n, "hostPath": {"path": p, "type": t}} for n, p, t in host]
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.replace("g", "Gi")}})
    volumes += writable_volumes
    if pod.smoke:
        init.append(
            {
                "name": "smoke-data",
                "image": request.image,
                "imagePullPolicy": "IfNotPresent",
                "args": pod.data_args,
                "resources": {"requests": INIT_RESOURCES, "limits": INIT_RESOURCES},
                "securityContext": CONTAINER_SECURITY,
                "volumeMounts": [
                    {"name": "smoke-files", "mountPath": SMOKE_FILES, "readOnly": True},
                    {"name": "smoke-out", "mountPath": "/smoke/out"},
                    *writable_mounts,
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
    cpu = str(sku.k8s_cpu_request)
    container = {
        "name": main["name"],
        "image": request.image,
        "imagePullPolicy": "IfNotPresent",
        **({"args": main["args"]} if main.get("args") else {}),  # args, not command: the entrypoint loads CANN first
        "env": [*networking_env(request, ray=ray), *main.get("env", [])],
        "resources": {  # limits = requests: the Guaranteed class, so the node never evicts a running job first
            "requests": {**npus, "cpu": cpu, "memory": memory},
            "limits": {**npus, "cpu": cpu, "memory": memory},
        },
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {}
    if restart:
        spec["restartPolicy"] = restart
    if request.hostnet:
        spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    spec.update(placement(request))
    spec.update(initContainers=init, containers=[container], volumes=volumes)
    return {"metadata": metadata, "spec": spec}


def pod_metadata(pod: Pod, role: str) -> dict[str, Any]:
    """The labels (MindCluster's job kind under Volcano) and, for a pod Volcano schedules by itself, its queue."""
    request = pod.request
    labels = {**pod.labels, f"{APP_LABEL}/component": role}
    if request.volcano:
        labels[MINDCLUSTER_JOB_KIND] = request.sku.k8s_ring_controller
    metadata: dict[str, Any] = {"labels": labels}
    annotations = dict(HOSTNET_SKIP) if request.hostnet else {}
    if request.volcano and request.kind in ("Job", "DaemonSet"):
        annotations[VOLCANO_POD_QUEUE] = request.queue or "default"
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def placement(request: K8sRequest) -> dict[str, Any]:
    """Where an NPU pod may run and as whom: the scheduler, the SKU's node labels, the pull secret,
    the locked-down pod securityContext with the devices' group."""
    spec: dict[str, Any] = {}
    if request.volcano and request.kind != "RayJob":  # KubeRay sets it on the pods it creates
        spec["schedulerName"] = "volcano"
    spec["nodeSelector"] = {
        "accelerator": request.sku.k8s_accelerator,
        "accelerator-type": request.sku.k8s_accelerator_type,
        "host-arch": HOST_ARCH[request.arch],
    }
    if request.pull_secret:
        spec["imagePullSecrets"] = [{"name": request.pull_secret}]
    spec.update(locked_down(request, devices=True))
    return spec


# What the preflight pod adds to the driver files: the NPU ports' configuration, which it compares
# with what the ports hold. A node without it fails to start the pod (hostPath type File): the
# summary lists it among the nodes that sent no report, and `kubectl describe pod` names the file.
# And the node's containerd config, read for its pull settings (DirectoryOrCreate: on a node whose
# runtime keeps no /etc/containerd an empty directory, and doctor says nothing of containerd).
PREFLIGHT_VOLUMES = (("hccn-conf", HCCN_CONF, "File"), ("containerd-config", "/etc/containerd", "DirectoryOrCreate"))
PREFLIGHT_DONE = "ascendkit-preflight: done"  # printed after doctor's report, before the pod idles


def preflight_pod(pod: Pod) -> dict[str, Any]:
    """The pod a preflight DaemonSet puts on each node: every NPU of the node, the host driver, its
    hccn.conf, and ``ascendkit doctor --json --links`` once; then it idles, so that the DaemonSet
    does not restart it and ``kubectl logs`` keeps the report."""
    request = pod.request
    npus = {request.resource: str(request.sku.npus_per_node)}
    limits = {**npus, **INIT_RESOURCES}
    files = (*host_volumes(request), *PREFLIGHT_VOLUMES)
    writable_mounts, writable_volumes = writable(request)
    script = f'ascendkit doctor --json --links; echo "{PREFLIGHT_DONE} (doctor exit $?)"; exec sleep infinity'
    container = {
        "name": "preflight",
        "image": request.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["bash", "-c", script],  # args, not command: the entrypoint loads CANN first
        "env": [{"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": limits, "limits": limits},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*({"name": n, "mountPath": p, "readOnly": True} for n, p, _ in files), *writable_mounts],
    }
    volumes = [{"name": n, "hostPath": {"path": p, "type": t}} for n, p, t in files] + writable_volumes
    spec = {**placement(request), "containers": [container], "volumes": volumes}
    return {"metadata": pod_metadata(pod, "preflight"), "spec": spec}


# The prepull pod asks for next to nothing (it sleeps), as a Guaranteed pod: requests = limits.
PREPULL_RESOURCES = {"cpu": "10m", "memory": "16Mi"}


def prepull_pod(pod: Pod) -> dict[str, Any]:
    """The pod a prepull DaemonSet puts on each node of the SKU: the job's image, pulled once
    (``IfNotPresent``) and then only sleeping, so the pull is done before the job lands. It takes no
    NPU and mounts nothing: it can run beside a job that holds every NPU of the node."""
    request = pod.request
    container = {
        "name": "prepull",
        "image": request.image,
        "imagePullPolicy": "IfNotPresent",
        # command, not args: nothing of the image starts (not even its entrypoint's CANN setup); the
        # image's own coreutils sleep, so no second image (a pause image) has to be reachable
        "command": ["sleep", "infinity"],
        "resources": {"requests": PREPULL_RESOURCES, "limits": PREPULL_RESOURCES},
        "securityContext": CONTAINER_SECURITY,
    }
    spec: dict[str, Any] = {}
    if request.volcano:
        spec["schedulerName"] = "volcano"
    spec["nodeSelector"] = placement(request)["nodeSelector"]
    if request.pull_secret:
        spec["imagePullSecrets"] = [{"name": request.pull_secret}]
    spec.update(locked_down(request, devices=False))
    spec.update(terminationGracePeriodSeconds=1, containers=[container])  # sleep ignores SIGTERM: no 30 s wait on delete
    return {"metadata": pod_metadata(pod, "prepull"), "spec": spec}
