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


MATRIX_NAMES = ("skus", "chips", "stacks")  # the placeholders a parameter's help may hold


@functools.cache
def matrix_names() -> dict[str, str]:
    """The names help lists, from the matrix ascendkit was released with: ``{skus}``, ``{chips}``,
    ``{stacks}`` (the default first). Read only when a command's help is shown or its command loads."""
    import yaml

    from buildkit.resources import released_matrix

    path = released_matrix()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path else {}
    except (OSError, yaml.YAMLError):
        data = {}
    skus = data.get("skus") if isinstance(data, dict) else None
    stacks = data.get("stacks") if isinstance(data, dict) else None
    skus, stacks = (skus if isinstance(skus, dict) else {}), (stacks if isinstance(stacks, dict) else {})
    chips = dict.fromkeys(str(s.get("chip")) for s in skus.values() if isinstance(s, dict) and s.get("chip"))
    default = [k for k, v in stacks.items() if isinstance(v, dict) and v.get("default")]
    ordered = [*default, *(k for k in stacks if k not in default)]
    return {
        "skus": ", ".join(map(str, skus)) or "see `ascendkit plan`",
        "chips": ", ".join(chips) or "see `ascendkit plan`",
        "stacks": ", ".join(map(str, ordered)) or "see `ascendkit plan`",
    }


def with_matrix_names(command: Any) -> Any:
    """Fill ``{skus}``, ``{chips}`` and ``{stacks}`` in the help of ``command``'s parameters when
    the help is shown (reading the matrix then, not on every run of the command)."""
    for param in getattr(command, "params", []):
        text = getattr(param, "help", None)
        if text and any(f"{{{key}}}" in text for key in MATRIX_NAMES):
            param.get_help_record = functools.partial(_help_with_names, param, param.get_help_record)
    return command


def _help_with_names(param: Any, record: Any, ctx: Any) -> Any:
    for key, value in matrix_names().items():
        param.help = param.help.replace(f"{{{key}}}", value)
    return record(ctx)


def polish(command: Any) -> Any:
    """What every loaded command (and subcommand) gets: placeholders, matrix names, its options grouped."""
    for sub in getattr(command, "commands", {}).values():
        polish(sub)
    with_placeholders(command)
    with_matrix_names(command)
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
    ``<PATH>``, ``<N>``, or the name of the thing (``--hw <SKU>``). Choices and explicit metavars stay.
    An argument shows its placeholder alone (``IMAGE``, ``<FILE>``), never a Python type beside it."""
    for param in getattr(command, "params", []):
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        shown = str(annotation)
        choices = "Literal" in shown or (isinstance(annotation, type) and issubclass(annotation, enum.Enum))
        if param.param_type_name == "argument" and not choices:
            param.display_type_rich = _no_type  # Typer would print ``IMAGE <str>``, ``<FILE> <file>``
        if param.metavar is not None or getattr(param, "is_flag", False):
            continue
        if choices:
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


def _no_type(ctx: Any) -> None:
    return None


def usage_message(exc: UsageError) -> str:
    """``build: invalid value for '--installer': 'foo' is not one of 'uv', 'pip' (see `ascendkit build --help`)``."""
    message = " ".join(exc.format_message().split()).removeprefix("Error: ")
    message = message.replace(": Value error, ", ": ")
    message = message[:1].lower() + message[1:]
    command = exc.ctx.command_path if exc.ctx is not None else "ascendkit"
    where = command.removeprefix("ascendkit").strip()
    return f"{where + ': ' if where else ''}{message.rstrip('.')} (see `{command} --help`)"


def plain_cell(cell: Any) -> str:
    """A cell's text, on one line."""
    from rich.text import Text  # only where a table is printed

    text = cell.plain if isinstance(cell, Text) else str(cell)  # a string is text as given, not Rich markup
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
