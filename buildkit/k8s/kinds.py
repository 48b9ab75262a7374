"""The kinds: a ``batch/v1`` Job on one node, a KubeRay ``RayJob`` or a Volcano Job on several,
each wrapping :func:`buildkit.k8s.pod.npu_pod` with only what is its own."""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from buildkit.k8s.pod import CONTAINER_SECURITY, Pod, env_list, locked_down, npu_pod, preflight_pod, prepull_pod, writable
from buildkit.k8s.request import (
    FILES,
    HOST_ARCH,
    HOSTNET_SKIP,
    KUBERAY_TOPOLOGY_MODE,
    KUBERAY_TOPOLOGY_TIER,
    KUBERAY_VOLCANO_QUEUE,
    MINDCLUSTER_JOB_KIND,
    RAY_JOIN_TIMEOUT,
    K8sRequest,
)
from buildkit.resources import SMOKE_DIR

# ---------------------------------------------------------------------------------------------
# The kinds


def _metadata(name: str, request: K8sRequest, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if request.namespace:
        meta["namespace"] = request.namespace
    meta["labels"] = labels
    return meta


def _workload_metadata(name: str, request: K8sRequest, labels: dict[str, str]) -> dict[str, Any]:
    """A workload's metadata. One on the host's network carries checkov's hostNetwork skip, as its
    pods do: checkov judges a Job's pod template by the Job's own annotations."""
    meta = _metadata(name, request, labels)
    if request.hostnet:
        meta["annotations"] = dict(HOSTNET_SKIP)
    return meta


def configmap(name: str, request: K8sRequest, labels: dict[str, str], files: tuple[str, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(name, request, labels),
        "data": {file: (SMOKE_DIR / file).read_text(encoding="utf-8") for file in files},
    }


def preflight_daemonset(name: str, pod: Pod) -> dict[str, Any]:
    """One preflight pod on every node of the SKU (its node labels), each checking its node once."""
    return _daemonset(name, pod, preflight_pod(pod))


def prepull_daemonset(name: str, pod: Pod) -> dict[str, Any]:
    """One prepull pod on every node of the SKU: the image pulled everywhere before the job lands.
    Rolled out all at once (a new image pulls on every node in parallel, not one node at a time)."""
    daemonset = _daemonset(name, pod, prepull_pod(pod))
    daemonset["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    return daemonset


def _daemonset(name: str, pod: Pod, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _workload_metadata(name, pod.request, pod.labels),
        "spec": {
            "selector": {
                "matchLabels": {k: v for k, v in template["metadata"]["labels"].items() if k.endswith(("/instance", "/component"))}
            },
            "template": template,
        },
    }


def batch_job(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
    request = pod.request
    main = {"name": request.image_job.framework, "args": argv, "env": env_list(pod.job_env)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _workload_metadata(name, request, pod.labels),
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


def rayjob(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
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
    mounts, volumes = writable(request)  # the Ray client's temp files and config, under a read-only root
    submitter["containers"] = [
        {
            "name": "ray-job-submitter",
            "image": request.image,
            "imagePullPolicy": "IfNotPresent",
            "resources": {"requests": small, "limits": small},
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": mounts,
        }
    ]
    submitter.update(locked_down(request, devices=False), volumes=volumes)  # no NPU: no device group
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
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _workload_metadata(name, request, labels), "spec": spec}


def volcano_job(name: str, pod: Pod, argv: list[str]) -> dict[str, Any]:
    request = pod.request
    ray_env = env_list(
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
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": _workload_metadata(name, request, labels), "spec": spec}
