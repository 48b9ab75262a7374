"""``ascendkit matrix outdated``'s options, declared once: the command's signature lists them, one line each."""

from __future__ import annotations

from typing import Annotated

import typer

OutdatedStackOption = Annotated[str | None, typer.Option("--stack", "-s", help="Only this stack; default: all.")]

OutdatedProposeOption = Annotated[
    str | None, typer.Option("--propose", help="NEW_ID: print a new stack stanza from --stack with the accepted bumps.")
]
