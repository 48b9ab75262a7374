"""The image's non-root user, for real: add-user.sh on the stand-in base in each state a CANN base
can be in, and NPU device nodes opened through their group. No NPU exists here, so the device
nodes are stand-ins: character devices made with mknod (the null device's numbers, 1:3) owned as
a host's Ascend driver owns /dev/davinci* (root or HwHiAiUser, group 1000, mode 0660). The engine
passes them with --device exactly as for real NPUs; the kernel's permission check on open() is the
one an NPU node gets."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from buildkit.doctor.base import DRIVER_VERSION
from buildkit.image.probe import run_in_image
from buildkit.matrix.load import load_matrix
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.container import run_container
from buildkit.run.devices import device_groups, host_config_args, plan_devices
from buildkit.run.job import JobFacts
from buildkit.run.smoke import SmokeRequest, run_smoke
from tests.conftest import DockerEnv
from tests.harness.hosttree import contract_paths

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
ADD_USER = ROOT / "buildkit" / "image" / "files" / "add-user.sh"
SKU = load_matrix(ROOT / DEFAULT_MATRIX).matrix.skus["a3"]
OTHER_GID = 2345  # a host that gives one card another group

OPEN = r"""
import json, os
opened = {}
for path in sorted(os.listdir("/dev")):
    if path.startswith(("davinci", "devmm", "hisi")):
        try:
            os.close(os.open("/dev/" + path, os.O_RDWR))
            opened[path] = "ok"
        except OSError as exc:
            opened[path] = exc.strerror
print(json.dumps({"uid": os.getuid(), "groups": sorted(os.getgroups()), "opened": opened}))
"""


def _standin_as_root(env: DockerEnv, script: str) -> tuple[int, str]:
    """``script`` as root in the stand-in base, with add-user.sh at /add-user.sh."""
    client = env.client
    host_config = client.create_host_config(binds={str(ADD_USER): {"bind": "/add-user.sh", "mode": "ro"}})
    cid = client.create_container(env.standin, command=["bash", "-euc", script], user="root", host_config=host_config)["Id"]
    try:
        client.start(cid)
        code = int(client.wait(cid, timeout=120)["StatusCode"])
        return code, client.logs(cid).decode(errors="replace")
    finally:
        client.remove_container(cid, force=True)


ADD = "bash /add-user.sh HwHiAiUser 1000 1000 /home/HwHiAiUser /workspace"
SHOW = "getent passwd 1000; getent group 1000; stat -c '%n %u:%g %a' /home/HwHiAiUser /home/HwHiAiUser/.cache/huggingface /workspace"
WANT = [
    "HwHiAiUser:x:1000:1000::/home/HwHiAiUser:/bin/bash",
    "HwHiAiUser:x:1000:",
    "/home/HwHiAiUser 1000:1000 750",
    "/home/HwHiAiUser/.cache/huggingface 1000:1000 755",
    "/workspace 1000:1000 755",
]


@pytest.mark.parametrize(
    ("state", "before"),
    [
        ("a base without the user", ""),
        ("uid and gid 1000 taken by a distribution's user", "useradd --uid 1000 --user-group --create-home ubuntu"),
        ("the user there with other numbers", "groupadd --gid 1200 HwHiAiUser; useradd --uid 1200 --gid 1200 HwHiAiUser"),
        ("the user already right (the script run twice)", ADD),
    ],
)
def test_add_user_leaves_the_user_1000_whatever_the_base_had(docker_env: DockerEnv, state: str, before: str) -> None:
    code, out = _standin_as_root(docker_env, f"{before}\n{ADD}\n{SHOW}")
    assert code == 0, f"{state}:\n{out}"
    lines = out.strip().splitlines()
    assert lines[-5:] == WANT, f"{state}:\n{out}"
    assert "ubuntu" not in "\n".join(lines[-5:]), "the uid's old name is gone: 1000 resolves to HwHiAiUser only"


@pytest.mark.parametrize(
    ("before", "said"),
    [
        (
            "useradd --uid 1000 --user-group ubuntu; useradd --uid 1300 --user-group HwHiAiUser",
            "gid 1000 is group ubuntu and group HwHiAiUser",
        ),
        ("useradd --uid 1000 --gid users ubuntu; useradd --uid 1300 --gid users HwHiAiUser", "uid 1000 is user ubuntu and user HwHiAiUser"),
    ],
)
def test_add_user_refuses_a_base_where_both_the_name_and_the_number_are_taken(docker_env: DockerEnv, before: str, said: str) -> None:
    code, out = _standin_as_root(docker_env, f"{before}\n{ADD}")
    assert code == 1 and f"add-user: {said} exists with another" in out and "fix the base image" in out, out


def test_the_image_runs_as_its_user_and_root_is_one_flag_away(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    client, image = docker_env.client, built["tags"][0]
    assert client.inspect_image(image)["Config"]["User"] == "1000:1000"
    code, out, err = run_in_image(client, image, ["sh", "-c", "id; echo $HOME; touch $HOME/x /workspace/x && pwd"])
    assert code == 0, err
    assert out.splitlines() == ["uid=1000(HwHiAiUser) gid=1000(HwHiAiUser) groups=1000(HwHiAiUser)", "/home/HwHiAiUser", "/workspace"]
    manifest = json.loads((built["workdir"] / built["manifest"]).read_text())
    checks = {c["name"]: c for c in manifest["checks"]}
    for name in ("user in config", "user", "user can write", "user can read", "user can import"):
        assert checks[name]["status"] == "ok", checks[name]
    assert manifest["user"] == {"name": "HwHiAiUser", "uid": 1000, "gid": 1000, "home": "/home/HwHiAiUser"}
    root = run_container(  # docker run --user root: what `smoke --as-root` does
        client, image, ["sh", "-c", "id -u; python3 -c 'import json, sys; print(sys.version_info[0])'"],
        log_path=Path(built["workdir"]) / "as-root.log", deadline=time.monotonic() + 120, want_stdout=True, user="root",
    )  # fmt: skip
    assert (root.exit_code, root.stdout.split()) == (0, ["0", "3"])


def _npu_host(root: Path) -> Path:
    """Two NPUs and the control devices as device nodes, owned as a host's driver leaves them;
    davinci1 with another group. The driver files are plain stand-ins (plan_devices wants them)."""
    (root / "dev").mkdir(parents=True)
    nodes = {"/dev/davinci0": 1000, "/dev/davinci1": OTHER_GID, **dict.fromkeys(contract_paths("a3", "required", devices=True), 1000)}
    for path, gid in nodes.items():
        node = root / path.lstrip("/")
        os.mknod(node, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
        os.chown(node, 0, gid)
        node.chmod(0o660)
    (root / "usr/local/Ascend/driver/lib64").mkdir(parents=True)
    (root / DRIVER_VERSION.lstrip("/")).write_text("Version=25.2.0\n")
    return root


def test_the_images_user_opens_the_npu_nodes_through_their_groups(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    host = _npu_host(tmp_path / "host")
    plan = plan_devices("a3", SKU, [0, 1], host_root=host)
    groups, notes = device_groups(plan, 1000, 1000)
    assert (groups, notes) == ((OTHER_GID,), ()), "read from the nodes: the user's own group opens the rest"

    def opened(**config: Any) -> dict[str, Any]:
        result = run_container(
            docker_env.client, built["tags"][0], ["python3", "-c", OPEN],
            log_path=tmp_path / "open.log", deadline=time.monotonic() + 120, want_stdout=True, **config,
        )  # fmt: skip
        assert result.exit_code == 0, (tmp_path / "open.log").read_text()
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    every = {"davinci0": "ok", "davinci1": "ok", "davinci_manager": "ok", "devmm_svm": "ok", "hisi_hdc": "ok"}
    with_groups = opened(host_config=host_config_args(plan, {}, privileged=False, groups=groups))
    assert with_groups == {"uid": 1000, "groups": [1000, OTHER_GID], "opened": every}
    # the control: without the group, the card of the other group is refused to the same user
    without = opened(host_config=host_config_args(plan, {}, privileged=False))
    assert without["uid"] == 1000 and without["opened"] == {**every, "davinci1": "Permission denied"}
    as_root = opened(host_config=host_config_args(plan, {}, privileged=False), user="root")
    assert as_root["uid"] == 0 and as_root["opened"] == every


def test_smoke_gives_its_containers_the_device_groups_and_doctor_judges_access(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """The smoke path users run, on the stand-in host: doctor runs in the image as its user with
    the host's nodes, and finds every one open; then, lacking torch_npu's NPUs, it fails there."""
    host = _npu_host(tmp_path / "host")
    (tmp_path / "model").mkdir()
    request = SmokeRequest(
        sku_id="a3", sku=SKU, chip_id="a3", image=built["tags"][0], out=tmp_path / "out", model_path=tmp_path / "model",
        visible=[0, 1], host_root=host, facts=JobFacts.of(load_matrix(ROOT / DEFAULT_MATRIX).matrix.compat),
        config_check=False, timeout=300,
    )  # fmt: skip
    report = run_smoke(docker_env.client, request)
    assert report.data["settings"]["user"] == "HwHiAiUser (1000:1000)" and report.data["settings"]["device_groups"] == [OTHER_GID]
    checks = {c["name"]: c for c in report.data["doctor"]["checks"]}
    assert checks["user"]["status"] == "ok" and checks["user"]["detail"].startswith("HwHiAiUser (1000:1000; groups 1000,2345)")
    assert checks["device access"] == {"name": "device access", "status": "ok", "detail": "5 device nodes open for reading and writing"}
    # the host's driver (25.2.0) judged in the image against its CANN (the test matrix: 8.3.RC1 on 25.2.X, 25.3.RC1)
    assert checks["driver"] == {
        "name": "driver",
        "status": "ok",
        "detail": "driver 25.2.0 is supported by CANN 8.3.RC1 (Ascend HDK 25.2.X, 25.3.RC1)",
    }
    assert report.outcome == "failed" and "doctor failed" in report.message, "no torch_npu NPUs behind stand-in nodes"
    assert (tmp_path / "out" / "data").stat().st_uid == 1000


def test_smoke_shows_an_old_host_driver_judged_against_the_images_cann(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """The verdict the k8s init containers give too: the same doctor in the same image, the same driver file."""
    host = _npu_host(tmp_path / "host")
    (host / DRIVER_VERSION.lstrip("/")).write_text("Version=24.1.0\n")
    (tmp_path / "model").mkdir()
    request = SmokeRequest(
        sku_id="a3", sku=SKU, chip_id="a3", image=built["tags"][0], out=tmp_path / "out", model_path=tmp_path / "model",
        visible=[0], host_root=host, facts=JobFacts.of(load_matrix(ROOT / DEFAULT_MATRIX).matrix.compat),
        config_check=False, timeout=300,
    )  # fmt: skip
    report = run_smoke(docker_env.client, request)
    driver = next(c for c in report.data["doctor"]["checks"] if c["name"] == "driver")
    assert driver["status"] == "error" and driver["detail"].startswith(
        "driver 24.1.0 is older than CANN 8.3.RC1 supports (Ascend HDK 25.2.X, 25.3.RC1): upgrade the host's driver"
    )
    assert report.outcome == "failed" and "doctor failed in the image" in report.message
    assert "| driver | error | driver 24.1.0 is older than CANN 8.3.RC1 supports" in (tmp_path / "out" / "report.md").read_text()
