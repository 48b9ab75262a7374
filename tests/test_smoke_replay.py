"""``smoke --baseline BUNDLE``: the NPU side of a replay (buildkit/run/smokereplay.py), on the fake NPU host and
engine of tests/test_smoke.py: composed to the bundle's names before anything runs, the dump and data mounted
read-only, the chip's deterministic environment set, and proven afterwards by the lines verl 0.8.0's own
rollout-skip code prints (run here from the vendored wheel)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import InputError
from buildkit.run.replaybundle import Bundle, load_bundle
from buildkit.run.smoke import run_smoke
from buildkit.run.smokereplay import check_bundle_request
from buildkit.run.smokerequest import make_request
from tests.conftest import MATRIX
from tests.harness.openrlhf_log import openrlhf_log
from tests.harness.upstream import compose_ppo_trainer
from tests.test_replay import verl_skip_module
from tests.test_replay_bundle import _compose, _run_on_the_gpu_machine
from tests.test_smoke import LOGS, OPENRLHF_LABELS, FakeEngine, _openrlhf_request, smoke_request

LABELS = {"io.ascendkit.chip": "a3", "io.ascendkit.stack": "cann9.0", "io.ascendkit.version.verl": "0.8.0"}


class ReplayEngine(FakeEngine):
    VERL = "0.8.0"

    def inspect_image(self, ref: str) -> dict[str, Any]:
        info = super().inspect_image(ref)
        info["Config"]["Env"] = ["HCCL_OP_EXPANSION_MODE=AIV", "PATH=/usr/bin"]  # cann9.0's image ENV
        return info


@pytest.fixture
def bundle(runner: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("replay") / "bundle"
    model = root.parent / "model"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    _compose(runner, root)
    assert _run_on_the_gpu_machine(root, model).returncode == 0
    assert runner.invoke(app, ["baseline", "seal", str(root)]).exit_code == 0
    return load_bundle(root)


def _npu_log(bundle: Bundle, tmp_path: Path, *, replayed: bool) -> Path:
    """The NPU run's log: verl 0.8.0's own RolloutSkip lines (printed by its vendored code, reading the dump the GPU
    run wrote, or finding none) and step lines near the GPU run's."""
    lines: list[str] = []
    dump = bundle.dump if replayed else tmp_path / "empty-dump"
    sides_overrides = [
        o.replace("@BUNDLE@/dump", str(dump)).replace("@BUNDLE@", str(bundle.root)).replace("@MODEL@", "/m") for o in bundle.plan.overrides
    ]
    with verl_skip_module("0.8.0") as module:
        skip = module.RolloutSkip(compose_ppo_trainer("0.8.0", sides_overrides), rollout_wg=None)
        for _ in range(bundle.plan.steps):
            skip.step()
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                skip.try_load()
            lines += printed.getvalue().splitlines()
    for step in bundle.steps:
        near = {k: v * 1.001 for k, v in step.metrics.items()}
        lines.append(f"(TaskRunner pid=7) step:{step.step} - " + " - ".join(f"{k}:{v}" for k, v in near.items()))
    log = tmp_path / ("npu-replayed.log" if replayed else "npu-generated.log")
    log.write_text("\n".join(lines) + "\n")
    return log


def _request(tmp_path: Path, bundle: Bundle, **kwargs: Any) -> Any:
    return smoke_request(
        tmp_path, replay=bundle, baseline=bundle.steps, baseline_name="bundle (replay bundle)", data_path=bundle.data,
        steps=bundle.plan.steps, **kwargs,
    )  # fmt: skip


def test_the_npu_run_replays_the_bundle_and_is_judged_by_replay(bundle: Bundle, tmp_path: Path) -> None:
    engine = ReplayEngine(0, _npu_log(bundle, tmp_path, replayed=True), labels=LABELS)
    report = run_smoke(cast(Any, engine), _request(tmp_path, bundle))
    assert (report.outcome, report.exit_code) == ("passed", 0), report.message
    check, _, job = engine.created
    script = job["command"][2]
    assert "actor_rollout_ref.rollout.skip.dump_dir=/smoke/replay" in script and "skip.max_dump_step=3" in script
    assert "data.train_files=/smoke/data/train.parquet" in script and "gsm8k_synth" not in script, "the bundle's data"
    binds = job["host_config"]["binds"]
    assert binds[str(bundle.dump.resolve())] == {"bind": "/smoke/replay", "mode": "ro"}
    assert binds[str(bundle.data.resolve())] == {"bind": "/smoke/data", "mode": "ro"}
    assert job["environment"]["LCCL_DETERMINISTIC"] == "1" and "HCCL_DETERMINISTIC" not in job["environment"], "AIV: LCCL"
    assert check["command"][5:] == report.data["job"]["command"][3:], "the config check composed the replay's overrides"
    checks = {c["name"]: c for c in report.data["checks"]}
    assert checks["replay"]["status"] == "ok" and "at 3 step(s)" in checks["replay"]["detail"]
    assert report.data["comparison"]["method"] == "replay" and report.data["comparison"]["status"] == "ok"
    assert (tmp_path / "out" / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_that_generated_instead_of_replaying_fails_saying_so(bundle: Bundle, tmp_path: Path) -> None:
    engine = ReplayEngine(0, _npu_log(bundle, tmp_path, replayed=False), labels=LABELS)
    report = run_smoke(cast(Any, engine), _request(tmp_path, bundle))
    assert (report.outcome, report.exit_code) == ("failed", 1) and "replay" in report.message
    detail = {c["name"]: c for c in report.data["checks"]}["replay"]["detail"]
    assert detail.startswith("the run found no dump for 3 rollout(s) (step 1, step 2, step 3) and generated its own")


def test_what_would_not_replay_is_refused_before_anything_runs(bundle: Bundle, tmp_path: Path) -> None:
    engine = ReplayEngine(0, tmp_path / "never.log", labels=LABELS)
    with pytest.raises(
        InputError,
        match=r"would not replay the bundle .*max_response_length \(data.max_response_length\): the baseline's '128', this run's '256'",
    ):
        run_smoke(cast(Any, engine), _request(tmp_path, bundle, overrides=("data.max_response_length=256",)))
    other = ReplayEngine(0, tmp_path / "never.log", labels={**LABELS, "io.ascendkit.version.verl": "0.9.1"})
    with pytest.raises(InputError, match=r"the bundle was made by verl 0\.8\.0; this image carries verl 0\.9\.1"):
        run_smoke(cast(Any, other), _request(tmp_path, bundle))
    assert engine.created == [] and other.created == [], "nothing ran"
    with pytest.raises(InputError, match="a replay runs those"):
        check_bundle_request(bundle, job="grpo", steps=5, data_path=None, model_path=None)
    with pytest.raises(InputError, match="replays the GRPO job"):
        check_bundle_request(bundle, job="sft", steps=None, data_path=None, model_path=None)
    with pytest.raises(InputError, match="leave --data out"):
        check_bundle_request(bundle, job="grpo", steps=None, data_path=tmp_path, model_path=None)
    request = make_request(
        __import__("buildkit.matrix.load", fromlist=["load_matrix"]).load_matrix(MATRIX),
        "a3",
        tmp_path / "o",
        image="x:y",
        baseline=bundle.root,
        check_only=True,
    )
    assert request.replay is not None and request.steps == 3 and request.data_path == bundle.data


def test_the_report_says_whether_the_images_framework_can_replay(tmp_path: Path) -> None:
    (tmp_path / "verl").mkdir()
    report = run_smoke(cast(Any, FakeEngine(0, LOGS / "npu_old_verl.log")), smoke_request(tmp_path / "verl"))
    assert report.data["replay"].startswith("available: `ascendkit baseline replay`")
    (tmp_path / "o").mkdir()
    log = tmp_path / "openrlhf.log"
    log.write_text(openrlhf_log(5))
    report = run_smoke(cast(Any, FakeEngine(0, log, labels=OPENRLHF_LABELS)), _openrlhf_request(tmp_path / "o"))
    assert report.exit_code == 0, report.message
    assert report.data["replay"].startswith("not available: OpenRLHF 0.7.5 has no rollout replay: it dumps no rollouts")
    assert "Replay of a GPU run's rollouts (precision alignment): not available" in (tmp_path / "o" / "out" / "report.md").read_text()
