"""``ascendkit smoke``'s options, declared once: the command's signature lists them, one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.cli.base import finite
from buildkit.run import MAX_SECONDS, MAX_STEPS, SmokeJob

SmokeHwOption = Annotated[str, typer.Option("--hw", help="SKU: {skus} (its NPUs per node size the job).")]

SmokeImageOption = Annotated[
    str | None,
    typer.Option(
        "--image",
        envvar="ASCENDKIT_SMOKE_IMAGE",
        help="Image to test; default: the local build of --stack (or the default stack) for --hw.",
    ),
]

SmokeStackOption = Annotated[
    str | None, typer.Option("--stack", help="Without --image: test this stack's local build (e.g. openrlhf-cann8.1).")
]

SmokeModelPathOption = Annotated[
    Path | None,
    typer.Option("--model-path", exists=True, file_okay=False, help="Host directory of Qwen2.5-0.5B-Instruct (mounted read-only)."),
]

SmokeDataOption = Annotated[
    Path | None,
    typer.Option("--data", exists=True, file_okay=False, help="Directory with gsm8k train.parquet/test.parquet; default: generated."),
]

SmokeJobOption = Annotated[
    SmokeJob,
    typer.Option("--job", help="grpo (verl or OpenRLHF, from the image) or sft (verl: LoRA SFT, seed 000). See smoke_tests/."),
]

SmokeStepsOption = Annotated[
    int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="Training steps (default 5; a replay: its bundle's).")
]

SmokeBaselineOption = Annotated[
    Path | None,
    typer.Option(
        "--baseline",
        exists=True,
        help="A GPU run's log or baseline file (the seeds' gate), or a sealed replay bundle (`baseline replay`): replay it.",
    ),
]

SmokeTimeoutOption = Annotated[
    float, typer.Option("--timeout", min=1, max=MAX_SECONDS, callback=finite, help="Seconds for doctor and the job together.")
]

SmokeOutOption = Annotated[Path, typer.Option("--out", help="Report directory: report.json, report.md, report.png, the logs.")]

SmokeDevicesOption = Annotated[str | None, typer.Option("--devices", help="NPU ids to use, e.g. 0-7 (default: all of the SKU's).")]

SmokePrivilegedOption = Annotated[bool, typer.Option("--privileged", help="Run privileged instead of with explicit devices.")]

SmokeAsRootOption = Annotated[
    bool, typer.Option("--as-root", help="Run the containers as root instead of the image's user (HwHiAiUser, 1000:1000).")
]

SmokeOverrideOption = Annotated[
    list[str] | None,
    typer.Option(
        "--override",
        help="Extra argument of the job (repeatable): a Hydra override KEY=VALUE (verl), a flag --override=--name=value (OpenRLHF).",
    ),
]

SmokeEnvOption = Annotated[list[str] | None, typer.Option("--env", "-e", help="Extra environment KEY=VALUE in the job (repeatable).")]

SmokeCheckOption = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Only the config check: verl composes the job's config (--cfg job), OpenRLHF parses its flags, in the image; any host.",
    ),
]

SmokeCpuOption = Annotated[
    bool,
    typer.Option(
        "--cpu",
        help=(
            "A CPU run in the image, on any host: the job's config check, its entry point to its accelerator boundary, then one "
            "training step through the framework's own code (no NPU, no network; --timeout bounds the run to the boundary). "
            "Not a smoke run."
        ),
    ),
]

SmokeConfigCheckOption = Annotated[
    bool,
    typer.Option("--config-check/--no-config-check", help="Run the config check before doctor and the job (default on)."),
]

SmokeStallTimeoutOption = Annotated[
    float,
    typer.Option(
        "--stall-timeout",
        min=1,
        max=MAX_SECONDS,
        callback=finite,
        help="Stop the job when no step follows Ray's start for this many seconds.",
    ),
]

SmokeQuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Do not echo the job's log.")]
