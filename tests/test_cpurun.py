"""The CPU run's judgement (buildkit/run/cpuverdict.py), its environments (cpuenv.py) and its choice of stacks.

The logs below are shaped as the runs print them (Ray's prefixes, Hydra's full errors); the runs
themselves are CI's ``cpu-run`` job (tests/harness/cpu_run.py), in each stack's own packages.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.resources import SMOKE_DIR
from buildkit.run.cpuenv import LEFT_OUT, plan_env
from buildkit.run.cpurun import LocalPlace, boundary_command, cpu_env, cpu_job
from buildkit.run.cpuverdict import judge_boundary, judge_step
from buildkit.run.job import ImageJob, JobFacts
from tests.conftest import MATRIX
from tests.harness.cpu_run import default_stacks


def _boundary_module() -> object:
    spec = importlib.util.spec_from_file_location("cpu_boundary", SMOKE_DIR / "cpu_boundary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


accelerator_demands = _boundary_module().accelerator_demands  # type: ignore[attr-defined]
SITE = "/venv/lib/python3.11/site-packages"
RAY_TASK = "ray.exceptions.RayTaskError({name}): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=1, ip=192.0.2.2)"


def traceback(frames: list[tuple[str, int, str]], name: str, message: str, ray: bool = True) -> str:
    lines = ["(TaskRunner pid=1) 'actor_rollout_ref': {'actor': {}},", "ray init kwargs: {}", "Traceback (most recent call last):"]
    lines += [f'  File "{path}", line {line}, in {func}\n    code()' for path, line, func in frames]
    if ray:
        lines.append(RAY_TASK.format(name=name))
    lines.append(f"{name}: {message}")
    return "\n".join(lines) + "\n"


RUNNER = (f"{SITE}/verl/trainer/main_ppo.py", 137, "run")


def test_the_resource_pool_check_is_the_boundary() -> None:
    log = traceback(
        [RUNNER, (f"{SITE}/verl/trainer/ppo/ray_trainer.py", 116, "_check_resource_available")],
        "ValueError",
        "Total available GPUs 0 is less than total desired GPUs 16",
    )
    verdict = judge_boundary("verl", {"exit_code": 1, "stopped": None}, log)
    assert verdict.reached and verdict.kind == "boundary"
    assert "asks Ray for 16 accelerators and finds 0" in verdict.where
    assert "configuration composed and printed" in verdict.ran and "trainer built, its workers asked for" in verdict.ran


def test_a_wait_for_accelerators_is_the_boundary_and_other_waits_are_not() -> None:
    waiting = {
        "exit_code": None,
        "stopped": "waiting-for-accelerators",
        "demands": ["{'NPU': 1.0} * 16 (PACK): 1+ pending placement groups"],
    }
    assert judge_boundary("verl", waiting, "").reached
    bound = judge_boundary("verl", {"exit_code": None, "stopped": "bound", "bound_s": 900.0, "demands": []}, "")
    assert not bound.reached and bound.kind == "bound" and "900.0 s" in bound.detail


STATUS = """Resources
---------------------------------------------------------------
Total Usage:
 9.0/32.0 CPU

From request_resources:
 (none)
Pending Demands:
 {'CPU': 1.0}: 2+ pending tasks/actors
 {'NPU': 1.0} * 16 (PACK): 1+ pending placement groups
"""


def test_ray_status_demands_for_accelerators_are_told_from_cpu_demands() -> None:
    assert accelerator_demands(STATUS) == ["{'NPU': 1.0} * 16 (PACK): 1+ pending placement groups"]
    ray_2_43 = "Usage:\n 0.0/12.0 CPU\n\nDemands:\n {'NPU': 1.0, 'CPU': 1.0} * 8 (PACK): 1+ pending placement groups\n"
    assert accelerator_demands(ray_2_43) == ["{'NPU': 1.0, 'CPU': 1.0} * 8 (PACK): 1+ pending placement groups"], "Ray 2.4x's header"
    assert accelerator_demands(STATUS.replace(" {'NPU': 1.0} * 16 (PACK): 1+ pending placement groups\n", "")) == []
    assert accelerator_demands("Pending Demands:\n (no resource demands)\n") == []


# Each failure class as it would be planted in a copy: the check must name it, with where.
@pytest.mark.parametrize(
    ("frames", "name", "message", "kind", "said"),
    [
        ([RUNNER], "ModuleNotFoundError", "No module named 'transfer_queue'", "import", "module transfer_queue imported at"),
        (
            [(f"{SITE}/hydra/_internal/config_loader_impl.py", 390, "_apply_overrides_to_config")],
            "ConfigCompositionException",
            "Could not override 'actor_rollout_ref.actor.optim.lrr'.",
            "configuration",
            "config_loader_impl.py:390",
        ),
        (
            [RUNNER, (f"{SITE}/verl/utils/dataset/rl_dataset.py", 160, "_read_files_and_tokenize")],
            "KeyError",
            "'prompt'",
            "data",
            "rl_dataset.py:160",
        ),
        (
            [RUNNER, (f"{SITE}/verl/workers/reward_manager/naive.py", 85, "__call__")],
            "TypeError",
            "compute_score() got an unexpected keyword argument 'data_source'",
            "reward",
            "naive.py:85",
        ),
    ],
)
def test_each_failure_before_the_boundary_is_named_with_its_place(
    frames: list[tuple[str, int, str]], name: str, message: str, kind: str, said: str
) -> None:
    verdict = judge_boundary("verl", {"exit_code": 1, "stopped": None}, traceback(frames, name, message))
    assert not verdict.reached
    assert verdict.kind == kind and said in verdict.where
    assert verdict.detail == f"{name}: {message}"


def test_an_error_the_log_holds_is_the_verdict_even_when_the_driver_still_waits_at_the_bound() -> None:
    """A task runner that died importing while its driver waits on it: the bound must not hide the error."""
    log = traceback(
        [RUNNER, (f"{SITE}/verl/workers/rollout/llm_server.py", 28, "<module>")], "ModuleNotFoundError", "No module named 'cachetools'"
    )
    verdict = judge_boundary("verl", {"exit_code": None, "stopped": "bound", "bound_s": 900.0, "demands": []}, log)
    assert not verdict.reached and verdict.kind == "import"
    assert "module cachetools imported at" in verdict.where and "llm_server.py:28" in verdict.where
    assert "still running" in verdict.detail


def test_the_step_is_held_to_what_a_step_must_do() -> None:
    good: dict[str, Any] = {
        "rewards": [1.0, 0.0],
        "reward_calls": 2,
        "advantages": [0.7, -0.7],
        "loss": 0.6,
        "grad_norm": 0.3,
        "parameters_changed": 26,
    }
    assert judge_step(good, "").reached
    changes: list[tuple[dict[str, Any], str]] = [
        ({"reward_calls": 1}, "called 1 times for 2 responses"),
        ({"advantages": [0.0, 0.0]}, "every GRPO advantage is zero"),
        ({"loss": float("nan")}, "not finite"),
        ({"grad_norm": 0.0}, "gradient norm is zero"),
        ({"parameters_changed": 0}, "no weight changed"),
    ]
    for change, said in changes:
        verdict = judge_step({**good, **change}, "")
        assert not verdict.reached and said in verdict.detail
    crashed = judge_step(None, traceback([RUNNER], "ModuleNotFoundError", "No module named 'verl'", ray=False))
    assert not crashed.reached and crashed.kind == "import"


def test_a_stack_with_a_resolved_lock_runs_its_locked_versions_less_what_cannot_be_had(loaded: LoadedMatrix, tmp_path: Path) -> None:
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    plan = plan_env(loaded, "cann8.3", wheel, tmp_path)
    names = {r.split("==")[0].lower() for r in plan.requirements}
    assert "verl" in names and "ray" in names and "transformers" in names
    assert not names & (set(LEFT_OUT) | {"torch"})
    assert {n for n, _, _ in plan.left_out} >= {"torch-npu", "vllm", "vllm-ascend", "triton-ascend"}
    assert plan.source == "locks/cann8.3-aarch64.txt"
    said = plan.left_out_report()
    assert said[-1]["package"].startswith("torch==2.7.1") and wheel.name in said[-1]["why"]


def test_ci_runs_the_default_stack_and_the_newest_stack_of_each_framework(loaded: LoadedMatrix) -> None:
    chosen = default_stacks(loaded)
    stacks = loaded.matrix.stacks
    assert chosen[0] == next(s for s, st in stacks.items() if st.default)
    for name in ("verl", "openrlhf"):
        newest = [s for s, st in stacks.items() if st.framework == name and st.rollout == "vllm"][-1]
        assert newest in chosen
    assert len(chosen) == len(set(chosen))


def test_an_openrlhf_stack_builds_what_its_entry_point_imports_and_its_fork_from_the_tree_given(
    loaded: LoadedMatrix, tmp_path: Path
) -> None:
    """OpenRLHF's launcher imports vllm before its boundary: built here as the image builds it (no device), not left
    out; DeepSpeed builds against the CPU torch; torch_npu is said to be the stand-in; the fork comes from a tree."""
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    with pytest.raises(InputError, match=r"openrlhf-cann8.1: its openrlhf is built from openrlhf-ascend at 06ac74cf"):
        plan_env(loaded, "openrlhf-cann8.1", wheel, tmp_path)
    plan = plan_env(loaded, "openrlhf-cann8.1", wheel, tmp_path, framework_tree=tmp_path / "fork")
    builds = dict(plan.builds)
    assert builds["deepspeed==0.16.7"] == (("DS_BUILD_OPS", "0"),)
    assert builds["vllm==0.8.5.post1"] == (("VLLM_TARGET_DEVICE", "empty"),)
    assert not {r for r in plan.requirements if r.startswith(("deepspeed==", "vllm=="))}, "built after torch, not with the rest"
    left = {n: why for n, _, why in plan.left_out}
    assert "vllm" not in left and "vllm-ascend" in left and "cpu_standins/torch_npu" in left["torch-npu"]
    assert plan.framework_tree == tmp_path / "fork" and plan.framework_env == (("TARGET_DEVICE", "NPU"),)
    verl = plan_env(loaded, "cann8.3", wheel, tmp_path)
    assert "vllm" in {n for n, _, _ in verl.left_out} and not verl.builds, "verl imports vllm only after its boundary"


def test_a_torchrun_job_runs_one_rank_to_its_boundary_without_ray(loaded: LoadedMatrix, tmp_path: Path) -> None:
    stack = loaded.matrix.stacks["cann8.3"]
    place = LocalPlace(Path("/venv/bin/python"), tmp_path)
    facts = JobFacts.of(loaded.matrix.compat)
    sft = cpu_job(ImageJob.of("cann8.3", stack), "sft", loaded.matrix.skus["a3"], facts, place)
    command, on_ray = boundary_command(sft)
    assert command[:4] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=1"] and not on_ray
    assert "--nproc_per_node=16" in sft.command, "the job itself is the SKU's"
    grpo = cpu_job(ImageJob.of("cann8.3", stack), "grpo", loaded.matrix.skus["a3"], facts, place)
    assert boundary_command(grpo) == (list(grpo.command), True)


def test_openrlhfs_reward_file_is_the_one_the_place_sees() -> None:
    loaded = load_matrix(MATRIX)
    stack = loaded.matrix.stacks["openrlhf-cann8.1"]
    place = LocalPlace(Path("/venv/bin/python"), Path("/w"), smoke_dir="/mnt/smoke")
    job = cpu_job(ImageJob.of("openrlhf-cann8.1", stack), "grpo", loaded.matrix.skus["a2-box16"], JobFacts.of(loaded.matrix.compat), place)
    assert "--remote_rm_url=/mnt/smoke/gsm8k_reward.py" in job.overrides and "--pretrain=/w/model" in job.overrides


def test_the_cpu_environment_puts_a_frameworks_stand_ins_first_on_the_path() -> None:
    env = cpu_env("openrlhf", "/mnt/smoke", {"RAY_DEDUP_LOGS": "0"}, {"PYTHONPATH": "/planted"})
    assert env["PYTHONPATH"] == "/planted" + os.pathsep + "/mnt/smoke/cpu_standins" and env["DS_ACCELERATOR"] == "cpu"
    assert "PYTHONPATH" not in cpu_env("verl", "/mnt/smoke", {}, {}) and cpu_env("verl", "/s", {}, {})["OMP_NUM_THREADS"] == "1"


def test_the_sft_boundary_is_the_process_groups_collective_backend() -> None:
    frames = [
        (f"{SITE}/verl/trainer/sft_trainer.py", 455, "run_sft"),
        (f"{SITE}/verl/utils/distributed.py", 64, "initialize_global_process_group"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 2181, "_new_process_group_helper"),
    ]
    for message in ("Distributed package doesn't have NCCL built in", "No available nccl backend found on device type cpu."):
        verdict = judge_boundary("verl", {"exit_code": 1}, traceback(frames, "RuntimeError", message, ray=False))
        assert verdict.reached and "initialize_global_process_group" in verdict.where, message
        assert "the SFT trainer's main ran (torchrun's rank started)" in verdict.ran
    # the same error anywhere else is not the boundary
    elsewhere = [(f"{SITE}/verl/trainer/sft_trainer.py", 100, "build_model")]
    verdict = judge_boundary(
        "verl", {"exit_code": 1}, traceback(elsewhere, "RuntimeError", "Distributed package doesn't have NCCL built in", ray=False)
    )
    assert not verdict.reached


def test_openrlhfs_wait_for_npus_is_its_boundary_with_what_ran_before() -> None:
    log = "\n".join(
        [
            "2026-12-05 00:09:31,886\tINFO worker.py:1841 -- Connected to Ray cluster.",
            "Namespace(ref_num_nodes=1, actor_num_gpus_per_node=8)",
            "(autoscaler +16s) Error: No available node types can fulfill resource request {'CPU': 1.0, 'NPU': 1.0}. Add suitable",
        ]
    )
    demands = ["{'NPU': 1.0, 'CPU': 1.0} * 8 (PACK): 1+ pending placement groups"]
    verdict = judge_boundary("openrlhf", {"exit_code": None, "stopped": "waiting-for-accelerators", "demands": demands}, log)
    assert verdict.reached and "placement group" in verdict.where and "NPU" in verdict.detail
    assert len(verdict.ran) == 3


def test_an_error_behind_torch_distributeds_rank_prefix_is_read() -> None:
    log = "\n".join(
        [
            "[rank0]: Traceback (most recent call last):",
            f'[rank0]:   File "{SITE}/verl/workers/reward_manager/naive.py", line 89, in __call__',
            '[rank0]:   File "/opt/ascendkit-smoke/cpu_step_verl.py", line 167, in counted',
            "[rank0]: TypeError: compute_score() got an unexpected keyword argument 'data_source'",
        ]
    )
    verdict = judge_step(None, log)
    assert verdict.kind == "reward" and "unexpected keyword argument 'data_source'" in verdict.detail


def test_an_sft_step_is_held_to_training_tokens_a_finite_loss_and_moved_weights() -> None:
    good = {
        "job": "sft", "trained_tokens": 3581, "loss": 6.01, "grad_norm": 0.13, "parameters_changed": 28, "parameters": 28,
        "batch": {"sequences": 64, "dataset_rows": 64}, "lora_rank": 32, "differs": "d",
    }  # fmt: skip
    assert judge_step(good, "").reached, "no reward and no advantage is asked of a supervised step"
    for broken, said in (
        ({"trained_tokens": 0}, "the loss mask trains no token"),
        ({"loss": float("nan")}, "the loss is not finite"),
        ({"grad_norm": 0.0}, "the gradient norm is zero"),
        ({"parameters_changed": 0}, "no weight changed"),
    ):
        verdict = judge_step({**good, **broken}, "")
        assert not verdict.reached and said in verdict.detail, broken


def _scripted_python(tmp_path: Path, script: str) -> Path:
    """A place's ``python3`` that is a shell script: it records its arguments and does what ``script`` says."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\n{script}\n', encoding="utf-8")
    fake.chmod(0o755)
    return bin_dir / "python"


def test_a_place_keeps_what_a_program_printed_apart_from_its_log_when_asked(tmp_path: Path) -> None:
    python = _scripted_python(tmp_path, 'echo "composed: {}"\necho "a warning" >&2\nexit 3')
    place = LocalPlace(python, tmp_path)
    assert place.run(["python3", "-m", "x"], {}, tmp_path / "log", 30, stdout=tmp_path / "out") == 3
    assert (tmp_path / "out").read_text() == "composed: {}\n" and (tmp_path / "log").read_text() == "a warning\n"
    assert place.run(["python3"], {}, tmp_path / "log", 30) == 3
    assert (tmp_path / "log").read_text() == "a warning\ncomposed: {}\na warning\n", "without stdout=, both go to the log"


@pytest.mark.parametrize(
    ("stack_id", "sku_id", "first"),
    [("cann8.3", "a3", ["-m", "verl.trainer.main_ppo", "--cfg", "job"]), ("openrlhf-cann8.1", "a2-box16", ["/mnt/smoke/openrlhf_args.py"])],
)
def test_the_cpu_runs_config_check_is_smokes_with_the_runs_overrides_and_a_refusal_fails_the_run(
    stack_id: str, sku_id: str, first: list[str], tmp_path: Path
) -> None:
    from buildkit.run.cpurun import CpuRun, config_check_at, render_markdown
    from buildkit.run.cpuverdict import Verdict

    loaded = load_matrix(MATRIX)
    stack = loaded.matrix.stacks[stack_id]
    python = _scripted_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'acme_rewards'\" >&2\nexit 1")
    place = LocalPlace(python, tmp_path / "work", smoke_dir="/mnt/smoke")
    (tmp_path / "work").mkdir()
    image, facts, sku = ImageJob.of(stack_id, stack), JobFacts.of(loaded.matrix.compat), loaded.matrix.skus[sku_id]
    job = cpu_job(image, "grpo", sku, facts, place)
    check = config_check_at(place, tmp_path / "work", job, image, (*job.overrides, "team.extra=1"), {}, sku, facts)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[: len(first)] == first and argv[-1] == "team.extra=1", "the job's module, its overrides and the run's own"
    assert not check["passed"] and "acme_rewards" in check["error"] and check["command"][1:] == argv
    run = CpuRun(stack_id, "grpo", stack.framework, None, "here", Verdict(True, "w", "boundary"), None, {}, None, 1.0, [], check)
    assert not run.passed and (run.failure() or "").startswith(f"{stack_id} {stack.framework} grpo: the config check refused the job:")
    assert "| **refused**: " in render_markdown([run])
