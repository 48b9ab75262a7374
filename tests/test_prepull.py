"""Warm nodes: `k8s render --job prepull` gives a DaemonSet that pulls the job's image on every node of
the SKU and then sleeps, locked down like every other pod; strictly valid against Kubernetes' schema,
and its container run as rendered in the built image."""

from __future__ import annotations

import time
from typing import Any

import pytest

from buildkit.errors import InputError
from buildkit.k8s.validate import validate_documents
from tests.conftest import DockerEnv
from tests.test_preflight import IMAGE, LOADED, daemonset_pod_spec, node_daemonset


def prepull(sku_id: str, **kw: Any) -> dict[str, Any]:
    return node_daemonset(sku_id, "prepull", **kw)


@pytest.mark.parametrize("scheduler", ["default", "volcano"])
@pytest.mark.parametrize("sku_id", sorted(LOADED.matrix.skus))
def test_the_prepull_daemonset_validates_strictly_for_every_sku_and_scheduler(sku_id: str, scheduler: str) -> None:
    doc = prepull(sku_id, scheduler=scheduler, namespace="rl", pull_secret="registry-cred")
    assert validate_documents([doc]) == []
    assert doc["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    spec = daemonset_pod_spec(doc, sku_id, "prepull")
    assert spec["imagePullSecrets"] == [{"name": "registry-cred"}]
    (container,) = spec["containers"]
    assert container["image"] == IMAGE and container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == ["sleep", "infinity"] and "args" not in container
    assert container["resources"]["requests"] == container["resources"]["limits"], "a Guaranteed pod"
    assert not any("/" in name for name in container["resources"]["limits"]), "no NPU: it runs beside a job holding them all"
    assert "volumes" not in spec and "volumeMounts" not in container and "initContainers" not in spec
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "supplementalGroups" not in spec["securityContext"], "no device group: it opens no device"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert ("schedulerName" in spec) == (scheduler == "volcano")


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"nodes": 2}, "drop --nodes"),
        ({"overrides": ("a=1",)}, "trains nothing"),
        ({"npu_resource": "huawei.com/Ascend910"}, "takes no NPU"),
        ({"host_network": True}, "takes no NPU"),
    ],
)
def test_prepull_refuses_what_it_does_not_use(kw: dict[str, Any], said: str) -> None:
    with pytest.raises(InputError, match=said):
        prepull("a3", **kw)


@pytest.mark.docker
def test_the_prepull_container_runs_as_rendered_in_the_built_image(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """Its command, as the image's user, read-only root, no capability, no network: it starts and stays up."""
    doc = prepull("a3")
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    client = docker_env.client
    config = client.create_host_config(read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"])
    created = client.create_container(
        built["tags"][0], entrypoint=container["command"], user=user, host_config=config, network_disabled=True
    )
    try:
        client.start(created)
        time.sleep(2)
        state = client.inspect_container(created)["State"]
        assert state["Running"], f"the prepull pod would crash-loop: {client.logs(created).decode()}"
    finally:
        client.remove_container(created, force=True)
