"""Deterministic replay (buildkit/frameworks/verl/replay.py, buildkit/run/replay.py), held to each stack's own verl:
both runs' overrides composed by verl's Hydra config in struct mode, the dump location each run would use computed by
that release's own code from the vendored wheel (verl/utils/rollout_skip.py, verl/utils/skip/), and the log lines
replay is proven by printed by that same code."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from buildkit.framework import ReplayUnavailable
from buildkit.frameworks.verl.config import check_config
from buildkit.frameworks.verl.replay import NPU_ENV_HCCL, NPU_ENV_LCCL, deterministic_env, evidence, scheme_for
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.run.job import ImageJob, JobFacts
from buildkit.run.replay import ReplaySides, compose_replay, differing_names, dump_names
from tests.conftest import MATRIX
from tests.harness.upstream import compose_ppo_trainer, verl_importable, verl_wheel

GPUS = 8
SHIPPED = load_matrix(MATRIX)
# every stack whose verl can replay (0.6.0 on), and one stack per verl release for the tests that run verl's code
REPLAYING = [s for s, st in SHIPPED.matrix.stacks.items() if st.framework == "verl" and Version(st.framework_version) >= Version("0.6.0")]
ONE_PER_RELEASE = sorted({SHIPPED.matrix.stacks[s].framework_version: s for s in REPLAYING}.values())


def _replaying(loaded: LoadedMatrix) -> list[str]:
    return [s for s, st in loaded.matrix.stacks.items() if st.framework == "verl" and Version(st.framework_version) >= Version("0.6.0")]


def _sides(loaded: LoadedMatrix, stack_id: str, dump_dir: str = "/smoke/replay", steps: int | None = None) -> ReplaySides:
    stack = loaded.matrix.stacks[stack_id]
    sku = loaded.matrix.skus[stack.skus[-1]]
    image = ImageJob.of(stack_id, stack)
    wanted = steps if steps is not None else (scheme_for(image.version).steps_replayed or 3)
    return compose_replay(
        sku, image, facts=JobFacts.of(loaded.matrix.compat), gpus=GPUS, steps=wanted,
        expansion_mode=stack.env.get("HCCL_OP_EXPANSION_MODE"), dump_dir=dump_dir,
    )  # fmt: skip


def test_every_verl_that_can_replay_is_covered(loaded: LoadedMatrix) -> None:
    assert set(_replaying(loaded)) >= {"cann8.2", "cann8.3", "cann8.5", "cann9.0", "cann9.1", "sglang-cann8.5"}


@pytest.mark.parametrize("stack_id", REPLAYING)
def test_both_runs_compose_with_the_stacks_verl_and_pass_its_checks(loaded: LoadedMatrix, stack_id: str) -> None:
    from omegaconf import OmegaConf

    verl = loaded.matrix.stacks[stack_id].framework_version
    sides = _sides(loaded, stack_id)
    for side, devices in ((sides.gpu, GPUS), (sides.npu, None)):
        config = compose_ppo_trainer(verl, list(side.overrides))  # struct mode: a key this verl lacks fails here
        assert OmegaConf.is_struct(config)
        plain: dict[str, Any] = OmegaConf.to_container(config, resolve=False)  # type: ignore[assignment]
        assert isinstance(plain, dict)
        checks = check_config(plain, verl=verl, first_autodetect="0.0", legacy_reward_ignored="0.9.0")  # the device is judged below
        assert [c.describe() for c in checks if c.status == "error" and c.name != "device"] == []
        assert plain["data"]["shuffle"] is False and plain["actor_rollout_ref"]["rollout"]["calculate_log_probs"] is True
        if devices is not None:
            assert plain["trainer"]["n_gpus_per_node"] == devices
    assert dump_names(sides.gpu) == dump_names(sides.npu)
    gpu_device = [o for o in sides.gpu.overrides if o.startswith("trainer.device=")]
    assert gpu_device in ([], ["trainer.device=cuda"]), "an old verl's device override turns to cuda on the GPU"
    assert "HCCL_DETERMINISTIC" not in sides.gpu.env and sides.gpu.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


# ---- verl's own dump-path code ------------------------------------------------------------------------------


class _DataProto:
    """verl.protocol.DataProto, as far as the skip code touches it (the real one needs torch)."""

    @staticmethod
    def load_from_disk(path: Any) -> _DataProto:
        return _DataProto()


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package, so submodules resolve under it
    return module


@contextmanager
def verl_skip_module(version: str) -> Iterator[Any]:
    """That release's rollout-skip module, imported from the vendored wheel; what it imports that needs torch or
    files not vendored is stubbed (DataProto, the dataclass bases: none of them is on the path code)."""
    stubs = {
        "torch": _stub("torch"),
        "verl.protocol": _stub("verl.protocol", DataProto=_DataProto),
        "verl.base_config": _stub("verl.base_config", BaseConfig=type("BaseConfig", (), {})),
        "verl.utils.config": _stub("verl.utils.config", omega_conf_to_dataclass=lambda c, *a, **k: c),
        "verl.workers": _stub("verl.workers"),
        "verl.workers.config": _stub("verl.workers.config"),
        "verl.workers.config.rollout": _stub("verl.workers.config.rollout", RolloutConfig=object),
    }
    real_torch = sys.modules.get("torch")
    with verl_importable(version):
        sys.modules.update(stubs)
        try:
            name = "verl.utils.skip.rollout_skip" if Version(version) >= Version("0.9.0") else "verl.utils.rollout_skip"
            yield importlib.import_module(name)
        finally:
            sys.modules.pop("torch", None)
            if real_torch is not None:
                sys.modules["torch"] = real_torch


def _dump_location(module: Any, version: str, config: Any) -> Path:
    """Where that release's RolloutSkip looks for (and writes) the first step's rollouts."""
    if Version(version) >= Version("0.9.0"):
        return Path(module.RolloutTqSkip(config.skip.rollout_tq, config)._get_step_dump_dir(1))
    skip = module.RolloutSkip(config, rollout_wg=None)
    if Version(version) >= Version("0.8.0"):
        skip.step()
        return Path(skip._get_path_dump())
    return Path(skip.curr_path_dump)


@pytest.mark.parametrize("stack_id", ONE_PER_RELEASE)
def test_the_npu_run_looks_where_the_gpu_run_dumped_by_verls_own_code(loaded: LoadedMatrix, stack_id: str, tmp_path: Path) -> None:
    verl = loaded.matrix.stacks[stack_id].framework_version
    sides = _sides(loaded, stack_id, dump_dir=str(tmp_path / "dump"))
    with verl_skip_module(verl) as module:
        wrote = _dump_location(module, verl, compose_ppo_trainer(verl, list(sides.gpu.overrides)))
        reads = _dump_location(module, verl, compose_ppo_trainer(verl, list(sides.npu.overrides)))
        assert wrote == reads and wrote.is_relative_to(tmp_path / "dump")
        # ... and a name that differs sends the NPU run elsewhere: the names are what the bundle holds them to
        changed = tuple(o.replace("data.max_response_length=128", "data.max_response_length=256") for o in sides.npu.overrides)
        names = ["max_response_length"] if Version(verl) >= Version("0.8.0") else []
        elsewhere = _dump_location(module, verl, compose_ppo_trainer(verl, list(changed)))
        assert (elsewhere != wrote) == bool(names), "from 0.8.0 the lengths are in the dump's name; before, only GBS and n"
    assert [d.split(" ")[0] for d in differing_names(dump_names(sides.gpu), dump_names(replace(sides.npu, overrides=changed)))] == [
        "max_response_length"
    ]


def _printed_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("stack_id", ["cann8.3", "cann9.0"])
def test_replay_is_proven_by_the_lines_verl_prints(
    loaded: LoadedMatrix, stack_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verl = loaded.matrix.stacks[stack_id].framework_version
    sides = _sides(loaded, stack_id, dump_dir=str(tmp_path / "dump"))
    with verl_skip_module(verl) as module:
        config = compose_ppo_trainer(verl, list(sides.npu.overrides))
        skip = module.RolloutSkip(config, rollout_wg=None)
        if Version(verl) >= Version("0.8.0"):
            skip.step()
            capsys.readouterr()
            skip.try_load()  # nothing dumped yet: verl says it will generate
            missed = _printed_lines(capsys)
            step_dir = Path(skip._get_path_dump())
            step_dir.mkdir(parents=True)
            (step_dir / "new_batch.dp").write_bytes(b"")
            (step_dir / "gen_batch.dp").write_bytes(b"")
            skip.try_load()
        else:
            capsys.readouterr()
            skip.try_load()
            missed = _printed_lines(capsys)
            Path(skip.curr_path_dump).write_bytes(b"")
            skip.try_load()
        loaded_lines = _printed_lines(capsys)
    assert evidence(verl, missed).verdict(1) is not None and evidence(verl, missed).missed
    found = evidence(verl, loaded_lines)
    assert found.verdict(1) is None and len(found.loaded) == 1 and not found.missed, loaded_lines


def _fstring(version: str, path: str, needle: str) -> ast.JoinedStr:
    """The f-string of a print call in that release's source that contains ``needle``."""
    tree = ast.parse((verl_wheel(version) / path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and needle in ast.unparse(node):
            return node
    raise AssertionError(f"{needle!r} is not printed by {path} of verl {version}")


def test_the_v1_trainers_lines_are_read_as_it_prints_them() -> None:
    """0.9.1's V1 trainer prints them only with TransferQueue running; the f-strings are taken from its source and
    evaluated with the values a run would have."""
    path = "verl/utils/skip/rollout_skip.py"
    values = {"self": types.SimpleNamespace(print_mark="[RolloutTqSkip()] "), "new_keys": [0] * 64, "load_step": 2, "step": 2}
    values |= {"new_prompt_uids": [0] * 32, "n": 2, "partition_id": "train"}
    injected = eval(compile(ast.Expression(_fstring("0.9.1", path, "Injected")), path, "eval"), values)
    no_cache = eval(compile(ast.Expression(_fstring("0.9.1", path, "No cached data found")), path, "eval"), values)
    assert evidence("0.9.1", [injected]).loaded == ("2",)
    assert evidence("0.9.1", [no_cache]).missed == ("step 2",)


# ---- what cannot replay, and the environments ---------------------------------------------------------------


def test_what_cannot_replay_is_refused_with_the_reason(loaded: LoadedMatrix) -> None:
    with pytest.raises(ReplayUnavailable, match=r"verl 0\.5\.0 has no rollout replay"):
        _sides(loaded, "cann8.1")
    with pytest.raises(ReplayUnavailable, match=r"only step 1 is a replay. Run --steps 1"):
        _sides(loaded, "cann8.3", steps=3)
    with pytest.raises(ReplayUnavailable, match=r"OpenRLHF 0\.7\.5 has no rollout replay: it dumps no rollouts"):
        _sides(loaded, "openrlhf-cann8.1")
    with pytest.raises(Exception, match=r"--gpus 6: the job's rollout tensor parallelism 2 must divide it|does not split over 6 GPUs"):
        stack = loaded.matrix.stacks["cann9.0"]
        compose_replay(loaded.matrix.skus["a3"], ImageJob.of("cann9.0", stack), facts=JobFacts.of(loaded.matrix.compat), gpus=6, steps=3)


def test_the_chips_deterministic_environment_follows_its_collectives() -> None:
    assert deterministic_env("npu") == NPU_ENV_HCCL and NPU_ENV_HCCL["HCCL_DETERMINISTIC"] == "true"
    assert deterministic_env("npu", "AIV") == NPU_ENV_LCCL and "HCCL_DETERMINISTIC" not in NPU_ENV_LCCL
    assert NPU_ENV_LCCL["LCCL_DETERMINISTIC"] == "1" and NPU_ENV_LCCL["ATB_LLM_LCOC_ENABLE"] == "0"
    assert deterministic_env("gpu")["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
