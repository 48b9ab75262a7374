"""``ascendkit smoke``: a smoke job of the image's framework (GRPO; verl's SFT), on this host's NPUs, with a report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from buildkit.cancel import interrupted
from buildkit.cli.base import JsonFlag, MatrixPath, app, print_json, user_errors
from buildkit.cli.smoke_options import (
    SmokeAsRootOption,
    SmokeBaselineOption,
    SmokeCheckOption,
    SmokeConfigCheckOption,
    SmokeCpuOption,
    SmokeDataOption,
    SmokeDevicesOption,
    SmokeEnvOption,
    SmokeHwOption,
    SmokeImageOption,
    SmokeJobOption,
    SmokeModelPathOption,
    SmokeOutOption,
    SmokeOverrideOption,
    SmokePrivilegedOption,
    SmokeQuietOption,
    SmokeStackOption,
    SmokeStallTimeoutOption,
    SmokeStepsOption,
    SmokeTimeoutOption,
)
from buildkit.fsio import output_dir
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    import docker

    from buildkit.run.smokerequest import SmokeRequest


def _progress(line: str) -> None:
    typer.echo(f"smoke: {line}", err=True)


def _cpu_run(client: docker.APIClient, request: SmokeRequest, as_json: bool) -> None:
    """``smoke --cpu``: the CPU run of the request's image and job; exits 0 or 1."""
    from buildkit.run.cpuimage import run_cpu_image

    typer.echo(f"smoke: CPU run of {request.image} ({request.job} job for --hw {request.sku_id}); report in {request.out}/", err=True)
    with output_dir(request.out, "report directory (--out)"):
        run = run_cpu_image(
            client, request.image, request.sku_id, request.chip_id, request.sku, request.facts, request.out, request.job,
            bound=request.timeout, as_root=request.as_root, progress=request.progress,
        )  # fmt: skip
    if as_json:
        print_json(run.data())
    failure = run.failure()
    typer.echo(
        f"smoke: cpu: {'FAILED: ' + failure if failure else 'passed: boundary reached, step passed'}; see {request.out / 'cpu-report.md'}",
        err=True,
    )
    raise typer.Exit(1 if failure else 0)


@app.command("smoke")
@user_errors
def smoke(
    hw: SmokeHwOption,
    image: SmokeImageOption = None,
    stack: SmokeStackOption = None,
    model_path: SmokeModelPathOption = None,
    data: SmokeDataOption = None,
    job: SmokeJobOption = "grpo",
    steps: SmokeStepsOption = None,
    baseline: SmokeBaselineOption = None,
    timeout: SmokeTimeoutOption = 1800,
    out: SmokeOutOption = Path("smoke-out"),
    devices: SmokeDevicesOption = None,
    privileged: SmokePrivilegedOption = False,
    as_root: SmokeAsRootOption = False,
    override: SmokeOverrideOption = None,
    env: SmokeEnvOption = None,
    check: SmokeCheckOption = False,
    cpu: SmokeCpuOption = False,
    config_check: SmokeConfigCheckOption = True,
    stall_timeout: SmokeStallTimeoutOption = 900,
    quiet: SmokeQuietOption = False,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Check the job's config with the image's framework, run doctor and a short GRPO (or verl SFT)
    job with the SKU's devices; judge it and write a report.

    Exit 0 passed (or --check passed), 1 failed, 9 timed out or stalled, 10 no Ascend devices here
    (config check and preflight only). With --cpu: 0 the job reached its accelerator boundary and the
    step passed, 1 either did not (the message names stack, job and step).
    """
    from buildkit.image.engine import connect
    from buildkit.matrix.load import load_matrix
    from buildkit.run.report import stderr_echo
    from buildkit.run.smoke import run_smoke
    from buildkit.run.smokerequest import make_request

    request = make_request(  # checked before the engine: a mistake in the options is exit 2, not 4
        load_matrix(matrix), hw, out, image=image, stack=stack, job=job, steps=steps, timeout=timeout, stall_timeout=stall_timeout,
        model_path=model_path, data_path=data, baseline=baseline, devices=devices, privileged=privileged, as_root=as_root,
        overrides=override or [], env=env or [], check_only=check or cpu, config_check=config_check,
        progress=None if as_json else _progress,
    )  # fmt: skip
    client = connect()
    if cpu:
        _cpu_run(client, request, as_json)
    typer.echo(f"smoke: {request.image} on --hw {request.sku_id}; report in {out}/", err=True)
    try:
        with output_dir(out, "report directory (--out)"):
            report = run_smoke(client, request, echo=None if quiet or as_json else stderr_echo)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: run_container has removed the container
        raise interrupted(
            exc, f"the smoke run was stopped and its container removed; no report was written (the logs so far stay in {out}/)"
        ) from None
    if as_json:
        print_json(report.data)
    typer.echo(f"smoke: {report.outcome}: {report.message} (exit {report.exit_code}); see {out / 'report.md'}", err=True)
    raise typer.Exit(report.exit_code)
