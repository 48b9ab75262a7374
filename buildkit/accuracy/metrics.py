"""Per-step metrics from a training log: verl's console logger or OpenRLHF's progress bar.

verl (``trainer.logger=console``, GRPO and SFT alike) prints one line per step:
``step:<N> - key:value - key:value ...``. Real logs add noise this parser tolerates: Ray prefixes
(``(TaskRunner pid=N) ``, ``(main_task pid=N, ip=...) ``), ANSI colour codes, unrelated lines in
between, both number formats (``83.000`` from verl < 0.5, full ``repr`` such as ``2e-06`` from later
verl), numpy 2 wrappers (``np.float64(0.12)``), and lines cut off while being copied around:
complete fields are kept, the partial one is dropped.

OpenRLHF (``train_ppo_ray``) shows each step's status on its ``Episode [e/E]`` progress bar (tqdm):
``Episode [1/1]:  40%|###   | 2/5 [01:23<02:04, 41.5s/it, policy_loss=0.0123, reward=0.25, ...]``,
redrawn after ``\r`` rather than on new lines, and from a Ray actor, so behind its prefix. A
step's status is shown first right after it finished, with the bar still on the step before: so
each new status is a step, numbered from the bar's count (``n + 1``, plus the episodes before).
tqdm prints three significant digits, which is the precision of these metrics. The bar's elapsed
time gives ``timing_s/step`` (whole seconds).
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


# tqdm's bar: "{desc}: {percent}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{, postfix}]"
_EPISODE = re.compile(r"Episode \[(\d+)/(\d+)\]:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([^\]]*)\]")
STEP_TIME = "timing_s/step"


def _seconds(clock: str) -> float | None:
    """tqdm's ``MM:SS`` or ``H:MM:SS`` -> seconds."""
    try:
        parts = [int(p) for p in clock.strip().split(":")]
    except ValueError:
        return None
    total = 0
    for part in parts:
        total = total * 60 + part
    return float(total)


class StepParser:
    """Steps from a log fed line by line (a stream, or a whole file): verl's step lines as they
    come, and OpenRLHF's progress bar, whose steps are only known from the statuses before them."""

    def __init__(self) -> None:
        self._status = ""  # the last OpenRLHF status seen (its postfix)
        self._episode = 0  # each episode has a bar of its own, its clock starting at zero
        self._elapsed = 0.0  # the bar's elapsed time at the last step

    def feed(self, line: str) -> list[StepMetrics]:
        found = parse_line(line)
        if found is not None:
            return [found]
        return [m for segment in strip_ansi(line).split("\r") if (m := self._bar(segment)) is not None]

    def _bar(self, segment: str) -> StepMetrics | None:
        match = _EPISODE.search(segment)
        if match is None:
            return None
        episode, count, total = int(match[1]), int(match[3]), int(match[4])
        clock, _, rest = match[5].partition("<")
        fields = [f.strip() for f in rest.split(",")[1:]]  # after the remaining time: the rate, then the status
        status = ", ".join(f for f in fields if "=" in f)
        if not status or status == self._status:
            return None  # the bar redrawn without a new status: no new step
        self._status = status
        if episode != self._episode:
            self._episode, self._elapsed = episode, 0.0
        metrics: dict[str, float] = {}
        for item in status.split(", "):
            key, _, raw = item.partition("=")
            value = parse_value(raw)
            if _KEY.match(key) and value is not None:
                metrics[key] = value
        elapsed = _seconds(clock)
        if elapsed is not None:
            metrics[STEP_TIME] = max(0.0, elapsed - self._elapsed)
            self._elapsed = elapsed
        return StepMetrics((episode - 1) * total + count + 1, metrics)


def parse_log(lines: Iterable[str]) -> list[StepMetrics]:
    """Every step of a log, in log order."""
    parser = StepParser()
    return [m for line in lines for m in parser.feed(line)]


def series(steps: list[StepMetrics], name: str) -> dict[int, float]:
    """``name`` by step number; a step printed twice keeps its last value."""
    return {s.step: s.metrics[name] for s in steps if name in s.metrics}


def metric_names(steps: list[StepMetrics]) -> list[str]:
    """Every metric name, in order of first appearance."""
    return list(dict.fromkeys(name for s in steps for name in s.metrics))


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
