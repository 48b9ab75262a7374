"""Watch a training job's log as it streams (verl or OpenRLHF): one progress line per step, and the cause of a stall.

A GRPO job that never trains rarely says so: Ray keeps a placement group pending when the workers
ask for devices the node does not offer, and HCCL retries a broken link for minutes. The watcher
notes when Ray came up and when each step line arrived; when no step follows Ray for too long,
it names what it saw last and the causes the log points at, instead of a bare "timed out".
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from buildkit.accuracy.metrics import STEP_TIME, StepParser
from buildkit.doctor.codes import code_pattern, codes_in, error_codes
from buildkit.text import strip_ansi

# Ray is up: what ray.init prints locally, or on connecting to a cluster (KubeRay, ray start).
_RAY_UP = re.compile(r"Started a local Ray instance|Connected to Ray cluster|Connecting to existing Ray cluster")
# Ray's autoscaler and scheduler, when a request waits for resources no node has.
_PENDING = re.compile(
    r"cannot be scheduled right now|No available node types can fulfill|placement group.*(?:pending|infeasible)|"
    r"Infeasible|resource request.*cannot be",
    re.IGNORECASE,
)
_GPU_ASK = re.compile(r"['\"]?GPU['\"]?\s*:\s*\d")
_HCCL = re.compile(
    r"\bHCCL\b.*(?:error|fail|timeout|timed out)|(?:error|fail|timeout).*\bHCCL\b|E[IJ]\d{4}|hccl.*(?:error|fail)", re.IGNORECASE
)
_NPU_ERROR = re.compile(r"\b(?:EE|EL|EH|EZ)\d{4}\b|ACL error|aclnn.*failed|NPU out of memory|socversion", re.IGNORECASE)
_PY_ERROR = re.compile(r"^(?:Traceback|\w+(?:Error|Exception):)")


@dataclass(frozen=True)
class Stall:
    """Why the watcher gave up on the job: what it saw last and what that points at."""

    summary: str
    causes: tuple[str, ...]
    last_lines: tuple[str, ...]

    def describe(self) -> dict[str, object]:
        return {"summary": self.summary, "likely_causes": list(self.causes), "last_lines": list(self.last_lines)}


@dataclass
class JobWatch:
    """Fed the job's log line by line (from the streaming thread); asked by the waiting thread."""

    steps: int
    stall_after: float  # seconds without a step line once Ray is up
    progress: Callable[[str], None] | None = None
    clock: Callable[[], float] = time.monotonic
    # What the log showed so far; not arguments.
    started: float = field(init=False)
    ray_up_at: float | None = field(default=None, init=False)
    last_step_at: float | None = field(default=None, init=False)
    last_step: int = field(default=0, init=False)
    pending_lines: list[str] = field(default_factory=list, init=False)
    hccl_lines: list[str] = field(default_factory=list, init=False)
    npu_lines: list[str] = field(default_factory=list, init=False)
    error_lines: list[str] = field(default_factory=list, init=False)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=15), init=False)
    parser: StepParser = field(default_factory=StepParser, init=False)
    codes: dict[str, str] = field(default_factory=dict, init=False)  # each known error code seen -> the first line with it
    _table: list[dict[str, str]] = field(default_factory=error_codes, init=False, repr=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._codes = code_pattern(self._table)

    def feed(self, raw: str) -> None:
        line = strip_ansi(raw).rstrip()
        if not line.strip():
            return
        self.tail.append(line)
        now = self.clock()
        if self.ray_up_at is None and _RAY_UP.search(line):
            self.ray_up_at = now
        found = self.parser.feed(line)
        for metrics in found:
            since = now - (self.last_step_at or self.ray_up_at or self.started)
            self.last_step, self.last_step_at = metrics.step, now
            timing = metrics.metrics.get(STEP_TIME)
            reported = f"{timing:.1f} s by the job's log" if timing is not None else f"{since:.1f} s since the last progress"
            if self.progress is not None:
                self.progress(f"step {metrics.step}/{self.steps}: {reported}")
        if found:
            return
        for pattern, bucket in ((_PENDING, self.pending_lines), (_HCCL, self.hccl_lines), (_NPU_ERROR, self.npu_lines)):
            if pattern.search(line) and len(bucket) < 5:
                bucket.append(line.strip())
        if _PY_ERROR.match(line.strip()) and len(self.error_lines) < 5:
            self.error_lines.append(line.strip())
        for code in codes_in(self._codes, line):
            self.codes.setdefault(code, line.strip())

    def stalled(self) -> Stall | None:
        """A stall once Ray has been up ``stall_after`` seconds with no new step line."""
        if self.ray_up_at is None or self.last_step >= self.steps:
            return None
        quiet = self.clock() - (self.last_step_at or self.ray_up_at)
        if quiet < self.stall_after:
            return None
        return self.diagnose(f"no step line for {quiet:.0f} s after {self.where()}")

    def where(self) -> str:
        return f"step {self.last_step}" if self.last_step else "Ray came up"

    def diagnose(self, summary: str | None = None) -> Stall:
        """What the log points at; used for a stall and for the overall timeout alike."""
        causes: list[str] = []
        if self.pending_lines:
            gpu = any(_GPU_ASK.search(line) for line in self.pending_lines)
            causes.append(
                "Ray cannot place the workers: a placement group waits for resources no node offers"
                + (
                    " — it asks for GPU: trainer.device is cuda (verl before NPU auto-detection needs trainer.device=npu)"
                    if gpu
                    else " — check the NPUs Ray sees (ray status) against trainer.n_gpus_per_node x trainer.nnodes"
                )
                + f". Seen: {self.pending_lines[0]}"
            )
        if self.hccl_lines:
            causes.append(
                f"HCCL reported errors: the NPUs' network between ranks (hccn_tool, HCCL_IF_IP, host network). Seen: {self.hccl_lines[0]}"
            )
        if self.npu_lines:
            causes.append(f"the NPU runtime reported an error (driver, CANN, chip). Seen: {self.npu_lines[0]}")
        if self.error_lines:
            causes.append(f"a Python error was printed: {self.error_lines[-1]}")
        by_code = {e["code"]: e for e in self._table}
        for code in self.codes:  # in the order they first appeared
            e = by_code[code]
            causes.append(f"{code} ({e['name']}): {e['meaning']}. First check: {e['check']}. Source: {e['source']}")
        if self.ray_up_at is None:
            causes.append("Ray never reported that it started: the job is stuck before training (imports, model load, data)")
        if not causes:
            causes.append("nothing in the log points at a cause; see the last lines and job.log")
        return Stall(summary or f"stopped at {self.where()}", tuple(causes), tuple(self.tail))
