"""``ascendkit lock``'s options, declared once: the command's signature lists them, one line each."""

from __future__ import annotations

from typing import Annotated

import typer

from buildkit.arch import Arch

LockStackOption = Annotated[str | None, typer.Option("--stack", "-s", help="Only this stack; default: every stack (same as --all).")]

LockAllStacksOption = Annotated[bool, typer.Option("--all", help="Every stack of the matrix (the default).")]

LockArchOption = Annotated[Arch | None, typer.Option("--arch", help="Only this arch; default: every arch of each stack.")]

LockUpgradeOption = Annotated[
    bool, typer.Option("--upgrade", help="Resolve afresh instead of keeping the current lock's versions where they fit.")
]

LockJobsOption = Annotated[int, typer.Option("--jobs", "-j", min=1, max=16, help="Targets resolved at once.")]

LockExcludeNewerOption = Annotated[
    str | None,
    typer.Option(
        "--exclude-newer",
        metavar="<DATE>",
        help="Resolve as the indexes stood then (2026-11-25 or 2026-11-25T00:00:00Z): a re-lock that reproduces.",
    ),
]
