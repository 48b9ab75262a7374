"""How the ``ascendkit`` command looks: placeholders that say what to type, options grouped in
panels in plain help, usage errors in ascendkit's one-line form, tables as plain columns when piped."""

from __future__ import annotations

import enum
import functools
from typing import Any

try:  # newer Typers carry their own click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - an older Typer on click itself
    from click.exceptions import UsageError  # type: ignore[assignment]

__all__ = ["PLACEHOLDERS", "UsageError", "plain_cell", "plain_table", "polish", "usage_message", "with_placeholders"]

# What to type, by the option's parameter name, where its type alone would say <str> or <path>.
PLACEHOLDERS = {
    "hw": "SKU",
    "stack": "STACK",
    "os_name": "OS",
    "image": "IMAGE",
    "images": "IMAGE",
    "base_image": "IMAGE",
    "src": "IMAGE",
    "dst": "HOST/REPO",
    "repository": "HOST/REPO",
    "base_registry": "HOST/PATH",
    "name": "NAME",
    "namespace": "NAME",
    "queue": "QUEUE",
    "pull_secret": "SECRET",
    "npu_resource": "RESOURCE",
    "nic": "IFACE",
    "model_pvc": "PVC",
    "model_path": "PATH",
    "override": "KEY=VALUE",
    "env": "KEY=VALUE",
    "sources": "SOURCE",
    "metric": "METRIC",
    "devices": "LIST",
    "propose": "VERSION",
    "command": "COMMAND",
    "output": "FILE",
    "log": "FILE",
    "npu_log": "FILE",
    "baseline": "FILE",
    "plot": "FILE",
    "files": "FILE",
    "tolerance": "X",
}


def polish(command: Any) -> Any:
    """What every loaded command (and subcommand) gets: placeholders, and its options grouped."""
    for sub in getattr(command, "commands", {}).values():
        polish(sub)
    with_placeholders(command)
    if any(getattr(p, "rich_help_panel", None) for p in getattr(command, "params", [])):
        command.format_options = functools.partial(format_options_by_panel, command)
    return command


def format_options_by_panel(command: Any, ctx: Any, formatter: Any) -> None:
    """``--help`` with the options in their panels (``rich_help_panel``: "Mirrors and indexes",
    "Publishing"), the rest under "Options" first, as Typer does only when Rich draws the help."""
    arguments, panels = [], {"Options": []}  # type: ignore[var-annotated]
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            arguments.append(record)
        else:
            panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    for title, records in panels.items():
        if records:
            with formatter.section(title):
                formatter.write_dl(records)


def with_placeholders(command: Any) -> Any:
    """Give every option of ``command`` (and of its subcommands) whose help would show only its type
    (``<str>``, ``<int range>``, ``<list[str]>``) a placeholder saying what to type: ``<URL>``,
    ``<PATH>``, ``<N>``, or the name of the thing (``--hw <SKU>``). Choices and explicit metavars stay."""
    for param in getattr(command, "params", []):
        if param.metavar is not None or getattr(param, "is_flag", False):
            continue
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        shown = str(annotation)
        if "Literal" in shown or (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
            continue  # its choices are the placeholder
        if param.name in PLACEHOLDERS:
            word = PLACEHOLDERS[param.name]
        elif param.name and param.name.endswith(("_url", "_mirror")):
            word = "URL"
        elif "int" in shown:
            word = "N"
        elif "float" in shown:
            word = "SECONDS" if "timeout" in (param.name or "") else "X"
        elif "Path" in shown:
            word = "DIR" if param.name in ("manifest_dir", "wheelhouse", "out", "model_path", "data") else "PATH"
        else:
            word = (param.name or "value").upper()
        param.metavar = f"<{word}>"
    return command


def usage_message(exc: UsageError) -> str:
    """``build: invalid value for '--installer': 'foo' is not one of 'uv', 'pip' (see `ascendkit build --help`)``."""
    message = " ".join(exc.format_message().split()).removeprefix("Error: ")
    message = message.replace(": Value error, ", ": ")
    message = message[:1].lower() + message[1:]
    command = exc.ctx.command_path if exc.ctx is not None else "ascendkit"
    where = command.removeprefix("ascendkit").strip()
    return f"{where + ': ' if where else ''}{message.rstrip('.')} (see `{command} --help`)"


def plain_cell(cell: Any) -> str:
    """A cell's text without markup, on one line."""
    from rich.text import Text  # only where a table is printed

    text = cell.plain if isinstance(cell, Text) else Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def plain_table(table: Any) -> str:
    """A Rich table as plain columns: its title, the header (when shown), then the rows, two spaces apart."""
    columns = [[plain_cell(c) for c in column.cells] for column in table.columns]
    rows = [list(row) for row in zip(*columns, strict=True)] if columns else []
    if table.show_header:
        rows.insert(0, [plain_cell(column.header) for column in table.columns])
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(len(table.columns))]
    lines = [plain_cell(table.title)] if table.title else []
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "".join(f"{line}\n" for line in lines)
