"""One GRPO step of a verl smoke job on a CPU, through verl's own code, in one process (world size 1, gloo):

    python3 cpu_step_verl.py --out RESULT.json -- OVERRIDE...

The overrides are the job's own (``smoke_tests/grpo_smoke.yaml`` as ``ascendkit smoke`` fills it in,
its model path naming a directory of the job's architecture, see cpu_model.py). In order:

1. Hydra composes verl's ``ppo_trainer`` config with them (struct mode, as ``main_ppo`` does), and where this
   release's ``main_ppo`` moves the legacy reward keys under ``reward:`` (0.7.1 to 0.8.x), so does this;
2. verl's ``RLHFDataset`` reads the job's train file and ``collate_fn`` batches the job's batch size
   (verl 0.7+ returns the chat messages only: the chat template is applied here, as its rollout would);
3. the model generates ``rollout.n`` responses per prompt (sampling, up to the job's response length);
   the first response of each group is replaced by the worked answer, so that the job's reward, a
   correctness check that a random model never passes, varies within each group;
4. verl's ``NaiveRewardManager`` scores every response with the job's reward function
   (``get_custom_reward_fn``: the job's ``custom_reward_function``, else verl's ``default_compute_score``),
   wrapped to count its calls;
5. verl's ``compute_response_mask`` and ``compute_advantage`` give the GRPO advantages;
6. verl's policy loss (``core_algos.get_policy_loss_fn`` of the job's loss mode, ``agg_loss``), its KL
   loss against the reference (``kl_penalty``) and entropy bonus as the actor combines them, then one
   AdamW step at the job's learning rate with the job's gradient clip.

verl's actor class (``DataParallelPPOActor``, gone from 0.8 on) wraps step 6 in FSDP micro-batching on
a device; this runs the same loss functions on the plain module instead, the same way for every
release, and says so in its result. Runs in the job's environment (the image or a CPU environment).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from cpu_step_common import Laps, peak_rss_mib, single_process_group  # type: ignore[import-not-found,unused-ignore]
from cpu_step_common import main as run_main  # type: ignore[import-not-found,unused-ignore]

PLANTED = "The answer is #### {answer}"


def _compose(overrides: list[str]) -> Any:
    import verl  # type: ignore[import-not-found,unused-ignore]
    from hydra import compose, initialize_config_dir  # type: ignore[import-not-found,unused-ignore]

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    return _as_main_ppo_moves_it(config)


def _as_main_ppo_moves_it(config: Any) -> Any:
    """The config as this release's main_ppo hands it on: verl 0.7.1 to 0.8.x's imports migrate_legacy_reward_impl and
    runs it first (the old top-level reward keys move under reward:); earlier releases have no reward section, later
    ones no longer move them (a job that still sets them scores with verl's default reward, as it would on the node)."""
    from verl.trainer import main_ppo  # type: ignore[import-not-found,unused-ignore]

    migrate = getattr(main_ppo, "migrate_legacy_reward_impl", None)
    return migrate(config) if migrate is not None else config


def _prompts(batch: dict[str, Any], tokenizer: Any, max_len: int) -> tuple[Any, Any]:
    """Left-padded prompt ids and mask: the dataset's own where it tokenizes (verl <= 0.6), else the
    chat template applied to its messages, as verl's agent loop does (0.7+)."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    if "input_ids" in batch:
        return batch["input_ids"], batch["attention_mask"]
    rows = [tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True) for messages in batch["raw_prompt"]]
    rows = [list(r["input_ids"]) if isinstance(r, dict) or hasattr(r, "keys") else list(r) for r in rows]
    width = min(max(len(r) for r in rows), max_len)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[-width:]
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


def _log_probs(model: Any, input_ids: Any, mask: Any, response_len: int, temperature: float) -> tuple[Any, Any]:
    """Per-token log probabilities and entropies of the response part (verl's own helpers)."""
    import torch  # type: ignore[import-not-found,unused-ignore]
    from verl.utils import torch_functional  # type: ignore[import-not-found,unused-ignore]

    position_ids = torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    logits = logits[:, -response_len - 1 : -1, :] / temperature
    log_probs = torch_functional.logprobs_from_logits(logits, input_ids[:, -response_len:])
    entropy = torch_functional.entropy_from_logits(logits)
    return log_probs, entropy


def step(_module: str, overrides: list[str]) -> dict[str, Any]:
    import numpy as np  # type: ignore[import-not-found,unused-ignore]
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-not-found,unused-ignore]
    from verl import DataProto  # type: ignore[import-not-found,unused-ignore]
    from verl.trainer.ppo import core_algos  # type: ignore[import-not-found,unused-ignore]
    from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask  # type: ignore[import-not-found,unused-ignore]
    from verl.trainer.ppo.reward import get_custom_reward_fn  # type: ignore[import-not-found,unused-ignore]
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # type: ignore[import-not-found,unused-ignore]
    from verl.utils.reward_score import default_compute_score  # type: ignore[import-not-found,unused-ignore]
    from verl.workers.reward_manager import NaiveRewardManager  # type: ignore[import-not-found,unused-ignore]

    lap = Laps()
    single_process_group()
    torch.manual_seed(0)
    config = _compose(overrides)
    lap("compose")
    data_cfg, actor_cfg, rollout_cfg = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    model_path = config.actor_rollout_ref.model.path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dataset = RLHFDataset(data_files=data_cfg.train_files, tokenizer=tokenizer, config=data_cfg, processor=None)
    batch_size = int(data_cfg.train_batch_size)
    batch = collate_fn([dataset[i] for i in range(min(batch_size, len(dataset)))])
    lap("dataset")

    n = int(rollout_cfg.n)
    prompt_ids, prompt_mask = _prompts(batch, tokenizer, int(data_cfg.max_prompt_length))
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
    response_len = int(data_cfg.max_response_length)
    with torch.no_grad():
        generated = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=float(rollout_cfg.temperature),
            max_new_tokens=response_len,
            min_new_tokens=1,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )[:, prompt_ids.shape[1] :]
    responses = torch.full((len(generated), response_len), tokenizer.pad_token_id, dtype=torch.long)
    responses[:, : generated.shape[1]] = generated
    truths = [str(item["ground_truth"]) for item in batch["reward_model"]]
    for group, truth in enumerate(truths):  # one correct answer per group: the reward varies within it
        planted = tokenizer(PLANTED.format(answer=truth), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        responses[group * n] = tokenizer.pad_token_id
        responses[group * n, : len(planted)] = torch.tensor(planted[:response_len])
    # What follows the first end of sequence is padding, as verl's rollouts leave it.
    ended = (responses == tokenizer.eos_token_id).int().cumsum(-1)
    response_mask = ((ended == 0) | ((ended == 1) & (responses == tokenizer.eos_token_id))).long()
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, tokenizer.pad_token_id))
    input_ids = torch.cat([prompt_ids, responses], dim=-1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    lap("generate")

    uids = np.repeat(np.array([f"prompt-{i}" for i in range(len(truths))], dtype=object), n)
    non_tensors = {key: np.repeat(np.asarray(batch[key], dtype=object), n) for key in ("data_source", "reward_model", "extra_info")}
    data = DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        },
        non_tensors={**non_tensors, "uid": uids},
        meta_info={"temperature": float(rollout_cfg.temperature)},
    )
    job_score = get_custom_reward_fn(config) or default_compute_score
    calls: list[float] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = job_score(*args, **kwargs)
        calls.append(float(result["score"] if isinstance(result, dict) else result))
        return result

    manager = NaiveRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=counted, reward_fn_key=data_cfg.reward_fn_key)
    reward_tensor = manager(data)
    if isinstance(reward_tensor, dict):
        reward_tensor = reward_tensor["reward_tensor"]
    data.batch["token_level_scores"] = reward_tensor
    data.batch["token_level_rewards"] = reward_tensor
    data.batch["response_mask"] = compute_response_mask(data)
    lap("reward")
    data = compute_advantage(
        data,
        adv_estimator=config.algorithm.adv_estimator,
        gamma=config.algorithm.gamma,
        lam=config.algorithm.lam,
        num_repeat=n,
        norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
        config=config.algorithm,
    )
    advantages = data.batch["advantages"]
    mask = data.batch["response_mask"].float()
    lap("advantage")

    temperature = float(rollout_cfg.temperature)
    with torch.no_grad():
        old_log_prob, _ = _log_probs(model, input_ids, attention_mask, response_len, temperature)
    ref_log_prob = old_log_prob.clone()  # the reference is the initial policy, as at verl's first step
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(actor_cfg.optim.lr), weight_decay=float(actor_cfg.optim.weight_decay))
    model.train()
    log_prob, entropy = _log_probs(model, input_ids, attention_mask, response_len, temperature)
    loss_mode = actor_cfg.policy_loss.get("loss_mode", "vanilla") if "policy_loss" in actor_cfg else "vanilla"
    agg = str(actor_cfg.loss_agg_mode)
    actor_config = _actor_config(actor_cfg)
    try:
        policy_loss_fn = core_algos.get_policy_loss_fn(loss_mode)
    except ValueError:  # verl 0.5 registers only the other modes; its vanilla loss is compute_policy_loss
        if loss_mode != "vanilla":
            raise
        policy_loss_fn = core_algos.compute_policy_loss
    pg_loss, _pg_metrics = _policy_loss(policy_loss_fn, old_log_prob, log_prob, advantages, mask, agg, actor_config)
    loss = pg_loss - float(actor_cfg.entropy_coeff) * core_algos.agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=agg)
    if actor_cfg.use_kl_loss:
        kl = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=actor_cfg.kl_loss_type)
        loss = loss + float(actor_cfg.kl_loss_coef) * core_algos.agg_loss(loss_mat=kl, loss_mask=mask, loss_agg_mode=agg)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float(actor_cfg.grad_clip))
    optimizer.step()
    changed = sum(int(not torch.equal(before[name], p.detach())) for name, p in model.named_parameters())
    lap("update")

    group_rewards = reward_tensor.sum(-1).view(-1, n)
    return {
        "framework": "verl",
        "batch": {"prompts": len(truths), "responses_per_prompt": n, "response_length": response_len},
        "rewards": [round(float(r), 4) for r in reward_tensor.sum(-1)],
        "reward_calls": len(calls),
        "reward_varies_within_groups": int((group_rewards.max(-1).values > group_rewards.min(-1).values).sum()),
        "advantages": [round(float(a), 4) for a in (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)],
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "loss_mode": loss_mode,
        "grad_norm": float(grad_norm),
        "parameters_changed": changed,
        "parameters": len(before),
        "timings_s": lap.timings,
        "peak_rss_mib": peak_rss_mib(),
        "differs": (
            "verl's losses, advantage, reward manager and dataset on the plain module; not verl's actor worker (FSDP, "
            "micro-batches, device placement), which needs an accelerator"
        ),
    }


def _actor_config(actor_cfg: Any) -> Any:
    """The actor section as verl's loss functions take it: its dataclass where the release has one."""
    try:
        from verl.utils.config import omega_conf_to_dataclass  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return actor_cfg
    try:
        return omega_conf_to_dataclass(actor_cfg)
    except Exception:  # releases before the dataclass read the DictConfig itself
        return actor_cfg


def _policy_loss(fn: Any, old: Any, new: Any, advantages: Any, mask: Any, agg: str, config: Any) -> tuple[Any, dict[str, Any]]:
    """verl's policy loss; its return grew from a tuple of four (0.4-0.5) to (loss, metrics) (0.6+)."""
    import inspect

    if "config" in inspect.signature(fn).parameters:
        result = fn(old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, loss_agg_mode=agg, config=config)
    else:  # verl 0.5's compute_policy_loss takes the clip ratios themselves
        clip = {"cliprange": config.clip_ratio, "cliprange_low": config.clip_ratio_low, "cliprange_high": config.clip_ratio_high}
        result = fn(old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, loss_agg_mode=agg, **clip)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result[0], result[1]
    return result[0], {}


def main(argv: list[str] | None = None) -> int:
    return run_main(
        "One GRPO step of a verl job on CPU through verl's own code.", "verl.trainer.main_ppo", step,
        lambda r: f"loss {r['loss']:.6g}, grad norm {r['grad_norm']:.4g}, {r['reward_calls']} reward calls", argv,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
