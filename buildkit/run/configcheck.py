"""The config check: the job's exact module and arguments run in the image as far as the framework's
own checks go, on no device.

verl composes its config there (Hydra's ``--cfg job``, struct mode) and prints it; OpenRLHF
parses its flags with its own parser and runs its own assertions, up to where it would start Ray
(``smoke_tests/openrlhf_args.py``). ascendkit reads what they printed and runs the checks the
framework would make only once it is on the cluster. Nothing touches an NPU, so it runs on any host.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import docker

from buildkit.fsio import write_atomic
from buildkit.matrix.model import Sku
from buildkit.resources import SMOKE_DIR
from buildkit.run.container import run_container
from buildkit.run.doctor.base import Check
from buildkit.run.job import SMOKE_FILES, ImageJob, Job, JobFacts
from buildkit.run.openrlhfargs import check_args, parse_printed_args
from buildkit.run.verlconfig import check_config, check_sft_config, parse_printed_config

CHECK_TIMEOUT_S = 900.0  # importing a framework's stack under emulation takes minutes; composing takes seconds
# The check imports the framework and parses or composes; nothing touches an NPU, so torch must not
# try to load torch_npu's device backend (that needs the host's driver, absent on a build host).
CHECK_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
_CHECK_ERROR_HINTS = ("Could not override", "not in struct", "Could not append", "Error merging", "Error parsing", "Error:")
_IMPORT_ERROR = re.compile(r"^(?:ModuleNotFoundError|ImportError|OSError): .*")
_ARGPARSE_ERROR = re.compile(r"^[\w.-]+: error: .*")
_ASSERTION = re.compile(r"^AssertionError(?:: .*)?$")
CONFIG_FILES = {"hydra": "job-config.yaml", "parser": "job-args.json"}


def composition_error(log: str, code: int, framework: str = "verl", module: str = "main_ppo") -> str:
    """Why a check run failed, in a sentence: the framework missing, an import failing, or the
    framework's own message (Hydra's, argparse's, an assertion's)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    imports = [line for line in lines if _IMPORT_ERROR.match(line)]
    if any(f"No module named '{framework}'" in line for line in lines):  # python -m says it its own way
        return f"{framework} is not installed in this image (No module named '{framework}'): nothing here can run the job"
    if imports and re.search(r"lib(?:hccl|ascend\w*|acl\w*|runtime|ge_runner|hccl_\w+)\.so", imports[-1]):
        return (
            f"torch_npu could not load the CANN or driver libraries (exit {code}): {imports[-1]}; run the check where the "
            "image's CANN is complete and, for driver libraries, on a host with the Ascend driver (it is mounted read-only)"
        )
    if imports:
        return f"{framework}'s {module} could not be imported in the image (exit {code}): {imports[-1]}"
    if framework == "openrlhf":
        said = [line for line in lines if _ARGPARSE_ERROR.match(line) or _ASSERTION.match(line)]
        return f"OpenRLHF refused the job's arguments (exit {code}): " + (" | ".join(said[-2:] or lines[-3:]) or "no output")
    hits = [line for line in lines if any(h in line for h in _CHECK_ERROR_HINTS)]
    return f"verl refused the job's config (exit {code}): " + (" | ".join(hits[:3] or lines[-3:]) or "no output")


def _checks(job: Job, printed: str, image: ImageJob, facts: JobFacts, sku: Sku) -> tuple[list[Check], str] | str:
    """The framework's printed config or arguments -> (the checks, the text to keep), or why none was printed."""
    if job.check_style == "parser":
        args = parse_printed_args(printed)
        if args is None:
            return "the check exited 0 but printed no parsed arguments (is the module an OpenRLHF training entry point?)"
        return check_args(args, npus_per_node=sku.npus_per_node, nnodes=job.nnodes, steps=job.steps), json.dumps(args, indent=2) + "\n"
    parsed = parse_printed_config(printed)
    if parsed is None:
        return "the command exited 0 but printed no composed config (is --cfg job reaching Hydra?)"
    config, text = parsed
    if job.name == "sft":
        return check_sft_config(config, verl=image.verl, first_engine=facts.verl_sft_trainer), text
    return check_config(config, verl=image.verl, first_autodetect=facts.verl_npu_autodetect), text


def run_config_check(
    client: docker.APIClient,
    image_id: str,
    job: Job,
    image: ImageJob,
    out: Path,
    deadline: float,
    *,
    facts: JobFacts,
    sku: Sku,
    driver_binds: dict[str, dict[str, str]] | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The job's module and arguments in the image, as far as the framework's own checks go.

    Writes the log to ``config-check.log`` and what the framework made of the job to
    ``job-config.yaml`` (verl) or ``job-args.json`` (OpenRLHF); returns the report's
    ``config_check`` section (``passed`` False with ``error`` when the framework refused)."""
    binds = dict(driver_binds or {})  # the host's driver, where there is one, lets torch_npu load
    if job.check_style == "parser":
        binds[str(SMOKE_DIR)] = {"bind": SMOKE_FILES, "mode": "ro"}  # the argument check script
    result = run_container(
        client,
        image_id,
        job.check_argv(),
        log_path=out / "config-check.log",
        deadline=min(deadline, time.monotonic() + CHECK_TIMEOUT_S),
        environment={**job.env, **CHECK_ENV},
        host_config={"binds": binds} if binds else None,  # no devices: the check needs none
        want_stdout=True,
        user=user,
    )
    section: dict[str, Any] = {"command": job.check_argv(), "style": job.check_style, "log": "config-check.log", "checks": []}
    if result.exit_code is None:
        return {**section, "passed": False, "error": "the config check did not finish before the timeout"}
    if result.exit_code != 0:
        log = (out / "config-check.log").read_text(encoding="utf-8", errors="replace")
        return {**section, "passed": False, "error": composition_error(log, result.exit_code, job.framework, job.module)}
    found = _checks(job, result.stdout, image, facts, sku)
    if isinstance(found, str):
        return {**section, "passed": False, "error": found}
    checks, text = found
    name = CONFIG_FILES[job.check_style]
    write_atomic(out / name, text)
    failed = [c for c in checks if c.status == "error"]
    section.update(config=name, checks=[c.__dict__ for c in checks], passed=not failed)
    if failed:
        section["error"] = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return section
