"""The replay bundle (buildkit/run/replaybundle.py, ``ascendkit baseline replay`` and ``seal``): written, run end to
end by bash as a GPU machine runs it (verl is a stand-in there: tests/fixtures/replay-standin, no GPU exists here),
sealed, and refused when any file differs from what was sealed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode, InputError
from buildkit.run.replaybundle import MANIFEST, PLAN, SCRIPT, ReplayPlan, load_bundle, model_mismatch, seal
from tests.conftest import MATRIX

STANDIN = Path(__file__).parent / "fixtures" / "replay-standin"


def _compose(runner: CliRunner, out: Path, *args: str) -> None:
    result = runner.invoke(
        app,
        [
            "baseline",
            "replay",
            "--hw",
            "a3",
            "--gpus",
            "8",
            "--stack",
            "cann9.0",
            "--steps",
            "3",
            "--out",
            str(out),
            *args,
            "--matrix",
            str(MATRIX),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"bash {out / SCRIPT}" in result.stdout and f"smoke --hw a3 --stack cann9.0 --baseline {out}" in result.stdout


def _run_on_the_gpu_machine(bundle: Path, model: Path) -> subprocess.CompletedProcess[str]:
    """run.sh as the GPU machine runs it: bash, python3 with pyarrow (for the data), verl (here the stand-in)."""
    env = {**os.environ, "MODEL": str(model), "PYTHONPATH": str(STANDIN), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(bundle / SCRIPT)], env=env, capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "config.json").write_text('{"model_type": "qwen2"}\n')
    (weights / "model.safetensors").write_bytes(b"stand-in weights")
    return weights


def test_a_bundle_is_written_run_sealed_and_loaded(runner: CliRunner, tmp_path: Path, model: Path) -> None:
    bundle = tmp_path / "bundle"
    _compose(runner, bundle)
    plan = ReplayPlan.read(bundle / PLAN)
    assert (plan.version, plan.gpus, plan.steps, plan.names["batch"]) == ("0.8.0", 8, 3, "32")
    assert "actor_rollout_ref.rollout.skip.dump_dir=@BUNDLE@/dump" in plan.overrides
    done = _run_on_the_gpu_machine(bundle, model)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (bundle / "data" / "train.parquet").is_file() and (bundle / "config.yaml").read_text().startswith("INFO stand-in")
    dumped = sorted(p.relative_to(bundle).as_posix() for p in (bundle / "dump").rglob("*.dp"))
    assert dumped[0] == "dump/qwen2.5-0.5b-grpo_ascendkit_smoke/GBS32_N2_in512_out128/genstep_000001/gen_batch.dp" and len(dumped) == 6
    sealed = runner.invoke(app, ["baseline", "seal", str(bundle), "--model", str(model)])
    assert sealed.exit_code == 0, sealed.output
    manifest = json.loads((bundle / MANIFEST).read_text())
    assert (
        manifest["versions"]["verl"] == "0.8.0"
        and manifest["steps"] == 3
        and set(manifest["model"]) == {"config.json", "model.safetensors"}
    )
    loaded = load_bundle(bundle)
    assert [s.step for s in loaded.steps] == [1, 2, 3] and loaded.plan == plan
    assert model_mismatch(loaded, model) is None
    (model / "model.safetensors").write_bytes(b"other weights")
    assert "model.safetensors" in (model_mismatch(loaded, model) or "")
    # a file changed, added or removed after sealing is refused, named
    (bundle / "dump" / "extra.dp").write_bytes(b"x")
    with pytest.raises(InputError, match=r"dump/extra\.dp: not in the manifest"):
        load_bundle(bundle)
    (bundle / "dump" / "extra.dp").unlink()
    (bundle / "run.log").write_text((bundle / "run.log").read_text().replace("actor/pg_loss:0.01", "actor/pg_loss:0.02"))
    with pytest.raises(InputError, match=r"run\.log: changed since it was sealed"):
        load_bundle(bundle)


def test_an_unfinished_or_foreign_bundle_is_not_sealed(runner: CliRunner, tmp_path: Path, model: Path) -> None:
    bundle = tmp_path / "bundle"
    _compose(runner, bundle)
    unrun = runner.invoke(app, ["baseline", "seal", str(bundle)])
    assert unrun.exit_code == ExitCode.INVALID_INPUT and "has run.sh run there to its end?" in unrun.stderr
    assert _run_on_the_gpu_machine(bundle, model).returncode == 0
    config = bundle / "config.yaml"
    config.write_text(config.read_text().replace("max_response_length: 128", "max_response_length: 256"))
    with pytest.raises(InputError, match="verl composed other names than the plan's: max_response_length"):
        seal(bundle)
    with pytest.raises(InputError, match="not sealed"):
        load_bundle(bundle)


def test_a_bundle_goes_into_a_new_directory_and_asks_for_what_it_cannot_do(runner: CliRunner, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["baseline", "replay", "--hw", "a3", "--gpus", "8", "--out", str(taken), "--matrix", str(MATRIX)])
    assert result.exit_code == ExitCode.INVALID_INPUT and "new or empty directory" in result.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"], "nothing of what is there is touched"
    old = runner.invoke(
        app,
        ["baseline", "replay", "--hw", "a3", "--gpus", "8", "--stack", "cann8.1", "--out", str(tmp_path / "b"), "--matrix", str(MATRIX)],
    )
    assert old.exit_code == ExitCode.INVALID_INPUT and "no rollout replay" in old.stderr and not (tmp_path / "b").exists()
    odd = runner.invoke(
        app,
        ["baseline", "replay", "--hw", "a3", "--gpus", "6", "--stack", "cann9.0", "--out", str(tmp_path / "c"), "--matrix", str(MATRIX)],
    )
    assert odd.exit_code == ExitCode.INVALID_INPUT and "--gpus 6" in odd.stderr
