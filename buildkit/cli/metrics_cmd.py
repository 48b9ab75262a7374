"""``ascendkit metrics parse``, ``ascendkit compare`` and ``ascendkit baseline import``."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from buildkit.cli.base import JsonFlag, app, out, print_json, user_errors
from buildkit.cli.metrics_options import (
    CompareBaselineArgument,
    CompareMethodOption,
    CompareMetricOption,
    CompareNpuLogArgument,
    ComparePlotOption,
    CompareThroughputStepsOption,
    CompareToleranceOption,
)
from buildkit.cli.tables import RichTable
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import STDOUT, check_output_file, output_dir, write_atomic, write_output

metrics_app = typer.Typer(help="Read verl and OpenRLHF console logs.", no_args_is_help=True)
baseline_app = typer.Typer(help="Baselines from real GPU runs.", no_args_is_help=True)
app.add_typer(metrics_app, name="metrics")
app.add_typer(baseline_app, name="baseline")

# The columns the table shows, when the log has them (--json/--csv give every metric).
SHOWN = (
    *("critic/rewards/mean", "actor/pg_loss", "train/loss", "actor/entropy", "response_length/mean"),  # verl
    *("reward", "policy_loss", "kl", "response_length"),  # OpenRLHF
    *("timing_s/step", "perf/throughput"),
)

ExistingFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]


@metrics_app.command("parse")
@user_errors
def metrics_parse(
    log: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A verl or OpenRLHF console log.")],
    as_json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="One row per step, one column per metric.")] = False,
) -> None:
    """Per-step metrics of a verl or OpenRLHF console log, in log order."""
    from buildkit.accuracy.compare import load_run
    from buildkit.accuracy.metrics import metric_names

    if as_json and as_csv:
        raise InputError("--json and --csv: choose one")
    steps = load_run(log)
    if as_json:
        print_json({"steps": [{"step": s.step, "metrics": s.metrics} for s in steps]})
        return
    names = metric_names(steps)
    if as_csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["step", *names])
        for s in steps:
            writer.writerow([s.step, *(repr(s.metrics[n]) if n in s.metrics else "" for n in names)])
        sys.stdout.write(buffer.getvalue())
        return
    shown = [n for n in SHOWN if n in names]
    table = RichTable(title=f"{log}: {len(steps)} steps, {len(names)} metrics (--json/--csv for all)")
    table.add_column("step", justify="right")
    for name in shown:
        table.add_column(name, justify="right")
    for s in steps:
        table.add_row(str(s.step), *(f"{s.metrics[n]:.6g}" if n in s.metrics else "" for n in shown))
    out.print(table)


@app.command("compare")
@user_errors
def compare(
    npu_log: CompareNpuLogArgument,
    baseline: CompareBaselineArgument,
    metric: CompareMetricOption = None,
    tolerance: CompareToleranceOption = None,
    throughput_steps: CompareThroughputStepsOption = 4,
    plot: ComparePlotOption = None,
    method: CompareMethodOption = "seeds",
    as_json: JsonFlag = False,
) -> None:
    """Judge an NPU run against a reference run by one method (exit 1 when it fails; docs/smoke.md says what each proves)."""
    from buildkit.accuracy.compare import PCT_UNIT, compare_runs, load_run
    from buildkit.accuracy.methods import METHODS
    from buildkit.accuracy.plot import plot_runs

    if method not in METHODS:
        raise InputError(f"--method {method!r}: one of {', '.join(METHODS)}")
    if method != "seeds":
        if metric or tolerance:
            raise InputError(f"--metric and --tolerance set the seeds' gate; --method {method} has its own (docs/smoke.md)")
        _judge(method, npu_log, baseline, plot, as_json)
        return
    metrics, tolerances = metric or [], tolerance or []
    if len(metrics) != len(tolerances):
        raise InputError(f"give one --tolerance per --metric ({len(metrics)} metric(s), {len(tolerances)} tolerance(s))")
    if plot is not None:
        check_output_file(plot)
    npu, base = load_run(npu_log), load_run(baseline)
    result = compare_runs(npu, base, list(zip(metrics, tolerances, strict=True)) or None, throughput_steps)
    if plot is not None:
        plot_runs(npu, base, plot, title=f"{npu_log.name} vs {baseline.name}")
    if as_json:
        print_json(result.describe())
    else:
        table = RichTable(title=f"{npu_log} against {baseline}")
        for column in ("metric", "steps", "mean abs error", "x100 (seeds' %)", "tolerance (same unit)", "result"):
            table.add_column(column)
        for m in result.metrics:
            table.add_row(
                m.name,
                str(m.steps),
                f"{m.mean_abs_error:.6g}",
                f"{m.mean_abs_error_pct:.3f}",
                f"{m.tolerance_pct:g}",
                "pass" if m.passed else "FAIL",
            )
        out.print(table)
        out.print(f"%: {PCT_UNIT}")
        ratio = "n/a (no perf/throughput in both runs)" if result.throughput_ratio is None else f"{result.throughput_ratio:.3f}"
        out.print(f"throughput ratio (first {throughput_steps} steps, NPU / baseline): {ratio}")
        out.print("PASS" if result.passed else "FAIL")
    if not result.passed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


def _judge(method: str, npu_log: Path, reference: Path, plot: Path | None, as_json: bool) -> None:
    from buildkit.accuracy.compare import load_run
    from buildkit.accuracy.methods import JUDGES
    from buildkit.accuracy.plot import plot_verdict

    if plot is not None:
        check_output_file(plot)
    verdict = JUDGES[method](load_run(npu_log), load_run(reference))  # type: ignore[index]
    if plot is not None:
        second = "earlier NPU run" if method == "regression" else "second NPU run" if method == "identical" else "GPU"
        plot_verdict(verdict, plot, title=f"{npu_log.name} vs {reference.name}", labels=("NPU", second))
    if as_json:
        print_json(verdict.describe())
    else:
        table = RichTable(title=f"{npu_log} against {reference}, method {method}")
        for column in ("metric", "measured", "value", "steps", "bound", "result"):
            table.add_column(column)
        for r in verdict.results:
            value = "not finite" if r.worst is None else f"{r.worst:.6g}"
            word = {"ok": "pass", "error": "FAIL", "reported": "not counted"}[r.status]
            table.add_row(r.name, r.measure, value, str(len(r.steps)), r.bound, word)
        out.print(table)
        for note in verdict.notes:
            out.print(f"note: {note}")
        out.print("PASS" if verdict.passed else "FAIL")
    if not verdict.passed:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


@baseline_app.command("import")
@user_errors
def baseline_import(
    log: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A GPU run's verl or OpenRLHF console log.")],
    name: Annotated[str, typer.Option("--name", help="Baseline name, e.g. a100-qwen2.5-0.5b-grpo.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Default: baselines/<name>.json.")] = None,
) -> None:
    """Turn a real GPU run's log into a baseline file for `compare` and `smoke --baseline`."""
    from buildkit.accuracy.compare import baseline_document

    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise InputError(f"--name {name!r}: letters, digits, '-', '_' and '.' only")
    target = output or Path("baselines") / f"{name}.json"
    document = baseline_document(name, log)  # refuses a log without steps before anything is written
    text = json.dumps(document, indent=2) + "\n"
    if target == STDOUT:
        write_output(target, text)
        return
    with output_dir(target.parent, "baselines directory") if output is None else contextlib.nullcontext():
        write_atomic(target, text)
    typer.echo(f"wrote {target}: {len(document['steps'])} steps from {log.name}", err=True)
