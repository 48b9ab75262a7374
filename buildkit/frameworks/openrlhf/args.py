"""What OpenRLHF would find wrong with its parsed arguments only once Ray is up, checked before it starts.

OpenRLHF's parser and its own assertions run in the image first (``smoke_tests/openrlhf_args.py``
stops the entry point where it would call ``ray.init``). What is left is found only on the cluster,
after the NPUs were booked: placement groups that ask for more NPUs than there are (Ray waits for
them forever), DeepSpeed's batch arithmetic (it refuses when the actors initialise), the fork's
unsupported hybrid engine, and the actor/reference colocation that ``train()`` asserts after
``ray.init``. Each is named for what would have happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from buildkit.doctor.base import Check

MARK = "ASCENDKIT-ARGS "  # what openrlhf_args.py prints before the arguments' JSON
# The Ascend fork's docs list the hybrid engine as unsupported on NPU (docs/ascend/ascend.md, the
# branch table's "不支持功能"): these flags turn it on.
HYBRID_ENGINE = ("colocate_all_models", "vllm_enable_sleep", "deepspeed_enable_sleep")


def parse_printed_args(stdout: str) -> dict[str, Any] | None:
    """The arguments openrlhf_args.py printed, or None when it printed none."""
    import json

    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _int(args: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = args.get(key)
    return default if value is None else int(value)


def npu_demand(args: Mapping[str, Any]) -> dict[str, int]:
    """NPUs each role's placement asks Ray for, as train() creates them (fork v0.7.5)."""
    demand = {"actor": _int(args, "actor_num_nodes", 1) * _int(args, "actor_num_gpus_per_node", 8)}
    if float(args.get("init_kl_coef") or 0) > 0 and not args.get("colocate_actor_ref"):
        demand["reference"] = _int(args, "ref_num_nodes", 1) * _int(args, "ref_num_gpus_per_node", 8)
    if not args.get("remote_rm_url"):
        demand["reward model"] = _int(args, "reward_num_nodes", 1) * _int(args, "reward_num_gpus_per_node", 8)
    if args.get("critic_pretrain") and not args.get("colocate_critic_reward"):
        demand["critic"] = _int(args, "critic_num_nodes", 1) * _int(args, "critic_num_gpus_per_node", 8)
    engines = _int(args, "vllm_num_engines")
    if engines > 0:
        demand["vLLM"] = engines * _int(args, "vllm_tensor_parallel_size", 1)
    return demand


def check_args(args: Mapping[str, Any], *, npus_per_node: int, nnodes: int, steps: int | None = None) -> list[Check]:
    """The checks, for a job on ``nnodes`` nodes of ``npus_per_node`` NPUs (and ``steps`` steps, when given)."""
    checks: list[Check] = []
    hybrid = [f"--{flag}" for flag in HYBRID_ENGINE if args.get(flag)]
    checks.append(
        Check("hybrid engine", "error", f"{' '.join(hybrid)}: the hybrid engine is not supported on NPU by the Ascend fork")
        if hybrid
        else Check("hybrid engine", "ok", "off (the Ascend fork does not support it)")
    )
    if args.get("colocate_actor_ref") and float(args.get("init_kl_coef") or 0) > 0:
        same = (_int(args, "actor_num_nodes", 1), _int(args, "actor_num_gpus_per_node", 8)) == (
            _int(args, "ref_num_nodes", 1),
            _int(args, "ref_num_gpus_per_node", 8),
        )
        checks.append(
            Check("colocation", "ok", "actor and reference share their NPUs")
            if same
            else Check("colocation", "error", "--colocate_actor_ref needs the reference on the actor's nodes and NPUs (train() asserts it)")
        )
    demand = npu_demand(args)
    total, have = sum(demand.values()), npus_per_node * nnodes
    parts = ", ".join(f"{role} {n}" for role, n in demand.items())
    checks.append(
        Check("NPU placement", "ok", f"{total} of the {have} NPUs of {nnodes} node(s): {parts}")
        if total <= have
        else Check(
            "NPU placement",
            "error",
            f"the job asks Ray for {total} NPUs ({parts}) and {nnodes} node(s) have {have}: its placement groups would wait forever",
        )
    )
    actors = demand["actor"] // max(1, _int(args, "ring_attn_size", 1) * _int(args, "ds_tensor_parallel_size", 1))
    train, micro = _int(args, "train_batch_size", 128), _int(args, "micro_train_batch_size", 4)
    checks.append(
        Check(
            "batch split", "ok", f"train_batch_size {train} = micro_train_batch_size {micro} x {actors} ranks x {train // (micro * actors)}"
        )
        if actors and train % (micro * actors) == 0
        else Check(
            "batch split",
            "error",
            f"DeepSpeed needs train_batch_size ({train}) to be micro_train_batch_size ({micro}) x the {actors} data-parallel "
            "actor ranks x the gradient accumulation steps",
        )
    )
    rollout = _int(args, "rollout_batch_size", 1024)
    runs = _int(args, "max_samples", 10**8) // rollout if rollout else 0
    if steps is not None:
        checks.append(
            Check("steps", "ok", f"{runs} steps of {rollout} prompts (max_samples / rollout_batch_size)")
            if runs == steps
            else Check("steps", "error", f"max_samples / rollout_batch_size gives {runs} steps, not the {steps} asked for")
        )
    reward = args.get("remote_rm_url") or []
    if isinstance(reward, str):
        reward = [reward]
    if reward and str(reward[0]).endswith(".py"):
        checks.append(Check("reward", "ok", f"a rule-based reward function: {reward[0]}"))
    elif reward:
        checks.append(Check("reward", "ok", f"a remote reward model: {', '.join(map(str, reward))}"))
    else:
        checks.append(Check("reward", "ok", f"a reward model on the NPUs: {args.get('reward_pretrain')}"))
    return checks
