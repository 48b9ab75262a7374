"""ascendkit doctor: preflight checks on a fake filesystem root, NPU checks against a fake torch
(no NPU exists on these machines), and for real inside an image built on the stand-in base."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buildkit.run import doctor
from buildkit.run.doctor import EXIT_FAILED, EXIT_NO_DEVICES, EXIT_OK, Environment
from tests.conftest import DockerEnv

INFO = {
    "stack": "cann8.3",
    "chip": "a3",
    "chip_name": "Ascend 910C (A3)",
    "soc_names": ["Ascend910_9391", "Ascend910_9392"],
    "atb_cxx_abi": 0,
}
HOME = "/usr/local/Ascend/ascend-toolkit/latest"
ATB = "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_0"


def image_root(tmp_path: Path, *, devices: int = 0, driver: str | None = None, pins: str | None = None) -> Path:
    root = tmp_path / "root"
    (root / "etc/ascendkit").mkdir(parents=True)
    (root / "etc/ascendkit/image.json").write_text(json.dumps(INFO))
    typer_version = metadata.version("typer")
    (root / "etc/ascendkit/constraints.txt").write_text(pins if pins is not None else f"numpy<2.0.0\ntyper=={typer_version}\n")
    for path in (HOME, ATB):
        (root / path.lstrip("/")).mkdir(parents=True)
    (root / "dev").mkdir()
    for n in range(devices):
        (root / f"dev/davinci{n}").touch()
    (root / "dev/davinci_manager").touch()
    if driver is not None:
        (root / "usr/local/Ascend/driver").mkdir(parents=True)
        (root / "usr/local/Ascend/driver/version.info").write_text(driver)
    return root


GOOD_ENV = {"ASCEND_HOME_PATH": HOME, "LD_LIBRARY_PATH": f"{HOME}/lib64:/usr/local/Ascend/driver/lib64", "ATB_HOME_PATH": ATB}


class FakeTensor:
    def __init__(self, a: Any) -> None:
        self.a = a

    def to(self, device: str) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return FakeTensor(self.a + FakeTorch.npu_error)

    def __matmul__(self, other: FakeTensor) -> FakeTensor:
        return FakeTensor(self.a @ other.a)


class FakeTorch:
    npu_error = 0.0

    class npu:  # noqa: N801 - torch's own name
        count = 2
        soc = "Ascend910_9392"

        @classmethod
        def device_count(cls) -> int:
            return cls.count

        @classmethod
        def get_device_name(cls, index: int) -> str:
            return cls.soc

    @staticmethod
    def randn(*shape: int) -> FakeTensor:
        return FakeTensor(np.random.default_rng(0).standard_normal(shape))

    @staticmethod
    def allclose(x: FakeTensor, y: FakeTensor, rtol: float, atol: float) -> bool:
        return bool(np.allclose(x.a, y.a, rtol=rtol, atol=atol))


class FakeTorchNpu:
    __version__ = "2.7.1"


@pytest.fixture(autouse=True)
def reset_fake() -> None:
    FakeTorch.npu.count, FakeTorch.npu.soc, FakeTorch.npu_error = 2, "Ascend910_9392", 0.0


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_no_devices_is_its_own_outcome(tmp_path: Path) -> None:
    code, report = doctor.run(Environment(image_root(tmp_path), GOOD_ENV))
    assert code == EXIT_NO_DEVICES == 10
    assert report["outcome"] == "no Ascend devices: preflight passed, NPU checks not run"
    assert statuses(report)["pinned packages"] == "ok" and statuses(report)["NPUs"] == "skip"


def test_missing_cann_environment_fails(tmp_path: Path) -> None:
    code, report = doctor.run(Environment(image_root(tmp_path), {}))
    assert code == EXIT_FAILED
    assert statuses(report)["ASCEND_HOME_PATH"] == "error"


def test_library_path_must_hold_the_toolkit(tmp_path: Path) -> None:
    code, report = doctor.run(Environment(image_root(tmp_path), {**GOOD_ENV, "LD_LIBRARY_PATH": "/usr/lib"}))
    assert code == EXIT_FAILED
    assert next(c["detail"] for c in report["checks"] if c["name"] == "LD_LIBRARY_PATH") == f"does not contain {HOME}/lib64"


def test_wrong_atb_abi_fails(tmp_path: Path) -> None:
    env = {**GOOD_ENV, "ATB_HOME_PATH": "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1"}
    code, report = doctor.run(Environment(image_root(tmp_path), env))
    assert code == EXIT_FAILED and "not the cxx_abi_0 build" in next(c["detail"] for c in report["checks"] if c["name"] == "ATB_HOME_PATH")


def test_pin_drift_fails(tmp_path: Path) -> None:
    root = image_root(tmp_path, pins="typer==0.0.1\nnot-installed-pkg==1.0\n")
    code, report = doctor.run(Environment(root, GOOD_ENV))
    assert code == EXIT_FAILED
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "pinned packages")
    assert "typer" in detail and "(pinned 0.0.1)" in detail and "not-installed-pkg missing (pinned 1.0)" in detail


@pytest.mark.parametrize(
    ("text", "version"), [("Version=7.6.t8.0.b050\npackage_version=25.0.rc1.1\n", "25.0.rc1.1"), ("Version=23.0.6\n", "23.0.6")]
)
def test_driver_version_prefers_package_version(tmp_path: Path, text: str, version: str) -> None:
    assert doctor.driver_version(Environment(image_root(tmp_path, driver=text))) == version


def test_npus_of_the_right_chip(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=2, driver="package_version=25.0.rc1.1\n")
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_OK and report["outcome"] == "ready" and report["devices"] == 2
    assert statuses(report)["SoC"] == "ok" and statuses(report)["matmul"] == "ok"


def test_a3_image_on_a_910b_host_is_an_error(tmp_path: Path) -> None:
    FakeTorch.npu.soc = "Ascend910B4"
    root = image_root(tmp_path, devices=1, driver="package_version=25.0.rc1.1\n")
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "SoC")
    assert detail.startswith("Ascend910B4: this image is built for Ascend 910C (A3)")


def test_wrong_matmul_and_invisible_npus(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=1, driver="package_version=25.0.rc1.1\n")
    FakeTorch.npu_error = 0.5
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and statuses(report)["matmul"] == "error"
    FakeTorch.npu_error, FakeTorch.npu.count = 0.0, 0
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and "torch_npu sees none" in next(c["detail"] for c in report["checks"] if c["name"] == "NPUs")


def test_devices_without_driver_fail(tmp_path: Path) -> None:
    code, report = doctor.run(Environment(image_root(tmp_path, devices=1), GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and statuses(report)["driver"] == "error"


def test_report_for_people(tmp_path: Path) -> None:
    _, report = doctor.run(Environment(image_root(tmp_path), GOOD_ENV))
    text = doctor.format_report(report)
    assert "skip  NPUs" in text and text.endswith("(exit 10)")


@pytest.mark.docker
def test_doctor_inside_a_built_image(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """In the image, through its entrypoint, on a machine without NPUs: the documented outcome."""
    client = docker_env.client
    container = client.create_container(built["image_id"], command=["ascendkit", "doctor", "--json"], network_disabled=True)
    try:
        client.start(container)
        code = client.wait(container, timeout=120)["StatusCode"]
        report = json.loads(client.logs(container, stdout=True, stderr=False))
    finally:
        client.remove_container(container, force=True)
    assert code == EXIT_NO_DEVICES
    assert report["outcome"].startswith("no Ascend devices")
    assert report["image"]["stack"] == "teststack" and report["image"]["chip"] == "a3"
    assert statuses(report)["pinned packages"] == "ok"  # every pin the image recorded is installed
    assert statuses(report)["ASCEND_HOME_PATH"] == "ok"  # the CANN environment reaches the process
    user = next(c for c in report["checks"] if c["name"] == "user")
    assert user["status"] == "ok" and user["detail"].startswith("HwHiAiUser (1000:1000;"), "as the image's own user, not root"
    manifest = json.loads((built["workdir"] / built["manifest"]).read_text())
    assert {"name": "ascendkit doctor (preflight)", "expected": "exit 0 or 10", "actual": "exit 10", "status": "pass"} in manifest["checks"]


def _hccn_tool(root: Path, states: dict[int, str]) -> None:
    """A stand-in for the driver's hccn_tool (no NPU here): prints each port's link as the tool does."""
    tool = root / doctor.HCCN_TOOL.lstrip("/")
    tool.parent.mkdir(parents=True, exist_ok=True)
    cases = "".join(f'  {i}) echo "link status: {s}" ;;\n' for i, s in states.items())
    tool.write_text(
        f'#!/bin/sh\n[ "$3 $4" = "-link -g" ] || exit 2\ncase "$2" in\n{cases}  *) echo "device $2 not found" >&2; exit 1 ;;\nesac\n'
    )
    tool.chmod(0o755)


def test_npu_links_up_pass_and_a_down_port_fails_a_multi_node_doctor_by_name(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=4, driver="Version=24.1.rc2\n")
    _hccn_tool(root, {0: "UP", 1: "UP", 2: "UP", 3: "UP"})
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    assert code == 0 and statuses(report)["NPU links"] == "ok"
    _hccn_tool(root, {0: "UP", 1: "DOWN", 2: "UP", 3: "UP"})
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 1 and links["status"] == "error" and links["detail"] == "NPU 1 link DOWN"
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == 0 and statuses(report)["NPU links"] == "warn", "one node: a down port is worth saying, not fatal"


def test_npu_links_without_hccn_tool_are_skipped_with_the_reason(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=2, driver="Version=24.1.rc2\n")
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 0 and links["status"] == "skip" and doctor.HCCN_TOOL in links["detail"]
    _hccn_tool(root, {0: "UP"})  # device 1 unknown to the tool
    code, report = doctor.run(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 1 and links["detail"] == "cannot read NPU 1 (device 1 not found)"
