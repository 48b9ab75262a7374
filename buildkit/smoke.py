"""``ascendkit smoke``: does this image train? A short GRPO run on the host's NPUs, judged.

The container gets exactly what the SKU needs and nothing more: one ``/dev/davinciN`` per NPU plus
the three control devices, the host's driver files read-only, a large ``/dev/shm`` and host
networking for multi-card HCCL, never ``--privileged`` unless asked. Two containers run from the
same settings: ``ascendkit doctor`` first, then (if the host has NPUs and doctor passed) the job
from ``smoke_tests/grpo_smoke.yaml``. Both are always removed; the log is kept.

Outcomes and exit codes (README, "Exit codes"):

    passed      0   the job ran the requested steps and passed every check (and the baseline gate)
    failed      1   doctor, the job or a check failed
    timed-out   9   the run outlived --timeout: the container was killed and removed, the log kept
    no-devices 10   no Ascend devices on this host: doctor's preflight ran in the image, GRPO did not
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from buildkit.compare import REWARD, THROUGHPUT, Comparison, compare_runs
from buildkit.doctor import EXIT_NO_DEVICES, Check
from buildkit.errors import ExitCode, InputError, OutputError, Unavailable
from buildkit.fsio import write_atomic
from buildkit.job import DATA_DIR, GENERATED_DATA, MODEL_DIR, OUT_DIR, SMOKE_DIR, SMOKE_FILES, ImageJob, Job, build_job, load_job
from buildkit.jobwatch import JobWatch, Stall
from buildkit.metrics import StepMetrics, is_finite, parse_log, series
from buildkit.model import Sku
from buildkit.render import LABEL_PREFIX
from buildkit.verlconfig import check_config, parse_printed_config

SMOKE_LABEL = f"{LABEL_PREFIX}.smoke"

CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
# The driver lives on the host, never in the image (facts: "Running a container on an NPU host").
DRIVER_FILES_REQUIRED = ("/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info")
DRIVER_FILES_OPTIONAL = ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/etc/ascend_install.info")
SHM_SIZE = "16g"  # what verl's NPU CI gives its containers


# ---------------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class DevicePlan:
    """What the container gets from the host. No NPUs at all means a preflight-only run."""

    npus: tuple[str, ...]
    control: tuple[str, ...]
    driver_files: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def has_npus(self) -> bool:
        return bool(self.npus)


def parse_visible(text: str) -> list[int]:
    """``0-3,8`` -> [0, 1, 2, 3, 8] (the ASCEND_VISIBLE_DEVICES form)."""
    ids: list[int] = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            ids += list(range(int(first), int(last) + 1)) if sep else [int(first)]
        except ValueError:
            raise InputError(f"--devices {text!r}: expected NPU ids like 0-7 or 0,1,2,3") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise InputError(f"--devices {text!r}: expected distinct NPU ids like 0-7 or 0,1,2,3")
    return sorted(ids)


def plan_devices(sku_id: str, sku: Sku, visible: list[int] | None = None, host_root: Path = Path("/")) -> DevicePlan:
    """The SKU's devices and driver files as found on this host.

    A host with no ``/dev/davinciN`` gets an empty plan (preflight only). A host with some NPUs
    must have every one the SKU (or ``--devices``) names, the control devices and the driver.
    """

    def on_host(path: str) -> bool:
        return (host_root / path.lstrip("/")).exists()

    present = sorted(int(p.name.removeprefix("davinci")) for p in (host_root / "dev").glob("davinci*") if p.name[7:].isdigit())
    if not present:
        return DevicePlan((), (), (), notes=("no /dev/davinci* on this host: preflight only",))
    wanted = visible if visible is not None else list(range(sku.npus_per_node))
    if visible is None and len(present) < sku.npus_per_node:
        raise InputError(
            f"--hw {sku_id} ({sku.product}) has {sku.npus_per_node} NPUs per node, this host shows {len(present)} "
            f"(/dev/davinci{present[0]}..{present[-1]}); pick the ones to use with --devices, e.g. --devices 0-{len(present) - 1}"
        )
    missing = [f"/dev/davinci{i}" for i in wanted if i not in present]
    missing += [d for d in CONTROL_DEVICES if not on_host(d)]
    missing += [f for f in DRIVER_FILES_REQUIRED if not on_host(f)]
    if missing:
        raise InputError(f"this host lacks what --hw {sku_id} needs: {', '.join(missing)} (is the Ascend driver installed?)")
    optional = [f for f in DRIVER_FILES_OPTIONAL if on_host(f)]
    notes = tuple(f"{f} not on this host: not mounted" for f in DRIVER_FILES_OPTIONAL if f not in optional)
    return DevicePlan(
        npus=tuple(f"/dev/davinci{i}" for i in wanted),
        control=CONTROL_DEVICES,
        driver_files=(*DRIVER_FILES_REQUIRED, *optional),
        notes=notes,
    )


def host_config_args(plan: DevicePlan, mounts: dict[str, tuple[str, str]], *, privileged: bool) -> dict[str, Any]:
    """Arguments of docker-py's ``create_host_config`` for the smoke containers.

    ``mounts`` maps host paths to (container path, mode). Multi-card runs get the host network
    (HCCL and Ray talk over it) and a 16 GiB ``/dev/shm``.
    """
    binds = {host: {"bind": target, "mode": mode} for host, (target, mode) in mounts.items()}
    binds.update({f: {"bind": f, "mode": "ro"} for f in plan.driver_files})
    args: dict[str, Any] = {
        "binds": binds,
        "devices": [f"{d}:{d}:rwm" for d in (*plan.npus, *plan.control)],
        "shm_size": SHM_SIZE,
        "privileged": privileged,
    }
    if len(plan.npus) > 1:
        args["network_mode"] = "host"
    return args


# ---------------------------------------------------------------------------------------------
# Containers


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when the container was killed (timeout or stall)
    timed_out: bool
    stdout: str  # the container's stdout, when asked for (doctor's JSON, the printed config)
    stalled: Stall | None = None  # the watcher stopped it: no progress


POLL_S = 5.0  # how often a waiting run looks at its watcher


def _stream(client: docker.APIClient, cid: str, log_path: Path, echo: Callable[[str], None] | None) -> None:
    with log_path.open("wb") as log:
        pending = b""
        for chunk in client.logs(cid, stream=True, follow=True, stdout=True, stderr=True):
            log.write(chunk)
            log.flush()
            if echo is None:
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                echo(line.decode("utf-8", "replace"))
        if echo is not None and pending:
            echo(pending.decode("utf-8", "replace"))


def _wait(client: docker.APIClient, cid: str, deadline: float, watch: JobWatch | None) -> tuple[int | None, Stall | None]:
    """The container's exit code; None when the deadline passed or the watcher saw a stall."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, None
        if watch is not None:
            stall = watch.stalled()
            if stall is not None:
                return None, stall
        poll = min(left, POLL_S) if watch is not None else left
        asked = time.monotonic()
        try:
            status = client.wait(cid, timeout=max(math.ceil(poll), 1))
            return int(status.get("StatusCode", -1)), None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            if time.monotonic() - asked < poll - 1:  # answered early without a status: the engine went away
                raise


def run_container(
    client: docker.APIClient,
    image: str,
    command: list[str],
    *,
    log_path: Path,
    deadline: float,
    host_config: dict[str, Any] | None = None,
    environment: dict[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
    want_stdout: bool = False,
    watch: JobWatch | None = None,
) -> RunResult:
    """Run ``command`` in ``image``, stream its output to ``log_path``, stop it at ``deadline``
    (a ``time.monotonic()`` value) or when ``watch`` sees a stall, and always remove it."""
    try:
        created = client.create_container(
            image,
            command=command,
            environment=environment or {},
            host_config=client.create_host_config(**(host_config or {})),
            labels={SMOKE_LABEL: "1"},
        )
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"cannot create the smoke container from {image}: {exc}") from None
    cid = created["Id"]
    code, stdout, stall = None, "", None
    streamer: threading.Thread | None = None

    def feed(line: str) -> None:
        if watch is not None:
            watch.feed(line)
        if echo is not None:
            echo(line)

    try:
        client.start(cid)
        streamer = threading.Thread(target=_stream, args=(client, cid, log_path, feed if (echo or watch) else None), daemon=True)
        streamer.start()
        code, stall = _wait(client, cid, deadline, watch)
        if code is None:
            with contextlib.suppress(NotFound, APIError):
                client.kill(cid)
        streamer.join(timeout=30)
        if want_stdout and code is not None:
            stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"the smoke container failed to run: {exc}") from None
    finally:
        with contextlib.suppress(NotFound, DockerException, requests.exceptions.RequestException):
            client.remove_container(cid, force=True)
    return RunResult(code, code is None and stall is None, stdout, stall)


# ---------------------------------------------------------------------------------------------
# Judging


def judge(steps: list[StepMetrics], requested: int) -> list[Check]:
    """The checks that need no baseline: steps done, finite numbers, rewards in [0, 1], throughput > 0."""
    checks: list[Check] = []
    done = max((s.step for s in steps), default=0)
    checks.append(
        Check("steps completed", "ok" if done >= requested else "error", f"the log shows step {done} of {requested}")
        if steps
        else Check("steps completed", "error", f"no step metrics in the log (0 of {requested})")
    )
    bad = [f"step {s.step} {name}={value}" for s in steps for name, value in s.metrics.items() if not is_finite(value)]
    checks.append(Check("finite metrics", "error" if bad else "ok", "; ".join(bad[:5]) or "no NaN or inf in any metric"))
    rewards = series(steps, REWARD)
    if not rewards:
        checks.append(Check("rewards in [0, 1]", "error", f"no {REWARD} in the log"))
    else:
        outside = [f"step {k}: {v}" for k, v in sorted(rewards.items()) if not (is_finite(v) and 0.0 <= v <= 1.0)]
        detail = "; ".join(outside[:5]) or f"{len(rewards)} steps, {min(rewards.values()):.4g}..{max(rewards.values()):.4g}"
        checks.append(Check("rewards in [0, 1]", "error" if outside else "ok", detail))
    throughput = series(steps, THROUGHPUT)
    if not throughput:
        checks.append(Check("throughput > 0", "error", f"no {THROUGHPUT} in the log"))
    else:
        slow = [f"step {k}: {v}" for k, v in sorted(throughput.items()) if not (is_finite(v) and v > 0)]
        mean = sum(throughput.values()) / len(throughput)
        detail = "; ".join(slow[:5]) or f"mean {mean:.4g} tokens/s/device over {len(throughput)} steps"
        checks.append(Check("throughput > 0", "error" if slow else "ok", detail))
    return checks


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class SmokeRequest:
    sku_id: str
    sku: Sku
    chip_id: str
    image: str
    out: Path
    steps: int = 5
    timeout: float = 1800.0
    model_path: Path | None = None
    data_path: Path | None = None
    baseline: list[StepMetrics] | None = None
    baseline_name: str | None = None
    visible: list[int] | None = None
    privileged: bool = False
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    host_root: Path = Path("/")
    first_autodetect: str = field(kw_only=True)  # compat.verl_npu_autodetect of the matrix
    check_only: bool = False  # --check: the config check alone, on any host
    config_check: bool = True  # --no-config-check: for images without verl (the CI test stack)
    stall_after: float = 900.0  # seconds without a step line once Ray is up
    progress: Callable[[str], None] | None = None


@dataclass
class SmokeReport:
    outcome: str
    exit_code: int
    message: str
    data: dict[str, Any]


def _image_labels(client: docker.APIClient, ref: str) -> tuple[str, dict[str, str]]:
    try:
        info = client.inspect_image(ref)
    except ImageNotFound:
        if "/" not in ref:
            raise Unavailable(f"image {ref} is not on this engine; build it (`ascendkit build --hw ...`) or pass --image") from None
        try:
            client.pull(ref)
            info = client.inspect_image(ref)
        except (DockerException, requests.exceptions.RequestException) as exc:
            raise Unavailable(f"image {ref} is not on this engine and could not be pulled: {exc}") from None
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"cannot inspect {ref}: {exc}") from None
    return str(info["Id"]), dict((info.get("Config") or {}).get("Labels") or {})


def check_image_chip(ref: str, labels: dict[str, str], sku_id: str, chip_id: str) -> str | None:
    """The image's chip must be the SKU's (an A3 image on a 910B host fails at run time); returns its stack."""
    chip = labels.get(f"{LABEL_PREFIX}.chip")
    if chip is None:
        raise InputError(f"{ref} has no {LABEL_PREFIX}.chip label: not an ascendkit image, so its chip cannot be checked")
    if chip != chip_id:
        raise InputError(f"{ref} is built for chip {chip!r}; --hw {sku_id} needs an image for chip {chip_id!r}")
    return labels.get(f"{LABEL_PREFIX}.stack")


CHECK_TIMEOUT_S = 900.0  # importing verl's stack under emulation takes minutes; composing takes seconds
# The config check imports main_ppo and lets Hydra compose; nothing touches an NPU, so torch must not
# try to load torch_npu's device backend (that needs the host's driver, absent on a build host).
CHECK_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
_CHECK_ERROR_HINTS = ("Could not override", "not in struct", "Could not append", "Error merging", "Error parsing", "Error:")
_IMPORT_ERROR = re.compile(r"^(?:ModuleNotFoundError|ImportError|OSError): .*")


def composition_error(log: str, code: int) -> str:
    """Why a ``--cfg job`` run failed, in a sentence: verl missing, an import failing, or Hydra's message."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    imports = [line for line in lines if _IMPORT_ERROR.match(line)]
    if any("No module named 'verl'" in line for line in lines):  # python -m says it its own way
        return "verl is not installed in this image (No module named 'verl'): nothing here can run the job"
    if imports and re.search(r"lib(?:hccl|ascend\w*|acl\w*|runtime|ge_runner|hccl_\w+)\.so", imports[-1]):
        return (
            f"torch_npu could not load the CANN or driver libraries (exit {code}): {imports[-1]}; run the check where the "
            "image's CANN is complete and, for driver libraries, on a host with the Ascend driver (it is mounted read-only)"
        )
    if imports:
        return f"verl's main_ppo could not be imported in the image (exit {code}): {imports[-1]}"
    hits = [line for line in lines if any(h in line for h in _CHECK_ERROR_HINTS)]
    return f"verl refused the job's config (exit {code}): " + (" | ".join(hits[:3] or lines[-3:]) or "no output")


def run_config_check(
    client: docker.APIClient,
    image_id: str,
    job: Job,
    image: ImageJob,
    out: Path,
    deadline: float,
    *,
    first_autodetect: str,
    driver_files: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The job's exact command with ``--cfg job`` in the image: verl composes its config and exits.

    Writes the log to ``config-check.log`` and the composed config to ``job-config.yaml``; returns
    the report's ``config_check`` section (``passed`` False with ``error`` when verl refused).
    """
    result = run_container(
        client,
        image_id,
        job.check_argv(),
        log_path=out / "config-check.log",
        deadline=min(deadline, time.monotonic() + CHECK_TIMEOUT_S),
        environment={**job.env, **CHECK_ENV},
        # No devices: composing needs none. The host's driver, where there is one, lets torch_npu load.
        host_config={"binds": {f: {"bind": f, "mode": "ro"} for f in driver_files}} if driver_files else None,
        want_stdout=True,
    )
    section: dict[str, Any] = {"command": job.check_argv(), "log": "config-check.log", "checks": []}
    if result.exit_code is None:
        return {**section, "passed": False, "error": "the config check did not finish before the timeout"}
    if result.exit_code != 0:
        log = (out / "config-check.log").read_text(encoding="utf-8", errors="replace")
        return {**section, "passed": False, "error": composition_error(log, result.exit_code)}
    printed = parse_printed_config(result.stdout)
    if printed is None:
        return {**section, "passed": False, "error": "the command exited 0 but printed no composed config (is --cfg job reaching Hydra?)"}
    config, text = printed
    write_atomic(out / "job-config.yaml", text)
    checks = check_config(config, verl=image.verl, first_autodetect=first_autodetect)
    failed = [c for c in checks if c.status == "error"]
    section.update(config="job-config.yaml", checks=[c.__dict__ for c in checks], passed=not failed)
    if failed:
        section["error"] = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return section


def run_smoke(client: docker.APIClient, request: SmokeRequest, echo: Callable[[str], None] | None = None) -> SmokeReport:
    """The config check, doctor, then (on a host with NPUs) the GRPO job; writes report.json,
    report.md and a PNG to ``out``."""
    if request.check_only and not request.config_check:
        raise InputError("--check and --no-config-check exclude each other")
    started = time.monotonic()
    deadline = started + request.timeout
    spec = load_job()
    image_id, labels = _image_labels(client, request.image)
    image = ImageJob(check_image_chip(request.image, labels, request.sku_id, request.chip_id), labels.get(f"{LABEL_PREFIX}.version.verl"))
    if request.check_only:
        devices = DevicePlan((), (), (), notes=("--check: the config check only, no devices used",))
    else:
        devices = plan_devices(request.sku_id, request.sku, request.visible, request.host_root)
    if devices.has_npus and request.model_path is None:
        raise InputError(
            "--model-path is required on a host with NPUs (a local Qwen2.5-0.5B-Instruct; README: 'Smoke test on an NPU host')"
        )
    job = build_job(
        spec,
        request.sku,
        image,
        first_autodetect=request.first_autodetect,
        steps=request.steps,
        data=DATA_DIR if request.data_path else GENERATED_DATA,
        extra=request.overrides,
        extra_env=request.env,
    )
    try:
        request.out.mkdir(parents=True, exist_ok=True)
        for stale in ("doctor.log", "job.log", "report.png", "config-check.log", "job-config.yaml"):  # never an earlier run's files
            (request.out / stale).unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {request.out}: cannot use the report directory: {exc.strerror}") from None
    mounts: dict[str, tuple[str, str]] = {str(SMOKE_DIR): (SMOKE_FILES, "ro"), str(request.out.resolve()): (OUT_DIR, "rw")}
    if request.model_path is not None:
        mounts[str(request.model_path.resolve())] = (MODEL_DIR, "ro")
    if request.data_path is not None:
        mounts[str(request.data_path.resolve())] = (DATA_DIR, "ro")
    host_config = host_config_args(devices, mounts, privileged=request.privileged)
    data: dict[str, Any] = {
        "format": "ascendkit-smoke/1",
        "sku": request.sku_id,
        "product": request.sku.product,
        "image": {"ref": request.image, "id": image_id, "stack": image.stack, "chip": request.chip_id, "verl": image.verl},
        "settings": {
            "steps": request.steps,
            "timeout_s": request.timeout,
            "stall_s": request.stall_after,
            "devices": list(devices.npus),
            "privileged": request.privileged,
            "network": host_config.get("network_mode", "default"),
            "model_path": str(request.model_path) if request.model_path else None,
            "data": str(request.data_path) if request.data_path else f"generated (smoke_tests/gsm8k_synth.py, {job.train_rows} rows)",
            "baseline": request.baseline_name,
        },
        "host_notes": list(devices.notes),
        "job": {"command": job.argv, "env": job.env, "device_override": job.device_override},
        "config_check": None,
        "doctor": None,
        "checks": [],
        "comparison": None,
        "files": {},
    }

    def finish(outcome: str, code: ExitCode, message: str) -> SmokeReport:
        data.update(outcome=outcome, exit_code=int(code), message=message)
        write_reports(request.out, data)
        return SmokeReport(outcome, int(code), message, data)

    if request.config_check:
        data["files"]["config_check_log"] = "config-check.log"
        check = run_config_check(
            client,
            image_id,
            job,
            image,
            request.out,
            deadline,
            first_autodetect=request.first_autodetect,
            driver_files=devices.driver_files,
        )
        data["config_check"] = check
        if "config" in check:
            data["files"]["job_config"] = check["config"]
        if not check["passed"]:
            return finish("failed", ExitCode.CHECK_FAILED, f"config check: {check['error']}; see config-check.log")
        if request.check_only:
            message = "verl composed the job's config in the image and it passes verl's start-up checks; nothing trained"
            return finish("checked", ExitCode.OK, message)

    data["files"]["doctor_log"] = "doctor.log"
    doctor = run_container(
        client,
        image_id,
        ["ascendkit", "doctor", "--json"],
        log_path=request.out / "doctor.log",
        deadline=min(deadline, time.monotonic() + 600),
        host_config=host_config,
        want_stdout=True,
    )
    if doctor.timed_out:
        return finish("timed-out", ExitCode.TIMED_OUT, "doctor did not finish before the timeout")
    with contextlib.suppress(ValueError):
        data["doctor"] = json.loads(doctor.stdout)
    if doctor.exit_code == EXIT_NO_DEVICES and not devices.has_npus:
        return finish(
            "no-devices",
            ExitCode.NO_DEVICES,
            "no Ascend devices on this host: "
            + ("the job's config passed verl's checks and " if request.config_check else "")
            + "doctor's preflight passed in the image; GRPO not run",
        )
    if doctor.exit_code == EXIT_NO_DEVICES:
        return finish("failed", ExitCode.CHECK_FAILED, "the host's NPUs were mounted but doctor sees none in the container")
    if doctor.exit_code != 0:
        return finish("failed", ExitCode.CHECK_FAILED, f"doctor failed in the image (exit {doctor.exit_code}); see doctor.log")

    command = ["sh", "-c", job.shell(generate_data=request.data_path is None)]
    data["files"]["job_log"] = "job.log"
    watch = JobWatch(steps=request.steps, stall_after=request.stall_after, progress=request.progress)
    result = run_container(
        client,
        image_id,
        command,
        log_path=request.out / "job.log",
        deadline=deadline,
        host_config=host_config,
        environment=job.env,
        echo=echo,
        watch=watch,
    )
    steps = parse_log((request.out / "job.log").read_text(encoding="utf-8", errors="replace").splitlines())
    data["job"].update(exit_code=result.exit_code, timed_out=result.timed_out, steps_logged=len(steps))
    checks = judge(steps, request.steps)
    comparison: Comparison | None = None
    if request.baseline is not None and steps:
        try:
            comparison = compare_runs(steps, request.baseline, None, 4)
            data["comparison"] = comparison.describe()
        except InputError as exc:  # e.g. the runs share no step: a failed gate, not a lost report
            checks.append(Check("baseline gate", "error", str(exc)))
    data["checks"] = [c.__dict__ for c in checks]
    if steps:
        from buildkit.plot import plot_runs

        plot_runs(steps, request.baseline, request.out / "report.png", title=f"GRPO smoke on {request.sku_id}: {request.image}")
        data["files"]["plot"] = "report.png"
    if result.stalled is not None:
        data["job"]["stall"] = result.stalled.describe()
        return finish(
            "stalled",
            ExitCode.TIMED_OUT,
            f"{result.stalled.summary}: killed and removed; likely: {result.stalled.causes[0]}",
        )
    if result.timed_out:
        why = watch.diagnose(f"the job outlived --timeout {request.timeout:g}s at {watch.where()}")
        data["job"]["stall"] = why.describe()
        return finish("timed-out", ExitCode.TIMED_OUT, f"{why.summary}: killed and removed; likely: {why.causes[0]}")
    if result.exit_code != 0:
        return finish("failed", ExitCode.CHECK_FAILED, f"the job exited with {result.exit_code}; see job.log")
    failed = [c.name for c in checks if c.status == "error"]
    if comparison is not None and not comparison.passed:
        failed += [f"baseline gate: {m.name}" for m in comparison.metrics if not m.passed]
    if failed:
        return finish("failed", ExitCode.CHECK_FAILED, "failed: " + ", ".join(failed))
    return finish("passed", ExitCode.OK, f"{request.steps} GRPO steps trained and passed every check")


# ---------------------------------------------------------------------------------------------
# Reports


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _devices_cell(devices: list[str]) -> str:
    if not devices:
        return "none (preflight only)"
    if len(devices) <= 4:
        return ", ".join(devices)
    return f"{len(devices)} NPUs: {devices[0]} .. {devices[-1]}"


def report_markdown(data: dict[str, Any]) -> str:
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    image = data["image"]
    settings = data["settings"]
    lines = [
        f"# GRPO smoke test: {data['outcome'].upper()}",
        "",
        f"{data['message']} (exit {data['exit_code']}).",
        "",
        "| | |",
        "|---|---|",
        f"| SKU | `{data['sku']}` ({cell(data['product'])}) |",
        f"| image | `{cell(image['ref'])}` (`{image['id'][:19]}`), stack `{image['stack']}`, chip `{image['chip']}` |",
        f"| steps | {settings['steps']} (timeout {settings['timeout_s']:g} s) |",
        f"| devices | {_devices_cell(settings['devices'])} |",
        f"| network | {settings['network']}{', privileged' if settings['privileged'] else ''} |",
        f"| model | {cell(settings['model_path'] or '-')} |",
        f"| data | {cell(settings['data'])} |",
        f"| baseline | {cell(settings['baseline'] or '-')} |",
    ]
    for note in data["host_notes"]:
        lines.append(f"\n> {note}")
    check = data.get("config_check")
    if check:
        state = "passed" if check["passed"] else "FAILED"
        lines += ["", f"## Config check (verl composes the job in the image): {state}", ""]
        lines += [f"`{cell(shlex.join(check['command']))}`"]
        if check.get("error"):
            lines += ["", f"> {cell(check['error'])}"]
        if check["checks"]:
            lines += ["", "| check | status | detail |", "|---|---|---|"]
            lines += [f"| {cell(c['name'])} | {c['status']} | {cell(c['detail'])} |" for c in check["checks"]]
    doctor = data.get("doctor")
    if doctor:
        lines += ["", f"## Doctor: {doctor.get('outcome', '?')}", "", "| check | status | detail |", "|---|---|---|"]
        lines += [f"| {cell(c['name'])} | {c['status']} | {cell(c['detail'])} |" for c in doctor.get("checks", [])]
    if data["checks"]:
        lines += ["", "## Training checks", "", "| check | status | detail |", "|---|---|---|"]
        lines += [f"| {cell(c['name'])} | {c['status']} | {cell(c['detail'])} |" for c in data["checks"]]
    stall = (data.get("job") or {}).get("stall")
    if stall:
        lines += ["", f"## Why the job stopped: {cell(stall['summary'])}", ""]
        lines += [f"- {cell(cause)}" for cause in stall["likely_causes"]]
        lines += ["", "Last lines of the log:", "", "```", *stall["last_lines"], "```"]
    comparison = data.get("comparison")
    if comparison:
        lines += [
            "",
            "## Against the baseline",
            "",
            "| metric | steps | mean abs error | % | tolerance % | result |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in comparison["metrics"].items():
            error = "n/a" if m["mean_abs_error"] is None else f"{m['mean_abs_error']:.6g}"
            pct = "n/a" if m["mean_abs_error_pct"] is None else f"{m['mean_abs_error_pct']:.3f}"
            lines.append(f"| `{name}` | {m['steps']} | {error} | {pct} | {m['tolerance_pct']:g} | {'pass' if m['pass'] else 'FAIL'} |")
        ratio = comparison.get("throughput_ratio")
        lines += ["", f"Throughput ratio (NPU / baseline): {'n/a' if ratio is None else f'{ratio:.3f}'}"]
    files = data["files"]
    lines += ["", "## Files", ""]
    lines += [f"- {kind.replace('_', ' ')}: `{name}`" for kind, name in files.items()]
    if "plot" in files:
        lines += ["", f"![reward, loss and throughput per step]({files['plot']})"]
    return "\n".join(lines) + "\n"


def write_reports(out: Path, data: dict[str, Any]) -> None:
    clean = _json_safe(data)
    write_atomic(out / "report.json", json.dumps(clean, indent=2) + "\n")
    write_atomic(out / "report.md", report_markdown(clean))


def stderr_echo(line: str) -> None:
    sys.stderr.write(f"  | {line}\n")
