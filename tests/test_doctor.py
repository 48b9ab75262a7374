"""ascendkit doctor: preflight checks on a fake filesystem root, NPU checks against a fake torch
(no NPU exists on these machines), and for real inside an image built on the stand-in base."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from buildkit.doctor.base import (
    EXIT_FAILED,
    EXIT_NO_DEVICES,
    EXIT_OK,
    FIRMWARE_VERSION,
    HCCN_TOOL,
    NODE_ENV,
    RUNTIME_ENV,
    Check,
    Environment,
    devices,
)
from buildkit.doctor.codes import error_codes, explain
from buildkit.doctor.engine import engine_from, engine_of_runtime, judge_engine
from buildkit.doctor.host import check_hccn, driver_version, zstd_verdict
from buildkit.doctor.report import format_report
from buildkit.doctor.report import run as run_doctor
from buildkit.image.render import CONTEXT_FILES, context_file, context_paths
from buildkit.matrix.load import LoadedMatrix
from tests.conftest import ROOT, DockerEnv

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


def _reset_fake() -> None:
    FakeTorch.npu.count, FakeTorch.npu.soc, FakeTorch.npu_error = 2, "Ascend910_9392", 0.0


@pytest.fixture(autouse=True)
def reset_fake() -> Iterator[None]:
    """The fakes as every test here expects them, and as this module's importers (test_preflight) find
    them after it, whichever test of this module ran last in their process."""
    _reset_fake()
    yield
    _reset_fake()


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_no_devices_is_its_own_outcome(tmp_path: Path) -> None:
    code, report = run_doctor(Environment(image_root(tmp_path), GOOD_ENV))
    assert code == EXIT_NO_DEVICES == 10
    assert report["outcome"] == "no Ascend devices: preflight passed, NPU checks not run"
    assert statuses(report)["pinned packages"] == "ok" and statuses(report)["NPUs"] == "skip"


def test_missing_cann_environment_fails(tmp_path: Path) -> None:
    code, report = run_doctor(Environment(image_root(tmp_path), {}))
    assert code == EXIT_FAILED
    assert statuses(report)["ASCEND_HOME_PATH"] == "error"


def test_library_path_must_hold_the_toolkit(tmp_path: Path) -> None:
    code, report = run_doctor(Environment(image_root(tmp_path), {**GOOD_ENV, "LD_LIBRARY_PATH": "/usr/lib"}))
    assert code == EXIT_FAILED
    assert next(c["detail"] for c in report["checks"] if c["name"] == "LD_LIBRARY_PATH") == f"does not contain {HOME}/lib64"


def test_wrong_atb_abi_fails(tmp_path: Path) -> None:
    env = {**GOOD_ENV, "ATB_HOME_PATH": "/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1"}
    code, report = run_doctor(Environment(image_root(tmp_path), env))
    assert code == EXIT_FAILED and "not the cxx_abi_0 build" in next(c["detail"] for c in report["checks"] if c["name"] == "ATB_HOME_PATH")


def test_pin_drift_fails(tmp_path: Path) -> None:
    root = image_root(tmp_path, pins="typer==0.0.1\nnot-installed-pkg==1.0\n")
    code, report = run_doctor(Environment(root, GOOD_ENV))
    assert code == EXIT_FAILED
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "pinned packages")
    assert "typer" in detail and "(pinned 0.0.1)" in detail and "not-installed-pkg missing (pinned 1.0)" in detail


@pytest.mark.parametrize(
    ("text", "version"), [("Version=7.6.t8.0.b050\npackage_version=25.0.rc1.1\n", "25.0.rc1.1"), ("Version=23.0.6\n", "23.0.6")]
)
def test_driver_version_prefers_package_version(tmp_path: Path, text: str, version: str) -> None:
    assert driver_version(Environment(image_root(tmp_path, driver=text))) == version


def test_npus_of_the_right_chip(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=2, driver="package_version=25.0.rc1.1\n")
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_OK and report["outcome"] == "ready" and report["devices"] == 2
    assert statuses(report)["SoC"] == "ok" and statuses(report)["matmul"] == "ok"


def test_a3_image_on_a_910b_host_is_an_error(tmp_path: Path) -> None:
    FakeTorch.npu.soc = "Ascend910B4"
    root = image_root(tmp_path, devices=1, driver="package_version=25.0.rc1.1\n")
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "SoC")
    assert detail.startswith("Ascend910B4: this image is built for Ascend 910C (A3)")


def test_wrong_matmul_and_invisible_npus(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=1, driver="package_version=25.0.rc1.1\n")
    FakeTorch.npu_error = 0.5
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and statuses(report)["matmul"] == "error"
    FakeTorch.npu_error, FakeTorch.npu.count = 0.0, 0
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and "torch_npu sees none" in next(c["detail"] for c in report["checks"] if c["name"] == "NPUs")


def test_devices_without_driver_fail(tmp_path: Path) -> None:
    code, report = run_doctor(Environment(image_root(tmp_path, devices=1), GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == EXIT_FAILED and statuses(report)["driver"] == "error"


def test_report_for_people(tmp_path: Path) -> None:
    _, report = run_doctor(Environment(image_root(tmp_path), GOOD_ENV))
    text = format_report(report)
    assert "skip  NPUs" in text and text.endswith("(exit 10)")


def test_the_package_runs_as_a_bare_directory_as_images_carry_it(tmp_path: Path) -> None:
    """Inside an image doctor is a directory of modules with no ascendkit installed: a copy of exactly
    what the build context sends, run with no site-packages (so no buildkit and no third-party
    package can be imported), reports and exits as on a host with no NPUs."""
    for relative in context_paths():
        if relative.startswith(CONTEXT_FILES["doctor"]):
            target = tmp_path / "lib" / "doctor" / relative.removeprefix(CONTEXT_FILES["doctor"])
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / relative, target)
    assert sorted(p.name for p in (tmp_path / "lib" / "doctor").iterdir()) == sorted(
        p.name for p in context_file("doctor").iterdir() if p.suffix in (".py", ".json")
    )
    env = {"PATH": os.environ["PATH"], RUNTIME_ENV: "containerd://1.7.2"}
    argv = [sys.executable, "-I", "-S", str(tmp_path / "lib" / "doctor"), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, check=False)
    assert proc.returncode in (EXIT_NO_DEVICES, EXIT_FAILED), proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode and "Traceback" not in proc.stderr
    assert {"name": "zstd pulls", "status": "ok"}.items() <= next(c for c in report["checks"] if c["name"] == "zstd pulls").items()
    assert explain("EI0006") and error_codes()  # the table travels inside the package, where codes.py looks


@pytest.mark.docker
def test_doctor_inside_a_built_image(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """In the image, through its entrypoint, on a machine without NPUs: the documented outcome."""
    client = docker_env.client
    container = client.create_container(built["tags"][0], command=["ascendkit", "doctor", "--json"], network_disabled=True)
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
    preflight = {
        "name": "ascendkit doctor (preflight)",
        "status": "ok",
        "detail": "exit 10",
        "expected": "exit 0 or 10",
        "actual": "exit 10",
    }
    assert preflight in manifest["checks"]


def _hccn_tool(root: Path, states: dict[int, str], ips: dict[int, str] | None = None) -> None:
    """A stand-in for the driver's hccn_tool (no NPU here): prints each port's link (`-link -g`) and,
    given ``ips``, its address (`-ip -g`) as the tool does; any other port or query fails."""
    tool = root / HCCN_TOOL.lstrip("/")
    tool.parent.mkdir(parents=True, exist_ok=True)
    answers = {i: f'echo "link status: {s}"' for i, s in states.items()}
    addresses = {i: f'printf "ipaddr:{ip}\\nnetmask:255.255.255.0\\n"' for i, ip in (ips or {}).items()}
    cases = "".join(f'  "{i} -link -g") {a} ;;\n' for i, a in answers.items())
    cases += "".join(f'  "{i} -ip -g") {a} ;;\n' for i, a in addresses.items())
    tool.write_text(f'#!/bin/sh\ncase "$2 $3 $4" in\n{cases}  *) echo "device $2 not found" >&2; exit 1 ;;\nesac\n')
    tool.chmod(0o755)


def test_npu_links_up_pass_and_a_down_port_fails_a_multi_node_doctor_by_name(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=4, driver="Version=24.1.rc2\n")
    _hccn_tool(root, {0: "UP", 1: "UP", 2: "UP", 3: "UP"})
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    assert code == 0 and statuses(report)["NPU links"] == "ok"
    _hccn_tool(root, {0: "UP", 1: "DOWN", 2: "UP", 3: "UP"})
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 1 and links["status"] == "error" and links["detail"] == "NPU 1 link DOWN"
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert code == 0 and statuses(report)["NPU links"] == "warn", "one node: a down port is worth saying, not fatal"


def test_npu_links_without_hccn_tool_are_skipped_with_the_reason(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=2, driver="Version=24.1.rc2\n")
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 0 and links["status"] == "skip" and HCCN_TOOL in links["detail"]
    _hccn_tool(root, {0: "UP"})  # device 1 unknown to the tool
    code, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu), links=True)
    (links,) = [c for c in report["checks"] if c["name"] == "NPU links"]
    assert code == 1 and links["detail"] == "cannot read NPU 1 (device 1 not found)"


# ---------------------------------------------------------------------------------------------
# The host's driver judged against the image's CANN (the matrix's compat.cann_drivers, in image.json)

DRIVERS = {"hdk": ["25.2.X", "25.3.RC1"], "source": "stand-in"}


def judged(tmp_path: Path, driver: str, devices: int = 1, **extra: Any) -> tuple[int, dict[str, Any]]:
    root = image_root(tmp_path, devices=devices, driver=driver)
    (root / "etc/ascendkit/image.json").write_text(json.dumps({**INFO, "cann": "8.3.RC1", "drivers": DRIVERS, **extra}))
    return run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))


@pytest.mark.parametrize(
    ("text", "status", "words"),
    [
        # the older format: the release in Version= alone
        ("Version=24.1.0\n", "error", ["driver 24.1.0 is older than CANN 8.3.RC1 supports (Ascend HDK 25.2.X, 25.3.RC1)", "upgrade"]),
        ("Version=23.0.6\n", "error", ["driver 23.0.6 is older"]),
        # the newer format: package_version= is the release, Version= an internal number; rc in lower case
        ("Version=7.6.t8.0.b050\npackage_version=25.3.rc1\n", "ok", ["driver 25.3.rc1 is supported by CANN 8.3.RC1"]),
        ("Version=7.6.t8.0.b050\npackage_version=25.3.rc1.1\n", "ok", ["25.3.rc1.1 is supported"]),  # a patch of a listed release
        ("package_version=25.2.1\n", "ok", ["25.2.1 is supported"]),  # any release of a listed line (25.2.X)
        (
            "package_version=26.0.rc1\n",
            "warn",
            ["driver 26.0.rc1 is newer than every Ascend HDK release(s) CANN 8.3.RC1", "25.2.X, 25.3.RC1"],
        ),
        ("package_version=25.3.0\n", "warn", ["driver 25.3.0 is newer than every"]),  # the final after the listed RC
        ("package_version=not-a-release\n", "warn", ["not a version this image can judge"]),
    ],
)
def test_the_driver_is_judged_against_the_images_cann(tmp_path: Path, text: str, status: str, words: list[str]) -> None:
    code, report = judged(tmp_path, text)
    (driver,) = [c for c in report["checks"] if c["name"] == "driver"]
    assert driver["status"] == status and all(w in driver["detail"] for w in words), driver
    assert code == (EXIT_FAILED if status == "error" else EXIT_OK)


def test_a_driver_between_listed_releases_warns(tmp_path: Path) -> None:
    _, report = judged(tmp_path, "package_version=25.0.rc1\n", drivers={"hdk": ["24.1.0", "25.2.0"], "source": "s"})
    (driver,) = [c for c in report["checks"] if c["name"] == "driver"]
    assert driver["status"] == "warn" and "25.0.rc1 is not one of the Ascend HDK release(s)" in driver["detail"]


# CANN 9.2.0 as the matrix records it: only the paired release is known, and its notes drop two lines.
DROPPING = {"hdk": ["26.2.RC1"], "complete": False, "refused": ["25.0.X", "25.2.X"], "source": "stand-in"}


@pytest.mark.parametrize(
    ("text", "status", "words"),
    [
        # a refused line fails although the list is only the paired release (which alone would only warn)
        ("package_version=25.2.1\n", "error", ["driver 25.2.1: CANN 9.2.0 no longer supports Ascend HDK 25.2.X", "upgrade"]),
        ("Version=25.0.RC1.1\n", "error", ["CANN 9.2.0 no longer supports Ascend HDK 25.0.X"]),  # a patch of a dropped line
        # older than the paired release but in no refused line: unconfirmed, a warning
        ("package_version=25.5.0\n", "warn", ["older than Ascend HDK 26.2.RC1, the release paired with CANN 9.2.0"]),
        ("package_version=26.2.rc1\n", "ok", ["driver 26.2.rc1 is supported by CANN 9.2.0"]),
    ],
)
def test_a_driver_line_the_canns_notes_drop_fails_doctor(tmp_path: Path, text: str, status: str, words: list[str]) -> None:
    code, report = judged(tmp_path, text, cann="9.2.0", drivers=DROPPING)
    (driver,) = [c for c in report["checks"] if c["name"] == "driver"]
    assert driver["status"] == status and all(w in driver["detail"] for w in words), driver
    assert code == (EXIT_FAILED if status == "error" else EXIT_OK)


def test_the_matrix_cann_9_2_drops_the_drivers_its_notes_name(loaded: LoadedMatrix, tmp_path: Path) -> None:
    """The real matrix's entries, as image.json carries them, judged by doctor: 9.2.0 refuses 25.2.X, 9.1.0 takes it."""
    table = loaded.matrix.compat.cann_drivers
    assert "refused" not in table["8.5.0"].as_image_info(), "an entry with nothing refused keeps image.json's bytes"
    for cann, driver, status in (("9.2.0", "25.2.0", "error"), ("9.1.0", "25.2.0", "ok"), ("9.1.0", "25.0.RC1", "error")):
        root = tmp_path / f"{cann}-{driver}"
        _, report = judged(root, f"package_version={driver}\n", cann=cann, drivers=table[cann].as_image_info())
        assert statuses(report)["driver"] == status, (cann, driver, report["checks"])


def test_an_old_driver_fails_doctor_even_where_no_npu_is_visible(tmp_path: Path) -> None:
    code, report = judged(tmp_path, "Version=24.1.0\n", devices=0)
    assert code == EXIT_FAILED and statuses(report)["driver"] == "error" and statuses(report)["NPUs"] == "skip"


@pytest.mark.parametrize(
    ("firmware", "status", "words"),
    [
        ("Version=7.5.0.1.129\n", "ok", "firmware 7.5.0.1.129 within the driver's 7.0.0..7.5.99"),
        ("Version=7.7.0.2.10\n", "error", "firmware 7.7.0.2.10 is outside 7.0.0..7.5.99"),
        (None, "skip", FIRMWARE_VERSION),
    ],
)
def test_the_firmware_is_judged_against_the_drivers_range(tmp_path: Path, firmware: str | None, status: str, words: str) -> None:
    root = image_root(tmp_path, devices=1, driver="package_version=25.3.rc1\ncompatible_version_fw=[7.0.0,7.5.99]\n")
    if firmware is not None:
        path = root / FIRMWARE_VERSION.lstrip("/")
        path.parent.mkdir(parents=True)
        path.write_text(firmware)
    _, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    (check,) = [c for c in report["checks"] if c["name"] == "firmware"]
    assert check["status"] == status and words in check["detail"]


def _hccn_ips(root: Path, ips: dict[int, str], conf: str | None) -> None:
    """The stand-in hccn_tool answering `-ip -g` for ``ips``, and the host's hccn.conf."""
    _hccn_tool(root, {}, ips)
    if conf is not None:
        (root / "etc/hccn.conf").write_text(conf)


def test_hccn_conf_addresses_are_compared_with_the_ports(tmp_path: Path) -> None:
    root = image_root(tmp_path, devices=2, driver="Version=24.1.rc2\n")
    conf = "address_0=192.168.1.10\nnetmask_0=255.255.255.0\naddress_1=192.168.1.11\nnetmask_1=255.255.255.0\n"
    _hccn_ips(root, {0: "192.168.1.10", 1: "192.168.1.11"}, conf)
    env = Environment(root, GOOD_ENV)
    assert check_hccn(env, devices(env)) == [Check("hccn.conf", "ok", "2 port addresses match /etc/hccn.conf")]
    _hccn_ips(root, {0: "192.168.1.10", 1: "192.168.9.99"}, conf.replace("address_0=192.168.1.10\n", ""))
    (check,) = check_hccn(env, devices(env))
    assert (
        check.status == "error"
        and check.detail == "NPU 0 has no address_0 in /etc/hccn.conf; NPU 1 holds 192.168.9.99, /etc/hccn.conf says 192.168.1.11"
    )
    (root / "etc/hccn.conf").unlink()
    assert check_hccn(env, devices(env))[0].status == "skip"


def test_a_torch_npu_failure_names_its_code_and_what_to_check(tmp_path: Path) -> None:
    class Failing(FakeTorch):
        class npu(FakeTorch.npu):  # noqa: N801 - torch's own name
            @classmethod
            def device_count(cls) -> int:
                raise RuntimeError("Initialize:torch_npu/csrc/core/npu/sys_ctrl/npu_sys_ctrl.cpp:253 NPU error, error code is 507033")

    root = image_root(tmp_path, devices=1, driver="Version=24.1.rc2\n")
    code, report = run_doctor(Environment(root, {**GOOD_ENV, NODE_ENV: "node-7"}), torch_modules=(Failing, FakeTorchNpu))
    (npus,) = [c for c in report["checks"] if c["name"] == "NPUs"]
    assert code == EXIT_FAILED and npus["status"] == "error" and report["node"] == "node-7"
    assert (
        "error code is 507033 [507033 (ACL_ERROR_RT_DEV_SETUP_ERROR): the device failed to start; first check: the host's driver"
        in npus["detail"]
    )


def test_every_error_code_has_its_meaning_what_to_check_and_a_source() -> None:
    table = error_codes()
    assert len(table) >= 15 and len({e["code"] for e in table}) == len(table)
    for entry in table:
        assert set(entry) == {"code", "name", "meaning", "check", "source"} and all(entry.values()), entry
    found = explain("EI0006 ... then EJ0001, EI00061 is no code, nor is error code 1507033")
    assert [e["code"] for e in found] == ["EI0006", "EJ0001"]
    # a numeric code counts only as an error's value: never a Ray worker's pid or a metric
    assert explain("(WorkerDict pid=107002) step:3 - perf/throughput:507033.0") == []
    said = "aclrtSetDevice(deviceId) failed: 507033; errorCode = 107002; runtime result = 507899"
    assert [e["code"] for e in explain(said)] == ["507033", "107002", "507899"]


def test_older_than_the_only_paired_release_recorded_warns_instead_of_failing(tmp_path: Path) -> None:
    """compat.cann_drivers with complete: false holds the release paired with the CANN, not its whole range."""
    code, report = judged(tmp_path, "Version=24.1.0\n", drivers={"hdk": ["25.3.RC1"], "source": "s", "complete": False})
    (driver,) = [c for c in report["checks"] if c["name"] == "driver"]
    assert code == EXIT_OK and driver["status"] == "warn"
    assert driver["detail"].startswith("driver 24.1.0 is older than Ascend HDK 25.3.RC1, the release paired with CANN 8.3.RC1;")


@pytest.mark.parametrize(
    ("runtime", "status", "words"),
    [
        ("containerd://1.6.20", "ok", "containerd 1.6.20 pulls zstd layers (containerd >= 1.5)"),
        ("containerd://1.4.13", "warn", "containerd 1.4.13 cannot pull zstd layers (containerd >= 1.5): pull the gzip tags"),
        ("docker://20.10.24", "warn", "docker 20.10.24 cannot pull zstd layers (docker >= 23.0)"),
        ("docker://18.09.0", "warn", "docker 18.09.0 cannot pull zstd layers"),
        ("docker://23.0.1", "ok", "docker 23.0.1 pulls zstd layers"),
        ("cri-o://1.28.2", "ok", "cri-o 1.28.2 pulls zstd layers"),
        ("rkt://1.30", "skip", "not a runtime and version doctor knows"),
        ("containerd://", "skip", "not a runtime and version doctor knows"),
    ],
)
def test_whether_the_nodes_runtime_pulls_zstd_names_its_version(tmp_path: Path, runtime: str, status: str, words: str) -> None:
    check = zstd_verdict(runtime)
    assert (check.name, check.status) == ("zstd pulls", status) and words in check.detail


def test_doctor_reports_the_runtimes_it_is_told(tmp_path: Path) -> None:
    """smoke tells doctor its engine (docker://VERSION) in the image; a zstd verdict for each runtime named."""
    where = Environment(image_root(tmp_path), {**GOOD_ENV, RUNTIME_ENV: "docker://20.10.24, containerd://1.6.20"})
    code, report = run_doctor(where)
    zstd = [c for c in report["checks"] if c["name"] == "zstd pulls"]
    assert [c["status"] for c in zstd] == ["warn", "ok"]
    assert code == EXIT_NO_DEVICES, "a runtime that cannot pull zstd is a warning, not a failure: the gzip tags work"
    _, quiet = run_doctor(Environment(image_root(tmp_path / "other"), GOOD_ENV))
    assert not [c for c in quiet["checks"] if c["name"] == "zstd pulls"], "not said, not guessed (a stand-in root is no host)"


@pytest.mark.parametrize(
    ("soc", "status"),
    [("Ascend950DT_9582", "ok"), ("Ascend950PR_9609", "ok"), ("ascend950dt_9999", "ok"), ("Ascend910_9392", "error")],
)
def test_a_950_image_knows_its_family_beyond_the_socs_it_lists(tmp_path: Path, soc: str, status: str) -> None:
    """No full list of 950 SoCs is published: an image of the a5 chip accepts any Ascend950* SoC (as
    vllm-ascend maps every ascend950* to A5), and still refuses an A3's."""
    from buildkit.matrix.load import load_matrix
    from tests.conftest import MATRIX

    chip = load_matrix(MATRIX).matrix.chips["a5"]
    assert (chip.soc_family == "Ascend950" and soc not in chip.soc_names) or soc == "Ascend950DT_9582"
    root = image_root(tmp_path, devices=1, driver="package_version=26.0.rc1\n")
    info = {**INFO, "chip": "a5", "chip_name": chip.name, "soc_names": list(chip.soc_names), "soc_family": chip.soc_family}
    (root / "etc/ascendkit/image.json").write_text(json.dumps(info))
    FakeTorch.npu.soc = soc
    _, report = run_doctor(Environment(root, GOOD_ENV), torch_modules=(FakeTorch, FakeTorchNpu))
    assert statuses(report)["SoC"] == status


# ---- the engine: what `docker version` and `docker info` answered on each engine the tests run ----------

ENGINES = Path(__file__).parent / "fixtures" / "engines"  # the answers of the real engines (tests/harness/services.py starts them)


@pytest.mark.parametrize(
    ("answers", "product", "store", "api"),
    [
        ("docker-26.1.5-containerd", "Docker Engine", "containerd", "1.45"),
        ("docker-26.1.5-overlay2", "Docker Engine", "graph driver", "1.45"),
        ("docker-20.10.24", "Docker Engine", "graph driver", "1.41"),
        ("podman-4.3.1", "Podman", "containers-storage", "1.41"),
    ],
)
def test_each_engine_s_own_answers_say_what_it_is(answers: str, product: str, store: str, api: str) -> None:
    said = json.loads((ENGINES / f"{answers}.json").read_text())
    engine = engine_from(said["version"], said["info"])
    assert (engine["product"], engine["image_store"], engine["api_version"]) == (product, store, api)
    verdict = judge_engine(engine)
    assert verdict.status == ("warn" if answers == "docker-20.10.24" else "ok"), verdict
    assert verdict.detail.startswith(f"{product} {engine['version']} (API {api}), {store} image store")


def test_an_engine_that_leaves_empty_fields_out_is_read() -> None:
    """API 1.52 (Docker 29) omits empty fields: nothing is assumed present."""
    engine = engine_from({"Version": "29.0.1", "ApiVersion": "1.52"}, {})
    assert engine == {
        "product": "Docker Engine",
        "version": "29.0.1",
        "api_version": "1.52",
        "image_store": "graph driver",
        "storage_driver": "",
    }


@pytest.mark.parametrize(
    ("runtime", "product", "api", "store"),
    [
        ("docker://26.1.5", "Docker Engine", "1.45", "not in the node list"),
        ("docker://29.0.1", "Docker Engine", "1.52", "not in the node list"),
        ("containerd://1.7.24", "containerd", "CRI", "containerd"),
        ("cri-o://1.30.2", "CRI-O", "CRI", "containers-storage"),
    ],
)
def test_a_node_s_runtime_says_what_it_can_of_its_engine(runtime: str, product: str, api: str, store: str) -> None:
    engine = engine_of_runtime(runtime)
    assert (engine["product"], engine["api_version"]) == (product, api) and engine["image_store"].startswith(store)
