"""``ascendkit smoke``: a smoke job of the image's framework (GRPO; verl's SFT), on this host's NPUs, with a report."""

from __future__ import annotations

from pathlib import Path

import typer

from buildkit.cancel import interrupted
from buildkit.cli.base import JsonFlag, MatrixPath, app, print_json, user_errors
from buildkit.cli.smoke_options import (
    SmokeAsRootOption,
    SmokeBaselineOption,
    SmokeCheckOption,
    SmokeConfigCheckOption,
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


def _progress(line: str) -> None:
    typer.echo(f"smoke: {line}", err=True)


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
    config_check: SmokeConfigCheckOption = True,
    stall_timeout: SmokeStallTimeoutOption = 900,
    quiet: SmokeQuietOption = False,
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Check the job's config with the image's framework, run doctor and a short GRPO (or verl SFT)
    job with the SKU's devices; judge it and write a report.

    Exit 0 passed (or --check passed), 1 failed, 9 timed out or stalled, 10 no Ascend devices here
    (config check and preflight only).
    """
    from buildkit.image.engine import connect
    from buildkit.matrix.load import load_matrix
    from buildkit.run.report import stderr_echo
    from buildkit.run.smoke import run_smoke
    from buildkit.run.smokerequest import make_request

    request = make_request(  # checked before the engine: a mistake in the options is exit 2, not 4
        load_matrix(matrix), hw, out, image=image, stack=stack, job=job, steps=steps, timeout=timeout, stall_timeout=stall_timeout,
        model_path=model_path, data_path=data, baseline=baseline, devices=devices, privileged=privileged, as_root=as_root,
        overrides=override or [], env=env or [], check_only=check, config_check=config_check,
        progress=None if as_json else _progress,
    )  # fmt: skip
    client = connect()
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
