"""OpenRLHF from its Ascend fork's git checkout: its GRPO smoke job (a Ray head first, as the seed
starts it), parsed by OpenRLHF's own parser in the image (``smoke_tests/openrlhf_args.py``) and
checked against what it would refuse only once Ray is up."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from buildkit.framework import CheckContext, Framework, Gate, Replay, ReplayUnavailable
from buildkit.frameworks.openrlhf.args import check_args, parse_printed_args
from buildkit.frameworks.openrlhf.rules import matches_stack
from buildkit.run.job import SMOKE_FILES

if TYPE_CHECKING:
    from buildkit.doctor.base import Check
    from buildkit.matrix.model import Matrix
    from buildkit.violation import Violation

ARGS_CHECK = f"{SMOKE_FILES}/openrlhf_args.py"  # the config check: OpenRLHF's parser and assertions, up to ray.init
_ARGPARSE_ERROR = re.compile(r"^[\w.-]+: error: .*")
_ASSERTION = re.compile(r"^AssertionError(?:: .*)?$")


class OpenRlhf(Framework):
    name = "openrlhf"
    title = "OpenRLHF"
    install = "checkout"
    jobs = ("grpo",)
    arguments = "flags"
    check_style = "parser"
    rollouts = ("vllm",)  # the Ascend branch rolls out with vLLM only
    splits_nodes = True  # actor and reference on a share of each node, vLLM engines on the rest
    gates = (Gate("openrlhf grpo", "reward", ("policy_loss",), None, 2.0, 2.0),)  # seed 003: reward and policy_loss 2 % each

    def check_argv(self, module: str, arguments: tuple[str, ...]) -> list[str]:
        return ["python3", ARGS_CHECK, module, *arguments]

    def refusal(self, lines: list[str], code: int) -> str:
        said = [line for line in lines if _ARGPARSE_ERROR.match(line) or _ASSERTION.match(line)]
        return f"OpenRLHF refused the job's arguments (exit {code}): " + (" | ".join(said[-2:] or lines[-3:]) or "no output")

    def config_checks(self, printed: str, context: CheckContext) -> tuple[list[Check], str] | str:
        args = parse_printed_args(printed)
        if args is None:
            return "the check exited 0 but printed no parsed arguments (is the module an OpenRLHF training entry point?)"
        checks = check_args(args, npus_per_node=context.npus_per_node, nnodes=context.nnodes, steps=context.steps)
        return checks, json.dumps(args, indent=2) + "\n"

    def replay(self, version: str | None) -> Replay:
        # OpenRLHF 0.7.5 (the fork's train_ppo_ray.py, ppo_trainer.py, experience_maker.py): no rollout dump or
        # replay, no rollout log-probabilities or mismatch metric, and shuffling always on (seeded by --seed).
        raise ReplayUnavailable(
            f"OpenRLHF {version or ''}".rstrip() + " has no rollout replay: it dumps no rollouts, logs no rollout probabilities and "
            "always shuffles (seeded by --seed); its smoke job runs with --seed and --full_determinism, and is compared by "
            "the seeds' rule or against an earlier NPU run (--method seeds|regression)"
        )

    def rules(self) -> dict[str, Callable[[Matrix], Iterator[Violation]]]:
        return {"openrlhf-matches-stack": matches_stack}


FRAMEWORK = OpenRlhf()
