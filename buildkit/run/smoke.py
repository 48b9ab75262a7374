"""``ascendkit smoke``: does this image train? A short run of one of its framework's jobs on the
host's NPUs (GRPO, or verl's SFT), judged.

The container gets exactly what the SKU needs and nothing more: one ``/dev/davinciN`` per NPU plus
the three control devices, the host's driver files read-only, a large ``/dev/shm`` and host
networking for multi-card HCCL, never ``--privileged`` unless asked. The containers run from the
same settings: the config check, ``ascendkit doctor``, then (if the host has NPUs and doctor
passed) the job from its file in ``smoke_tests/`` (:mod:`buildkit.run.job` says which). All are
always removed; the logs are kept.

Outcomes and exit codes (README, "Exit codes"):

    passed      0   the job ran the requested steps and passed every check (and the baseline gate)
    failed      1   doctor, the job or a check failed
    timed-out   9   the run outlived --timeout: the container was killed and removed, the log kept
    no-devices 10   no Ascend devices on this host: doctor's preflight ran in the image, the job did not
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from buildkit.accuracy.compare import Comparison, compare_runs
from buildkit.accuracy.metrics import StepMetrics, parse_log
from buildkit.errors import ExitCode, InputError, OutputError, Unavailable
from buildkit.framework import UNLABELLED, framework, title_of
from buildkit.fsio import check_output_dir
from buildkit.imageref import IMAGE_REFERENCE
from buildkit.matrix.model import Sku
from buildkit.plan import LABEL_PREFIX
from buildkit.reach import engine_said
from buildkit.resources import SMOKE_DIR
from buildkit.run.configcheck import run_config_check
from buildkit.run.container import engine_runtime, run_container
from buildkit.run.devices import DevicePlan, device_groups, host_config_args, image_user, plan_devices, prepare_data_dir
from buildkit.run.doctor.base import EXIT_NO_DEVICES, RUNTIME_ENV, Check
from buildkit.run.job import (
    DATA_DIR,
    DATA_FILES,
    GENERATED_DATA,
    MODEL_DIR,
    OUT_DIR,
    SMOKE_FILES,
    ImageJob,
    JobFacts,
    build_job,
    check_overrides,
    spec_for,
)
from buildkit.run.jobwatch import JobWatch
from buildkit.run.report import judge, write_reports


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
    as_root: bool = False  # --as-root: every container as root instead of the image's user
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    host_root: Path = Path("/")
    facts: JobFacts = field(kw_only=True)  # what the matrix knows of the frameworks' entry points
    job: str = "grpo"  # --job: grpo, or verl's sft
    check_only: bool = False  # --check: the config check alone, on any host
    config_check: bool = True  # --no-config-check: for images without the framework (the CI test stack)
    stall_after: float = 900.0  # seconds without a step line once Ray is up
    progress: Callable[[str], None] | None = None


@dataclass
class SmokeReport:
    outcome: str
    exit_code: int
    message: str
    data: dict[str, Any]


def _image_labels(client: docker.APIClient, ref: str) -> tuple[str, dict[str, str], str]:
    try:
        info = client.inspect_image(ref)
    except ImageNotFound:
        if "/" not in ref:
            raise Unavailable(f"image {ref} is not on this engine; build it (`ascendkit build --hw ...`) or pass --image") from None
        try:
            client.pull(ref)
            info = client.inspect_image(ref)
        except (DockerException, requests.exceptions.RequestException) as exc:
            raise Unavailable(f"image {ref} is not on this engine and could not be pulled: {engine_said(exc)}") from None
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"cannot inspect {ref}: {engine_said(exc)}") from None
    config = info.get("Config") or {}
    return str(info["Id"]), dict(config.get("Labels") or {}), str(config.get("User") or "")


def check_image_chip(ref: str, labels: dict[str, str], sku_id: str, chip_id: str) -> str | None:
    """The image's chip must be the SKU's (an A3 image on a 910B host fails at run time); returns its stack."""
    chip = labels.get(f"{LABEL_PREFIX}.chip")
    if chip is None:
        raise InputError(f"{ref} has no {LABEL_PREFIX}.chip label: not an ascendkit image, so its chip cannot be checked")
    if chip != chip_id:
        raise InputError(f"{ref} is built for chip {chip!r}; --hw {sku_id} needs an image for chip {chip_id!r}")
    return labels.get(f"{LABEL_PREFIX}.stack")


def image_job_of(labels: dict[str, str], stack: str | None) -> ImageJob:
    """The framework and release an image carries, from its labels (images built before the
    framework label carry :data:`~buildkit.framework.UNLABELLED`: their only framework then)."""
    name = labels.get(f"{LABEL_PREFIX}.framework", UNLABELLED)
    rollout = labels.get(f"{LABEL_PREFIX}.rollout", "vllm")  # images built before the label roll out with vLLM
    return ImageJob(stack, labels.get(f"{LABEL_PREFIX}.version.{name}"), name, rollout)


PARQUET_MAGIC = b"PAR1"


def check_data_dir(path: Path) -> None:
    """``--data`` must hold the two parquet files the job reads (smoke_tests/grpo_smoke.yaml)."""
    if not path.is_dir():
        raise InputError(f"--data {path}: not a directory (one holding train.parquet and test.parquet)")
    for name in DATA_FILES:
        file = path / name
        if not file.is_file():
            raise InputError(
                f"--data {path}: no {name} in it (the job reads train.parquet and test.parquet; leave --data out to generate them)"
            )
        try:
            with file.open("rb") as handle:
                magic = handle.read(len(PARQUET_MAGIC))
        except OSError as exc:
            raise InputError(f"--data {file}: cannot read: {exc.strerror}") from None
        if magic != PARQUET_MAGIC:
            raise InputError(f"--data {file}: not a parquet file (it does not start with PAR1)")


def check_visible(visible: list[int], sku_id: str, sku: Sku) -> None:
    """``--devices`` must name NPUs the SKU has: ids 0 to npus_per_node - 1."""
    beyond = [i for i in visible if i >= sku.npus_per_node]
    if beyond:
        raise InputError(
            f"--devices: {sku_id} has {sku.npus_per_node} NPUs per node (ids 0-{sku.npus_per_node - 1}); {beyond[0]} is not one of them"
        )


def check_request(request: SmokeRequest) -> DevicePlan:
    """Everything about a request that needs no engine, so a mistake is exit 2 (or 3) before the
    engine is contacted: the options, the paths, the report directory and the host's devices."""
    if request.check_only and not request.config_check:
        raise InputError("--check and --no-config-check exclude each other")
    if not IMAGE_REFERENCE.match(request.image):
        raise InputError(f"--image {request.image!r} is not an image reference: NAME[:TAG] or NAME@sha256:<64 hex>")
    if request.model_path is not None and not request.model_path.is_dir():
        raise InputError(f"--model-path {request.model_path}: not a directory (a local Qwen2.5-0.5B-Instruct)")
    if request.data_path is not None:
        check_data_dir(request.data_path)
    if request.visible is not None:
        check_visible(request.visible, request.sku_id, request.sku)
    check_output_dir(request.out, "report directory (--out)")
    if request.check_only:
        devices = DevicePlan((), (), (), notes=("--check: the config check only, no devices used",))
    else:
        devices = plan_devices(request.sku_id, request.sku, request.visible, request.host_root)
    if devices.has_npus and request.model_path is None:
        raise InputError("--model-path is required on a host with NPUs (a local Qwen2.5-0.5B-Instruct; docs/smoke.md)")
    return devices


def run_smoke(client: docker.APIClient, request: SmokeRequest, echo: Callable[[str], None] | None = None) -> SmokeReport:
    """The config check, doctor, then (on a host with NPUs) the GRPO job; writes report.json,
    report.md and a PNG to ``out``."""
    devices = check_request(request)
    started = time.monotonic()
    deadline = started + request.timeout
    image_id, labels, config_user = _image_labels(client, request.image)
    image = image_job_of(labels, check_image_chip(request.image, labels, request.sku_id, request.chip_id))
    spec = spec_for(image, request.job, request.facts)  # the image's framework decides which jobs it has
    job = build_job(
        spec,
        request.sku,
        image,
        facts=request.facts,
        steps=request.steps,
        data=DATA_DIR if request.data_path else GENERATED_DATA,
        extra=check_overrides(list(request.overrides), image.framework),
        extra_env=request.env,
    )
    what = f"{title_of(image.framework)} {job.name.upper()}"
    try:
        request.out.mkdir(parents=True, exist_ok=True)
        for stale in (
            "doctor.log",
            "job.log",
            "report.png",
            "config-check.log",
            "job-config.yaml",
            "job-args.json",
        ):  # never an earlier run's
            (request.out / stale).unlink(missing_ok=True)
        user_name, uid, gid = ("root", 0, 0) if request.as_root else image_user(labels, config_user)
        data_note = prepare_data_dir(request.out, uid, gid)
    except OSError as exc:
        raise OutputError(f"--out {request.out}: cannot use the report directory: {exc.strerror}") from None
    groups, device_notes = device_groups(devices, uid, gid)
    run_as = "root" if request.as_root else None  # None: the image's own user
    mounts: dict[str, tuple[str, str]] = {str(SMOKE_DIR): (SMOKE_FILES, "ro"), str(request.out.resolve()): (OUT_DIR, "rw")}
    if request.model_path is not None:
        mounts[str(request.model_path.resolve())] = (MODEL_DIR, "ro")
    if request.data_path is not None:
        mounts[str(request.data_path.resolve())] = (DATA_DIR, "ro")
    host_config = host_config_args(devices, mounts, privileged=request.privileged, groups=groups)
    data: dict[str, Any] = {
        "format": "ascendkit-smoke/1",
        "sku": request.sku_id,
        "product": request.sku.product,
        "image": {
            "ref": request.image,
            "id": image_id,
            "stack": image.stack,
            "chip": request.chip_id,
            "framework": image.framework,
            "version": image.version,
        },
        "settings": {
            "steps": request.steps,
            "timeout_s": request.timeout,
            "stall_s": request.stall_after,
            "devices": list(devices.npus),
            "privileged": request.privileged,
            "user": f"{user_name} ({uid}:{gid})" + (", --as-root" if request.as_root else ""),
            "device_groups": list(groups),
            "network": host_config.get("network_mode", "default"),
            "host_env": dict(devices.env),
            "model_path": str(request.model_path) if request.model_path else None,
            "data": str(request.data_path) if request.data_path else f"generated (smoke_tests/gsm8k_synth.py, {job.train_rows} rows)",
            "baseline": request.baseline_name,
        },
        "host_notes": [*devices.notes, *device_notes, *([data_note] if data_note else [])],
        "job": {
            "framework": job.framework,
            "name": job.name,
            "command": job.argv,
            "env": job.env,
            "appended": list(job.appended),  # what the framework added for the image's release
        },
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
            facts=request.facts,
            sku=request.sku,
            driver_binds=devices.driver_binds(),
            user=run_as,
        )
        data["config_check"] = check
        if "config" in check:
            data["files"]["job_config"] = check["config"]
        if not check["passed"]:
            return finish("failed", ExitCode.CHECK_FAILED, f"config check: {check['error']}; see config-check.log")
        if request.check_only:
            title = title_of(job.framework)
            if job.check_style == "parser":
                message = f"{title} parsed the {what} job's flags in the image and they pass its start-up checks; nothing trained"
            else:
                message = f"{title} composed the {what} job's config in the image and it passes {title}'s start-up checks; nothing trained"
            return finish("checked", ExitCode.OK, message)

    data["files"]["doctor_log"] = "doctor.log"
    doctor = run_container(
        client,
        image_id,
        ["ascendkit", "doctor", "--json"],
        environment={RUNTIME_ENV: engine_runtime(client), **dict(devices.env)},
        log_path=request.out / "doctor.log",
        deadline=min(deadline, time.monotonic() + 600),
        host_config=host_config,
        want_stdout=True,
        user=run_as,
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
            + (
                f"the job's {'flags' if job.check_style == 'parser' else 'config'} passed {what.split()[0]}'s checks and "
                if request.config_check
                else ""
            )
            + f"doctor's preflight passed in the image; {what} not run",
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
        environment={**job.env, **dict(devices.env)},
        echo=echo,
        watch=watch,
        user=run_as,
    )
    steps = parse_log((request.out / "job.log").read_text(encoding="utf-8", errors="replace").splitlines())
    data["job"].update(exit_code=result.exit_code, timed_out=result.timed_out, steps_logged=len(steps))
    checks = judge(steps, request.steps, framework(job.framework).gate(job.name))
    comparison: Comparison | None = None
    if request.baseline is not None and steps:
        try:
            comparison = compare_runs(steps, request.baseline, None, 4)
            data["comparison"] = comparison.describe()
        except InputError as exc:  # e.g. the runs share no step: a failed gate, not a lost report
            checks.append(Check("baseline gate", "error", str(exc)))
    data["checks"] = [c.__dict__ for c in checks]
    if steps:
        from buildkit.accuracy.plot import plot_runs

        plot_runs(steps, request.baseline, request.out / "report.png", title=f"{what} smoke on {request.sku_id}: {request.image}")
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
        why = watch.diagnose(f"the job exited with {result.exit_code} at {watch.where()}")
        data["job"]["stall"] = why.describe()  # what the log points at: the same diagnosis as a stall's
        return finish("failed", ExitCode.CHECK_FAILED, f"the job exited with {result.exit_code}; see job.log; likely: {why.causes[0]}")
    failed = [c.name for c in checks if c.status == "error"]
    if comparison is not None and not comparison.passed:
        failed += [f"baseline gate: {m.name}" for m in comparison.metrics if not m.passed]
    if failed:
        return finish("failed", ExitCode.CHECK_FAILED, "failed: " + ", ".join(failed))
    return finish("passed", ExitCode.OK, f"{request.steps} {what} steps trained and passed every check")
