"""PNG plots of a run against its baseline: reward, loss and throughput (or step time) per step; and, for the
other methods, each judged metric with the band it had to stay in."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from buildkit.accuracy.compare import gate_of
from buildkit.accuracy.methods import Verdict
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
    _save(figure, path)


def plot_verdict(verdict: Verdict, path: Path, title: str = "", labels: tuple[str, str] = ("NPU", "GPU")) -> None:
    """One panel per metric a method judged: both runs per step, and the band the NPU run had to stay in
    (shaded around the reference), or the limit it had to stay under (a dashed line)."""
    check_output_file(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    judged = [r for r in verdict.results if r.points]
    columns = max(1, min(3, len(judged)))
    rows = max(1, -(-len(judged) // columns))
    figure, grid = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), constrained_layout=True, squeeze=False)
    axes = [axis for row in grid for axis in row]
    for axis, result in zip(axes, judged, strict=False):
        steps = [p[0] for p in result.points]
        axis.plot(steps, [p[1] for p in result.points], "-o", markersize=3, label=labels[0])
        reference = [(p[0], p[2], p[3]) for p in result.points if p[2] is not None]
        if reference:
            axis.plot([s for s, _, _ in reference], [r for _, r, _ in reference], "--s", markersize=3, label=labels[1])
            if len(reference) == 1 and reference[0][2]:  # one step: the band as an error bar
                step, value, width = reference[0]
                axis.errorbar([step], [value], yerr=[width], fmt="none", capsize=6, label="allowed band")
            elif any(w for _, _, w in reference):
                low = [r - (w or 0.0) for _, r, w in reference]
                high = [r + (w or 0.0) for _, r, w in reference]
                axis.fill_between([s for s, _, _ in reference], low, high, alpha=0.2, label="allowed band")
        elif result.bound.startswith("under "):
            axis.axhline(float(result.bound.split()[1]), linestyle=":", color="red", label=result.bound)
        verdict_word = {"ok": "pass", "error": "FAIL", "reported": "not counted"}[result.status]
        axis.set_title(f"{result.name} ({verdict_word})\n{result.bound}", fontsize=9)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis in axes[len(judged) :]:
        axis.set_visible(False)
    figure.suptitle(f"{title}  [method: {verdict.method}]" if title else f"method: {verdict.method}")
    _save(figure, path)


def _save(figure: Any, path: Path) -> None:
    """The figure as a PNG at ``path`` (written whole, no software tag: the same plot gives the same bytes), closed."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        figure.savefig(png, format="png", dpi=100, metadata={"Software": None})
    finally:
        plt.close(figure)
    write_atomic(path, png.getvalue())
