"""Multi-node Ray, executed: three Ray nodes as containers of the OpenRLHF-shaped test image (it
carries the real Ray 2.43.0 of the fork's requirements-npu.txt) on a Docker network of their own.

Each container is started with exactly what the rendered manifest gives its pod: the image, its
``command``/``args``, its environment. What a cluster would add is reproduced, and named:

- **Volcano Job** (``--scheduler volcano --no-kuberay``): the ``svc`` plugin's stable host names
  (hostname ``<job>-<task>-<i>``, resolvable as ``<job>-<task>-<i>.<job>``) and its
  ``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM`` variables, the ``env`` plugin's ``VC_TASK_INDEX``.
- **KubeRay RayJob**: the ``ray start`` line KubeRay v1.7.0 generates from ``rayStartParams`` and
  the container's limits (``generateRayStartCommand`` / ``setMissingRayStartParams`` /
  ``convertParamMap`` of ray-operator/controllers/ray/common/pod.go at v1.7.0, restated below), run
  as KubeRay runs it (``/bin/bash -lc -- "ulimit ...; ray start ..."``). The job submitter's
  ``ray job submit`` needs Ray's dashboard (``ray[default]``), which the image does not carry, so
  the entrypoint runs on the head as the driver that submission would start.

Left out, because nothing here has them: the NPUs (Ray's ``NPU`` resource is a custom resource,
which Ray counts without any device), the driver's hostPath mounts, the doctor init container
(it needs /dev/davinci*), the downward API's pod IP (``HCCL_IF_IP``, unused by Ray) and host
networking (each pod gets its own address, as on the pod network).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import TEST_MATRIX, DockerEnv

pytestmark = pytest.mark.docker
NODES = 3
NPUS = 16  # a2-box16's NPUs per node: the NPU resource each node must register
STACK = "teststack-openrlhf"
# The job's command (--job train): the driver connects to the cluster, prints what it sees, holds
# for argv[1] seconds and exits with argv[2], so the exit code's way out can be followed.
PROBE = (
    "import json, sys, time, ray\n"
    "ray.init(address='auto', logging_level='ERROR')\n"
    "alive = [n for n in ray.nodes() if n['Alive']]\n"
    "print('ASCENDKIT-PROBE ' + json.dumps({'nodes': len(alive), 'npus': sorted(n['Resources'].get('NPU', 0) for n in alive),"
    " 'cpus': sorted(n['Resources'].get('CPU', 0) for n in alive)}), flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
    "sys.exit(int(sys.argv[2]))\n"
)
ALIVE = "import ray; ray.init(address='auto', logging_level='ERROR'); print('ASCENDKIT-ALIVE', sum(1 for n in ray.nodes() if n['Alive']))"


@pytest.fixture(scope="module")
def image(docker_env: DockerEnv, openrlhf_built: dict[str, Any]) -> str:
    ref = f"{docker_env.registry}/{openrlhf_built['repo']}@{openrlhf_built['digest']}"
    docker_env.client.pull(ref)  # as a node would: the pushed digest, from the registry
    return ref


def render(env: DockerEnv, image: str, tmp_path: Path, *options: str, hold: float, code: int) -> dict[str, Any]:
    """The job object `ascendkit k8s render` writes for three a2-box16 nodes, running PROBE."""
    out = tmp_path / f"job-{uuid.uuid4().hex[:6]}.yaml"
    proc = env.ascendkit(
        "k8s", "render", "--matrix", str(TEST_MATRIX), "--hw", "a2-box16", "--image", image, "--stack", STACK,
        "--nodes", str(NODES), *options, "--job", "train", "-o", str(out), "--", "python3", "-c", PROBE, str(hold), str(code),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert env.ascendkit("k8s", "validate", str(out), cwd=tmp_path).returncode == 0
    (job,) = [d for d in yaml.safe_load_all(out.read_text()) if d and d["kind"] in ("Job", "RayJob")]
    return dict(job)


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment; values from the downward API (the pod's IP) have no pod here."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def locked_down(pod: dict[str, Any], container: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The pod's and the container's securityContext as the engine's options (user, groups, no new
    privileges, no capability, read-only root) with each emptyDir it mounts as a tmpfs (mode 0777
    and group fsGroup, as the kubelet makes them): the pods run as locked down as rendered."""
    pod_security, security = pod["securityContext"], container["securityContext"]
    assert pod_security["runAsNonRoot"] and security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    empty = {v["name"] for v in pod["volumes"] if v.get("emptyDir") is not None and v["name"] != "dshm"}
    tmpfs = {m["mountPath"]: f"mode=0777,gid={pod_security['fsGroup']}" for m in container["volumeMounts"] if m["name"] in empty}
    return f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}", {
        "group_add": [str(g) for g in pod_security["supplementalGroups"]],
        "cap_drop": security["capabilities"]["drop"],
        "security_opt": ["no-new-privileges"],
        "read_only": security["readOnlyRootFilesystem"],
        "tmpfs": tmpfs,
    }


@dataclass
class Cluster:
    """Containers on a network of their own, removed with it at the end."""

    env: DockerEnv
    network: str = field(default_factory=lambda: f"ak-ray-{uuid.uuid4().hex[:8]}")
    ids: dict[str, str] = field(default_factory=dict)

    def start(
        self,
        name: str,
        image: str,
        *,
        args: list[str],
        command: list[str] | None,
        env: dict[str, str],
        aliases: list[str],
        pod: dict[str, Any],
        container: dict[str, Any],
    ) -> str:
        client = self.env.client
        user, locked = locked_down(pod, container)
        host_config = client.create_host_config(shm_size="1g", network_mode=self.network, **locked)
        endpoints = {self.network: client.create_endpoint_config(aliases=aliases)}
        networking = client.create_networking_config(endpoints)  # type: ignore[arg-type]  # docker-py's stubs: one per network, as here
        cid: str = client.create_container(
            image, command=args, entrypoint=command, environment=env, hostname=name, name=f"{self.network}-{name}",
            host_config=host_config, networking_config=networking, user=user,
        )["Id"]  # fmt: skip
        self.ids[name] = cid
        client.start(cid)
        return cid

    def logs(self, name: str) -> str:
        return str(self.env.client.logs(self.ids[name], stdout=True, stderr=True).decode(errors="replace"))

    def wait_log(self, name: str, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logs = self.logs(name)
            if text in logs:
                return logs
            if not self.running(name):
                break
            time.sleep(1)
        pytest.fail(f"{name}: no {text!r} within {timeout:.0f} s; its log:\n{self.logs(name)[-3000:]}")

    def running(self, name: str) -> bool:
        return bool(self.env.client.inspect_container(self.ids[name])["State"]["Running"])

    def exit_code(self, name: str, timeout: int) -> int:
        result = self.env.client.wait(self.ids[name], timeout=timeout)
        return int(result["StatusCode"])

    def alive(self, name: str) -> int:
        """Ray nodes alive, as the cluster on ``name`` sees them (-1: it cannot be asked yet)."""
        client = self.env.client
        exec_id = client.exec_create(self.ids[name], ["python3", "-c", ALIVE])["Id"]
        found = re.search(r"ASCENDKIT-ALIVE (\d+)", client.exec_start(exec_id).decode(errors="replace"))
        return int(found[1]) if found else -1


@pytest.fixture
def cluster(docker_env: DockerEnv) -> Iterator[Cluster]:
    docker_env.client.create_network((made := Cluster(docker_env)).network, driver="bridge")
    try:
        yield made
    finally:
        for cid in made.ids.values():
            docker_env.client.remove_container(cid, force=True)
        docker_env.client.remove_network(made.network)


# ---- Volcano Job: the head and worker scripts of buildkit/k8s/files -------------------------------------


def start_volcano(cluster: Cluster, job: dict[str, Any], *, workers: int | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Every pod of the Volcano Job's tasks (or only ``workers`` of its workers), as Volcano's svc and
    env plugins would start them; returns their names, head first."""
    name = job["metadata"]["name"]
    assert set(job["spec"]["plugins"]) == {"svc", "env"}, "the plugins reproduced here"
    tasks = {t["name"]: t for t in job["spec"]["tasks"]}
    hosts = {t: [f"{name}-{t}-{i}.{name}" for i in range(task["replicas"])] for t, task in tasks.items()}
    svc = {f"VC_{t.upper().replace('-', '_')}_HOSTS": ",".join(h) for t, h in hosts.items()}
    svc |= {f"VC_{t.upper().replace('-', '_')}_NUM": str(len(h)) for t, h in hosts.items()}
    started = []
    for task_name in ("head", "worker"):
        task = tasks[task_name]
        replicas = task["replicas"] if task_name == "head" or workers is None else workers
        (container,) = task["template"]["spec"]["containers"]
        for index in range(replicas):
            pod = f"{name}-{task_name}-{index}"
            cluster.start(
                pod, container["image"],
                args=container["args"], command=container.get("command"),
                env={**plain_env(container), **svc, "VC_TASK_INDEX": str(index), "VK_TASK_INDEX": str(index), **(env or {})},
                aliases=[f"{pod}.{name}"], pod=task["template"]["spec"], container=container,
            )  # fmt: skip
            started.append(pod)
    return started


def probe(logs: str) -> dict[str, Any]:
    match = re.search(r"ASCENDKIT-PROBE (\{.*\})", logs)
    assert match, logs[-2000:]
    found: dict[str, Any] = json.loads(match[1])
    return found


def test_volcano_job_joins_every_node_then_runs_the_job_and_everyone_exits(
    docker_env: DockerEnv, image: str, cluster: Cluster, tmp_path: Path
) -> None:
    job = render(docker_env, image, tmp_path, "--scheduler", "volcano", "--no-kuberay", hold=0, code=3)
    head, *workers = start_volcano(cluster, job)
    assert len(workers) == NODES - 1
    assert cluster.exit_code(head, timeout=240) == 3, "the head exits with the job's own code\n" + cluster.logs(head)[-3000:]
    logs = cluster.logs(head)
    joined = f"ascendkit: {NODES} Ray nodes with {NODES * NPUS} NPUs joined; starting the job"
    assert joined in logs
    assert logs.index(joined) < logs.index("ASCENDKIT-PROBE"), "the job started only after every node had joined"
    seen = probe(logs)
    assert seen["nodes"] == NODES and seen["npus"] == [NPUS] * NODES, "every node registered the SKU's NPUs"
    cpus = int(plain_env(job["spec"]["tasks"][0]["template"]["spec"]["containers"][0])["ASCENDKIT_RAY_CPUS"])
    assert seen["cpus"] == [cpus] * NODES
    for worker in workers:
        assert "ascendkit: joined the Ray head at" in cluster.logs(worker)
        assert cluster.exit_code(worker, timeout=120) == 0, cluster.logs(worker)[-2000:]
        assert "is gone; this worker is done" in cluster.logs(worker)


def test_volcano_head_gives_up_on_a_worker_that_never_comes(docker_env: DockerEnv, image: str, cluster: Cluster, tmp_path: Path) -> None:
    """One worker of two started; the join timeout shortened from the rendered 1200 s (the one change)."""
    job = render(docker_env, image, tmp_path, "--scheduler", "volcano", "--no-kuberay", hold=0, code=0)
    head, *_ = start_volcano(cluster, job, workers=1, env={"ASCENDKIT_RAY_JOIN_TIMEOUT": "25"})
    code = cluster.exit_code(head, timeout=180)
    logs = cluster.logs(head)
    assert code != 0, logs[-2000:]
    assert f"ascendkit: only {NODES - 1} of {NODES} Ray nodes joined in time; is a worker pod pending or failing?" in logs
    assert "ASCENDKIT-PROBE" not in logs, "the job never started"


def test_volcano_workers_exit_when_the_head_is_killed_mid_job(docker_env: DockerEnv, image: str, cluster: Cluster, tmp_path: Path) -> None:
    job = render(docker_env, image, tmp_path, "--scheduler", "volcano", "--no-kuberay", hold=600, code=0)
    head, *workers = start_volcano(cluster, job)
    cluster.wait_log(head, "ASCENDKIT-PROBE", timeout=240)
    docker_env.client.kill(cluster.ids[head])
    for worker in workers:
        assert cluster.exit_code(worker, timeout=120) == 0, cluster.logs(worker)[-2000:]
        assert "is gone; this worker is done" in cluster.logs(worker)


def test_volcano_a_restarted_worker_joins_again(docker_env: DockerEnv, image: str, cluster: Cluster, tmp_path: Path) -> None:
    """A worker pod restarted mid-job (its container started again, same name) runs its script again
    and joins: the cluster is back to every node."""
    job = render(docker_env, image, tmp_path, "--scheduler", "volcano", "--no-kuberay", hold=600, code=0)
    head, first, _ = start_volcano(cluster, job)
    cluster.wait_log(head, "ASCENDKIT-PROBE", timeout=240)
    assert cluster.alive(head) == NODES
    docker_env.client.restart(cluster.ids[first], timeout=5)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if cluster.logs(first).count("ascendkit: joined the Ray head at") >= 2 and cluster.alive(head) == NODES:
            break
        time.sleep(3)
    else:
        pytest.fail(f"the restarted worker did not join again; its log:\n{cluster.logs(first)[-3000:]}")
    assert cluster.running(head), "the job went on"


# ---- KubeRay RayJob: rayStartParams as KubeRay v1.7.0 passes them to `ray start` -------------------------


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _quantity(text: str) -> int:
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", str(text))
    assert match, text
    return int(match[1]) * _UNITS.get(match[2], 1)


def kuberay_args(node_type: str, params: dict[str, str], limits: dict[str, Any], head_fqdn: str) -> str:
    """What KubeRay v1.7.0 puts in the Ray container's args (its command being /bin/bash -lc --)."""
    p = dict(params)
    if node_type == "worker":
        p.setdefault("address", f"{head_fqdn}:6379")
    else:
        p.setdefault("dashboard-host", "0.0.0.0")
    p.setdefault("metrics-export-port", "8080")
    p["block"] = "true"
    p.setdefault("dashboard-agent-listen-port", "52365")
    if "num-cpus" not in p and "cpu" in limits:
        p["num-cpus"] = str(_quantity(limits["cpu"]))
    if "memory" not in p and "memory" in limits:
        p["memory"] = str(_quantity(limits["memory"]))
    flags = "".join(f" --{k} " if v.lower() == "true" else f" --{k}={v} " for k, v in sorted(p.items()) if v.lower() != "false")
    start = f"ray start --head {flags}" if node_type == "head" else f"ray start {flags}"
    return f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"


def test_kuberay_start_params_join_every_node_with_its_npus(docker_env: DockerEnv, image: str, cluster: Cluster, tmp_path: Path) -> None:
    job = render(docker_env, image, tmp_path, hold=0, code=0)
    spec = job["spec"]["rayClusterSpec"]
    head_group, (worker_group,) = spec["headGroupSpec"], spec["workerGroupSpecs"]
    assert worker_group["replicas"] == NODES - 1
    head_fqdn = f"{job['metadata']['name']}-head-svc"
    kuberay_env = {"RAY_USAGE_STATS_KUBERAY_IN_USE": "1", "RAY_ADDRESS": f"{head_fqdn}:6379"}
    groups = [("head", head_group, 1), ("worker", worker_group, worker_group["replicas"])]
    names = []
    for node_type, group, replicas in groups:
        (container,) = [c for c in group["template"]["spec"]["containers"] if c["name"].startswith("ray-")]
        assert "command" not in container and "args" not in container, "KubeRay generates them"
        args = kuberay_args(node_type, group["rayStartParams"], container["resources"].get("limits", {}), head_fqdn)
        for index in range(replicas):
            pod = f"{node_type}-{index}"
            aliases = [head_fqdn] if node_type == "head" else []
            cluster.start(
                pod, container["image"], args=[args], command=["/bin/bash", "-lc", "--"],
                env={**plain_env(container), **kuberay_env}, aliases=aliases,
                pod=group["template"]["spec"], container=container,
            )  # fmt: skip
            names.append(pod)
    deadline = time.monotonic() + 240
    while cluster.running("head-0") and time.monotonic() < deadline:
        if cluster.alive("head-0") == NODES:
            break
        time.sleep(3)
    else:
        pytest.fail(f"not every node joined; the head's log:\n{cluster.logs('head-0')[-3000:]}")
    # the job submitter's part: the RayJob's entrypoint as the driver, on the head
    client = docker_env.client
    exec_id = client.exec_create(cluster.ids["head-0"], ["/bin/bash", "-lc", job["spec"]["entrypoint"]])["Id"]
    output = client.exec_start(exec_id).decode(errors="replace")
    assert client.exec_inspect(exec_id)["ExitCode"] == 0, output[-3000:]
    seen = probe(output)
    assert seen["nodes"] == NODES and seen["npus"] == [NPUS] * NODES, "rayStartParams' resources: each node's NPUs"
    assert all(cluster.running(n) for n in names), "--block keeps every ray start in the foreground"
