"""``docs/cli.md``: every command and option of the ``ascendkit`` app, generated from the app itself.

``ascendkit render --all`` writes it and ``render --check`` fails when it drifts, like every other
generated file, so the reference cannot disagree with ``--help``. Only what the app declares goes
in (no machine's paths, no terminal width): the same app gives the same page everywhere.

Typer carries its own click, so parameters are told apart by what they declare (``param_type_name``),
not by click's classes.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
import typer.main

from buildkit.cli.commands import COMMANDS

REFERENCE_FILE = "docs/cli.md"
PROG = "ascendkit"

HEADER = """# The `ascendkit` commands

Generated from the command-line app by `ascendkit render --all` (do not edit; `ascendkit render --check`
fails when this page and the app disagree). `ascendkit COMMAND --help` prints the same, and
`ascendkit --install-completion` installs tab completion for your shell.

"""


def load_app() -> Any:
    """The whole click group: every command module imported, as a run of each would."""
    from buildkit.cli.base import app

    for modules, _ in COMMANDS.values():
        for module in modules:
            importlib.import_module(module)
    return typer.main.get_group(app)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _record(param: Any, ctx: Any) -> tuple[str, str]:
    """What ``--help`` prints for a parameter: its names with the placeholder, and its help with the default."""
    record = param.get_help_record(ctx)
    if record is None:
        return param.name or "", ""
    return record[0], record[1]


def _command(path: list[str], command: Any, parent: Any) -> list[str]:
    ctx = typer.Context(command, info_name=path[-1], parent=parent)
    lines = [f"## `{' '.join(path)}`", ""]
    if command.help:
        lines += [" ".join(command.help.split()), ""]
    pieces = command.collect_usage_pieces(ctx)
    lines += ["```", f"{' '.join(path)} {' '.join(pieces)}".rstrip(), "```", ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    if arguments or options:
        lines += ["| argument or option | |", "|---|---|"]
        for param in [*arguments, *options]:
            names, text = _record(param, ctx)
            lines.append(f"| `{_cell(names)}` | {_cell(text)} |")
        lines.append("")
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += _command([*path, name], sub, ctx)
    return lines


def cli_reference() -> str:
    """The markdown page for the whole app, commands in the order ``--help`` lists them."""
    group = load_app()
    root = typer.Context(group, info_name=PROG)
    lines = [HEADER.rstrip("\n"), ""]
    if group.epilog:
        lines += [" ".join(group.epilog.split()), ""]
    lines += ["| command | what it does |", "|---|---|"]
    names = group.list_commands(root)
    for name in names:
        command = group.get_command(root, name)
        assert command is not None
        lines.append(f"| [`{name}`](#{PROG}-{name}) | {_cell(command.get_short_help_str(limit=300))} |")
    lines.append("")
    for name in names:
        command = group.get_command(root, name)
        assert command is not None
        lines += _command([PROG, name], command, root)
    return "\n".join(lines).rstrip("\n") + "\n"
