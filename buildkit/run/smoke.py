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
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from buildkit.accuracy.compare import Comparison, compare_runs
from buildkit.accuracy.metrics import StepMetrics, parse_log
from buildkit.doctor.base import EXIT_NO_DEVICES, RUNTIME_ENV, Check
from buildkit.errors import ExitCode, InputError, OutputError, Unavailable
from buildkit.framework import UNLABELLED, framework, title_of
from buildkit.plan import LABEL_PREFIX
from buildkit.reach import engine_said
from buildkit.resources import SMOKE_DIR
from buildkit.run.configcheck import run_config_check
from buildkit.run.container import engine_runtime, run_container
from buildkit.run.devices import DevicePlan, device_groups, host_config_args, image_user, prepare_data_dir
from buildkit.run.job import (
    DATA_DIR,
    GENERATED_DATA,
    MODEL_DIR,
    OUT_DIR,
    SMOKE_FILES,
    ImageJob,
    Job,
    JobSpec,
    build_job,
    check_overrides,
    spec_for,
)
from buildkit.run.jobwatch import JobWatch
from buildkit.run.report import judge, write_reports
from buildkit.run.smokereplay import judge_replay_run, replay_job, replay_mounts, replay_note
from buildkit.run.smokerequest import SmokeRequest, check_request

__all__ = ["SmokeReport", "SmokeRequest", "check_image_chip", "image_job_of", "run_smoke"]  # SmokeRequest: where it always was


@dataclass
class SmokeReport:
    outcome: str
    exit_code: int
    message: str
    data: dict[str, Any]


def _image_labels(client: docker.APIClient, ref: str) -> tuple[str, dict[str, str], str, dict[str, str]]:
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
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return str(info["Id"]), dict(config.get("Labels") or {}), str(config.get("User") or ""), env


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


def run_smoke(client: docker.APIClient, request: SmokeRequest, echo: Callable[[str], None] | None = None) -> SmokeReport:
    """The config check, doctor, then (on a host with NPUs) the job; writes report.json,
    report.md and a PNG to ``out``."""
    devices = check_request(request)
    deadline = time.monotonic() + request.timeout
    image_id, labels, config_user, image_env = _image_labels(client, request.image)
    image = image_job_of(labels, check_image_chip(request.image, labels, request.sku_id, request.chip_id))
    spec = spec_for(image, request.job, request.facts)  # the image's framework decides which jobs it has
    if request.replay is not None:  # the NPU side of a replay, held to the bundle's names before anything runs
        expansion = image_env.get("HCCL_OP_EXPANSION_MODE")
        job = replay_job(request.replay, request.sku, image, request.facts, expansion, tuple(request.overrides), request.env)
    else:
        job = _job(request, spec, image)
    user, groups, notes = _prepare_out(request, devices, labels, config_user)
    run = _Run(client, request, devices, deadline, image_id, image, job, _host_config(request, devices, groups))
    run.data = run.report_data(user, groups, notes)
    return run.config_check() or run.doctor() or run.train(echo)


def _job(request: SmokeRequest, spec: JobSpec, image: ImageJob) -> Job:
    return build_job(
        spec,
        request.sku,
        image,
        facts=request.facts,
        steps=request.steps,
        data=DATA_DIR if request.data_path else GENERATED_DATA,
        extra=check_overrides(list(request.overrides), image.framework),
        extra_env=request.env,
    )


def _prepare_out(
    request: SmokeRequest, devices: DevicePlan, labels: dict[str, str], config_user: str
) -> tuple[tuple[str, int, int], tuple[int, ...], list[str]]:
    """The report directory emptied of an earlier run's files, and who the containers run as:
    (name, uid, gid), the device groups it joins, and what the host needed doing."""
    try:
        request.out.mkdir(parents=True, exist_ok=True)
        for stale in STALE:  # never an earlier run's
            (request.out / stale).unlink(missing_ok=True)
        user_name, uid, gid = ("root", 0, 0) if request.as_root else image_user(labels, config_user)
        data_note = prepare_data_dir(request.out, uid, gid)
    except OSError as exc:
        raise OutputError(f"--out {request.out}: cannot use the report directory: {exc.strerror}") from None
    groups, device_notes = device_groups(devices, uid, gid)
    return (user_name, uid, gid), tuple(groups), [*devices.notes, *device_notes, *([data_note] if data_note else [])]


STALE = ("doctor.log", "job.log", "report.png", "config-check.log", "job-config.yaml", "job-args.json")


def _host_config(request: SmokeRequest, devices: DevicePlan, groups: tuple[int, ...]) -> dict[str, Any]:
    mounts: dict[str, tuple[str, str]] = {str(SMOKE_DIR): (SMOKE_FILES, "ro"), str(request.out.resolve()): (OUT_DIR, "rw")}
    if request.model_path is not None:
        mounts[str(request.model_path.resolve())] = (MODEL_DIR, "ro")
    if request.data_path is not None:
        mounts[str(request.data_path.resolve())] = (DATA_DIR, "ro")
    if request.replay is not None:
        mounts.update(replay_mounts(request.replay))
    return host_config_args(devices, mounts, privileged=request.privileged, groups=groups)


@dataclass
class _Run:
    """One smoke run's phases, each ending the run with its report or handing on to the next."""

    client: docker.APIClient
    request: SmokeRequest
    devices: DevicePlan
    deadline: float
    image_id: str
    image: ImageJob
    job: Job
    host_config: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def what(self) -> str:
        return f"{title_of(self.image.framework)} {self.job.name.upper()}"

    @property
    def run_as(self) -> str | None:
        return "root" if self.request.as_root else None  # None: the image's own user

    def report_data(self, user: tuple[str, int, int], groups: tuple[int, ...], notes: list[str]) -> dict[str, Any]:
        request, job, image, devices = self.request, self.job, self.image, self.devices
        name, uid, gid = user
        return {
            "format": "ascendkit-smoke/1",
            "sku": request.sku_id,
            "product": request.sku.product,
            "image": {
                "ref": request.image,
                "id": self.image_id,
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
                "user": f"{name} ({uid}:{gid})" + (", --as-root" if request.as_root else ""),
                "device_groups": list(groups),
                "network": self.host_config.get("network_mode", "default"),
                "host_env": dict(devices.env),
                "model_path": str(request.model_path) if request.model_path else None,
                "data": str(request.data_path) if request.data_path else f"generated (smoke_tests/gsm8k_synth.py, {job.train_rows} rows)",
                "baseline": request.baseline_name,
            },
            "host_notes": notes,
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
            "replay": replay_note(self.request.replay, self.image),
            "files": {},
        }

    def finish(self, outcome: str, code: ExitCode, message: str) -> SmokeReport:
        self.data.update(outcome=outcome, exit_code=int(code), message=message)
        write_reports(self.request.out, self.data)
        return SmokeReport(outcome, int(code), message, self.data)

    def config_check(self) -> SmokeReport | None:
        """The job checked in the image by its framework (unless --no-config-check); --check ends here."""
        request, job = self.request, self.job
        if not request.config_check:
            return None
        self.data["files"]["config_check_log"] = "config-check.log"
        check = run_config_check(
            self.client,
            self.image_id,
            job,
            self.image,
            request.out,
            self.deadline,
            facts=request.facts,
            sku=request.sku,
            driver_binds=self.devices.driver_binds(),
            user=self.run_as,
        )
        self.data["config_check"] = check
        if "config" in check:
            self.data["files"]["job_config"] = check["config"]
        if not check["passed"]:
            return self.finish("failed", ExitCode.CHECK_FAILED, f"config check: {check['error']}; see config-check.log")
        if not request.check_only:
            return None
        title = title_of(job.framework)
        if job.check_style == "parser":
            message = f"{title} parsed the {self.what} job's flags in the image and they pass its start-up checks; nothing trained"
        else:
            message = f"{title} composed the {self.what} job's config in the image and it passes {title}'s start-up checks; nothing trained"
        return self.finish("checked", ExitCode.OK, message)

    def doctor(self) -> SmokeReport | None:
        """doctor in the image with the devices; a host without NPUs ends here."""
        self.data["files"]["doctor_log"] = "doctor.log"
        doctor = run_container(
            self.client,
            self.image_id,
            ["ascendkit", "doctor", "--json"],
            environment={RUNTIME_ENV: engine_runtime(self.client), **dict(self.devices.env)},
            log_path=self.request.out / "doctor.log",
            deadline=min(self.deadline, time.monotonic() + 600),
            host_config=self.host_config,
            want_stdout=True,
            user=self.run_as,
        )
        if doctor.timed_out:
            return self.finish("timed-out", ExitCode.TIMED_OUT, "doctor did not finish before the timeout")
        with contextlib.suppress(ValueError):
            self.data["doctor"] = json.loads(doctor.stdout)
        if doctor.exit_code == EXIT_NO_DEVICES and not self.devices.has_npus:
            checked = (
                f"the job's {'flags' if self.job.check_style == 'parser' else 'config'} passed {self.what.split()[0]}'s checks and "
                if self.request.config_check
                else ""
            )
            message = f"no Ascend devices on this host: {checked}doctor's preflight passed in the image; {self.what} not run"
            return self.finish("no-devices", ExitCode.NO_DEVICES, message)
        if doctor.exit_code == EXIT_NO_DEVICES:
            return self.finish("failed", ExitCode.CHECK_FAILED, "the host's NPUs were mounted but doctor sees none in the container")
        if doctor.exit_code != 0:
            return self.finish("failed", ExitCode.CHECK_FAILED, f"doctor failed in the image (exit {doctor.exit_code}); see doctor.log")
        return None

    def train(self, echo: Callable[[str], None] | None) -> SmokeReport:
        """The job, watched step by step, then judged (and gated against the baseline)."""
        request, job = self.request, self.job
        self.data["files"]["job_log"] = "job.log"
        watch = JobWatch(steps=request.steps, stall_after=request.stall_after, progress=request.progress)
        result = run_container(
            self.client,
            self.image_id,
            ["sh", "-c", job.shell(generate_data=request.data_path is None)],
            log_path=request.out / "job.log",
            deadline=self.deadline,
            host_config=self.host_config,
            environment={**job.env, **dict(self.devices.env)},
            echo=echo,
            watch=watch,
            user=self.run_as,
        )
        lines = (request.out / "job.log").read_text(encoding="utf-8", errors="replace").splitlines()
        steps = parse_log(lines)
        self.data["job"].update(exit_code=result.exit_code, timed_out=result.timed_out, steps_logged=len(steps))
        failed = self.judged_replay(lines, steps) if request.replay is not None else self.judged(steps)
        if result.stalled is not None:
            self.data["job"]["stall"] = result.stalled.describe()
            message = f"{result.stalled.summary}: killed and removed; likely: {result.stalled.causes[0]}"
            return self.finish("stalled", ExitCode.TIMED_OUT, message)
        if result.timed_out:
            why = watch.diagnose(f"the job outlived --timeout {request.timeout:g}s at {watch.where()}")
            self.data["job"]["stall"] = why.describe()
            return self.finish("timed-out", ExitCode.TIMED_OUT, f"{why.summary}: killed and removed; likely: {why.causes[0]}")
        if result.exit_code != 0:
            why = watch.diagnose(f"the job exited with {result.exit_code} at {watch.where()}")
            self.data["job"]["stall"] = why.describe()  # what the log points at: the same diagnosis as a stall's
            message = f"the job exited with {result.exit_code}; see job.log; likely: {why.causes[0]}"
            return self.finish("failed", ExitCode.CHECK_FAILED, message)
        if failed:
            return self.finish("failed", ExitCode.CHECK_FAILED, "failed: " + ", ".join(failed))
        return self.finish("passed", ExitCode.OK, f"{request.steps} {self.what} steps trained and passed every check")

    def judged_replay(self, lines: list[str], steps: list[StepMetrics]) -> list[str]:
        """A replay's checks: the run's own, whether it replayed (verl's lines), and the replay method against the GPU run."""
        request = self.request
        assert request.replay is not None
        checks = judge(steps, request.steps, framework(self.job.framework).gate(self.job.name))
        replayed, verdict = judge_replay_run(request.replay, self.image, lines, steps)
        self.data["checks"] = [c.describe() for c in [*checks, *replayed]]
        if verdict is not None:
            from buildkit.accuracy.plot import plot_verdict

            self.data["comparison"] = verdict.describe()
            plot_verdict(verdict, request.out / "report.png", title=f"{self.what} replay on {request.sku_id}: {request.image}")
            self.data["files"]["plot"] = "report.png"
        return [c.name for c in [*checks, *replayed] if c.failed]

    def judged(self, steps: list[StepMetrics]) -> list[str]:
        """The run's checks and its baseline gate into the report, and the plot; returns what failed."""
        request = self.request
        checks = judge(steps, request.steps, framework(self.job.framework).gate(self.job.name))
        comparison: Comparison | None = None
        if request.baseline is not None and steps:
            try:
                comparison = compare_runs(steps, request.baseline, None, 4)
                self.data["comparison"] = comparison.describe()
            except InputError as exc:  # e.g. the runs share no step: a failed gate, not a lost report
                checks.append(Check("baseline gate", "error", str(exc)))
        self.data["checks"] = [c.describe() for c in checks]
        if steps:
            from buildkit.accuracy.plot import plot_runs

            title = f"{self.what} smoke on {request.sku_id}: {request.image}"
            plot_runs(steps, request.baseline, request.out / "report.png", title=title)
            self.data["files"]["plot"] = "report.png"
        gates = [m.check for m in comparison.metrics] if comparison is not None else []
        return [c.name for c in [*checks, *gates] if c.failed]
