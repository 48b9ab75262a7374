"""``ascendkit smoke``: a smoke job of the image's framework (GRPO; verl's SFT), on this host's NPUs, with a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.cancel import interrupted
from buildkit.cli.base import JsonFlag, MatrixPath, app, finite, print_json, user_errors
from buildkit.fsio import output_dir
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run import MAX_SECONDS, MAX_STEPS, SmokeJob


def _progress(line: str) -> None:
    typer.echo(f"smoke: {line}", err=True)


@app.command("smoke")
@user_errors
def smoke(
    hw: Annotated[str, typer.Option("--hw", help="SKU: {skus} (its NPUs per node size the job).")],
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            envvar="ASCENDKIT_SMOKE_IMAGE",
            help="Image to test; default: the local build of --stack (or the default stack) for --hw.",
        ),
    ] = None,
    stack: Annotated[
        str | None, typer.Option("--stack", help="Without --image: test this stack's local build (e.g. openrlhf-cann8.1).")
    ] = None,
    model_path: Annotated[
        Path | None,
        typer.Option("--model-path", exists=True, file_okay=False, help="Host directory of Qwen2.5-0.5B-Instruct (mounted read-only)."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", exists=True, file_okay=False, help="Directory with gsm8k train.parquet/test.parquet; default: generated."),
    ] = None,
    job: Annotated[
        SmokeJob,
        typer.Option("--job", help="grpo (verl or OpenRLHF, from the image) or sft (verl: LoRA SFT, seed 000). See smoke_tests/."),
    ] = "grpo",
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="Training steps (default 5; a replay: its bundle's).")
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            exists=True,
            help="A GPU run's log or baseline file (the seeds' gate), or a sealed replay bundle (`baseline replay`): replay it.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, max=MAX_SECONDS, callback=finite, help="Seconds for doctor and the job together.")
    ] = 1800,
    out: Annotated[Path, typer.Option("--out", help="Report directory: report.json, report.md, report.png, the logs.")] = Path("smoke-out"),
    devices: Annotated[str | None, typer.Option("--devices", help="NPU ids to use, e.g. 0-7 (default: all of the SKU's).")] = None,
    privileged: Annotated[bool, typer.Option("--privileged", help="Run privileged instead of with explicit devices.")] = False,
    as_root: Annotated[
        bool, typer.Option("--as-root", help="Run the containers as root instead of the image's user (HwHiAiUser, 1000:1000).")
    ] = False,
    override: Annotated[
        list[str] | None,
        typer.Option(
            "--override",
            help="Extra argument of the job (repeatable): a Hydra override KEY=VALUE (verl), a flag --override=--name=value (OpenRLHF).",
        ),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="Extra environment KEY=VALUE in the job (repeatable).")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only the config check: verl composes the job's config (--cfg job), OpenRLHF parses its flags, in the image; any host.",
        ),
    ] = False,
    config_check: Annotated[
        bool,
        typer.Option("--config-check/--no-config-check", help="Run the config check before doctor and the job (default on)."),
    ] = True,
    stall_timeout: Annotated[
        float,
        typer.Option(
            "--stall-timeout",
            min=1,
            max=MAX_SECONDS,
            callback=finite,
            help="Stop the job when no step follows Ray's start for this many seconds.",
        ),
    ] = 900,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not echo the job's log.")] = False,
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
        load_matrix(matrix),
        hw,
        out,
        image=image,
        stack=stack,
        job=job,
        steps=steps,
        timeout=timeout,
        stall_timeout=stall_timeout,
        model_path=model_path,
        data_path=data,
        baseline=baseline,
        devices=devices,
        privileged=privileged,
        as_root=as_root,
        overrides=override or [],
        env=env or [],
        check_only=check,
        config_check=config_check,
        progress=None if as_json else _progress,
    )
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
