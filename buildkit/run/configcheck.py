"""The config check: the job's exact command with ``--cfg job`` in the image, on no device.

verl composes its config there (Hydra, struct mode) and prints it; ascendkit parses it and
runs the start-up checks verl would. It needs no NPU, so it runs on any host.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import docker

from buildkit.fsio import write_atomic
from buildkit.run.container import run_container
from buildkit.run.job import ImageJob, Job
from buildkit.run.verlconfig import check_config, parse_printed_config

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
