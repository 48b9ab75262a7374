"""One GRPO step of an OpenRLHF smoke job on a CPU, through OpenRLHF's own code, world size 1 (gloo):

    python3 cpu_step_openrlhf.py --out RESULT.json -- FLAG...

The flags are the job's own (``smoke_tests/openrlhf_grpo_smoke.yaml`` as ``ascendkit smoke`` fills it in,
``--pretrain`` naming a directory of the job's architecture, see cpu_model.py). In order:

1. OpenRLHF's own parser reads them (``train_ppo_ray`` run as ``__main__`` up to where it would start Ray,
   see openrlhf_args.py), and ``get_strategy`` makes its DeepSpeed strategy object from them;
2. ``blending_datasets`` and ``PromptDataset`` read the job's prompt file as its trainer does (chat
   template, input and label keys), and one rollout batch of prompts is taken;
3. OpenRLHF's experience maker (``RemoteExperienceMaker.make_experience_list``) runs as in training: its
   vLLM path turns engine outputs into padded samples, micro-batches them, calls the job's reward function
   (``--remote_rm_url``, loaded and run as a Ray task, its calls counted), and computes the group-normalised
   advantages (``compute_advantages_and_returns``). Two things are stand-ins, said in the result: the vLLM
   engine is a Ray actor that answers with the tiny model's sampled tokens through transformers' generate
   (vLLM cannot run here), and the actor and reference groups compute their log probabilities in this
   process with OpenRLHF's ``Actor`` (no DeepSpeed engine). The first response of each group is the
   worked answer, so that the job's reward, a correctness check a random model never passes, varies;
4. the actor's training loss as ``ActorPPOTrainer.training_step`` combines it (OpenRLHF's ``PolicyLoss``,
   its k3 KL against the reference, the entropy bonus), over every experience of the batch, then one
   AdamW step at the job's learning rate with its gradient clip. The weights stay in float32 and the
   forward runs in bfloat16 autocast when the job says ``--bf16`` (DeepSpeed keeps float32 master weights).

Runs in the job's environment (the image or a CPU environment), torch_npu being the CPU run's stand-in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from cpu_step_common import Laps, peak_rss_mib, single_process_group  # type: ignore[import-not-found,unused-ignore]
from cpu_step_common import main as run_main  # type: ignore[import-not-found,unused-ignore]

PLANTED = "The answer is #### {answer}"


def parse_job_flags(module: str, flags: list[str]) -> Any:
    """The job's flags as OpenRLHF's own parser reads them (openrlhf_args.py's way: train_ppo_ray run as
    __main__ with ray.init replaced by a stop)."""
    import runpy

    import openrlhf_args  # type: ignore[import-not-found,unused-ignore]  # beside this file
    import ray  # type: ignore[import-not-found,unused-ignore]

    real_init, real_is_initialized = ray.init, ray.is_initialized
    ray.init, ray.is_initialized = openrlhf_args._stop, lambda: False
    saved_argv = sys.argv
    sys.argv = [module, *flags]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except openrlhf_args._Stop as stop:
        return stop.args[0]
    finally:
        ray.init, ray.is_initialized, sys.argv = real_init, real_is_initialized, saved_argv
    raise SystemExit(f"cpu_step_openrlhf: {module} ran to its end without starting Ray")


def _engine_class() -> Any:
    import ray  # type: ignore[import-not-found,unused-ignore]

    @ray.remote(num_cpus=0)
    class Engine:
        """Stand-in for OpenRLHF's LLMRayActor (a vLLM engine): the same two calls, answered with the tiny
        model's sampled tokens in vLLM's output shape (``prompt_token_ids``, ``outputs[0].token_ids``)."""

        def __init__(self, model_path: str, eos_token_id: int, seed: int) -> None:
            import torch  # type: ignore[import-not-found,unused-ignore]
            from transformers import AutoModelForCausalLM  # type: ignore[import-not-found,unused-ignore]

            torch.manual_seed(seed)
            self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
            self.eos = eos_token_id
            self.planted: dict[int, list[int]] = {}
            self.responses: list[Any] = []

        def plant(self, planted: dict[int, list[int]]) -> None:
            self.planted = planted

        def add_requests(self, actor_rank: int, *, sampling_params: Any, prompt_token_ids: list[list[int]]) -> None:
            import torch  # type: ignore[import-not-found,unused-ignore]

            out = []
            for index, prompt in enumerate(prompt_token_ids):
                if index in self.planted:
                    tokens = self.planted[index]
                else:
                    with torch.no_grad():
                        generated = self.model.generate(
                            input_ids=torch.tensor([prompt]),
                            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            do_sample=True,
                            temperature=max(float(sampling_params.temperature), 1e-5),
                            top_p=float(sampling_params.top_p),
                            max_new_tokens=int(sampling_params.max_tokens),
                            min_new_tokens=int(sampling_params.min_tokens or 1),
                            pad_token_id=self.eos,
                            eos_token_id=self.eos,
                        )
                    tokens = generated[0, len(prompt) :].tolist()
                out.append(SimpleNamespace(prompt_token_ids=list(prompt), outputs=[SimpleNamespace(token_ids=tokens)]))
            self.responses = out

        def get_responses(self, actor_rank: int) -> list[Any]:
            return self.responses

    return Engine


class LocalGroup:
    """Stand-in for a PPORayActorGroup of one actor: ``forward`` with OpenRLHF's ``Actor`` in this process,
    results handed back through Ray's object store as the group's actors hand theirs."""

    def __init__(self, actor: Any, autocast: bool) -> None:
        self.actor = actor
        self.autocast = autocast

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[Any]:
        import ray  # type: ignore[import-not-found,unused-ignore]
        import torch  # type: ignore[import-not-found,unused-ignore]

        assert method_name == "forward", method_name
        results = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            for sequences, action_mask, attention_mask in zip(
                kwargs["sequences"], kwargs["action_mask"], kwargs["attention_mask"], strict=True
            ):
                results.append(self.actor(sequences, action_mask, attention_mask).float())
        return [ray.put(results)]

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[Any]:
        import ray  # type: ignore[import-not-found,unused-ignore]

        return [ray.put(None)]


class CountedReward:
    """The experience maker's ``custom_reward_func`` (the job's ``reward_func`` as a Ray remote function),
    wrapped to count the responses it is asked to score."""

    def __init__(self, remote: Any) -> None:
        self.inner = remote
        self.calls = 0
        self.scored = 0

    def remote(self, queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        self.calls += 1
        self.scored += len(queries)
        return self.inner.remote(queries, prompts, labels)


def step(module: str, flags: list[str]) -> dict[str, Any]:
    import ray  # type: ignore[import-not-found,unused-ignore]
    import torch  # type: ignore[import-not-found,unused-ignore]

    lap = Laps()
    args = parse_job_flags(module, flags)
    from openrlhf import ACCELERATOR_TYPE  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.datasets import PromptDataset  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.models import Actor, PolicyLoss  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.models.utils import compute_approx_kl, masked_mean  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController  # type: ignore[import-not-found,unused-ignore]
    from openrlhf.utils import blending_datasets, get_strategy, get_tokenizer  # type: ignore[import-not-found,unused-ignore]

    single_process_group()
    torch.manual_seed(args.seed)
    os.environ.pop("RAY_ADDRESS", None)  # a private Ray of this process, for the reward task and the engine
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    strategy = get_strategy(args)
    lap("parse")

    tokenizer = get_tokenizer(args.pretrain, None, "left", strategy, use_fast=not args.disable_fast_tokenizer)
    data = blending_datasets(
        args.prompt_data, args.prompt_data_probs, strategy, args.seed, max_count=args.max_samples, dataset_split=args.prompt_split
    )
    data = data.select(range(min(args.max_samples, len(data))))
    dataset = PromptDataset(data, tokenizer, strategy, input_template=args.input_template)
    batch = [dataset[i] for i in range(min(args.rollout_batch_size, len(dataset)))]
    prompts, labels = [p for _, p, _ in batch], [label for _, _, label in batch]
    lap("dataset")

    autocast = bool(args.bf16)
    actor = Actor(
        args.pretrain,
        use_flash_attention_2=args.flash_attn,
        bf16=False,  # float32 weights, bfloat16 compute: DeepSpeed's master weights
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        target_modules=args.target_modules,
        lora_dropout=args.lora_dropout,
        packing_samples=args.packing_samples,
        temperature=args.temperature,
    )
    reference = Actor(args.pretrain, use_flash_attention_2=args.flash_attn, bf16=False, packing_samples=args.packing_samples)
    reference.eval()
    n = int(args.n_samples_per_prompt)
    engine = _engine_class().remote(args.pretrain, tokenizer.eos_token_id, args.seed)
    planted = {
        group * n: tokenizer(PLANTED.format(answer=label), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for group, label in enumerate(labels)
    }
    ray.get(engine.plant.remote(planted))
    maker = RemoteExperienceMaker(
        LocalGroup(actor, autocast),
        None,
        None,
        LocalGroup(reference, autocast) if args.init_kl_coef > 0 else None,
        tokenizer,
        args.prompt_max_len,
        FixedKLController(args.init_kl_coef),
        strategy,
        args.remote_rm_url,
        vllm_engines=[engine],
        packing_samples=args.packing_samples,
    )
    if maker.custom_reward_func is None:
        raise SystemExit(f"cpu_step_openrlhf: --remote_rm_url {args.remote_rm_url} is not a Python reward file")
    counted = CountedReward(maker.custom_reward_func)
    maker.custom_reward_func = counted
    generate = {
        "do_sample": True,
        "prompt_max_len": args.prompt_max_len,
        "max_new_tokens": args.generate_max_len,
        "max_length": args.max_len,
        "temperature": args.temperature,
        "top_p": args.top_p,
    }
    experiences = maker.make_experience_list(prompts, labels, **generate)
    lap("experience")

    before = {name: p.detach().clone() for name, p in actor.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(
        [p for p in actor.parameters() if p.requires_grad], lr=args.actor_learning_rate, betas=args.adam_betas, weight_decay=args.l2
    )
    policy_loss = PolicyLoss(args.eps_clip)
    actor.train()
    optimizer.zero_grad()
    total = pg_total = 0.0
    for experience in experiences:  # one update over the whole batch (train_batch_size = the rollout's responses)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            log_probs, output = actor(
                experience.sequences,
                experience.action_mask,
                attention_mask=experience.attention_mask,
                return_output=True,
                return_entropy=args.entropy_loss_coef > 1e-8,
            )
        log_probs = log_probs.float()
        pg = policy_loss(log_probs, experience.action_log_probs, experience.advantages, action_mask=experience.action_mask)
        loss = pg
        if args.use_kl_loss and experience.base_action_log_probs is not None:
            kl = compute_approx_kl(log_probs, experience.base_action_log_probs, kl_estimator=args.kl_estimator)
            loss = loss + masked_mean(kl, experience.action_mask) * maker.kl_ctl.value
        if args.entropy_loss_coef > 1e-8:
            entropy = masked_mean(output.entropy[:, -experience.action_mask.shape[1] :], experience.action_mask)
            loss = loss - entropy * args.entropy_loss_coef
        (loss / len(experiences)).backward()
        total += float(loss.detach()) / len(experiences)
        pg_total += float(pg.detach()) / len(experiences)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in actor.parameters() if p.requires_grad], max_norm=args.max_norm)
    optimizer.step()
    changed = sum(int(not torch.equal(before[name], p.detach())) for name, p in actor.named_parameters() if name in before)
    lap("update")

    rewards = torch.cat([e.info["reward"].float().reshape(-1) for e in experiences])
    groups = rewards.view(-1, n)
    advantages = [
        round(float(a), 4) for e in experiences for a in (e.advantages * e.action_mask).sum(-1) / e.action_mask.sum(-1).clamp(min=1)
    ]
    ray.shutdown()
    return {
        "framework": "openrlhf",
        "accelerator_type": ACCELERATOR_TYPE,
        "batch": {"prompts": len(prompts), "responses_per_prompt": n, "response_length": args.generate_max_len},
        "rewards": [round(float(r), 4) for r in rewards],
        "reward_calls": counted.scored,  # responses the job's reward_func scored (it takes them in micro-rollout batches)
        "reward_batches": counted.calls,
        "reward_varies_within_groups": int((groups.max(-1).values > groups.min(-1).values).sum()),
        "advantages": advantages,
        "experiences": len(experiences),
        "loss": total,
        "pg_loss": pg_total,
        "loss_mode": f"PolicyLoss(eps_clip={args.eps_clip}), advantage {args.advantage_estimator}, KL {args.kl_estimator}",
        "grad_norm": float(grad_norm),
        "parameters_changed": changed,
        "parameters": len(before),
        "timings_s": lap.timings,
        "peak_rss_mib": peak_rss_mib(),
        "differs": (
            "OpenRLHF's parser, dataset, experience maker (its vLLM output path, reward call and group_norm advantage) and "
            "losses; the vLLM engine is a stand-in answering with transformers' generate, the actor and reference forward "
            "in this process without DeepSpeed (float32 weights, bfloat16 autocast) and AdamW in place of DeepSpeed's optimizer"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    return run_main(
        "One GRPO step of an OpenRLHF job on CPU through OpenRLHF's own code.", "openrlhf.cli.train_ppo_ray", step,
        lambda r: f"loss {r['loss']:.6g}, grad norm {r['grad_norm']:.4g}, {r['reward_calls']} responses scored", argv,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
