"""The seeds' NPU-versus-baseline gate, automated.

For each metric, over the steps both runs have: mean error = sum(|npu_i - base_i|) / N, reported
as ``mean_abs_error`` and as ``mean_abs_error_pct`` (x100, as the seed formula writes it), passing
at or under its tolerance. The defaults follow the job the logs come from, told by its metrics:
each framework plug-in's gates (:mod:`buildkit.framework`; verl GRPO ``critic/rewards/mean`` 4 % and
its loss 2 %, seeds 002 and 004; OpenRLHF GRPO ``reward`` and ``policy_loss`` 2 % each, seed 003;
verl SFT ``train/loss`` 2 %, seeds 000 and 001). Throughput ratio = the mean of the gate's
throughput metric over the first K steps of the NPU run / the same for the baseline, where the job
logs one (verl's GRPO: ``perf/throughput``).

A baseline is a GPU run's log, or a baseline file made from one by ``ascendkit baseline import``:
only a real run's numbers, never invented ones.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.accuracy.metrics import StepMetrics, is_finite, metric_names, parse_log, series
from buildkit.doctor.base import Check
from buildkit.errors import InputError
from buildkit.framework import Gate, all_gates
from buildkit.fsio import read_input_bytes, read_input_text


def gate_of(steps: list[StepMetrics]) -> Gate | None:
    """The job a run's metrics come from, told by its marker metric."""
    names = set(metric_names(steps))
    return next((g for g in all_gates() if g.marker in names), None)


BASELINE_FORMAT = "ascendkit-baseline/1"
# The seeds' "Mean Error" is sum(|npu_i - gpu_i|) / N x 100 %: an absolute error scaled by 100, not
# an error relative to the values. Every "%" ascendkit prints for the gate is that, and says so.
PCT_UNIT = "mean absolute error x 100 (the seeds' %: absolute, not relative)"


@dataclass(frozen=True)
class MetricResult:
    name: str
    mean_abs_error: float
    mean_abs_error_pct: float
    steps: int
    tolerance_pct: float
    passed: bool

    @property
    def check(self) -> Check:
        """The metric's gate as a check: ok within its tolerance, error beyond it."""
        got = f"{self.mean_abs_error_pct:.3f}" if is_finite(self.mean_abs_error) else "not finite"
        detail = f"mean absolute error x100 {got} over {self.steps} steps (tolerance {self.tolerance_pct:g})"
        return Check(f"baseline gate: {self.name}", "ok" if self.passed else "error", detail)

    def describe(self) -> dict[str, Any]:
        finite = is_finite(self.mean_abs_error)  # a NaN/inf in either run fails the metric; JSON gets null
        return {
            "mean_abs_error": self.mean_abs_error if finite else None,
            "mean_abs_error_pct": self.mean_abs_error_pct if finite else None,
            "steps": self.steps,
            "tolerance_pct": self.tolerance_pct,
            "status": self.check.status,
        }


@dataclass(frozen=True)
class Comparison:
    metrics: tuple[MetricResult, ...]
    throughput_ratio: float | None
    throughput_steps: int

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.metrics)

    def describe(self) -> dict[str, Any]:
        return {
            "method": "seeds",
            "metrics": {m.name: m.describe() for m in self.metrics},
            "pct_unit": PCT_UNIT,
            "throughput_ratio": self.throughput_ratio,
            "throughput_steps": self.throughput_steps,
            "status": "ok" if self.passed else "error",
        }


def load_run(path: Path) -> list[StepMetrics]:
    """Steps from a verl console log or an ascendkit baseline file."""
    text = read_input_text(path, "training log or baseline", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{path}: looks like JSON but is not valid: {exc}") from None
        return _baseline_steps(path, data)
    steps = parse_log(text.splitlines())
    if not steps:
        raise InputError(
            f"{path}: no steps: neither verl's step lines (`step:N - key:value ...`; was it started with trainer.logger=console?) "
            "nor OpenRLHF's `Episode [e/E]` progress bar"
        )
    return steps


def _baseline_steps(path: Path, data: Any) -> list[StepMetrics]:
    """The steps of a baseline file, its shape checked: every problem names the file and the entry."""
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt != BASELINE_FORMAT:
        raise InputError(f"{path}: not an ascendkit baseline file (format {fmt!r}, expected {BASELINE_FORMAT!r})")
    entries = data.get("steps")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: steps: expected a non-empty list of {{step, metrics}} entries")
    steps = []
    for i, entry in enumerate(entries):
        where = f"{path}: steps[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise InputError(f"{where}: expected {{step: N, metrics: {{name: value}}}}")
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InputError(f"{where}.step: expected a step number, got {step!r}")
        metrics = {}
        for key, value in entry["metrics"].items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not is_finite(float(value)):
                raise InputError(f"{where}.metrics.{key}: expected a finite number, got {value!r}")
            metrics[key] = float(value)
        steps.append(StepMetrics(step, metrics))
    return steps


def default_tolerances(npu: list[StepMetrics], base: list[StepMetrics]) -> list[tuple[str, float]]:
    """The seeds' tolerances for the job both runs come from."""
    gate = gate_of(npu)
    known = "; ".join(f"{g.job}: {', '.join(filter(None, (g.reward, *g.losses)))}" for g in all_gates())
    if gate is None:
        raise InputError(f"the NPU run has no metric of a known job ({known}); name the metrics with --metric")
    both = set(metric_names(npu)) & set(metric_names(base))
    loss = next((name for name in gate.losses if name in both), None)
    if loss is None or (gate.reward and gate.reward not in both):
        wanted = ", ".join(filter(None, (gate.reward, *gate.losses)))
        raise InputError(f"the runs are not both {gate.job} runs: the baseline lacks {wanted}; name the metrics with --metric")
    return ([(gate.reward, gate.reward_tolerance)] if gate.reward else []) + [(loss, gate.loss_tolerance)]


def compare_runs(
    npu: list[StepMetrics],
    base: list[StepMetrics],
    tolerances: list[tuple[str, float]] | None = None,
    throughput_steps: int = 4,
) -> Comparison:
    wanted = tolerances or default_tolerances(npu, base)
    results = []
    for name, tolerance in wanted:
        a, b = series(npu, name), series(base, name)
        for label, run in (("NPU run", a), ("baseline", b)):
            if not run:
                raise InputError(f"the {label} has no metric {name!r}; it has: {', '.join(metric_names(npu if run is a else base))}")
        common = sorted(set(a) & set(b))
        if not common:
            raise InputError(f"{name}: the runs share no step (NPU steps {min(a)}-{max(a)}, baseline {min(b)}-{max(b)})")
        error = sum(abs(a[i] - b[i]) for i in common) / len(common)
        results.append(MetricResult(name, error, error * 100, len(common), tolerance, error * 100 <= tolerance))
    return Comparison(tuple(results), throughput_ratio(npu, base, throughput_steps), throughput_steps)


def throughput_ratio(npu: list[StepMetrics], base: list[StepMetrics], first: int) -> float | None:
    gate = gate_of(npu)
    if gate is None or gate.throughput is None:
        return None
    metric = gate.throughput

    def head_mean(run: list[StepMetrics]) -> float | None:
        values = [v for _, v in sorted(series(run, metric).items())[:first]]
        return sum(values) / len(values) if values else None

    a, b = head_mean(npu), head_mean(base)
    return a / b if a is not None and b else None


def baseline_document(name: str, log: Path) -> dict[str, Any]:
    """A baseline file's content: the run's steps, where they came from, nothing invented."""
    raw = read_input_bytes(log, "training log")
    steps = load_run(log)
    return {
        "format": BASELINE_FORMAT,
        "name": name,
        "source": {"file": log.name, "sha256": hashlib.sha256(raw).hexdigest()},
        "steps": [{"step": s.step, "metrics": s.metrics} for s in steps],
    }
