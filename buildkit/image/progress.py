"""Follow the classic builder's JSON stream: which step runs, which were cached, what failed.

The engine sends lines such as ``{"stream": "Step 3/12 : RUN ..."}``, ``{"stream": " ---> Using
cache"}``, ``{"stream": " ---> Running in 0a1b2c"}``, ``{"aux": {"ID": "sha256:..."}}`` and, on
failure, ``{"error": "..."}``. :class:`BuildProgress` turns them into a small state a reporter can
show and a failure message can quote.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from buildkit.text import strip_ansi

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
TAIL_LINES = 30


@dataclass
class Step:
    number: int
    total: int
    instruction: str
    started: float
    cacheable: bool = True  # False for FROM and the ARGs before it: the engine never caches those
    cached: bool = False
    finished: float | None = None
    output: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


class Reporter(Protocol):
    def step_started(self, step: Step) -> None: ...
    def step_finished(self, step: Step) -> None: ...
    def output(self, step: Step | None, line: str) -> None: ...


def tell(reporter: Reporter, line: str) -> None:
    """``line`` to ``reporter.note``: what the build does besides its steps (a retry), shown always. A reporter
    may have no ``note`` (one written for ``buildkit.api.build`` before it came): it is then told nothing."""
    note = getattr(reporter, "note", None)
    if callable(note):
        note(line)


class QuietReporter:
    def step_started(self, step: Step) -> None:
        pass

    def step_finished(self, step: Step) -> None:
        pass

    def output(self, step: Step | None, line: str) -> None:
        pass


@dataclass
class BuildProgress:
    reporter: Reporter = field(default_factory=QuietReporter)
    steps: list[Step] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)  # every RUN container the engine started
    image_id: str | None = None
    error: str | None = None
    # The engine cuts a step's output into events wherever its buffer fills, not at newlines: the
    # text after the last newline waits for the next event, so a line is never shown in two halves.
    _partial: str = ""

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    @property
    def cached_steps(self) -> int:
        return sum(1 for s in self.steps if s.cached)

    @property
    def cacheable_steps(self) -> int:
        return sum(1 for s in self.steps if s.cacheable)

    def _finish_current(self) -> None:
        step = self.current
        if step is not None and step.finished is None:
            step.finished = time.monotonic()
            self.reporter.step_finished(step)

    def feed(self, event: Mapping[str, Any]) -> None:
        text = event.get("stream")
        if isinstance(text, str):
            if _STEP.match(text) or text.startswith(" ---> "):
                self._flush_partial()  # the builder's own lines start afresh
            # The classic builder wraps every chunk a step writes to stderr in red (ESC[91m .. ESC[0m),
            # also mid-line when the program wrote the line in pieces: shown without them.
            *lines, self._partial = (self._partial + strip_ansi(text)).split("\n")
            for line in lines:
                for raw in line.splitlines():
                    self._line(raw.rstrip())
            return
        self._flush_partial()
        if "error" in event:
            self.error = str(event.get("error") or event.get("errorDetail", {}).get("message", "unknown error")).strip()
            return
        aux = event.get("aux")
        if isinstance(aux, Mapping) and isinstance(aux.get("ID"), str):
            self.image_id = aux["ID"]
            return
        status = event.get("status")
        if isinstance(status, str):
            self._pull_status(str(event.get("id", "")), status)
            return

    def _flush_partial(self) -> None:
        partial, self._partial = self._partial, ""
        for raw in partial.splitlines():
            self._line(raw.rstrip())

    def _line(self, line: str) -> None:
        if not line.strip():
            return
        step_match = _STEP.match(line)
        if step_match:
            self._finish_current()
            number, total, instruction = int(step_match[1]), int(step_match[2]), step_match[3]
            keyword = instruction.split(maxsplit=1)[0].upper() if instruction.strip() else ""
            after_from = any(not s.cacheable and s.instruction.upper().startswith("FROM") for s in self.steps)
            started = Step(number, total, instruction, time.monotonic(), cacheable=after_from and keyword != "FROM")
            self.steps.append(started)
            self.reporter.step_started(started)
            return
        step = self.current
        if line == " ---> Using cache":
            if step is not None:
                step.cached = True
            return
        running = _RUNNING.match(line)
        if running:
            self.containers.append(running[1])
            return
        if _LAYER.match(line) or line.startswith("Removing intermediate container "):
            return
        if line.startswith("Successfully built "):
            self._finish_current()
            return
        if step is not None:
            step.output.append(line)
        self.reporter.output(step, line)

    def _pull_status(self, layer: str, status: str) -> None:
        """The engine pulling the base image: one line per layer state, not per progress tick."""
        if status in ("Downloading", "Extracting", "Waiting", "Verifying Checksum"):
            return
        line = f"{layer}: {status}" if layer else status
        if self.current is not None:
            self.current.output.append(line)
        self.reporter.output(self.current, line)

    def close(self) -> None:
        self._flush_partial()
        self._finish_current()

    def failure_message(self) -> str:
        step = self.current
        where = f"step {step.number}/{step.total} ({' '.join(step.instruction.split())[:110]} ...)" if step else "before the first step"
        code = re.search(r"(?:returned a non-zero code|did not complete successfully: exit code): (\d+)", self.error or "")
        reason = f"the command exited with code {code[1]}" if code else self.error
        tail = "\n".join(f"    {line}" for line in (step.output if step else []))
        return f"build failed at {where}: {reason}" + (f"\n  last output:\n{tail}" if tail else "")
