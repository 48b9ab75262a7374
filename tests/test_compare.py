"""The seeds' gate: mean absolute error per metric and the throughput ratio, computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.accuracy.compare import compare_runs, load_run
from buildkit.accuracy.metrics import parse_log
from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from tests.conftest import ROOT

LOGS = ROOT / "tests" / "fixtures" / "logs"
NPU, GPU = LOGS / "npu_old_verl.log", LOGS / "gpu_new_verl.log"


def test_defaults_by_hand() -> None:
    result = compare_runs(load_run(NPU), load_run(GPU))
    reward, loss = result.metrics
    # rewards: |.50-.52|+|.60-.58|+|.70-.71|+|.80-.79|+|.81-.80| = .07 over 5 steps
    assert reward.name == "critic/rewards/mean" and reward.steps == 5
    assert reward.mean_abs_error == pytest.approx(0.014)
    assert reward.mean_abs_error_pct == pytest.approx(1.4)
    assert reward.tolerance_pct == 4.0 and reward.passed
    # loss: .002+.005+.001+.0005+0 = .0085 over 5 steps
    assert loss.name == "actor/pg_loss" and loss.mean_abs_error == pytest.approx(0.0017) and loss.tolerance_pct == 2.0
    # throughput: NPU (1000+1100+1200+1300)/4 = 1150, GPU (2000+2000+2200+2200)/4 = 2100
    assert result.throughput_ratio == pytest.approx(1150 / 2100)
    assert result.passed


def test_tighter_tolerance_fails_and_exits_1(runner: CliRunner) -> None:
    result = runner.invoke(app, ["compare", str(NPU), str(GPU), "--metric", "critic/rewards/mean", "--tolerance", "1", "--json"])
    assert result.exit_code == ExitCode.CHECK_FAILED
    data = json.loads(result.stdout)
    assert data["status"] == "error"
    assert data["metrics"]["critic/rewards/mean"] == {
        "mean_abs_error": pytest.approx(0.014),
        "mean_abs_error_pct": pytest.approx(1.4),
        "steps": 5,
        "tolerance_pct": 1.0,
        "status": "error",
    }
    assert data["throughput_ratio"] == pytest.approx(1150 / 2100)


def test_only_common_steps_count(tmp_path: Path) -> None:
    npu = parse_log(["step:1 - critic/rewards/mean:0.5 - actor/pg_loss:0.1", "step:2 - critic/rewards/mean:0.7 - actor/pg_loss:0.1"])
    base = parse_log(["step:2 - critic/rewards/mean:0.6 - actor/pg_loss:0.1", "step:3 - critic/rewards/mean:0.9 - actor/pg_loss:0.1"])
    reward = compare_runs(npu, base).metrics[0]
    assert reward.steps == 1 and reward.mean_abs_error == pytest.approx(0.1)


def test_non_finite_values_fail_the_metric() -> None:
    npu = parse_log(["step:1 - critic/rewards/mean:nan - actor/pg_loss:0.1"])
    base = parse_log(["step:1 - critic/rewards/mean:0.5 - actor/pg_loss:0.1"])
    reward = compare_runs(npu, base).metrics[0]
    assert not reward.passed
    assert reward.describe()["mean_abs_error"] is None  # valid JSON, not NaN


def test_loss_falls_back_to_the_loss_the_run_has() -> None:
    npu = parse_log(["step:1 - critic/rewards/mean:0.5 - actor/loss:0.30"])
    base = parse_log(["step:1 - critic/rewards/mean:0.5 - actor/loss:0.31"])
    assert [m.name for m in compare_runs(npu, base).metrics] == ["critic/rewards/mean", "actor/loss"]
    with pytest.raises(InputError, match="the runs are not both verl grpo runs: the baseline lacks critic/rewards/mean"):
        compare_runs(parse_log(["step:1 - critic/rewards/mean:0.5"]), parse_log(["step:1 - critic/rewards/mean:0.5"]))
    with pytest.raises(InputError, match="the NPU run has no metric of a known job"):
        compare_runs(parse_log(["step:1 - throughput:5"]), parse_log(["step:1 - throughput:5"]))


def test_each_jobs_gate_is_the_seeds() -> None:
    """verl GRPO: rewards 4 %, loss 2 % (seeds 002, 004); OpenRLHF: reward and policy loss 2 % (seed 003);
    verl SFT: loss 2 % (seed 000). The job is told from the metrics its log holds."""
    sft = parse_log(["step:1 - train/loss:1.20 - train/lr(1e-3):0.1", "step:2 - train/loss:1.10"])
    sft_gpu = parse_log(["step:1 - train/loss:1.21", "step:2 - train/loss:1.11"])
    result = compare_runs(sft, sft_gpu)
    assert [(m.name, m.tolerance_pct, m.passed) for m in result.metrics] == [("train/loss", 2.0, True)]
    assert result.throughput_ratio is None
    bar = "Episode [1/1]:  20%|##        | {n}/5 [00:{t:02d}<00:40, 10.0s/it, policy_loss={loss}, reward={reward}]"
    npu = parse_log([bar.format(n=0, t=10, loss=0.05, reward=0.25), bar.format(n=1, t=20, loss=0.04, reward=0.5)])
    gpu = parse_log([bar.format(n=0, t=8, loss=0.05, reward=0.25), bar.format(n=1, t=16, loss=0.041, reward=0.53)])
    result = compare_runs(npu, gpu)
    assert [(m.name, m.tolerance_pct) for m in result.metrics] == [("reward", 2.0), ("policy_loss", 2.0)]
    reward, loss = result.metrics
    assert abs(reward.mean_abs_error_pct - 1.5) < 1e-9 and reward.passed  # (0 + 0.03) / 2 x 100
    assert abs(loss.mean_abs_error_pct - 0.05) < 1e-9 and loss.passed


def test_baseline_import_round_trip(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "a100.json"
    result = runner.invoke(app, ["baseline", "import", str(GPU), "--name", "a100-qwen0.5b", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "ascendkit-baseline/1" and doc["name"] == "a100-qwen0.5b"
    assert doc["source"]["file"] == "gpu_new_verl.log" and len(doc["source"]["sha256"]) == 64
    from_file = runner.invoke(app, ["compare", str(NPU), str(out), "--json"])
    from_log = runner.invoke(app, ["compare", str(NPU), str(GPU), "--json"])
    assert from_file.exit_code == 0 and json.loads(from_file.stdout) == json.loads(from_log.stdout)


def test_plot_is_written(runner: CliRunner, tmp_path: Path) -> None:
    png = tmp_path / "cmp.png"
    result = runner.invoke(app, ["compare", str(NPU), str(GPU), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "PASS" in result.stdout and "throughput ratio" in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metric", "critic/rewards/mean"], "give one --tolerance per --metric"),
        (["--metric", "nope/metric", "--tolerance", "1"], "has no metric 'nope/metric'"),
    ],
)
def test_compare_errors(runner: CliRunner, argv: list[str], message: str) -> None:
    result = runner.invoke(app, ["compare", str(NPU), str(GPU), *argv])
    assert result.exit_code == ExitCode.INVALID_INPUT and message in result.stderr


def test_bad_baseline_file(runner: CliRunner, tmp_path: Path) -> None:
    bogus = tmp_path / "b.json"
    bogus.write_text('{"format": "other"}')
    result = runner.invoke(app, ["compare", str(NPU), str(bogus)])
    assert result.exit_code == ExitCode.INVALID_INPUT and "not an ascendkit baseline file" in result.stderr


def test_the_percent_is_named_as_the_seeds_define_it(runner: CliRunner) -> None:
    """The seeds' Mean Error is sum(|npu - gpu|) / N x 100: absolute, so "4 %" means 0.04 reward."""
    table = runner.invoke(app, ["compare", str(NPU), str(GPU)])
    assert "x100 (seeds' %)" in table.stdout and "absolute, not relative" in table.stdout
    data = json.loads(runner.invoke(app, ["compare", str(NPU), str(GPU), "--json"]).stdout)
    assert data["pct_unit"].startswith("mean absolute error x 100")
    reward = data["metrics"]["critic/rewards/mean"]
    assert reward["mean_abs_error_pct"] == pytest.approx(reward["mean_abs_error"] * 100)
