"""The methods besides the seeds' rule (buildkit/accuracy/methods.py): replay, regression and identical, judged on
the verl logs the tests keep and on runs made from them, and drawn with their bands."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.accuracy.methods import (
    GRAD_NORM,
    PG_LOSS,
    PROBS_DIFF,
    REWARD,
    judge_identical,
    judge_regression,
    judge_replay,
)
from buildkit.accuracy.metrics import StepMetrics, parse_log
from buildkit.cli import app
from buildkit.errors import ExitCode, InputError

LOGS = Path(__file__).parent / "fixtures" / "logs"
NPU = parse_log((LOGS / "npu_old_verl.log").read_text().splitlines())
GPU = parse_log((LOGS / "gpu_new_verl.log").read_text().splitlines())


def _run(steps: int, **per_step: list[float]) -> list[StepMetrics]:
    return [StepMetrics(i + 1, {name: values[i] for name, values in per_step.items()}) for i in range(steps)]


def test_replay_holds_each_step_to_its_band_and_does_not_count_the_replayed_rewards() -> None:
    verdict = judge_replay(NPU, GPU)
    by = {r.name: r for r in verdict.results}
    # step 2: |-0.02 - (-0.015)| = 0.005 > 0.002 + 2 % x 0.015 = 0.0023
    assert by[PG_LOSS].status == "error" and by[PG_LOSS].worst == pytest.approx(0.005)
    assert by[REWARD].status == "reported" and not verdict.passed
    assert any("not logged by both runs" in n and GRAD_NORM in n for n in verdict.notes)
    gpu = _run(3, **{PG_LOSS: [0.01, -0.02, 0.005], GRAD_NORM: [1.0, 2.0, 3.0]})
    close = _run(3, **{PG_LOSS: [0.0115, -0.0214, 0.0069], GRAD_NORM: [1.04, 1.91, 3.1], PROBS_DIFF: [0.004, 0.005, 0.006]})
    assert judge_replay(close, gpu).passed, judge_replay(close, gpu).describe()
    drifting = _run(3, **{PG_LOSS: [0.0115, -0.0214, 0.0069], GRAD_NORM: [1.04, 1.91, 3.2], PROBS_DIFF: [0.004, 0.005, 0.011]})
    failed = {r.name for r in judge_replay(drifting, gpu).results if r.status == "error"}
    assert failed == {GRAD_NORM, PROBS_DIFF}, "3.2 is 6.7 % off 3.0; 0.011 is over the guide's 0.01"
    nan = _run(3, **{PG_LOSS: [0.01, math.nan, 0.005], GRAD_NORM: [1.0, 2.0, 3.0]})
    assert {r.name: r.status for r in judge_replay(nan, gpu).results}[PG_LOSS] == "error"
    with pytest.raises(InputError, match="nothing to judge"):
        judge_replay(_run(2, other=[1.0, 2.0]), _run(2, other=[1.0, 2.0]))


def test_regression_is_verls_nightly_over_steps_five_to_fourteen() -> None:
    verdict = judge_regression(NPU, GPU)
    by = {r.name: r for r in verdict.results}
    assert by[REWARD].steps == (5,) and by[REWARD].status == "ok"  # |0.81 - 0.80| <= 0.05
    assert by["perf/throughput"].status == "error"  # 1150 against 2100: far beyond 5 %
    earlier = _run(15, **{REWARD: [0.3] * 15, "actor/perf/max_memory_allocated_gb": [20.0] * 14 + [30.0]})
    now = _run(15, **{REWARD: [0.0] * 4 + [0.34] * 11, "actor/perf/max_memory_allocated_gb": [20.0] * 14 + [30.9]})
    by = {r.name: r for r in judge_regression(now, earlier).results}
    assert by[REWARD].steps == tuple(range(5, 15)) and by[REWARD].worst == pytest.approx(0.04) and by[REWARD].status == "ok"
    assert by["actor/perf/max_memory_allocated_gb"].steps == (15,) and by["actor/perf/max_memory_allocated_gb"].status == "ok"
    with pytest.raises(InputError, match="steps 5-14"):
        judge_regression(NPU[:4], GPU[:4])


def test_identical_means_equal_as_logged() -> None:
    assert judge_identical(NPU, NPU).passed
    nudged = [StepMetrics(s.step, {**s.metrics, PG_LOSS: s.metrics[PG_LOSS] + 1e-9}) for s in NPU]
    verdict = judge_identical(NPU, nudged)
    assert not verdict.passed and {r.name for r in verdict.results if r.status == "error"} == {PG_LOSS}


def test_compare_takes_the_method_and_draws_its_bands(runner: CliRunner, tmp_path: Path) -> None:
    png = tmp_path / "replay.png"
    result = runner.invoke(
        app, ["compare", str(LOGS / "npu_old_verl.log"), str(LOGS / "gpu_new_verl.log"), "--method", "replay", "--plot", str(png)]
    )
    assert result.exit_code == ExitCode.CHECK_FAILED, result.output
    assert "method replay" in result.stdout and "not counted" in result.stdout and "FAIL" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    same = runner.invoke(
        app, ["compare", str(LOGS / "npu_old_verl.log"), str(LOGS / "npu_old_verl.log"), "--method", "identical", "--json"]
    )
    assert same.exit_code == 0 and '"method": "identical"' in same.stdout
    bad = runner.invoke(app, ["compare", str(LOGS / "npu_old_verl.log"), str(LOGS / "gpu_new_verl.log"), "--method", "replays"])
    assert bad.exit_code == ExitCode.INVALID_INPUT and "one of seeds, replay, regression, identical" in bad.stderr
    mixed = runner.invoke(
        app,
        [
            "compare",
            str(LOGS / "npu_old_verl.log"),
            str(LOGS / "gpu_new_verl.log"),
            "--method",
            "replay",
            "--metric",
            "x",
            "--tolerance",
            "1",
        ],
    )
    assert mixed.exit_code == ExitCode.INVALID_INPUT and "has its own" in mixed.stderr
