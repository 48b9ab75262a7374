"""The config check: the job's exact module and arguments run in the image as far as the framework's
own checks go, on no device.

In the ``hydra`` style (verl's) Hydra composes the config there (``--cfg job``, struct mode) and
prints it; in the ``parser`` style (OpenRLHF's) the framework parses its flags with its own parser
and runs its own assertions, up to where it would start Ray (``smoke_tests/openrlhf_args.py``). The
framework's plug-in reads what was printed and runs the checks the framework would make only once
it is on the cluster. Nothing touches an NPU, so it runs on any host.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import docker

from buildkit.framework import CheckContext, framework
from buildkit.fsio import write_atomic
from buildkit.matrix.model import Sku
from buildkit.resources import SMOKE_DIR
from buildkit.run.container import run_container
from buildkit.run.job import SMOKE_FILES, ImageJob, Job, JobFacts

CHECK_TIMEOUT_S = 900.0  # importing a framework's stack under emulation takes minutes; composing takes seconds
# The check imports the framework and parses or composes; nothing touches an NPU, so torch must not
# try to load torch_npu's device backend (that needs the host's driver, absent on a build host).
CHECK_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
_IMPORT_ERROR = re.compile(r"^(?:ModuleNotFoundError|ImportError|OSError): .*")
CONFIG_FILES = {"hydra": "job-config.yaml", "parser": "job-args.json"}


def composition_error(log: str, code: int, framework_name: str, module: str) -> str:
    """Why a check run failed, in a sentence: the framework missing, an import failing, or the
    framework's own message (its plug-in reads it: Hydra's, argparse's, an assertion's)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    imports = [line for line in lines if _IMPORT_ERROR.match(line)]
    package = module.split(".", 1)[0]
    if any(f"No module named '{package}'" in line for line in lines):  # python -m says it its own way
        return f"{framework_name} is not installed in this image (No module named '{package}'): nothing here can run the job"
    if imports and re.search(r"lib(?:hccl|ascend\w*|acl\w*|runtime|ge_runner|hccl_\w+)\.so", imports[-1]):
        return (
            f"torch_npu could not load the CANN or driver libraries (exit {code}): {imports[-1]}; run the check where the "
            "image's CANN is complete and, for driver libraries, on a host with the Ascend driver (it is mounted read-only)"
        )
    if imports:
        return f"{framework_name}'s {module} could not be imported in the image (exit {code}): {imports[-1]}"
    return framework(framework_name).refusal(lines, code)


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
    log = (out / "config-check.log").read_text(encoding="utf-8", errors="replace") if result.exit_code else ""
    return judge_config_check(result.exit_code, log, result.stdout, job, image, out, facts=facts, sku=sku)


def judge_config_check(
    code: int | None,
    log: str,
    printed: str,
    job: Job,
    image: ImageJob,
    out: Path,
    *,
    facts: JobFacts,
    sku: Sku,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """The report's ``config_check`` section from how the check's run ended (``code`` None: it did not finish), its log
    and what it printed; writes the framework's reading of the job to ``out`` (``job-config.yaml`` or ``job-args.json``)."""
    argv = command or job.check_argv()
    section: dict[str, Any] = {"command": argv, "style": job.check_style, "log": "config-check.log", "checks": []}
    if code is None:
        return {**section, "passed": False, "error": "the config check did not finish before the timeout"}
    if code != 0:
        return {**section, "passed": False, "error": composition_error(log, code, job.framework, job.module)}
    context = CheckContext(job.name, image.version, facts.compat, sku.npus_per_node, job.nnodes, job.steps)
    found = framework(job.framework).config_checks(printed, context)
    if isinstance(found, str):
        return {**section, "passed": False, "error": found}
    checks, text = found
    name = CONFIG_FILES[job.check_style]
    write_atomic(out / name, text)
    failed = [c for c in checks if c.status == "error"]
    section.update(config=name, checks=[c.describe() for c in checks], passed=not failed)
    if failed:
        section["error"] = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return section
