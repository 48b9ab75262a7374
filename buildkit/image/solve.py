"""Follow BuildKit's solve status (``buildx build --progress=rawjson``) as :class:`BuildProgress`
steps, so a BuildKit build shows and fails the way a classic one does.

buildx writes one JSON document per status update, pretty-printed over several lines, on stderr:
``{"vertexes": [{"digest", "name", "started", "completed", "cached", "error"}], "statuses": [...],
"logs": [{"vertex", "stream", "data" (base64)}], "warnings": [...]}``. A vertex named
``[stage-0 3/12] RUN ...`` is a Dockerfile step; the others (``[internal] load build definition``,
``exporting to image``, ``importing cache manifest from ...``) are BuildKit's own work. Lines that
are not JSON (``ERROR: failed to solve: ...``) are buildx's last words.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from buildkit.image.progress import BuildProgress, Step
from buildkit.text import strip_ansi

# "[stage-0 3/12] RUN ...", "[3/12] RUN ...", "[builder 2/5] COPY ..."
_STEP = re.compile(r"^\[(?:[^\]\s]+ )?\s*(\d+)/(\d+)\] (.*)$", re.DOTALL)
_MOUNT = re.compile(r"--mount=\S+\s+")  # shown without: every installing step has the same ones
_DECODER = json.JSONDecoder()
CACHE_EXPORT = "exporting cache"  # the vertex that writes a registry cache ("exporting cache to registry")
CACHE_IMPORT = "importing cache manifest from "
EXPORT = "exporting to "  # "exporting to image" (the docker driver), "exporting to docker image format", ...
# BuildKit before v0.14 (Docker 26 and older) gives itself 20 s to record a finished build in its history,
# after the image was exported, and fails the build when that runs out (moby/buildkit#4327; v0.14 waits 300 s).
HISTORY_DEADLINE = "DeadlineExceeded"


@dataclass
class SolveProgress(BuildProgress):
    """:class:`BuildProgress` fed by BuildKit's status documents instead of the classic stream."""

    warnings: list[str] = field(default_factory=list)  # what BuildKit warned or a cache export that failed
    _by_digest: dict[str, Step] = field(default_factory=dict)
    _text: str = ""  # what has come on stderr and not yet been decoded
    _last_words: list[str] = field(default_factory=list)
    _partial_lines: dict[tuple[str, int], str] = field(default_factory=dict)  # (vertex, stream) -> its unfinished line
    failed: Step | None = None  # the step whose error ended the build
    _errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # digest -> (started, error) of a failed step
    _stale: dict[str, str] = field(default_factory=dict)  # digest -> the error a step that ran again still carries
    _doubtful: tuple[Step, str] | None = None  # a step that ran again and ended still carrying its old error
    exported: bool = False  # the image was exported (loaded into the engine): every step had run
    unrecorded: bool = False  # then BuildKit failed the build on recording it in its history (HISTORY_DEADLINE)

    def feed_text(self, chunk: str) -> None:
        """More of buildx's stderr: every complete JSON document in it is applied. A document
        spans many lines and can only end on a ``}``: until one comes, nothing is decoded again."""
        inside = self._text.lstrip().startswith("{")
        self._text += chunk
        if inside and "}" not in chunk:
            return
        while True:
            text = self._text.lstrip()
            if not text:
                self._text = ""
                return
            if not text.startswith("{"):
                line, newline, rest = text.partition("\n")
                if not newline:
                    self._text = text
                    return
                self._last_words.append(strip_ansi(line).rstrip())
                self._text = rest
                continue
            try:
                document, end = _DECODER.raw_decode(text)
            except json.JSONDecodeError:
                self._text = text  # the rest of it is still on its way
                return
            self._text = text[end:]
            if isinstance(document, dict):
                self.feed_status(document)

    def feed_status(self, status: dict[str, Any]) -> None:
        for vertex in status.get("vertexes") or []:
            self._vertex(vertex)
        for log in status.get("logs") or []:
            self._log(log)
        for warning in status.get("warnings") or []:
            short = warning.get("short") if isinstance(warning, dict) else None
            text = _decoded(short) if isinstance(short, str) else ""
            if text and text not in self.warnings:
                self.warnings.append(text)

    def _vertex(self, vertex: dict[str, Any]) -> None:
        digest, name = str(vertex.get("digest", "")), str(vertex.get("name", ""))
        error = vertex.get("error")
        if error and name.startswith((CACHE_EXPORT, CACHE_IMPORT)):  # the build goes on without it (ignore-error)
            said = " ".join(str(error).split())
            if name.startswith(CACHE_EXPORT):
                message = f"the registry cache was not written ({said})"
            elif said.endswith(": not found"):  # the first build of this image with this cache: nothing to read yet
                message = f"the registry cache holds nothing for this image yet ({name.removeprefix(CACHE_IMPORT)}); this build writes it"
            else:
                message = f"the registry cache was not read: every step without a local cache ran ({said})"
            if message not in self.warnings:
                self.warnings.append(message)
            return
        if name.startswith(EXPORT) and vertex.get("completed") and not error:
            self.exported = True
        match = _STEP.match(name)
        step = self._by_digest.get(digest)
        if match and step is None and vertex.get("started"):
            number, total, instruction = int(match[1]), int(match[2]), _MOUNT.sub("", match[3])
            keyword = instruction.split(maxsplit=1)[0].upper() if instruction.strip() else ""
            step = Step(number, total, instruction, time.monotonic(), cacheable=keyword != "FROM")
            self._by_digest[digest] = step
            self.steps.append(step)
            self.reporter.step_started(step)
        if step is None:
            if error and not self.error:
                self.error = str(error)  # BuildKit's own work failed (loading the base, exporting)
            return
        if vertex.get("cached") and step.cacheable:  # FROM counts as the classic builder counts it: never
            step.cached = True
        if digest in self._errors and vertex.get("started") not in (None, self._errors[digest][0]):  # a start of its own
            self._ran_again(digest, step)
        if error and self._stale.get(digest) == str(error):  # the old error, not a new one
            error = None
            if vertex.get("completed"):
                self._doubtful = (step, self._stale[digest])
        if error:
            self.error = self.error or str(error)
            self.failed = step
            self._errors[digest] = (str(vertex.get("started")), str(error))
        if (vertex.get("completed") or error) and step.finished is None:
            self._flush(digest)
            step.finished = time.monotonic()
            self.reporter.step_finished(step)

    def _ran_again(self, digest: str, step: Step) -> None:
        """A failed step started again. BuildKit's solver shares a step among the builds that hold it at once:
        when every build waiting on the step's run is stopped, its process is killed (exit 137) and the error
        shows in the status of every build holding the step, also of one that had not asked for the run yet;
        that build's request then runs the step again. The vertex keeps the old error in every later status
        (BuildKit sets a vertex's error and never clears it), so that error is stale from here on; whether the
        step ended well is settled by buildx's exit code (:meth:`settle`)."""
        _, said = self._errors.pop(digest)
        self._stale[digest] = said
        if self.failed is step:
            self.failed = None
            self.error = None if self.error == said else self.error
        note = f"step {step.number}/{step.total} was stopped ({' '.join(said.split())}) and BuildKit ran it again"
        if note not in self.warnings:
            self.warnings.append(note)
        step.started, step.finished = time.monotonic(), None
        self.reporter.step_started(step)

    def settle(self, code: int) -> None:
        """buildx's exit code has the last word: 0 is a build that succeeded whatever a step said on the
        way (a step that ran again keeps its old error); otherwise a step that ran again and still
        carries an error is the one that failed, unless another step's error said so."""
        if code == 0:
            if self.error:
                self.warnings.append(f"BuildKit reported an error on the way ({' '.join(self.error.split())}), and the build succeeded")
            self.error, self.failed = None, None
        elif self.error is None and self._doubtful is not None:
            self.failed, self.error = self._doubtful
        elif self.exported and self.failed is None:
            self.unrecorded = HISTORY_DEADLINE in (self.error or "")

    def failure_message(self) -> str:
        """As for the classic builder, except for a build that failed after its image was exported:
        that is not the last step's failure, and BuildKit's history is named where it was the cause."""
        if not self.exported or self.failed is not None:
            return super().failure_message()
        said = " ".join((self.error or "").split())
        if self.unrecorded:
            return (
                f"BuildKit built and exported the image, then failed the build on recording it in its history ({said}): "
                "BuildKit before v0.14 (Docker 26 and older) gives that 20 s, too little for an engine this busy or a disk "
                "this slow (moby/buildkit#4327); Docker 27 or later gives it 300 s"
            )
        return f"BuildKit built and exported the image, then failed the build: {said}"

    def _log(self, log: dict[str, Any]) -> None:
        """A piece of a step's output. BuildKit cuts it wherever a write ended, not at newlines: the
        text after the last newline waits for the next piece of the same stream (or the step's end),
        so a line is never shown, nor searched, in two halves."""
        data = log.get("data")
        vertex = str(log.get("vertex", ""))
        key = (vertex, int(log.get("stream") or 0))
        text = self._partial_lines.get(key, "") + (_decoded(data) if isinstance(data, str) else "")
        *lines, self._partial_lines[key] = text.split("\n")
        self._emit(vertex, lines)

    def _flush(self, vertex: str | None = None) -> None:
        """The unfinished last lines of ``vertex`` (every vertex when None), shown as they are."""
        for key in [k for k in self._partial_lines if vertex is None or k[0] == vertex]:
            self._emit(key[0], [self._partial_lines.pop(key)])

    def _emit(self, vertex: str, lines: list[str]) -> None:
        step = self._by_digest.get(vertex)
        for raw in lines:
            for part in strip_ansi(raw).splitlines():
                line = part.rstrip()
                if not line.strip():
                    continue
                if step is not None:
                    step.output.append(line)
                self.reporter.output(step, line)

    @property
    def current(self) -> Step | None:
        return self.failed or super().current

    def close(self, *, ended: bool = True) -> None:
        """What is left of the output read; with ``ended`` (buildx exited on its own) the steps
        still open are done, else (stopped) they stay unfinished and are not reported done."""
        self.feed_text("\n")
        self._flush()
        for step in self.steps:
            if ended and step.finished is None and step is not self.failed and not self.error:
                step.finished = time.monotonic()
                self.reporter.step_finished(step)
        said = [line for line in self._last_words if line.startswith("ERROR:")]
        if said and not self.error:
            self.error = said[-1].removeprefix("ERROR:").strip()

    @property
    def last_words(self) -> list[str]:
        """What buildx printed that was not a status document (its ERROR and WARNING lines)."""
        return list(self._last_words)


def _decoded(data: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return data
