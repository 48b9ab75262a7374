"""Write a tiny, randomly initialised model of the smoke jobs' architecture (Qwen2) with a tokenizer
made here, so a job's training code can run on a CPU with no download:

    python3 cpu_model.py --out DIR [--seed 0]

The directory is what a job's ``model.path`` names: ``config.json`` and ``model.safetensors`` of a
Qwen2ForCausalLM (hidden size 64, two layers: about 0.1 M parameters), and a byte-level BPE
tokenizer with Qwen's special tokens and a ChatML chat template, so the jobs' chat-formatted
prompts and Qwen's response markers tokenize as they would with Qwen2.5. Nothing it generates is
meaningful: it exists so that every line between the data and the loss runs. Runs in the job's
environment (the image or a CPU environment): transformers, tokenizers and torch are the image's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5's ChatML form, reduced to what the jobs use: a turn per message, then the assistant's header.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# What the tokenizer learns its merges from: the words of the synthetic gsm8k prompts and answers.
CORPUS = (
    'system user assistant Let\'s think step by step and output the final answer after "####". '
    "A bakery bakes loaves of bread every day for days and sells of them. How many loaves are left? "
    "Mia has stickers. She gives the same number to each of her friends, as many as she can, and keeps the rest. "
    "0 1 2 3 4 5 6 7 8 9 10 100 + - * / = $ #### The answer is"
)
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def write_model(out: Path, seed: int = 0) -> dict[str, object]:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config  # type: ignore[import-not-found,unused-ignore]

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator([CORPUS] * 8, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        **SHAPE,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.save_pretrained(str(out))
    facts = {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        **SHAPE,
        "note": "randomly initialised, tokenizer made here: a stand-in for the job's Qwen2.5-0.5B-Instruct, same architecture",
    }
    (out / "ascendkit-cpu-model.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny random Qwen2 model and tokenizer for a CPU run of a smoke job.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    facts = write_model(args.out, args.seed)
    print(f"cpu_model: {facts['architecture']} with {facts['parameters']} parameters, vocab {facts['vocab']}, in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
