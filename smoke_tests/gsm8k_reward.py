"""The rule-based gsm8k reward of OpenRLHF's smoke job: 1 for the right final number, else 0.

OpenRLHF takes a Python file where a reward model's URL would go (``--remote_rm_url
gsm8k_reward.py``): it imports the file and calls ``reward_func(queries, prompts, labels)`` as a
Ray task, with each query being the prompt and the response decoded together (special tokens and
padding included), and expects a tensor of one reward per query.

The rule is the one verl applies to the same data (``openai/gsm8k``): the answer is the last
``#### <number>`` of the response, thousands separators and ``$`` dropped, compared as text with
the label (the number after ``####`` in the worked answer, as gsm8k_synth.py writes it). A test
holds the two to the same verdicts. Standard library only, but for the tensor OpenRLHF wants.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
# Only the end of a long response is searched: the final answer is there.
_TAIL_CHARS = 300
# OpenRLHF right-pads each response to the longest of its micro-batch and decodes with the special tokens kept, so a
# short right answer can be followed by hundreds of pad tokens: they are not the response (verl scores the valid
# tokens only), and are dropped before the tail is read.
_TRAILING_SPECIAL = re.compile(r"(?:<\|[A-Za-z_]+\|>|\s)+$")
_ASSISTANT = "<|im_start|>assistant"  # Qwen's chat template: where the response begins


def response_of(query: str, prompt: str) -> str:
    """The response part of a decoded query: what follows the prompt, else the last assistant turn."""
    if prompt and prompt in query:
        return query.split(prompt, 1)[1]
    if _ASSISTANT in query:
        return query.rsplit(_ASSISTANT, 1)[1]
    return query


def final_answer(response: str) -> str | None:
    found = _ANSWER.findall(_TRAILING_SPECIAL.sub("", response)[-_TAIL_CHARS:])
    return found[-1].replace(",", "").replace("$", "") if found else None


def score(query: str, prompt: str, label: str) -> float:
    answer = final_answer(response_of(query, prompt))
    return 1.0 if answer is not None and answer == str(label).strip() else 0.0


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> object:
    """What OpenRLHF calls: one reward per query, as a float tensor."""
    import torch  # type: ignore[import-not-found,unused-ignore]  # the image's (OpenRLHF's own dependency)

    return torch.tensor([score(q, p, label) for q, p, label in zip(queries, prompts, labels, strict=True)], dtype=torch.float)
