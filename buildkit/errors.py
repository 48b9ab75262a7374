"""Errors users can act on, and the exit codes the CLI maps them to.

Every failure caused by the user's input is raised as an :class:`AscendkitError` subclass; the CLI
prints it without a traceback and exits with its :class:`ExitCode`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Documented process exit codes (README, "Exit codes")."""

    OK = 0
    CHECK_FAILED = 1  # a check ran and found a difference (render --check drift)
    INVALID_INPUT = 2  # bad matrix, unknown --hw/--stack, bad option value, missing input file
    OUTPUT_ERROR = 3  # an output file or directory could not be written
    UNAVAILABLE = 4  # the Docker engine, the base image or the registry cannot be reached
    BUILD_FAILED = 5  # a Dockerfile step failed
    VERIFY_FAILED = 6  # the built image does not match the matrix or its labels; nothing was tagged
    PUBLISH_FAILED = 7  # a push or the multi-arch index failed; nothing was reported as published
    UNVERIFIED = 8  # nothing was found wrong, but some of it could not be checked (index unreachable)
    TIMED_OUT = 9  # smoke: the run outlived --timeout; the container was killed and removed, the log kept
    NO_DEVICES = 10  # doctor/smoke: no Ascend devices here; the preflight ran, the NPU work did not
    INTERRUPTED = 130  # Ctrl-C: the run was stopped and cleaned up
    TERMINATED = 143  # SIGTERM (CI, Kubernetes): stopped and cleaned up as for Ctrl-C


class AscendkitError(Exception):
    """Base class for errors that reach the user as a message, never as a traceback."""

    exit_code: ExitCode = ExitCode.INVALID_INPUT


class InputError(AscendkitError):
    """The user asked for something that does not exist or cannot be read."""


class OutputError(AscendkitError):
    """A file could not be written; nothing partial was left behind."""

    exit_code = ExitCode.OUTPUT_ERROR


class Unavailable(AscendkitError):
    """Something outside ascendkit (engine, base image, registry) cannot be reached."""

    exit_code = ExitCode.UNAVAILABLE


class BuildFailed(AscendkitError):
    exit_code = ExitCode.BUILD_FAILED


class VerifyFailed(AscendkitError):
    exit_code = ExitCode.VERIFY_FAILED


class PublishFailed(AscendkitError):
    exit_code = ExitCode.PUBLISH_FAILED


class Interrupted(AscendkitError):
    """Ctrl-C (exit 130) or SIGTERM (``terminated=True``, exit 143) stopped the run; what it started was cleaned up."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str, *, terminated: bool = False) -> None:
        super().__init__(message)
        self.terminated = terminated
        if terminated:
            self.exit_code = ExitCode.TERMINATED


@dataclass(frozen=True, order=True)
class Location:
    """A position in a source file; line and column are 1-based, 0 when unknown."""

    path: Path
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.path}:{self.line}:{self.column}"
        return str(self.path)


@dataclass(frozen=True)
class Finding:
    """One problem found in the matrix: where, in which field, what is wrong, what would be valid."""

    location: Location
    field: str
    message: str
    hint: str = ""
    rule: str = ""
    severity: str = "error"

    def format(self) -> str:
        rule = f" [{self.rule}]" if self.rule else ""
        text = f"{self.location}: {self.severity}: {self.field}: {self.message}{rule}"
        if self.hint:
            text += f"\n    valid: {self.hint}"
        return text


class MatrixError(AscendkitError):
    """The matrix failed to parse or validate. Carries every finding, not just the first."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = sorted(findings, key=lambda f: (f.location, f.field, f.message))
        errors = sum(1 for f in self.findings if f.severity == "error")
        super().__init__(f"{errors} error(s) in the compatibility matrix")

    def format(self) -> str:
        lines = [f.format() for f in self.findings]
        lines.append(str(self))
        return "\n".join(lines)
