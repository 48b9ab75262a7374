"""OpenRLHF-shaped training logs, drawn by the real tqdm the way OpenRLHF's PPOTrainer.fit draws them.

fit() (zhuo97/OpenRLHF@06ac74cf, openrlhf/trainer/ppo_trainer.py) makes one bar per episode,
``tqdm(range(len(dataloader)), desc=f"Episode [{episode + 1}/{num_episodes}]")``, and after each
step calls ``set_postfix(status)`` then ``update()``. PPOTrainer is a Ray actor, so its stderr
reaches the driver's log behind a ``(PPOTrainer pid=N)`` prefix; its ``print(sample0)`` lines come
in between. The clock is a fake one, so each step takes the seconds asked for.
"""

from __future__ import annotations

import io
from unittest import mock

from tqdm import std, tqdm  # type: ignore[import-untyped]

PREFIX = "(PPOTrainer pid=4242) "


def status(step: int) -> dict[str, float]:
    """A plausible status dict for one step, as the fork's actor returns it."""
    return {
        "policy_loss": round(0.05 - 0.003 * step, 6),
        "actor_lr": 5e-7,
        "kl": round(0.0001 * step, 7),
        "reward": round(min(1.0, 0.2 + 0.1 * step), 4),
        "response_length": 96.0 + step,
        "total_length": 190.0 + step,
        "return": round(min(1.0, 0.2 + 0.1 * step), 4),
    }


def openrlhf_log(
    steps: int,
    *,
    episodes: int = 1,
    seconds: float = 41.0,
    statuses: list[dict[str, float]] | None = None,
    redraws_on_new_lines: bool = False,
) -> str:
    """The driver's log of a run of ``steps`` steps per episode. tqdm redraws after ``\\r``: Ray passes
    that on inside one line (the default here) or, where a log was copied through a terminal, each
    redraw ends up on a line of its own (``redraws_on_new_lines``)."""
    now = [1000.0]
    out = io.StringIO()
    log = ["2026-11-24 10:00:00,000\tINFO worker.py:1654 -- Connecting to existing Ray cluster at address: 10.0.0.5:6379...\n"]
    number = 0

    def drawn() -> None:  # what tqdm wrote since the last look, as Ray forwards it
        text = out.getvalue()
        out.seek(0)
        out.truncate()
        parts = text.replace("\r", "\n").split("\n") if redraws_on_new_lines else [text.rstrip("\n")]
        log.extend(PREFIX + part + "\n" for part in parts if part)

    with mock.patch.object(std, "time", lambda: now[0]):
        for episode in range(episodes):
            bar = tqdm(range(steps), desc=f"Episode [{episode + 1}/{episodes}]", disable=False, file=out)
            for _ in range(steps):
                now[0] += seconds
                number += 1
                log.append(f"{PREFIX}['<|im_start|>user ... #### {number}<|im_end|>']\n")
                bar.set_postfix((statuses or [])[number - 1] if statuses else status(number))
                bar.update()
                drawn()
            bar.close()
            drawn()
    return "".join(log)
