"""Parsing training logs: verl's console lines (both number formats, Ray prefixes, ANSI, noise and
cut-off lines) and OpenRLHF's progress bar as the real tqdm draws it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.accuracy.metrics import STEP_TIME, StepParser, parse_line, parse_log, parse_value
from buildkit.cli import app
from buildkit.errors import ExitCode
from tests.conftest import ROOT
from tests.harness.openrlhf_log import openrlhf_log, status

LOGS = ROOT / "tests" / "fixtures" / "logs"
GPU_STEP1 = {
    "actor/entropy": 1.2345,
    "critic/rewards/mean": 0.52,
    "actor/pg_loss": 0.012,
    "actor/lr": 2e-06,
    "response_length/mean": 84.0,
    "perf/throughput": 2000.0,
}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.123", 0.123),
        ("83.000", 83.0),
        ("2e-06", 2e-06),
        ("-8.16e-06", -8.16e-06),
        ("34", 34.0),
        ("np.float64(0.12)", 0.12),
        ("np.int64(7)", 7.0),
    ],
)
def test_values(text: str, value: float) -> None:
    assert parse_value(text) == value


def test_non_finite_values_are_kept_to_be_judged() -> None:
    assert math.isnan(parse_value("nan") or 0.0)
    assert parse_value("inf") == math.inf
    assert parse_value("np.float64(0.1") is None  # cut inside the wrapper
    assert parse_value("abc") is None


def test_old_verl_log() -> None:
    steps = parse_log((LOGS / "npu_old_verl.log").read_text().splitlines())
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert steps[0].metrics == {
        "critic/score/mean": 0.5,
        "critic/rewards/mean": 0.5,
        "actor/pg_loss": 0.01,
        "actor/entropy": 1.234,
        "response_length/mean": 83.0,
        "timing_s/step": 43.21,
        "perf/throughput": 1000.0,
    }


def test_new_verl_log_with_noise_and_cut_lines() -> None:
    steps = parse_log((LOGS / "gpu_new_verl.log").read_text().splitlines())
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert steps[0].metrics == GPU_STEP1
    assert steps[1].metrics["actor/kl_loss"] == -8.16e-06  # behind an ANSI-coloured prefix with ip=
    assert steps[2].metrics == {"critic/rewards/mean": 0.71, "actor/pg_loss": 0.004, "perf/throughput": 2200.0}  # cut wrapper dropped
    assert steps[3].metrics == {"critic/rewards/mean": 0.79, "actor/pg_loss": 0.0015, "perf/throughput": 2200.0}  # cut key dropped


@pytest.mark.parametrize(
    "line",
    [
        "",
        "step",
        "step:",
        "(TaskRunner pid=1) step:7 - ",
        "step:7 - a:",
        "step:7 - :1",
        "step:7 - a:1 - - b",
        "\x1b[0m",
        "stepping:3 - a:1",
        "x" * 10000,
    ],
)
def test_odd_lines_never_crash(line: str) -> None:
    result = parse_line(line)
    assert result is None or result.step == 7


def test_parse_command_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["metrics", "parse", str(LOGS / "gpu_new_verl.log"), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4, 5]
    assert data["steps"][0] == {"step": 1, "metrics": GPU_STEP1}


def test_parse_command_csv_and_table(runner: CliRunner) -> None:
    result = runner.invoke(app, ["metrics", "parse", str(LOGS / "npu_old_verl.log"), "--csv"])
    rows = result.stdout.splitlines()
    assert (
        rows[0]
        == "step,critic/score/mean,critic/rewards/mean,actor/pg_loss,actor/entropy,response_length/mean,timing_s/step,perf/throughput"
    )
    assert rows[2] == "2,0.6,0.6,-0.02,1.2,80.0,41.0,1100.0"
    table = runner.invoke(app, ["metrics", "parse", str(LOGS / "npu_old_verl.log")])
    assert table.exit_code == 0 and "5 steps" in table.stdout


def test_parse_command_errors(runner: CliRunner, tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("nothing to see\n")
    result = runner.invoke(app, ["metrics", "parse", str(empty)])
    assert result.exit_code == ExitCode.INVALID_INPUT and "no steps: neither verl's step lines" in result.stderr
    both = runner.invoke(app, ["metrics", "parse", str(LOGS / "npu_old_verl.log"), "--json", "--csv"])
    assert both.exit_code == ExitCode.INVALID_INPUT
    missing = runner.invoke(app, ["metrics", "parse", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


# ---- OpenRLHF's progress bar -----------------------------------------------------------------------


@pytest.mark.parametrize("redraws_on_new_lines", [False, True], ids=["ray-forwarded", "one-redraw-a-line"])
def test_openrlhf_steps_come_from_each_new_status_of_its_episode_bar(redraws_on_new_lines: bool) -> None:
    """tqdm shows a step's status first with the bar still on the step before; each new status is a step,
    over episodes too, with tqdm's three significant digits and the bar's clock as the step time."""
    text = openrlhf_log(4, episodes=2, seconds=37, redraws_on_new_lines=redraws_on_new_lines)
    steps = parse_log(text.splitlines())
    assert [s.step for s in steps] == list(range(1, 9))
    for s in steps:
        expected = {k: float(f"{v:.3g}") for k, v in status(s.step).items()}
        assert {k: v for k, v in s.metrics.items() if k != STEP_TIME} == pytest.approx(expected, rel=1e-9)
        assert s.metrics[STEP_TIME] == 37.0, "the bar's elapsed clock, per step (the second episode's bar starts at 0)"


def test_openrlhf_a_redraw_without_a_new_status_is_no_step() -> None:
    bar = "Episode [1/1]:  40%|####      | {n}/5 [00:{t:02d}<00:40, 10.0s/it, policy_loss=0.05, reward=0.5]"
    parser = StepParser()
    assert [m.step for m in parser.feed(bar.format(n=1, t=20))] == [2]
    assert parser.feed(bar.format(n=2, t=21)) == [], "the same status after update(): the same step"
    assert parser.feed("Episode [1/1]:   0%|          | 0/5 [00:00<?, ?it/s]") == [], "no status yet"
    assert parser.feed("(ActorModelRayActor pid=9) Train epoch [1/1]: 100%|###| 4/4 [00:02<00:00, act_loss=0.1, reward=0.5]") == []


def test_metrics_parse_reads_an_openrlhf_log(runner: CliRunner, tmp_path: Path) -> None:
    log = tmp_path / "openrlhf.log"
    log.write_text(openrlhf_log(3))
    result = runner.invoke(app, ["metrics", "parse", str(log), "--csv"])
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.startswith("step,") and "policy_loss" in header and "reward" in header and len(rows) == 3
    table = runner.invoke(app, ["metrics", "parse", str(log)], env={"COLUMNS": "200"})
    head = next(line for line in table.stdout.splitlines() if "step" in line and "reward" in line)
    assert [c for c in ("reward", "policy_loss", "kl", "timing_s/step") if c in head] == ["reward", "policy_loss", "kl", "timing_s/step"], (
        "the table shows OpenRLHF's own metrics, not verl's empty columns"
    )
