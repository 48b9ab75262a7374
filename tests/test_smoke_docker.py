"""`ascendkit smoke` against the real engine with the image built on the stand-in base (no NPU
here): the config check runs the job's command in the container and reports that the test stack
carries no verl (its packages are small stand-ins); without the check, doctor runs for real and the
run ends as "no devices". The container runner's timeout, stall, log and clean-up are exercised
with real containers. The config check passing against real verl: tests/test_arm64_layers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.container import SMOKE_LABEL, run_container
from buildkit.run.devices import DevicePlan, host_config_args
from buildkit.run.jobwatch import JobWatch
from tests.conftest import DockerEnv

pytestmark = pytest.mark.docker
MATRIX = Path(__file__).resolve().parents[1] / DEFAULT_MATRIX  # the shipped SKUs; the image is the test stack's


def _smoke_containers(env: DockerEnv) -> set[str]:
    """The engine's smoke-labelled containers. Tests compare against the set before they ran: an
    engine that outlived an interrupted run may hold one from it, and that is not this test's."""
    return {c["Id"] for c in env.client.containers(all=True, filters={"label": SMOKE_LABEL})}


def test_the_config_check_runs_the_jobs_command_in_the_image_and_stops_the_run(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    before = docker_env.containers()
    out = tmp_path / "report"
    proc = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", built["tags"][0], "--out", str(out), "--timeout", "300", cwd=tmp_path
    )
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
    assert "config check: verl is not installed in this image (No module named 'verl')" in proc.stderr
    assert docker_env.containers() == before, "the check's container was removed"
    report = json.loads((out / "report.json").read_text())
    check = report["config_check"]
    assert check["command"][:5] == ["python3", "-m", "verl.trainer.main_ppo", "--cfg", "job"] and not check["passed"]
    assert report["doctor"] is None and not (out / "doctor.log").exists(), "doctor and the job never ran"
    assert "No module named 'verl'" in (out / "config-check.log").read_text()
    alone = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", built["tags"][0], "--check", "--out", str(out), cwd=tmp_path
    )
    assert alone.returncode == ExitCode.CHECK_FAILED and "verl is not installed in this image" in alone.stderr


@pytest.mark.engine_20_10
def test_smoke_on_a_host_without_npus_runs_doctor_and_stops_there(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    before = docker_env.containers()
    out = tmp_path / "report"
    proc = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", built["tags"][0], "--out", str(out), "--timeout", "300",
        "--no-config-check", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.NO_DEVICES, proc.stderr
    assert "no Ascend devices on this host: doctor's preflight passed in the image; verl GRPO not run" in proc.stderr
    assert docker_env.containers() == before, "the smoke containers were removed"
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "no-devices" and report["exit_code"] == 10
    assert report["doctor"]["exit_code"] == 10 and report["doctor"]["devices"] == 0
    assert {c["name"]: c["status"] for c in report["doctor"]["checks"]}["pinned packages"] == "ok"
    assert report["config_check"] is None and report["settings"]["devices"] == [] and report["settings"]["privileged"] is False
    assert "trainer.device=npu" not in report["job"]["command"], "the test stack's verl pin (3.7) detects NPUs itself"
    assert json.loads((out / "doctor.log").read_text())["outcome"].startswith("no Ascend devices")
    assert (out / "report.md").read_text().startswith("# verl GRPO smoke test: NO-DEVICES")
    assert not (out / "job.log").exists()


def test_smoke_refuses_an_image_for_another_chip_before_running_anything(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    before = docker_env.containers()
    out = tmp_path / "report"
    proc = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "900-podc", "--image", built["tags"][0], "--out", str(out), cwd=tmp_path
    )
    assert proc.returncode == ExitCode.INVALID_INPUT, proc.stderr
    assert "is built for chip 'a3'; --hw 900-podc needs an image for chip 'a2'" in proc.stderr
    assert not out.exists() and docker_env.containers() == before


def test_smoke_reports_a_missing_image_as_unavailable(docker_env: DockerEnv, tmp_path: Path) -> None:
    proc = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", "no-such-image:1", "--out", str(tmp_path / "r"), cwd=tmp_path
    )
    assert proc.returncode == ExitCode.UNAVAILABLE
    assert "image no-such-image:1 is not on this engine" in proc.stderr


def test_a_job_that_outlives_the_timeout_is_killed_removed_and_its_log_kept(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    log = tmp_path / "job.log"
    before = _smoke_containers(docker_env)
    lines: list[str] = []
    started = time.monotonic()
    result = run_container(
        docker_env.client,
        built["tags"][0],
        ["sh", "-c", "echo step:1 - critic/rewards/mean:0.5; sleep 600"],
        log_path=log,
        deadline=time.monotonic() + 3,
        echo=lines.append,
    )
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 60
    assert "step:1 - critic/rewards/mean:0.5" in log.read_text()
    assert lines[:1] == ["step:1 - critic/rewards/mean:0.5"]
    assert _smoke_containers(docker_env) == before


def test_a_job_that_stops_stepping_is_stopped_early_with_its_cause(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    before = _smoke_containers(docker_env)
    watch = JobWatch(steps=5, stall_after=3)
    started = time.monotonic()
    script = (
        "echo 'INFO worker.py:1888 -- Started a local Ray instance.'; "
        "echo \"(autoscaler +5s) Warning: The following resource request cannot be scheduled right now: {'GPU': 1.0}\"; sleep 600"
    )
    result = run_container(
        docker_env.client, built["tags"][0], ["sh", "-c", script], log_path=log, deadline=time.monotonic() + 300, watch=watch
    )
    assert result.stalled is not None and result.exit_code is None and not result.timed_out
    assert time.monotonic() - started < 60, "stopped by the watcher, not the deadline"
    assert "trainer.device is cuda" in result.stalled.causes[0]
    assert _smoke_containers(docker_env) == before


@pytest.mark.engine_20_10
def test_a_finished_job_keeps_its_exit_code_output_and_stdout(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    before = _smoke_containers(docker_env)
    result = run_container(
        docker_env.client,
        built["tags"][0],
        ["sh", "-c", "echo out; echo err >&2; test -d /dev/shm && df -k /dev/shm | tail -1; exit 3"],
        log_path=log,
        deadline=time.monotonic() + 120,
        host_config=host_config_args(DevicePlan((), (), ()), {str(tmp_path): ("/smoke/out", "rw")}, privileged=False),
        want_stdout=True,
    )
    assert result.exit_code == 3 and not result.timed_out
    text = log.read_text()
    assert "out" in text and "err" in text
    assert "err" not in result.stdout.split("\n")[1:2]  # stdout alone, stderr apart
    assert str(16 * 1024 * 1024) in text, "/dev/shm is 16 GiB as the SKU's containers get it"
    assert _smoke_containers(docker_env) == before


@pytest.fixture(scope="module")
def sleeper(docker_env: DockerEnv, built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A stand-in job that sleeps: the built test image (its ascendkit labels, chip a3) with an
    entrypoint that prints one line and sleeps, whatever command smoke gives it. Removed after."""
    context = tmp_path_factory.mktemp("sleeper")
    (context / "Dockerfile").write_text(
        f'FROM {built["tags"][0]}\nENTRYPOINT ["/bin/sh", "-c", "echo stand-in job: sleeping; exec sleep 600", "stand-in"]\n'
    )
    tag = f"ascendkit-sleeper:{os.getpid()}"
    for _ in docker_env.client.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True):
        pass
    yield tag
    docker_env.client.remove_image(tag, force=True)


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGTERM, ExitCode.TERMINATED, "terminated (SIGTERM)"), (signal.SIGINT, ExitCode.INTERRUPTED, "interrupted (Ctrl-C)")],
    ids=["sigterm", "ctrl-c"],
)
def test_a_stopped_smoke_run_removes_its_running_container(
    docker_env: DockerEnv, sleeper: str, tmp_path: Path, signum: signal.Signals, code: ExitCode, said: str
) -> None:
    """CI and Kubernetes stop a run with SIGTERM: the job's container (on an NPU host, the one holding
    the NPUs) is stopped and removed, and the exit code says which signal it was."""
    before = _smoke_containers(docker_env)
    exe = Path(sys.executable).with_name("ascendkit")
    argv = [str(exe), "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", sleeper, "--out", str(tmp_path / "r"), "--timeout", "300"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=docker_env.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        running: set[str] = set()
        while not running and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            running = {c["Id"] for c in docker_env.client.containers(filters={"label": SMOKE_LABEL, "status": "running"})} - before
        assert running, f"no smoke container started; exit {proc.poll()}"
        time.sleep(1)  # the job's log is being streamed now
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    assert f"ascendkit: {said}: the smoke run was stopped and its container removed" in stderr
    assert "Traceback" not in stderr
    assert _smoke_containers(docker_env) == before, "the job's container is gone"


def test_a_cpu_run_in_an_image_without_the_framework_names_what_is_missing_and_leaves_nothing(
    docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path
) -> None:
    """`smoke --cpu` runs in containers of the image (no network, no devices): the test stack carries stand-in
    packages, so the run stops making the job's model and says so, naming stack, job and what is missing.
    The same run passing in real verl packages: CI's cpu-run job (tests/harness/cpu_run.py)."""
    before = docker_env.containers()
    out = tmp_path / "report"
    proc = docker_env.ascendkit(
        "smoke", "--matrix", str(MATRIX), "--hw", "a3", "--image", built["tags"][0], "--cpu", "--out", str(out), "--timeout", "300",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
    assert "smoke: cpu: FAILED: teststack verl grpo: the entry point stopped before the accelerator boundary: import" in proc.stderr
    assert "cpu_model.py failed" in proc.stderr and "No module named" in proc.stderr
    assert docker_env.containers() == before, "every container of the run was removed"
    report = json.loads((out / "cpu-report.json").read_text())
    (run,) = report["runs"]
    assert run["stack"] == "teststack" and not run["passed"] and run["boundary"]["kind"] == "import"
    assert "a container of" in run["place"] and "no network, no devices" in run["place"]
    assert (out / "cpu-report.md").read_text().startswith("# CPU run of the smoke jobs")
