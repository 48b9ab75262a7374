"""Where a CPU run of a job stopped, read from what it printed: the accelerator boundary, or the error and where.

A run on a machine without NPUs must end at the first place that needs an accelerator. For verl that
is the resource pool (``ResourcePoolManager._check_resource_available`` in every release the matrix
carries, 0.5 to 0.9: it counts Ray's accelerators and raises "Total available GPUs 0 is less than total
desired GPUs N"), or Ray reporting a demand for accelerators no node has. Anything else it ends at
is classified by the frame it came from: an import, the configuration, the data, the reward function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The boundary each framework reaches, said from its source (docs/smoke.md, "A CPU run").
BOUNDARIES = {
    "verl": (
        (  # GRPO: the trainer's resource pool, before any worker starts
            re.compile(r"Total available (?:GPUs|NPUs|\w+) (\d+) is less than total desired (?:GPUs|NPUs|\w+) (\d+)"),
            "the resource pool asks Ray for {1} accelerators and finds {0} (ResourcePoolManager._check_resource_available)",
            None,
        ),
        (  # SFT: each rank's process group asks for the device's collective backend (HCCL on the NPU) first thing
            re.compile(r"No available nccl backend found on device type (\w+)|Distributed package doesn't have (NCCL) built in"),
            "each rank's process group asks for the device's collective backend (verl.utils.distributed.initialize_global_process_group)",
            re.compile(r"in initialize_global_process_group"),
        ),
    ),
}
# Where a framework waits for accelerators instead of failing at a check (the boundary seen as Ray's pending demand).
WAITING = {
    "openrlhf": "train_ppo_ray's placement group for the actor and reference ({NPU: 1, CPU: 1} per device) waits in "
    "ray.get(pg.ready()) for NPUs no node has",
}
# What ran before the boundary, as the frameworks print it (in order).
MILESTONES = {
    "verl": (
        ("configuration composed and printed", re.compile(r"'actor_rollout_ref':|actor_rollout_ref:")),
        ("verl's validate_config passed", re.compile(r"All configuration checks passed")),
        ("joined the Ray cluster", re.compile(r"Connecting to existing Ray cluster|Connected to Ray cluster|ray init kwargs")),
        ("task runner started in Ray", re.compile(r"\(TaskRunner\w* pid=")),
        (
            "train and validation data loaded by verl's dataset",
            re.compile(r"Size of train dataloader|train dataset size|filter dataset len"),
        ),
        ("trainer built, its workers asked for", re.compile(r"_check_resource_available|create_resource_pool")),
        ("the SFT trainer's main ran (torchrun's rank started)", re.compile(r"in run_sft\b|sft_trainer\.py\W+line \d+, in main")),
    ),
    "openrlhf": (
        ("OpenRLHF's parser read the job's flags, its DeepSpeed strategy made", re.compile(r"^Namespace\(", re.M)),
        ("joined the Ray cluster", re.compile(r"Connecting to existing Ray cluster|Connected to Ray cluster")),
        (
            "the actor and reference placement group asked Ray for accelerators",
            re.compile(r"No available node types can fulfill resource request \{[^}]*'(?:NPU|GPU)'"),
        ),
    ),
}
_EXCEPTION = re.compile(r"(?:^|\()((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|KeyboardInterrupt))\)?: (.*)$")
# What torch.distributed and Ray put in front of a process's lines: "[rank0]: ", "(TaskRunner pid=12) ".
_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s?|\(\w+(?:\.\w+)* pid=\d+(?:, ip=[\d.]+)?\)\s?)+")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_MISSING = re.compile(r"No module named '([^']+)'")
# Where an error came from, by the file of its deepest frame.
_KINDS = (
    ("configuration", re.compile(r"/(hydra|omegaconf)/|/verl/trainer/config/|validate_config|/verl/utils/config\.py")),
    (
        "data",
        re.compile(r"/datasets/|rl_dataset\.py|sft_dataset\.py|multiturn_sft_dataset\.py|/pyarrow/|/pandas/|create_rl_(?:sampler|dataset)"),
    ),
    ("reward", re.compile(r"/reward_score/|reward_manager|/reward\.py|reward_func|gsm8k_reward")),
)


@dataclass
class Verdict:
    reached: bool  # the run ended at the accelerator boundary
    where: str  # the boundary, or the error's kind and place
    kind: str  # boundary, import, configuration, data, reward, error, bound
    detail: str = ""
    ran: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"reached": self.reached, "kind": self.kind, "where": self.where, "detail": self.detail, "ran": self.ran}


def milestones(framework: str, log: str) -> list[str]:
    return [name for name, pattern in MILESTONES.get(framework, ()) if pattern.search(log)]


def last_error(log: str) -> tuple[str, str, list[tuple[str, int, str]]]:
    """The last exception a log shows (its type, message) and the frames of its traceback."""
    lines = log.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        line = _PREFIX.sub("", re.sub(r"\x1b\[[0-9;]*m", "", lines[index])).strip()
        match = _EXCEPTION.search(line)
        if match and not line.startswith("File "):
            name, message = match.group(1).split(".")[-1], match.group(2).strip()
            if name in ("RayTaskError", "RayActorError") and index + 1 < len(lines):
                continue
            frames = []
            for before in lines[max(0, index - 400) : index]:
                frame = _FRAME.search(before)
                if frame:
                    frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
            return name, message, frames
    return "", "", []


def classify(name: str, message: str, frames: list[tuple[str, int, str]]) -> tuple[str, str]:
    """(kind, place) of an error: an import names the module; the rest by their deepest frame."""
    place = f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else "(no traceback)"
    if name in ("ModuleNotFoundError", "ImportError") or _MISSING.search(message):
        missing = _MISSING.search(message)
        return "import", f"module {missing.group(1) if missing else '?'} imported at {place}"
    if name in ("ConfigAttributeError", "ConfigKeyError", "ConfigCompositionException", "OverrideParseException", "MissingMandatoryValue"):
        return "configuration", place
    for kind, pattern in _KINDS:
        if any(pattern.search(path) or pattern.search(func) for path, _, func in frames[-3:]):
            return kind, place
    return "error", place


def judge_boundary(framework: str, result: dict[str, Any], log: str) -> Verdict:
    """Where the entry point stopped: cpu_boundary.py's ``result`` and the run's log."""
    ran = milestones(framework, log)
    for pattern, said, context in BOUNDARIES.get(framework, ()):
        if (found := pattern.search(log)) and (context is None or context.search(log)):
            return Verdict(True, said.format(*found.groups()), "boundary", found.group(0), ran)
    if result.get("stopped") == "waiting-for-accelerators":
        demands = "; ".join(result.get("demands", []))
        where = WAITING.get(framework, "Ray holds a demand for accelerators no node has: the trainer waits for them")
        return Verdict(True, where, "boundary", demands, ran)
    name, message, frames = last_error(log)
    if result.get("stopped") == "bound":
        still = f"stopped after {result.get('bound_s')} s, still running"
        if name:  # a worker died and the driver waits on it: the error is the verdict, not the bound
            kind, place = classify(name, message, frames)
            return Verdict(False, place, kind, f"{name}: {message} ({still})"[:500], ran)
        detail = f"{still}; Ray's pending demands: {result.get('demands') or 'none'}"
        return Verdict(False, "no boundary within the bound", "bound", detail, ran)
    if result.get("exit_code") is None:
        return Verdict(False, "the run did not start", "error", str(result.get("error", "")), ran)
    if not name:
        return Verdict(False, f"exited {result.get('exit_code')} without an error", "error", "", ran)
    kind, place = classify(name, message, frames)
    return Verdict(False, place, kind, f"{name}: {message}"[:500], ran)


def judge_step(result: dict[str, Any] | None, log: str) -> Verdict:
    """Whether the training step did what a step must: the reward called per response and varying
    within groups, non-zero advantages, a finite loss, a gradient, weights that moved."""
    if result is None:
        name, message, frames = last_error(log)
        kind, place = classify(name, message, frames) if name else ("error", "(no traceback)")
        return Verdict(False, place, kind, f"{name}: {message}"[:500] if name else "the step wrote no result")
    problems = []
    if result.get("job") == "sft":  # a supervised step: tokens the loss mask trains, no reward
        if not result.get("trained_tokens"):
            problems.append("the loss mask trains no token")
    else:
        responses = len(result.get("rewards", []))
        if result.get("reward_calls") != responses:
            problems.append(f"the reward function was called {result.get('reward_calls')} times for {responses} responses")
        if not any(abs(a) > 0 for a in result.get("advantages", [])):
            problems.append("every GRPO advantage is zero")
    loss = result.get("loss")
    if not isinstance(loss, float) or loss != loss or abs(loss) == float("inf"):
        problems.append(f"the loss is not finite ({loss})")
    if not result.get("grad_norm", 0) > 0:
        problems.append("the gradient norm is zero")
    if not result.get("parameters_changed"):
        problems.append("no weight changed")
    if problems:
        return Verdict(False, "the step's checks", "step", "; ".join(problems))
    return Verdict(True, "one optimizer step", "step", f"loss {loss:.6g}, grad norm {result['grad_norm']:.4g}")
