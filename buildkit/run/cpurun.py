"""A CPU run of a smoke job: smoke's config check of it, its own entry point run to the accelerator boundary, and
one training step through the framework's own code, in the job's packages, on a machine without NPUs.

Where the packages are is a :class:`Place`: a built image (``ascendkit smoke --cpu --image``: a
container of it, smoke_tests/ mounted read-only) or a local environment (``--python``: CI's CPU
environments of each stack, :mod:`buildkit.run.cpuenv`). The job is the one ``ascendkit smoke``
runs on the SKU (:func:`buildkit.run.job.build_job`), with a tiny random model of its architecture
and the synthetic data in place of the weights and the dataset. Writes ``cpu-report.json`` and
``cpu-report.md``; what a CPU run proves and what it cannot is docs/smoke.md's "A CPU run".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from buildkit.framework import framework
from buildkit.fsio import write_atomic
from buildkit.matrix.model import Sku
from buildkit.resources import SMOKE_DIR
from buildkit.run.configcheck import CHECK_ENV, CHECK_TIMEOUT_S, judge_config_check
from buildkit.run.cpuverdict import Verdict, judge_boundary, judge_step
from buildkit.run.job import SMOKE_FILES, ImageJob, Job, JobFacts, build_job, spec_for

# The jobs with a training step on CPU, per framework.
STEP_PROGRAMS = {
    ("verl", "grpo"): "cpu_step_verl.py",
    ("verl", "sft"): "cpu_step_verl_sft.py",
    ("openrlhf", "grpo"): "cpu_step_openrlhf.py",
}
DEFAULT_BOUND_S = 900.0
# A CPU run must not ask the device backends to load: torch_npu needs the host's driver. One thread per process:
# the model is tiny, and the run's processes (the job, Ray's workers, the step) share the host's cores with whatever
# else it runs; each spinning a thread per core made a loaded 2-core machine's step 10x slower (20 s to 260 s).
CPU_ENV = {
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    "HYDRA_FULL_ERROR": "1",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# What a framework's CPU run needs besides ({smoke}: smoke_tests/ as the place sees it). The Ascend fork of OpenRLHF
# picks its code path by whether torch_npu can be found (its NPU path, as in the image): the stand-in of
# smoke_tests/cpu_standins/torch_npu, first on the path; DeepSpeed then picks its npu accelerator, which needs torch.npu,
# so it is told to use its cpu one.
FRAMEWORK_CPU_ENV = {"openrlhf": {"PYTHONPATH": "{smoke}/cpu_standins", "DS_ACCELERATOR": "cpu"}}


def cpu_env(framework: str, smoke_dir: str, job_env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of a CPU run: the job's, the CPU run's, the framework's, then a variation's (paths joined)."""
    env = {**job_env, **CPU_ENV}
    for key, value in [*FRAMEWORK_CPU_ENV.get(framework, {}).items(), *extra.items()]:
        value = value.replace("{smoke}", smoke_dir)
        env[key] = f"{value}{os.pathsep}{env[key]}" if key == "PYTHONPATH" and env.get(key) else value
    return env


class Place(Protocol):
    """Where the job's packages are: runs ``python3 PROGRAM ARGS`` there with ``work`` at hand."""

    smoke_dir: str  # smoke_tests/ as the place sees it
    work_dir: str  # the run's work directory as the place sees it
    description: str

    def run(self, argv: list[str], env: dict[str, str], log: Path, timeout: float, stdout: Path | None = None) -> int | None:
        """Exit code, None at the timeout; output appended to ``log`` (stdout to ``stdout`` instead, when given)."""
        ...


@dataclass
class LocalPlace:
    """A Python environment on this machine (a venv's python): its bin directory first on PATH."""

    python: Path
    work: Path
    smoke_dir: str = str(SMOKE_DIR)
    description: str = ""

    def __post_init__(self) -> None:
        self.work_dir = str(self.work)
        self.description = self.description or f"the environment of {self.python}"

    def run(self, argv: list[str], env: dict[str, str], log: Path, timeout: float, stdout: Path | None = None) -> int | None:
        bin_dir = str(self.python.parent)
        full = {
            **os.environ,
            **env,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "VIRTUAL_ENV": str(self.python.parent.parent),
        }
        with log.open("a", encoding="utf-8") as out, contextlib.ExitStack() as stack:
            printed = stack.enter_context(stdout.open("w", encoding="utf-8")) if stdout is not None else None
            try:
                # In the work directory: Hydra writes its outputs/ where the job starts.
                return subprocess.run(
                    argv, env=full, cwd=self.work, stdout=printed or out, stderr=out if printed else subprocess.STDOUT,
                    timeout=timeout, check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                return None


@dataclass
class CpuRun:
    """What one CPU run found, for the report."""

    stack: str | None
    job: str
    framework: str
    version: str | None
    place: str
    boundary: Verdict
    step: Verdict | None
    boundary_result: dict[str, Any]
    step_result: dict[str, Any] | None
    seconds: float
    left_out: list[dict[str, str]] = field(default_factory=list)
    config_check: dict[str, Any] | None = None  # the report's config_check section, as smoke's (None: not run)

    @property
    def passed(self) -> bool:
        checked = self.config_check is None or bool(self.config_check["passed"])
        return checked and self.boundary.reached and (self.step is None or self.step.reached)

    def failure(self) -> str | None:
        """The first failure, naming stack, job and step."""
        who = f"{self.stack or 'image'} {self.framework} {self.job}"
        if self.config_check is not None and not self.config_check["passed"]:
            return f"{who}: the config check refused the job: {self.config_check['error']}"
        if not self.boundary.reached:
            where = f"{self.boundary.kind} at {self.boundary.where}: {self.boundary.detail}"
            return f"{who}: the entry point stopped before the accelerator boundary: {where}"
        if self.step is not None and not self.step.reached:
            return f"{who}: the training step failed: {self.step.kind} at {self.step.where}: {self.step.detail}"
        return None

    def data(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "job": self.job,
            "framework": self.framework,
            "version": self.version,
            "place": self.place,
            "passed": self.passed,
            "failure": self.failure(),
            "boundary": {
                **self.boundary.describe(),
                "seconds": self.boundary_result.get("seconds"),
                "peak_rss_mib": self.boundary_result.get("peak_rss_mib"),
            },
            "step": None if self.step is None else {**self.step.describe(), "result": self.step_result},
            "seconds": self.seconds,
            "left_out": self.left_out,
            "config_check": self.config_check,
        }


@dataclass(frozen=True)
class Variation:
    """A change to a run: how the harness plants each failure class in a copy of the job (and the parts it runs)."""

    overrides: tuple[str, ...] = ()  # appended to the job's
    env: tuple[tuple[str, str], ...] = ()
    after_setup: tuple[tuple[str, ...], ...] = ()  # commands run where the job runs, after its model and data are made
    check: bool = True  # the config check smoke runs first (the job's module composing or parsing it, with these overrides)
    boundary: bool = True
    step: bool = True
    prepare: bool = True  # False: the work directory already holds the model and the data (a copy of another run's)


def cpu_job(spec_image: ImageJob, job_name: str, sku: Sku, facts: JobFacts, place: Place) -> Job:
    """The SKU's job, its model and data in the run's work directory."""
    spec = spec_for(spec_image, job_name, facts)
    return build_job(
        spec, sku, spec_image, facts=facts, steps=1, model=f"{place.work_dir}/model", data=f"{place.work_dir}/data",
        reward=f"{place.smoke_dir}/gsm8k_reward.py",
    )  # fmt: skip


def boundary_command(job: Job) -> tuple[list[str], bool]:
    """The job's command for its run to the boundary, and whether it runs on Ray. A torchrun job runs one rank of its
    N (every rank runs the same code up to the device; N ranks of a 16-NPU SKU on a CPU box would only cost memory),
    and needs no Ray head."""
    command = list(job.command)
    if Path(command[0]).name != "torchrun":
        return command, True
    return [re.sub(r"^(--nproc[-_]per[-_]node=).*$", r"\g<1>1", part) for part in command], False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_cpu(
    place: Place,
    work: Path,
    image: ImageJob,
    job_name: str,
    sku: Sku,
    facts: JobFacts,
    *,
    bound: float = DEFAULT_BOUND_S,
    left_out: list[dict[str, str]] | None = None,
    progress: Callable[[str], None] | None = None,
    variation: Variation = Variation(),
) -> CpuRun:
    """The three parts of a CPU run of ``job_name`` at ``place`` (config check, boundary, step); ``work`` is the host's
    side of its work directory."""
    say = progress or (lambda _line: None)
    started = time.monotonic()
    job = cpu_job(image, job_name, sku, facts, place)
    overrides = (*job.overrides, *variation.overrides)
    env = cpu_env(image.framework, place.smoke_dir, job.env, dict(variation.env))
    for stale in ("boundary.json", "step.json", "boundary.log", "step.log", "setup.log", "boundary-driver.log"):
        (work / stale).unlink(missing_ok=True)
    setup = work / "setup.log"
    smoke = place.smoke_dir
    generate = [
        ["python3", f"{smoke}/cpu_model.py", "--out", f"{place.work_dir}/model"],
        [
            "python3",
            f"{smoke}/gsm8k_synth.py",
            "--out",
            f"{place.work_dir}/data",
            "--train",
            str(max(64, job.batch * job.steps)),  # every step's batch, as the job's own generator would
            "--test",
            "16",
            "--format",
            job.data_format,
        ],
    ]
    prepare = [*(generate if variation.prepare else []), *(list(command) for command in variation.after_setup)]
    say(f"{job_name}: a random model of the job's architecture and the job's synthetic data")
    for argv in prepare:
        code = place.run(argv, env, setup, 600)
        if code != 0:
            log = setup.read_text(encoding="utf-8", errors="replace")
            verdict = judge_step(None, log)
            return CpuRun(
                image.stack, job_name, image.framework, image.version, place.description,
                Verdict(False, verdict.where, verdict.kind, f"{Path(argv[1]).name} failed (exit {code}): {verdict.detail}"),
                None, {}, None, round(time.monotonic() - started, 1), left_out or [],
            )  # fmt: skip
    check = config_check_at(place, work, job, image, overrides, env, sku, facts) if variation.check else None
    if check is not None:
        say(f"{job_name}: config check {'passed' if check['passed'] else 'REFUSED: ' + str(check['error'])}")
    boundary_result: dict[str, Any] = {}
    boundary = Verdict(True, "not run", "skipped")
    if variation.boundary:
        command, on_ray = boundary_command(job)
        say(f"{job_name}: {' '.join(command)} to its accelerator boundary (bound {bound:.0f} s)")
        boundary_argv = ["python3", f"{smoke}/cpu_boundary.py", "--out", f"{place.work_dir}/boundary.json"]
        boundary_argv += ["--log", f"{place.work_dir}/boundary.log", "--bound", str(bound), *([] if on_ray else ["--no-ray"])]
        boundary_argv += ["--", *command, *overrides]
        place.run(boundary_argv, env, work / "boundary-driver.log", bound + 120)
        boundary_result = _read_json(work / "boundary.json") or {"exit_code": None, "error": "the boundary run wrote no result"}
        log_path = work / "boundary.log"
        log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
        boundary = judge_boundary(image.framework, boundary_result, log)
        say(f"{job_name}: {'boundary: ' if boundary.reached else 'STOPPED: ' + boundary.kind + ' at '}{boundary.where}")
    step = step_result = None
    program = STEP_PROGRAMS.get((image.framework, job_name))
    if program is not None and variation.step:
        say(f"{job_name}: one training step through {image.framework}'s own code")
        code = place.run(
            ["python3", f"{smoke}/{program}", "--out", f"{place.work_dir}/step.json", "--module", job.module, "--", *overrides],
            env,
            work / "step.log",
            1200,
        )
        step_result = _read_json(work / "step.json") if code == 0 else None
        step = judge_step(step_result, (work / "step.log").read_text(encoding="utf-8", errors="replace"))
        say(f"{job_name}: step {'passed: ' if step.reached else 'FAILED: '}{step.detail}")
    return CpuRun(
        image.stack, job_name, image.framework, image.version, place.description, boundary, step,
        boundary_result, step_result, round(time.monotonic() - started, 1), left_out or [], check,
    )  # fmt: skip


def config_check_at(
    place: Place, work: Path, job: Job, image: ImageJob, overrides: tuple[str, ...], env: dict[str, str], sku: Sku, facts: JobFacts
) -> dict[str, Any]:
    """smoke's config check of the job, at ``place``: its module composing (or parsing) the job's arguments with the
    framework's own code, then the framework's checks of what it printed, as ``smoke --check`` runs them in an image."""
    argv = [part.replace(SMOKE_FILES, place.smoke_dir, 1) for part in framework(job.framework).check_argv(job.module, overrides)]
    log, printed = work / "config-check.log", work / "config-check.out"
    for stale in (log, printed):
        stale.unlink(missing_ok=True)
    code = place.run(argv, {**env, **CHECK_ENV}, log, CHECK_TIMEOUT_S, stdout=printed)
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    said = printed.read_text(encoding="utf-8", errors="replace") if printed.is_file() else ""
    return judge_config_check(code, text, said, job, image, work, facts=facts, sku=sku, command=argv)


def render_markdown(runs: list[CpuRun]) -> str:
    lines = ["# CPU run of the smoke jobs", ""]
    lines += [
        "The jobs' own entry points and one training step through the frameworks' own code, on a machine without NPUs.",
        'This is not a smoke run: what only an NPU proves is in docs/smoke.md ("A CPU run").',
        "",
        "| stack | job | framework | config check | boundary | seconds | step | loss | grad norm | step seconds | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run.step_result or {}
        c = run.config_check
        check = "-" if c is None else f"passed ({len(c['checks'])} checks)" if c["passed"] else f"**refused**: {c['error']}"
        bound = ("reached: " if run.boundary.reached else f"**{run.boundary.kind}**: ") + run.boundary.where
        step = "-" if run.step is None else ("passed" if run.step.reached else f"**{run.step.kind}**: {run.step.detail}")
        lines.append(
            f"| {run.stack or '-'} | {run.job} | {run.framework} {run.version or ''} | {check} | {bound} "
            f"| {run.boundary_result.get('seconds', '-')} "
            f"| {step} | {s.get('loss', '-')} | {s.get('grad_norm', '-')} | {s.get('seconds', '-')} | {s.get('peak_rss_mib', '-')} |"
        )
    for run in runs:
        lines += ["", f"## {run.stack or 'image'} {run.job}", "", f"- where: {run.place}"]
        if run.config_check is not None:
            c = run.config_check
            said = [f"{k['name']} {k['status']}" for k in c["checks"] if k.get("status") != "ok"]
            lines.append(
                f"- config check: `{' '.join(c['command'][:4])} ...`: "
                + (f"{len(c['checks'])} checks passed" if c["passed"] else f"refused: {c['error']}")
                + (f" ({'; '.join(said)})" if said else "")
            )
        lines.append(f"- ran before the boundary: {', '.join(run.boundary.ran) or 'nothing recognised'}")
        if run.boundary.detail:
            lines.append(f"- {'boundary' if run.boundary.reached else 'error'}: `{run.boundary.detail}`")
        if run.step_result and run.step_result.get("job") == "sft":
            s = run.step_result
            lines.append(
                f"- step: {s['batch']['sequences']} sequences of {s['batch']['dataset_rows']} rows; {s['trained_tokens']} tokens trained "
                f"(LoRA rank {s['lora_rank']}); {s['parameters_changed']} of {s['parameters']} trained tensors moved; {s['differs']}"
            )
        elif run.step_result:
            s = run.step_result
            lines.append(
                f"- step: {s['batch']['prompts']} prompts x {s['batch']['responses_per_prompt']} responses; rewards {s['rewards'][:8]}...; "
                f"advantages {s['advantages'][:8]}...; reward calls {s['reward_calls']}; groups whose reward varies "
                f"{s['reward_varies_within_groups']} (the first response of each group is the worked answer); {s['differs']}"
            )
        if run.left_out:
            lines += ["", "Packages not as in the image (left out, built here, or replaced):", ""]
            lines += [f"- {item['package']}: {item['why']}" for item in run.left_out]
    return "\n".join(lines) + "\n"


def write_report(out: Path, runs: list[CpuRun], planted: list[dict[str, Any]] | None = None) -> None:
    """cpu-report.json and .md; ``planted``: the failures a test planted, each with what the check said of it."""
    data: dict[str, Any] = {"runs": [r.data() for r in runs]}
    text = render_markdown(runs)
    if planted:
        data["planted"] = planted
        text += "\n## Failures planted in copies of the job, and what the check said\n\n"
        text += "| planted | expected | named | said |\n|---|---|---|---|\n"
        text += "".join(f"| {p['name']} | {p['expected']} | {'yes' if p['named'] else '**no**'} | {p['said']} |\n" for p in planted)
    write_atomic(out / "cpu-report.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_atomic(out / "cpu-report.md", text)
