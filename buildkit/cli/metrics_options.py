"""``ascendkit compare``'s options, declared once: the command's signature lists them, one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.cli.base import finite
from buildkit.run import MAX_STEPS

CompareNpuLogArgument = Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The NPU run's log.")]

CompareBaselineArgument = Annotated[
    Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A GPU run's log or baseline file.")
]

CompareMetricOption = Annotated[list[str] | None, typer.Option("--metric", help="Metric to gate (repeatable, paired with --tolerance).")]

CompareToleranceOption = Annotated[
    list[float] | None,
    typer.Option("--tolerance", min=0, max=100, callback=finite, help="Its tolerance: mean absolute error x 100 (the seeds' %)."),
]

CompareThroughputStepsOption = Annotated[
    int, typer.Option("--throughput-steps", min=1, max=MAX_STEPS, help="Steps averaged for the throughput ratio.")
]

ComparePlotOption = Annotated[Path | None, typer.Option("--plot", help="Write a PNG of the judged metrics per step (with their bands).")]

CompareMethodOption = Annotated[
    str,
    typer.Option(
        "--method",
        help="seeds: the seeds' mean absolute error (any two runs); replay: against the GPU run whose rollouts the NPU run "
        "replayed; regression: against an earlier NPU run (verl's nightly); identical: two NPU runs of one replay.",
    ),
]
