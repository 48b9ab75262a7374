"""The ways an NPU run is judged besides the seeds' rule (:mod:`buildkit.accuracy.compare`):

``replay``      against the GPU run whose rollouts it replayed (docs/smoke.md, "Precision alignment"): both
                trainers learned from the same samples and rewards, so what is left is arithmetic. Per step,
                ``actor/pg_loss`` within 0.002 + 2 % of the GPU's, ``actor/grad_norm`` and ``actor/entropy``
                within 5 % and 2 % of the GPU's; the NPU run's own ``training/rollout_probs_diff_mean`` under
                0.01 (verl's transfer_to_npu_guide.md). Rewards were replayed: reported, not counted.
``regression``  against an earlier NPU run, as verl's Ascend nightly judges one (verl-ascend-recipe
                baseline/check_npu.py): means over steps 5-14, ``critic/rewards/mean`` within 0.05,
                ``training/rollout_probs_diff_mean``, ``perf/throughput`` and ``timing_s/step`` within 5 %,
                ``actor/perf/max_memory_allocated_gb`` (its last step) within 1 GB.
``identical``   two NPU runs of one deterministic replay: every step's losses, gradient norm, entropy and
                rewards equal as logged.

Each result says what it measured and the bound it was held to; a metric a run did not log is said, not
guessed, and a method that finds nothing to compare is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from buildkit.accuracy.metrics import StepMetrics, is_finite, series
from buildkit.doctor.base import Check
from buildkit.errors import InputError

Method = Literal["seeds", "replay", "regression", "identical"]
METHODS: tuple[Method, ...] = ("seeds", "replay", "regression", "identical")

PG_LOSS, GRAD_NORM, ENTROPY = "actor/pg_loss", "actor/grad_norm", "actor/entropy"
REWARD = "critic/rewards/mean"
PROBS_DIFF = "training/rollout_probs_diff_mean"
THROUGHPUT, STEP_TIME, MEMORY = "perf/throughput", "timing_s/step", "actor/perf/max_memory_allocated_gb"


@dataclass(frozen=True)
class Band:
    """How far an NPU value may sit from the reference value: ``absolute + relative x |reference|``."""

    absolute: float
    relative: float

    def width(self, reference: float) -> float:
        return self.absolute + self.relative * abs(reference)

    def describe(self) -> str:
        if not self.absolute and not self.relative:
            return "equal, as logged"
        parts = ([f"{self.absolute:g}"] if self.absolute else []) + (
            [f"{self.relative * 100:g} % of the reference"] if self.relative else []
        )
        return "within " + " + ".join(parts)


# replay: the tolerances, each justified in docs/smoke.md ("Precision alignment")
REPLAY_BANDS = {PG_LOSS: Band(0.002, 0.02), GRAD_NORM: Band(0.0, 0.05), ENTROPY: Band(0.0, 0.02)}
PROBS_DIFF_LIMIT = 0.01
# regression: verl's nightly (check_npu.py): steps 5-14, these bounds
REGRESSION_STEPS = (5, 14)
REGRESSION_BANDS = {
    REWARD: Band(0.05, 0.0),
    PROBS_DIFF: Band(0.0, 0.05),
    THROUGHPUT: Band(0.0, 0.05),
    STEP_TIME: Band(0.0, 0.05),
    MEMORY: Band(1.0, 0.0),
}
IDENTICAL = (PG_LOSS, GRAD_NORM, ENTROPY, REWARD, "actor/pg_clipfrac", "actor/kl_loss")


@dataclass(frozen=True)
class Judged:
    """One metric under one method: the steps it was read at, how far apart the runs were, the bound."""

    name: str
    measure: str  # what was measured, in words
    worst: float | None  # the largest |npu - reference| (or the value itself, for a limit); None: not finite
    bound: str
    steps: tuple[int, ...]
    status: Literal["ok", "error", "reported"]  # reported: shown, not counted
    points: tuple[tuple[int, float, float | None, float | None], ...] = ()  # step, npu, reference, band half-width

    @property
    def check(self) -> Check:
        got = "not finite" if self.worst is None else f"{self.worst:.6g}"
        status = "ok" if self.status == "reported" else self.status
        return Check(f"{self.name}", status, f"{self.measure}: {got} over {len(self.steps)} step(s), {self.bound}")

    def describe(self) -> dict[str, Any]:
        return {"measure": self.measure, "worst": self.worst, "bound": self.bound, "steps": list(self.steps), "status": self.status}


@dataclass(frozen=True)
class Verdict:
    method: Method
    results: tuple[Judged, ...]
    notes: tuple[str, ...]  # metrics a run did not log, and what the method did not count

    @property
    def passed(self) -> bool:
        return all(r.status != "error" for r in self.results)

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "metrics": {r.name: r.describe() for r in self.results},
            "notes": list(self.notes),
            "status": "ok" if self.passed else "error",
        }


def _steps_of(npu: dict[int, float], ref: dict[int, float], window: tuple[int, int] | None = None) -> list[int]:
    common = sorted(set(npu) & set(ref))
    return [s for s in common if window is None or window[0] <= s <= window[1]]


def _per_step(
    name: str, npu: list[StepMetrics], ref: list[StepMetrics], band: Band, counted: bool = True, runs: str = "NPU - GPU"
) -> Judged | None:
    a, b = series(npu, name), series(ref, name)
    steps = _steps_of(a, b)
    if not steps:
        return None
    points, worst_excess, worst = [], float("-inf"), 0.0
    for s in steps:
        width = band.width(b[s])
        gap = abs(a[s] - b[s])
        points.append((s, a[s], b[s], width))
        if not (is_finite(a[s]) and is_finite(b[s])):
            return Judged(name, f"|{runs}| per step", None, band.describe(), tuple(steps), "error", tuple(points))
        worst_excess, worst = max(worst_excess, gap - width), max(worst, gap)
    status: Literal["ok", "error", "reported"] = ("ok" if worst_excess <= 0 else "error") if counted else "reported"
    bound = band.describe() + " at every step" if counted else "none: reported"
    return Judged(name, f"largest |{runs}| per step", worst, bound, tuple(steps), status, tuple(points))


def judge_replay(npu: list[StepMetrics], gpu: list[StepMetrics]) -> Verdict:
    results, notes = [], []
    for name, band in REPLAY_BANDS.items():
        judged = _per_step(name, npu, gpu, band)
        if judged is None:
            notes.append(f"{name}: not logged by both runs")
        else:
            results.append(judged)
    reward = _per_step(REWARD, npu, gpu, Band(0.0, 0.0), counted=False)
    if reward is not None:
        results.append(reward)
        notes.append(f"{REWARD}: replayed with the rollouts (the reward is computed at rollout), so equal by construction: not counted")
    diff = series(npu, PROBS_DIFF)
    if diff:
        steps = tuple(sorted(diff))
        worst = max(diff.values())
        ok = all(is_finite(v) for v in diff.values()) and worst < PROBS_DIFF_LIMIT
        points = tuple((s, diff[s], None, None) for s in steps)
        results.append(
            Judged(
                PROBS_DIFF,
                "the NPU run's own value, largest over steps",
                worst,
                f"under {PROBS_DIFF_LIMIT:g}",
                steps,
                "ok" if ok else "error",
                points,
            )
        )
    else:
        notes.append(f"{PROBS_DIFF}: not logged by the NPU run (actor_rollout_ref.rollout.calculate_log_probs=True logs it)")
    if not [r for r in results if r.status != "reported"]:
        raise InputError(f"replay: the runs share none of {', '.join(REPLAY_BANDS)}: nothing to judge")
    return Verdict("replay", tuple(results), tuple(notes))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def judge_regression(npu: list[StepMetrics], earlier: list[StepMetrics]) -> Verdict:
    results, notes = [], []
    for name, band in REGRESSION_BANDS.items():
        a, b = series(npu, name), series(earlier, name)
        steps = _steps_of(a, b)[-1:] if name == MEMORY else _steps_of(a, b, REGRESSION_STEPS)  # memory: the peak, its last step
        if not steps:
            notes.append(f"{name}: not logged by both runs at steps {REGRESSION_STEPS[0]}-{REGRESSION_STEPS[1]}")
            continue
        mine, theirs = _mean([a[s] for s in steps]), _mean([b[s] for s in steps])
        gap, width = abs(mine - theirs), band.width(theirs)
        finite = is_finite(mine) and is_finite(theirs)
        measure = "|mean NPU - mean earlier|" + (" at the last step" if name == MEMORY else f" over steps {steps[0]}-{steps[-1]}")
        points = tuple((s, a[s], b[s], width) for s in steps)
        status: Literal["ok", "error"] = "ok" if finite and gap <= width else "error"
        results.append(Judged(name, measure, gap if finite else None, band.describe(), tuple(steps), status, points))
    if not results:
        raise InputError(
            f"regression: the runs share none of {', '.join(REGRESSION_BANDS)} at steps {REGRESSION_STEPS[0]}-{REGRESSION_STEPS[1]} "
            "(verl's nightly runs 15 steps and judges 5-14)"
        )
    return Verdict("regression", tuple(results), tuple(notes))


def judge_identical(first: list[StepMetrics], second: list[StepMetrics]) -> Verdict:
    results, notes = [], []
    for name in IDENTICAL:
        judged = _per_step(name, first, second, Band(0.0, 0.0), runs="first - second")
        if judged is None:
            notes.append(f"{name}: not logged by both runs")
        else:
            results.append(judged)
    if not results:
        raise InputError(f"identical: the runs share none of {', '.join(IDENTICAL)}")
    return Verdict("identical", tuple(results), tuple(notes))


JUDGES: dict[Method, Callable[[list[StepMetrics], list[StepMetrics]], Verdict]] = {
    "replay": judge_replay,
    "regression": judge_regression,
    "identical": judge_identical,
}
