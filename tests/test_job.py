"""The smoke jobs filled for an SKU and an image: which file serves which image, per-SKU values,
the device fact, OpenRLHF's NPU split, the data size."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from buildkit.errors import InputError
from buildkit.frameworks.openrlhf import ARGS_CHECK
from buildkit.frameworks.verl.releases import DEVICE_OVERRIDE, needs_device_override
from buildkit.matrix.load import load_matrix
from buildkit.resources import SMOKE_DIR
from buildkit.run.job import (
    MODEL_DIR,
    REWARD_FILE,
    ImageJob,
    Job,
    JobFacts,
    build_job,
    check_overrides,
    job_file,
    load_job,
    spec_for,
)
from tests.conftest import TEST_MATRIX

MATRIX = load_matrix(TEST_MATRIX)  # the behaviour of jobs: the test stacks' SKUs (16 and 8 NPUs) and facts
SHIPPED = load_matrix()
SKUS = MATRIX.matrix.skus
FACTS = JobFacts.of(MATRIX.matrix.compat)
FIRST = FACTS.compat.verl_npu_autodetect
OPENRLHF = ImageJob("openrlhf-cann8.1", "0.7.5", "openrlhf")


def _job(sku_id: str = "a3", verl: str | None = "0.6.1", job: str = "grpo", **kwargs: object) -> Job:
    image = ImageJob("cann8.3", verl)
    return build_job(spec_for(image, job, FACTS), SKUS[sku_id], image, facts=FACTS, **kwargs)  # type: ignore[arg-type]


def _openrlhf(sku_id: str = "a2-box16", **kwargs: object) -> Job:
    return build_job(spec_for(OPENRLHF, "grpo", FACTS), SKUS[sku_id], OPENRLHF, facts=FACTS, **kwargs)  # type: ignore[arg-type]


def _override(argv: list[str], key: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")]
    assert len(values) == 1, f"{key} appears {len(values)} times in {argv}"
    return values[0]


def test_every_shipped_job_file_loads_and_is_what_its_name_says() -> None:
    files = sorted(p.name for p in SMOKE_DIR.glob("*.yaml"))
    assert files == ["grpo_smoke.yaml", "openrlhf_grpo_smoke.yaml", "sft_engine_smoke.yaml", "sft_smoke.yaml"]
    kinds = {name: (load_job(SMOKE_DIR / name).framework, load_job(SMOKE_DIR / name).job) for name in files}
    assert kinds == {
        "grpo_smoke.yaml": ("verl", "grpo"),
        "openrlhf_grpo_smoke.yaml": ("openrlhf", "grpo"),
        "sft_engine_smoke.yaml": ("verl", "sft"),
        "sft_smoke.yaml": ("verl", "sft"),
    }


def test_the_file_follows_the_images_framework_and_release() -> None:
    assert job_file(ImageJob("cann8.3", "0.6.1"), "grpo", FACTS).name == "grpo_smoke.yaml"
    assert job_file(ImageJob("cann8.3", "0.6.1"), "sft", FACTS).name == "sft_smoke.yaml"  # fsdp_sft_trainer
    assert job_file(ImageJob("cann8.5", "0.7.1"), "sft", FACTS).name == "sft_engine_smoke.yaml"  # compat.verl_sft_trainer
    assert job_file(ImageJob(None, None), "sft", FACTS).name == "sft_smoke.yaml", "an unknown verl gets the older entry point"
    assert job_file(OPENRLHF, "grpo", FACTS).name == "openrlhf_grpo_smoke.yaml"
    with pytest.raises(InputError, match="an OpenRLHF image has the grpo smoke job"):
        job_file(OPENRLHF, "sft", FACTS)
    with pytest.raises(InputError, match="--job 'dpo': one of grpo, sft"):
        job_file(OPENRLHF, "dpo", FACTS)


@pytest.mark.parametrize(("sku_id", "npus", "batch"), [("a3", 16, 32), ("a2-box16", 16, 32), ("350", 8, 16)])
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


@pytest.mark.parametrize(("sku_id", "npus"), [("a3", 16), ("350", 8)])
def test_the_sft_job_is_torchrun_on_one_node_with_lora(sku_id: str, npus: int) -> None:
    job = _job(sku_id, job="sft", steps=5)
    assert job.argv[:6] == ["torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={npus}", "-m", "verl.trainer.fsdp_sft_trainer"]
    assert _override(job.argv, "data.train_batch_size") == str(4 * npus)
    assert _override(job.argv, "trainer.n_gpus_per_node") == str(npus)
    assert _override(job.argv, "model.lora_rank") == "32" and _override(job.argv, "model.partial_pretrain") == MODEL_DIR
    assert job.appended == (DEVICE_OVERRIDE,) and job.overrides[-1] == DEVICE_OVERRIDE, "fsdp_sft_trainer never sets the device itself"
    assert job.data_format == "verl-sft"
    assert job.check_argv() == ["python3", "-m", "verl.trainer.fsdp_sft_trainer", "--cfg", "job", *job.overrides]
    engine = _job(sku_id, verl="0.7.1", job="sft", steps=5)
    assert engine.module == "verl.trainer.sft_trainer" and not engine.appended
    assert _override(engine.argv, "model.path") == MODEL_DIR and _override(engine.argv, "data.messages_key") == "messages"
    with pytest.raises(InputError, match="runs on one node"):
        _job(sku_id, job="sft", steps=5, nnodes=2)


@pytest.mark.parametrize(("sku_id", "nodes", "actors", "engines"), [("a2-box16", 1, 8, 8), ("350", 1, 4, 4), ("a2-box16", 3, 8, 24)])
def test_openrlhf_splits_each_node_between_the_actor_and_vllm(sku_id: str, nodes: int, actors: int, engines: int) -> None:
    job = _openrlhf(sku_id, steps=5, nnodes=nodes)
    flags = dict((f.split("=", 1)[0], f.split("=", 1)[1]) if "=" in f else (f, "") for f in job.overrides)
    assert job.argv[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    assert flags["--actor_num_nodes"] == flags["--ref_num_nodes"] == str(nodes)
    assert flags["--actor_num_gpus_per_node"] == flags["--ref_num_gpus_per_node"] == str(actors)
    assert "--colocate_actor_ref" in flags and flags["--vllm_num_engines"] == str(engines)
    assert actors * nodes + engines * int(flags["--vllm_tensor_parallel_size"]) == SKUS[sku_id].npus_per_node * nodes
    batch = 2 * actors * nodes
    assert flags["--rollout_batch_size"] == str(batch) and flags["--train_batch_size"] == str(2 * batch)
    assert flags["--max_samples"] == str(5 * batch), "exactly the steps asked for, in one episode"
    assert flags["--remote_rm_url"] == REWARD_FILE and flags["--prompt_data"] == "/smoke/out/data/train.parquet"
    assert job.data_format == "openrlhf-rl" and not job.appended
    assert not [a for a in job.argv if "{" in a or "}" in a], "every placeholder is filled"
    assert job.check_argv() == ["python3", ARGS_CHECK, "openrlhf.cli.train_ppo_ray", *job.overrides]


def test_openrlhf_starts_a_ray_head_with_the_nodes_npus_on_one_node_only() -> None:
    one = _openrlhf("350", steps=5)
    assert one.ray_npus == 8
    shell = one.shell(generate_data=True)
    steps = shell.removeprefix("set -e; ").split("; ")
    assert steps[0].startswith("python3 /opt/ascendkit-smoke/gsm8k_synth.py") and steps[0].endswith("--format openrlhf-rl")
    assert shlex.split(steps[1])[:3] == ["ray", "start", "--head"]
    assert json.loads(shlex.split(steps[1])[-1].removeprefix("--resources=")) == {"NPU": 8}
    assert steps[2].startswith("exec python3 -m openrlhf.cli.train_ppo_ray ")
    assert _openrlhf("350", steps=5, nnodes=2).ray_npus == 0, "on several nodes KubeRay or the Volcano head starts Ray"
    assert _job(steps=5).ray_npus == 0, "verl starts its own Ray"


def test_the_device_follows_the_images_verl_and_the_users_overrides_come_last() -> None:
    old = _job(verl="0.6.1", steps=2, extra=("trainer.test_freq=-1",))
    assert DEVICE_OVERRIDE in old.overrides and old.appended
    assert old.argv[-1] == "trainer.test_freq=-1"
    assert DEVICE_OVERRIDE not in _job(verl="0.7.1", steps=2).overrides
    assert DEVICE_OVERRIDE in _job(verl=None, steps=2).overrides, "an image that does not say gets the safe choice"


def test_every_shipped_stack_with_an_old_verl_gets_the_override_from_the_fact_alone() -> None:
    """No per-stack list: a stack's verl release and compat.verl_npu_autodetect decide."""
    expected = {
        "cann8.1": True,
        "cann8.2": True,
        "cann8.3": True,
        "cann8.5": False,
        "cann9.0": False,
        "cann9.1": False,
        "cann9.2": False,
        "sglang-cann8.5": False,
    }
    got = {s: needs_device_override(st.framework_version, FIRST) for s, st in SHIPPED.matrix.stacks.items() if st.framework == "verl"}
    assert got == expected
    assert needs_device_override("0.6.99", "0.7.0") and not needs_device_override("0.7.0", "0.7.0")
    assert needs_device_override("not-a-version", "0.7.0")


def test_tensor_parallel_must_divide_the_npus() -> None:
    spec = load_job(SMOKE_DIR / "grpo_smoke.yaml").model_copy(update={"tensor_parallel": 3})
    with pytest.raises(InputError, match="does not divide the SKU's 16 NPUs"):
        build_job(spec, SKUS["a3"], ImageJob(None, None), facts=FACTS, steps=1)
    spec = spec_for(OPENRLHF, "grpo", FACTS).model_copy(update={"tensor_parallel": 3})
    with pytest.raises(InputError, match="leaves 8 for rollout engines of tensor_parallel 3"):
        build_job(spec, SKUS["a2-box16"], OPENRLHF, facts=FACTS, steps=1)


@pytest.mark.parametrize(("sku_id", "nodes", "steps", "rows"), [("a3", 1, 5, 256), ("a2-box16", 2, 5, 320), ("350", 4, 10, 640)])
def test_the_data_holds_every_steps_batch(sku_id: str, nodes: int, steps: int, rows: int) -> None:
    job = _job(sku_id, steps=steps, nnodes=nodes)
    assert job.train_rows == rows and job.train_rows >= job.batch * steps
    assert job.data_command()[-4:] == ["--train", str(rows), "--format", "verl-rl"]
    assert job.shell(generate_data=True).startswith("set -e; python3 /opt/ascendkit-smoke/gsm8k_synth.py --out /smoke/out/data --train")


def test_the_check_runs_the_same_command_with_cfg_job() -> None:
    job = _job(steps=5)
    assert job.check_argv() == [*job.command, "--cfg", "job", *job.overrides]


def test_overrides_take_each_frameworks_form() -> None:
    assert check_overrides(["a.b=1", "--seed=7", "--bf16"]) == ("a.b=1", "--seed=7", "--bf16"), "before the image is read: either"
    with pytest.raises(InputError, match=r"a flag --name\[=value\] \(OpenRLHF\) or a Hydra override KEY=VALUE \(verl\)"):
        check_overrides(["nonsense"])
    with pytest.raises(InputError, match="this image runs verl, whose arguments are Hydra overrides"):
        check_overrides(["--seed=7"], "verl")
    with pytest.raises(InputError, match="this image runs OpenRLHF, whose arguments are flags"):
        check_overrides(["seed=7"], "openrlhf")
    assert check_overrides(["--colocate_all_models"], "openrlhf") == ("--colocate_all_models",)


def test_a_bad_job_file_names_file_line_and_field(tmp_path: Path) -> None:
    head = "framework: verl\njob: grpo\nmodule: verl.trainer.main_ppo\ndata: verl-rl\n"
    bad = tmp_path / "job.yaml"
    bad.write_text(head + "tensor_parallel: 2\nprompts_per_npu: 1\noverrides:\n  - a={npus}\n  - b={gpus}\n")
    with pytest.raises(InputError) as err:
        load_job(bad)
    assert f"{bad}:9:" in str(err.value) and "overrides[1]" in str(err.value) and "{gpus}" in str(err.value)
    bad.write_text(head + "tensor_parallel: two\nprompts_per_npu: 1\nstacks: {}\n")
    with pytest.raises(InputError) as err:
        load_job(bad)
    assert f"{bad}:5:" in str(err.value) and "tensor_parallel" in str(err.value) and "stacks" in str(err.value)
    bad.write_text("framework: openrlhf\njob: grpo\nmodule: openrlhf.cli.train_ppo_ray\ndata: openrlhf-rl\nprompts_per_npu: 1\n")
    with pytest.raises(InputError, match="give actor_share"):
        load_job(bad)


def test_the_grpo_job_selects_the_images_rollout_engine() -> None:
    """vLLM for an image without the label or with rollout vllm; SGLang with the Ascend backend and its env."""
    spec = spec_for(ImageJob("cann8.5", "0.7.1"), "grpo", FACTS)
    vllm = build_job(spec, SKUS["a3"], ImageJob("cann8.5", "0.7.1"), facts=FACTS, steps=2)
    assert "actor_rollout_ref.rollout.name=vllm" in vllm.overrides and "HCCL_HOST_SOCKET_PORT_RANGE" not in vllm.env
    stack = MATRIX.matrix.stacks["teststack-sglang"]
    image = ImageJob.of("teststack-sglang", stack)
    assert image.rollout == "sglang"
    sglang = build_job(spec, SKUS["a3"], image, facts=FACTS, steps=2, extra=("trainer.test_freq=-1",))
    assert "actor_rollout_ref.rollout.name=sglang" in sglang.overrides
    assert "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend" in sglang.overrides
    assert not any(o.endswith("rollout.name=vllm") for o in sglang.overrides)
    assert sglang.overrides[-1] == "trainer.test_freq=-1", "the user's overrides stay last"
    assert sglang.env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1" and sglang.env["HYDRA_FULL_ERROR"] == "1"
    with pytest.raises(InputError, match="no settings for the trtllm rollout"):
        build_job(spec, SKUS["a3"], ImageJob("x", "0.8.0", rollout="trtllm"), facts=FACTS, steps=2)
    sft = build_job(spec_for(image, "sft", FACTS), SKUS["a3"], image, facts=FACTS, steps=2)
    assert not any("rollout.name" in o for o in sft.overrides), "SFT has no rollout"


def test_a_placeholder_in_a_rollouts_override_is_checked(tmp_path: Path) -> None:
    text = (SMOKE_DIR / "grpo_smoke.yaml").read_text().replace("rollout.name=sglang", "rollout.name={engine}")
    bad = tmp_path / "grpo.yaml"
    bad.write_text(text)
    with pytest.raises(InputError, match=r"grpo\.yaml:\d+:\d+: error: rollouts\.sglang\.overrides\[0\]: unknown placeholder \{engine\}"):
        load_job(bad)
