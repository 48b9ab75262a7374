"""PNG plots of a run against its baseline: reward, loss and throughput (or step time) per step."""

from __future__ import annotations

import io
from pathlib import Path

from buildkit.accuracy.compare import gate_of
from buildkit.accuracy.metrics import STEP_TIME, StepMetrics, metric_names, series
from buildkit.fsio import check_output_file, write_atomic


def plot_runs(npu: list[StepMetrics], baseline: list[StepMetrics] | None, path: Path, title: str = "") -> None:
    check_output_file(path)  # refused before anything is drawn
    import matplotlib  # imported here: only plotting commands pay for it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = metric_names(npu)
    gate = gate_of(npu)  # None: a log of no job a framework plug-in knows; its panels say so
    reward, losses, throughput = (gate.reward, gate.losses, gate.throughput) if gate else (None, (), None)
    loss = next((n for n in losses if n in names), None)
    speed = (throughput, "throughput (tokens/s/device)") if throughput else (STEP_TIME, "step time (s)")
    panels = [(reward, "reward (mean)"), (loss, "loss"), speed]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for axis, (name, label) in zip(axes, panels, strict=True):
        axis.set_title(f"{label}\n{name or f'no {label} metric'}", fontsize=10)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        if not name:
            continue
        for run, run_label, style in ((npu, "NPU", "-o"), (baseline, "baseline", "--s")):
            if run is None:
                continue
            values = sorted(series(run, name).items())
            if values:
                axis.plot([s for s, _ in values], [v for _, v in values], style, markersize=3, label=run_label)
        if axis.lines:
            axis.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    png = io.BytesIO()
    try:
        figure.savefig(png, format="png", dpi=100, metadata={"Software": None})
    finally:
        plt.close(figure)
    write_atomic(path, png.getvalue())
