"""The smoke job filled for an SKU and an image: per-SKU values, the device fact, the data size."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildkit.errors import InputError
from buildkit.matrix.load import load_matrix
from buildkit.run.job import DEVICE_OVERRIDE, MODEL_DIR, ImageJob, Job, build_job, load_job, needs_device_override

MATRIX = load_matrix()
SKUS = MATRIX.matrix.skus
FIRST = MATRIX.matrix.compat.verl_npu_autodetect


def _job(sku_id: str = "a3", verl: str | None = "0.6.1", **kwargs: object) -> Job:
    return build_job(load_job(), SKUS[sku_id], ImageJob("cann8.3", verl), first_autodetect=FIRST, **kwargs)  # type: ignore[arg-type]


def _override(argv: list[str], key: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")]
    assert len(values) == 1, f"{key} appears {len(values)} times in {argv}"
    return values[0]


@pytest.mark.parametrize(("sku_id", "npus", "batch"), [("a3", 16, 32), ("a2-box16", 16, 32), ("900-podc", 8, 16)])
def test_per_sku_values_come_from_the_matrix(sku_id: str, npus: int, batch: int) -> None:
    argv = _job(sku_id, steps=3).argv
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert _override(argv, "algorithm.adv_estimator") == "grpo"
    assert _override(argv, "trainer.n_gpus_per_node") == str(npus)
    assert _override(argv, "trainer.nnodes") == "1"
    assert _override(argv, "actor_rollout_ref.rollout.tensor_model_parallel_size") == "2"
    assert _override(argv, "data.train_batch_size") == str(batch)
    assert _override(argv, "trainer.total_training_steps") == "3"
    assert _override(argv, "actor_rollout_ref.model.path") == MODEL_DIR
    assert not [a for a in argv if "{" in a or "}" in a], "every placeholder is filled"


def test_the_device_follows_the_images_verl_and_the_users_overrides_come_last() -> None:
    old = _job(verl="0.6.1", steps=2, extra=("trainer.test_freq=-1",))
    assert DEVICE_OVERRIDE in old.overrides and old.device_override
    assert old.argv[-1] == "trainer.test_freq=-1"
    assert DEVICE_OVERRIDE not in _job(verl="0.7.1", steps=2).overrides
    assert DEVICE_OVERRIDE in _job(verl=None, steps=2).overrides, "an image that does not say gets the safe choice"


def test_every_shipped_stack_with_an_old_verl_gets_the_override_from_the_fact_alone() -> None:
    """No per-stack list: a stack's verl release and compat.verl_npu_autodetect decide."""
    expected = {"cann8.1": True, "cann8.2": True, "cann8.3": True, "cann8.5": False, "cann9.1": False}
    got = {s: needs_device_override(st.verl.version, FIRST) for s, st in MATRIX.matrix.stacks.items()}
    assert got == expected
    assert needs_device_override("0.6.99", "0.7.0") and not needs_device_override("0.7.0", "0.7.0")
    assert needs_device_override("not-a-version", "0.7.0")


def test_tensor_parallel_must_divide_the_npus() -> None:
    spec = load_job().model_copy(update={"tensor_parallel": 3})
    with pytest.raises(InputError, match="does not divide the SKU's 16 NPUs"):
        build_job(spec, SKUS["a3"], ImageJob(None, None), first_autodetect=FIRST, steps=1)


@pytest.mark.parametrize(("sku_id", "nodes", "steps", "rows"), [("a3", 1, 5, 256), ("a2-box16", 2, 5, 320), ("900-podc", 4, 10, 640)])
def test_the_data_holds_every_steps_batch(sku_id: str, nodes: int, steps: int, rows: int) -> None:
    job = _job(sku_id, steps=steps, nnodes=nodes)
    assert job.train_rows == rows and job.train_rows >= job.batch * steps
    assert job.data_command()[-2:] == ["--train", str(rows)]
    assert job.shell(generate_data=True).startswith("set -e; python3 /opt/ascendkit-smoke/gsm8k_synth.py --out /smoke/out/data --train")


def test_the_check_runs_the_same_command_with_cfg_job() -> None:
    job = _job(steps=5)
    assert job.check_argv() == [*job.command, "--cfg", "job", *job.overrides]


def test_a_bad_job_file_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("command: [python3]\ntensor_parallel: 2\nprompts_per_npu: 1\noverrides:\n  - a={npus}\n  - b={gpus}\n")
    with pytest.raises(InputError) as err:
        load_job(bad)
    assert f"{bad}:6:" in str(err.value) and "overrides[1]" in str(err.value) and "{gpus}" in str(err.value)
    bad.write_text("command: [python3]\ntensor_parallel: two\nprompts_per_npu: 1\nstacks: {}\n")
    with pytest.raises(InputError) as err:
        load_job(bad)
    assert f"{bad}:2:" in str(err.value) and "tensor_parallel" in str(err.value) and "stacks" in str(err.value)
