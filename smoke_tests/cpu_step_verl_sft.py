"""One SFT step of a verl smoke job on a CPU, through verl's own code, in one process (world size 1, gloo):

    python3 cpu_step_verl_sft.py --out RESULT.json --module verl.trainer.sft_trainer -- OVERRIDE...

The module is the job's SFT trainer and the overrides are the job's own (``smoke_tests/sft_smoke.yaml`` or
``sft_engine_smoke.yaml`` as ``ascendkit smoke`` fills them in, the model path naming a directory of the job's
architecture, see cpu_model.py). In order:

1. Hydra composes the trainer's own config (the ``config_name`` of its ``@hydra.main``) with the overrides;
2. the trainer module's own ``create_sft_dataset`` reads the job's train file (``SFTDataset`` for verl 0.5-0.6's
   ``fsdp_sft_trainer``; ``MultiTurnSFTDataset`` for 0.7+'s ``sft_trainer``) and one batch of the job's batch
   size is made as the trainer makes it (0.7+: its ``SFTTensorCollator``, the jagged batch of the engine);
3. the model, with the job's LoRA adapter when ``model.lora_rank`` is set (peft, as verl wraps it);
4. the loss as the trainer computes it: 0.5-0.6 ``FSDPSFTTrainer._compute_loss_and_backward`` itself, on this
   process's module instead of its FSDP one; 0.7+ ``verl.workers.utils.losses.sft_loss`` on the log probabilities
   of each sequence (its engine's forward is FSDP with padding removed: here each sequence runs alone), then one
   AdamW step at the job's learning rate with its gradient clip.

Checked by the CPU run: tokens the loss mask trains, a finite loss, a gradient and moved weights.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from cpu_step_common import Laps, peak_rss_mib, single_process_group  # type: ignore[import-not-found,unused-ignore]
from cpu_step_common import main as run_main  # type: ignore[import-not-found,unused-ignore]


def _compose(module: Any, overrides: list[str]) -> Any:
    import verl  # type: ignore[import-not-found,unused-ignore]
    from hydra import compose, initialize_config_dir  # type: ignore[import-not-found,unused-ignore]

    found = re.search(r"""config_name=["']([\w-]+)["']""", inspect.getsource(module))
    if found is None:
        raise SystemExit(f"cpu_step_verl_sft: {module.__name__} names no Hydra config")
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name=found.group(1), overrides=overrides)


def _model(config: Any) -> Any:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM  # type: ignore[import-not-found,unused-ignore]

    model_cfg = config.model
    path = model_cfg.get("partial_pretrain") or model_cfg.get("path")
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    if int(model_cfg.get("lora_rank", 0) or 0) > 0:
        from peft import LoraConfig, TaskType, get_peft_model  # type: ignore[import-not-found,unused-ignore]

        targets = model_cfg.target_modules
        targets = targets if isinstance(targets, str) else list(targets)
        lora = LoraConfig(
            task_type=TaskType.CAUSAL_LM,
            r=int(model_cfg.lora_rank),
            lora_alpha=int(model_cfg.lora_alpha),
            target_modules=targets,
            bias="none",
        )
        model = get_peft_model(model, lora)
    return path, model


def _loss_fsdp_sft_trainer(trainer_module: Any, config: Any, model: Any, dataset: Any, batch_size: int) -> tuple[Any, int]:
    """verl 0.5-0.6: the trainer's own loss method, its ``self`` this process's plain module."""
    from torch.utils.data import default_collate  # type: ignore[import-not-found,unused-ignore]

    batch = default_collate([dataset[i] for i in range(min(batch_size, len(dataset)))])
    tokens = int(batch["loss_mask"][:, 1:].sum())
    this = SimpleNamespace(
        use_remove_padding=False, config=config, device_name="cpu", fsdp_model=model, model=model, sharding_manager=None,
        ulysses_device_mesh=None,
    )  # fmt: skip
    method = trainer_module.FSDPSFTTrainer._compute_loss_and_backward
    kwargs = {"n_micro_batches": 1} if "n_micro_batches" in inspect.signature(method).parameters else {}
    loss = method(this, dict(batch), do_backward=True, **kwargs)
    return loss, tokens


def _loss_sft_trainer(config: Any, model: Any, dataset: Any, batch_size: int, pad_token_id: int) -> tuple[Any, int]:
    """verl 0.7+: its collator's jagged batch and its ``sft_loss`` on per-sequence log probabilities."""
    import torch  # type: ignore[import-not-found,unused-ignore]
    from verl.utils import tensordict_utils as tu  # type: ignore[import-not-found,unused-ignore]
    from verl.utils.dataset.dataset_utils import SFTTensorCollator  # type: ignore[import-not-found,unused-ignore]
    from verl.utils.torch_functional import logprobs_from_logits  # type: ignore[import-not-found,unused-ignore]
    from verl.workers.utils.losses import sft_loss  # type: ignore[import-not-found,unused-ignore]

    collated = SFTTensorCollator(config.data.pad_mode)([dataset[i] for i in range(min(batch_size, len(dataset)))])
    meta = {"pad_mode": config.data.pad_mode, "pad_token_id": pad_token_id, "temperature": 1.0, "global_batch_size": batch_size}
    data = tu.get_tensordict(tensor_dict=collated, non_tensor_dict=meta)
    loss_mask = data["loss_mask"]
    tokens = int(loss_mask.values().sum() if loss_mask.is_nested else loss_mask.sum())
    tu.assign_non_tensor(data, batch_num_tokens=tokens, dp_size=1)
    input_ids = data["input_ids"]
    sequences = input_ids.unbind() if input_ids.is_nested else [row[row != pad_token_id] for row in input_ids]
    log_probs, lengths = [], [0]
    for ids in sequences:
        logits = model(input_ids=ids[None], position_ids=torch.arange(len(ids))[None], use_cache=False).logits[0]
        log_probs.append(logprobs_from_logits(logits=logits, labels=torch.roll(ids, shifts=-1, dims=0)))
        lengths.append(lengths[-1] + len(ids))
    flat = torch.cat(log_probs)
    output = {"log_probs": torch.nested.nested_tensor_from_jagged(flat, torch.tensor(lengths)) if input_ids.is_nested else flat}
    loss, _metrics = sft_loss(config=None, model_output=output, data=data)
    loss.backward()
    return loss, tokens


def step(module_name: str, overrides: list[str]) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]

    lap = Laps()
    single_process_group()
    torch.manual_seed(0)
    trainer_module = importlib.import_module(module_name)
    config = _compose(trainer_module, overrides)
    lap("compose")
    path, model = _model(config)
    tokenizer = AutoTokenizer.from_pretrained(path)
    create = trainer_module.create_sft_dataset
    if "processor" in inspect.signature(create).parameters:
        dataset = create(config.data.train_files, config.data, tokenizer, processor=None)
    else:
        dataset = create(config.data.train_files, config.data, tokenizer)
    batch_size = int(config.data.train_batch_size)
    lap("dataset")

    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    before = {name: p.detach().clone() for name, p in trained}
    optim = config.optim
    optimizer = torch.optim.AdamW([p for _, p in trained], lr=float(optim.lr), weight_decay=float(optim.get("weight_decay", 0.0)))
    model.train()
    optimizer.zero_grad()
    if hasattr(trainer_module, "FSDPSFTTrainer"):
        loss, tokens = _loss_fsdp_sft_trainer(trainer_module, config, model, dataset, batch_size)
        how = "FSDPSFTTrainer._compute_loss_and_backward on the plain module (not FSDP)"
    else:
        loss, tokens = _loss_sft_trainer(config, model, dataset, batch_size, tokenizer.pad_token_id)
        how = "verl.workers.utils.losses.sft_loss on each sequence's log probabilities (not the FSDP engine's padding-free forward)"
    clip = float(optim.get("clip_grad", 1.0) or 1.0)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in trained], max_norm=clip)
    optimizer.step()
    changed = sum(int(not torch.equal(before[name], p.detach())) for name, p in trained)
    lap("update")
    return {
        "framework": "verl",
        "job": "sft",
        "module": module_name,
        "batch": {"sequences": min(batch_size, len(dataset)), "dataset_rows": len(dataset)},
        "trained_tokens": tokens,
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "parameters_changed": changed,
        "parameters": len(before),
        "lora_rank": int(config.model.get("lora_rank", 0) or 0),
        "timings_s": lap.timings,
        "peak_rss_mib": peak_rss_mib(),
        "differs": f"verl's dataset and SFT loss: {how}",
    }


def main(argv: list[str] | None = None) -> int:
    return run_main(
        "One SFT step of a verl job on CPU through verl's own code.", "verl.trainer.sft_trainer", step,
        lambda r: f"loss {r['loss']:.6g}, grad norm {r['grad_norm']:.4g}, {r['trained_tokens']} tokens trained", argv,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
