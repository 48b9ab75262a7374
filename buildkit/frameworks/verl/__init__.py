"""verl from the package index: its GRPO and LoRA SFT smoke jobs, composed by Hydra in the image
(``--cfg job``) and checked against what verl asserts once it is on the cluster.

    grpo  grpo_smoke.yaml            trainer.device=npu before compat.verl_npu_autodetect
    sft   sft_smoke.yaml             before compat.verl_sft_trainer (fsdp_sft_trainer; with trainer.device=npu)
          sft_engine_smoke.yaml      from it on (sft_trainer, which sets the device itself)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildkit.framework import CheckContext, Framework, Gate
from buildkit.frameworks.verl.config import check_config, check_sft_config, parse_printed_config
from buildkit.frameworks.verl.releases import DEVICE_OVERRIDE, older
from buildkit.frameworks.verl.replay import VerlReplay

if TYPE_CHECKING:
    from buildkit.doctor.base import Check
    from buildkit.matrix.model import Compat

REWARD = "critic/rewards/mean"  # GRPO's
THROUGHPUT = "perf/throughput"  # GRPO's: tokens / (seconds x devices)
# Hydra's own words when it refuses an override or a config
_REFUSALS = ("Could not override", "not in struct", "Could not append", "Error merging", "Error parsing", "Error:")


class Verl(Framework):
    name = "verl"
    title = "verl"
    install = "index"
    jobs = ("grpo", "sft")
    arguments = "hydra"
    check_style = "hydra"
    # The seeds' gates: GRPO critic/rewards/mean 4 % and its loss 2 % (seeds 002, 004); SFT train/loss 2 % (000, 001).
    gates = (
        Gate("verl grpo", REWARD, ("actor/pg_loss", "actor/loss"), THROUGHPUT, 4.0, 2.0),
        Gate("verl sft", None, ("train/loss",), None, 0.0, 2.0),
    )

    def job_file(self, job: str, version: str | None, compat: Compat) -> str:
        if job == "sft":
            return "sft_smoke.yaml" if older(version, compat.verl_sft_trainer) else "sft_engine_smoke.yaml"
        return "grpo_smoke.yaml"

    def job_overrides(self, job: str, version: str | None, compat: Compat) -> tuple[str, ...]:
        first = compat.verl_npu_autodetect if job == "grpo" else compat.verl_sft_trainer
        return (DEVICE_OVERRIDE,) if older(version, first) else ()

    def refusal(self, lines: list[str], code: int) -> str:
        hits = [line for line in lines if any(h in line for h in _REFUSALS)]
        return f"verl refused the job's config (exit {code}): " + (" | ".join(hits[:3] or lines[-3:]) or "no output")

    def config_checks(self, printed: str, context: CheckContext) -> tuple[list[Check], str] | str:
        parsed = parse_printed_config(printed)
        if parsed is None:
            return "the command exited 0 but printed no composed config (is --cfg job reaching Hydra?)"
        config, text = parsed
        if context.job == "sft":
            return check_sft_config(config, verl=context.version, first_engine=context.compat.verl_sft_trainer), text
        compat = context.compat
        return (
            check_config(
                config,
                verl=context.version,
                first_autodetect=compat.verl_npu_autodetect,
                legacy_reward_ignored=compat.verl_legacy_reward_ignored,
            ),
            text,
        )

    def replay(self, version: str | None) -> VerlReplay:
        return VerlReplay(version)


FRAMEWORK = Verl()
