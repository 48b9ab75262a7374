"""The ``ascendkit`` command: a thin layer that parses options, calls one function, prints the result.

User mistakes are printed as messages (never tracebacks) and mapped to the exit codes in
:class:`buildkit.errors.ExitCode`. Each submodule registers its commands on the shared app.
"""

from __future__ import annotations

from buildkit.cancel import terminate_like_interrupt
from buildkit.cli import (
    build_cmd,
    doctor_cmd,
    k8s_cmd,
    lock_cmd,
    matrix_cmd,
    metrics_cmd,
    outdated_cmd,
    plan_cmd,
    render_cmd,
    sbom_cmd,
    smoke_cmd,
)
from buildkit.cli.base import app

__all__ = [
    "app",
    "build_cmd",
    "doctor_cmd",
    "k8s_cmd",
    "lock_cmd",
    "main",
    "matrix_cmd",
    "metrics_cmd",
    "outdated_cmd",
    "plan_cmd",
    "render_cmd",
    "sbom_cmd",
    "smoke_cmd",
]


def main() -> None:
    terminate_like_interrupt()  # SIGTERM (CI, Kubernetes) cleans up like Ctrl-C and exits 143
    app(prog_name="ascendkit")
