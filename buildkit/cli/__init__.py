"""The ``ascendkit`` command: a thin layer that parses options, calls one function, prints the result.

User mistakes are printed as messages (never tracebacks) and mapped to the exit codes in
:class:`buildkit.errors.ExitCode`. Each ``*_cmd`` module registers its commands on the shared app
when it is imported; :data:`buildkit.cli.commands.COMMANDS` says which module holds which command,
so a run imports only the one it needs and ``--help`` none of them.
"""

from __future__ import annotations

from buildkit.cancel import terminate_like_interrupt
from buildkit.cli.base import app

__all__ = ["app", "main"]


def main() -> None:
    terminate_like_interrupt()  # SIGTERM (CI, Kubernetes) cleans up like Ctrl-C and exits 143
    app(prog_name="ascendkit")
