"""Parsing verl console logs: both number formats, Ray prefixes, ANSI, noise and cut-off lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.accuracy.metrics import parse_line, parse_log, parse_value
from buildkit.cli import app
from buildkit.errors import ExitCode
from tests.conftest import ROOT

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
    assert result.exit_code == ExitCode.INVALID_INPUT and "no verl step lines" in result.stderr
    both = runner.invoke(app, ["metrics", "parse", str(LOGS / "npu_old_verl.log"), "--json", "--csv"])
    assert both.exit_code == ExitCode.INVALID_INPUT
    missing = runner.invoke(app, ["metrics", "parse", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
