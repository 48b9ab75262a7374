"""Deterministic replay of a GPU run's rollouts on the NPU, in the keys each verl release reads.

Ascend's precision-alignment guide (verl docs/ascend_tutorial/dev_guide/precision_analysis, 05/2026) compares an
NPU run with a GPU run with the noise taken out: shuffling off, deterministic kernels and collectives, and the
GPU run's rollouts replayed on the NPU so both trainers learn from the same samples. verl's rollout-skip option
does the replay, but not as the guide writes it: it reads only its own dumps (not ``trainer.rollout_data_dir``'s
JSONL), so the GPU run has to run with skip on too, in dump mode (a run that finds no dump generates and writes
one), and its dump directory travels to the NPU. Where a dump is looked for is a function of names both runs
must share (the experiment and project, the batch, ``n``, the prompt and response lengths): a difference in any
of them and the NPU run silently generates its own rollouts. The keys differ by release:

    < 0.6       no replay at all
    0.6, 0.7    actor_rollout_ref.rollout.skip_rollout / skip_dump_dir: one file, no step in its name, so
                every step replays step 1's batch: only one step is a replay
    0.8         actor_rollout_ref.rollout.skip.{enable, dump_dir, max_dump_step, action}: one directory per step
    >= 0.9      skip.rollout_tq.{enable, dump_dir, steps, action}: the V1 trainer (trainer.use_v1, its
                default) reads these and ignores skip.rollout.*; steps: [] skips nothing

Each release's own code for the dump path (verl/utils/rollout_skip.py, verl/utils/skip/) is called on both
runs' composed configs in tests/test_replay.py, from the vendored wheels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

from buildkit.framework import Replay, ReplayEvidence, ReplayUnavailable

Scheme = Literal["single", "per-step", "tq"]
Side = Literal["gpu", "npu"]
DUMP_DIR = "/smoke/replay"  # where both runs see the dump directory (the NPU's mount is read-only)

# Both runs, whatever the release: shuffling off (verl's guide, section 2), the rollout's log-probabilities kept so
# training/rollout_probs_diff_* is logged (transfer_to_npu_guide.md), torch.compile off (verl's Ascend nightly).
COMMON = (
    "data.shuffle=False",
    "data.validation_shuffle=False",
    "data.seed=42",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.actor.use_torch_compile=False",
)
# verl's own switch (engine/fsdp.yaml) sets HCCL_DETERMINISTIC and CLOSE_MATMUL_K_SHIFT from 0.8.0 on; 0.7.1's sets
# NCCL_DETERMINISTIC on the NPU too and needs trainer.use_legacy_worker_impl=disable, so there the environment does it.
FULL_DETERMINISM = "actor_rollout_ref.actor.fsdp_config.full_determinism=True"
FIRST_FULL_DETERMINISM = Version("0.8.0")

# The chip's deterministic kernels and collectives (precision_alignment_zh.md): HCCL by default; with
# HCCL_OP_EXPANSION_MODE=AIV the collectives run on LCCL, whose switches differ.
NPU_ENV_HCCL = {
    "CLOSE_MATMUL_K_SHIFT": "1",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "HCCL_DETERMINISTIC": "true",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
NPU_ENV_LCCL = {
    "CLOSE_MATMUL_K_SHIFT": "1",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "LCCL_DETERMINISTIC": "1",
    "ATB_LLM_LCOC_ENABLE": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# The GPU side: cuBLAS's deterministic workspace (CUDA's reproducibility notes) and vLLM in-process.
GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class ReplayScheme:
    """How one verl release dumps and replays rollouts, and what its log says when it does."""

    scheme: Scheme
    loaded: re.Pattern[str]  # verl's line when it read a dump instead of generating
    missed: re.Pattern[str]  # ... and when it found none and generated (and dumped) its own

    @property
    def steps_replayed(self) -> int | None:
        """How many steps a run can replay soundly: None for all of them."""
        return 1 if self.scheme == "single" else None

    def keys(self, dump_dir: str, steps: int) -> tuple[str, ...]:
        if self.scheme == "single":
            return (
                "actor_rollout_ref.rollout.skip_rollout=True",
                f"actor_rollout_ref.rollout.skip_dump_dir={dump_dir}",
            )
        if self.scheme == "per-step":
            return (
                "actor_rollout_ref.rollout.skip.enable=True",
                f"actor_rollout_ref.rollout.skip.dump_dir={dump_dir}",
                f"actor_rollout_ref.rollout.skip.max_dump_step={steps}",
                "actor_rollout_ref.rollout.skip.action=cache",
            )
        listed = ",".join(str(s) for s in range(1, steps + 1))
        return (
            "skip.rollout_tq.enable=True",
            f"skip.rollout_tq.dump_dir={dump_dir}",
            f"skip.rollout_tq.steps=[{listed}]",
            "skip.rollout_tq.action=cache",
        )


_ANSI = r"(?:\x1b\[[0-9;]*m)*"
SINGLE = ReplayScheme(
    "single",
    re.compile(rf"\[RolloutSkip\(\)\]\s*{_ANSI}Successfully load pre-generated data from (?P<where>\S+?){_ANSI}$"),
    re.compile(r"\[RolloutSkip\(\)\]\s*No data dump found at (?P<where>\S+?)\."),
)
PER_STEP = ReplayScheme(
    "per-step",
    re.compile(rf"\[RolloutSkip\(\)\]\s*{_ANSI}Successfully load pre-generated data from (?P<where>\S+?)\.{_ANSI}$"),
    re.compile(rf"\[RolloutSkip\(\)\]\s*{_ANSI}No dumped data found at gen_step (?P<step>\d+)"),
)
TQ = ReplayScheme(
    "tq",
    re.compile(rf"\[RolloutTqSkip\(\)\]\s*{_ANSI}Injected \d+ cached trajectories from step (?P<step>\d+) .* at current step \d+"),
    re.compile(rf"\[RolloutTqSkip\(\)\]\s*{_ANSI}No cached data found for step (?P<step>\d+)\."),
)
_SCHEMES = ((Version("0.9.0"), TQ), (Version("0.8.0"), PER_STEP), (Version("0.6.0"), SINGLE))


def scheme_for(verl: str | None) -> ReplayScheme:
    """How ``verl`` replays rollouts; refused, with the reason, where it cannot."""
    try:
        version = Version(verl or "")
    except InvalidVersion:
        raise ReplayUnavailable(f"verl {verl or '(unknown)'}: the image does not say its verl release; replay keys depend on it") from None
    for first, scheme in _SCHEMES:
        if version >= first:
            return scheme
    raise ReplayUnavailable(
        f"verl {verl} has no rollout replay (the rollout-skip option came with 0.6.0): compare it by the seeds' rule or "
        "against an earlier NPU run (compare --method seeds|regression)"
    )


def replay_steps(verl: str | None, steps: int) -> int:
    """The steps a replay runs: all of them, or (0.6, 0.7) refused beyond the one that is a replay."""
    limit = scheme_for(verl).steps_replayed
    if limit is not None and steps > limit:
        raise ReplayUnavailable(
            f"verl {verl} dumps one rollout batch with no step in its name and replays it at every step, against later "
            f"steps' prompts: only step 1 is a replay. Run --steps 1 (or a stack with verl >= 0.8.0 for more steps)"
        )
    return steps


def replay_overrides(verl: str | None, steps: int, dump_dir: str = DUMP_DIR) -> tuple[str, ...]:
    """What both runs append to the GRPO job: the same names on both sides, and the release's replay keys."""
    scheme = scheme_for(verl)
    replay_steps(verl, steps)
    determinism = (FULL_DETERMINISM,) if Version(verl or "0") >= FIRST_FULL_DETERMINISM else ()
    return (*COMMON, *determinism, *scheme.keys(dump_dir, steps))


def deterministic_env(side: Side, expansion_mode: str | None = None) -> dict[str, str]:
    """The environment that makes kernels and collectives deterministic on ``side``."""
    if side == "gpu":
        return dict(GPU_ENV)
    return dict(NPU_ENV_LCCL if (expansion_mode or "").upper() == "AIV" else NPU_ENV_HCCL)


def evidence(verl: str | None, lines: list[str]) -> ReplayEvidence:
    scheme = scheme_for(verl)
    loaded, missed = [], []
    for line in lines:
        line = line.rstrip()
        if (m := scheme.loaded.search(line)) is not None:
            loaded.append(m.groupdict().get("where") or m.group("step"))
        elif (m := scheme.missed.search(line)) is not None:
            missed.append(m.groupdict().get("where") or f"step {m.group('step')}")
    return ReplayEvidence(tuple(loaded), tuple(missed))


class VerlReplay(Replay):
    """:class:`buildkit.framework.Replay` for one verl release."""

    def __init__(self, version: str | None) -> None:
        scheme_for(version)  # refused here, with the reason, where the release cannot replay
        self.version = version

    def steps(self, steps: int | None) -> int:
        if steps is None:  # as many as the release replays soundly, at most the smoke job's default
            return scheme_for(self.version).steps_replayed or 5
        return replay_steps(self.version, steps)

    def overrides(self, steps: int, dump_dir: str) -> tuple[str, ...]:
        return replay_overrides(self.version, steps, dump_dir)

    def env(self, side: Side, expansion_mode: str | None) -> dict[str, str]:
        return deterministic_env(side, expansion_mode)

    def evidence(self, lines: list[str]) -> ReplayEvidence:
        return evidence(self.version, lines)
