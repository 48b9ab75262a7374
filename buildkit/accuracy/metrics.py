"""Per-step metrics from a verl console log (``trainer.logger=console``).

verl prints one line per step: ``step:<N> - key:value - key:value ...``. Real logs add noise this
parser tolerates: Ray prefixes (``(TaskRunner pid=N) ``, ``(main_task pid=N, ip=...) ``), ANSI
colour codes, unrelated lines in between, both number formats (``83.000`` from verl < 0.5, full
``repr`` such as ``2e-06`` from later verl), numpy 2 wrappers (``np.float64(0.12)``), and lines
cut off while being copied around: complete fields are kept, the partial one is dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from buildkit.text import strip_ansi

_RAY_PREFIX = re.compile(r"^\s*\((?:[A-Za-z_][\w.]*)\s+pid=\d+[^)]*\)\s*")
_STEP = re.compile(r"^step:\s*(\d+)\s*(?:-\s*|$)")
_WRAPPED = re.compile(r"^np\.(?:float|int|uint)\d*\((.*)\)$")
_KEY = re.compile(r"^[A-Za-z_][\w./@\-]*$")


@dataclass(frozen=True)
class StepMetrics:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


def parse_value(text: str) -> float | None:
    """``0.123``, ``2e-06``, ``34``, ``np.float64(0.12)``, ``nan``, ``inf`` -> float; else None."""
    value = text.strip()
    wrapped = _WRAPPED.match(value)
    if wrapped:
        value = wrapped[1].strip()
    if value.startswith("np."):
        return None  # a wrapper cut before its closing parenthesis
    try:
        return float(value)
    except ValueError:
        return None


def parse_line(line: str) -> StepMetrics | None:
    """The metrics of one step line, or None when the line is not a step line."""
    text = _RAY_PREFIX.sub("", strip_ansi(line)).strip()
    match = _STEP.match(text)
    if not match:
        return None
    metrics: dict[str, float] = {}
    for fld in text[match.end() :].split(" - "):
        key, sep, raw = fld.partition(":")
        key = key.strip()
        if not sep or not _KEY.match(key):
            continue  # a field cut before its value, or not a metric at all
        value = parse_value(raw)
        if value is not None:
            metrics[key] = value
    return StepMetrics(int(match[1]), metrics)


def parse_log(lines: Iterable[str]) -> list[StepMetrics]:
    """Every step line of a log, in log order."""
    return [m for m in (parse_line(line) for line in lines) if m is not None]


def series(steps: list[StepMetrics], name: str) -> dict[int, float]:
    """``name`` by step number; a step printed twice keeps its last value."""
    return {s.step: s.metrics[name] for s in steps if name in s.metrics}


def metric_names(steps: list[StepMetrics]) -> list[str]:
    """Every metric name, in order of first appearance."""
    return list(dict.fromkeys(name for s in steps for name in s.metrics))


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
