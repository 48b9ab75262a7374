"""Shared pieces of the ``ascendkit`` command: the Typer apps, common options, error handling.

User mistakes are printed as messages (never tracebacks) and mapped to the exit codes in
:class:`buildkit.errors.ExitCode`.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
import typer.main
from typer import Abort
from typer.core import TyperCommand, TyperGroup

from buildkit import __version__
from buildkit.arch import Arch
from buildkit.cancel import signal_exit_code, stopped_by
from buildkit.cli.commands import COMMANDS, SUMMARIES
from buildkit.cli.style import UsageError, plain_cell, plain_table, polish, usage_message
from buildkit.errors import AscendkitError, ExitCode, Finding, MatrixError

if TYPE_CHECKING:
    from rich.console import Console

P = ParamSpec("P")
R = TypeVar("R")


class LazyGroup(TyperGroup):
    """The top-level group: its commands are listed from :data:`buildkit.cli.commands.COMMANDS`, and a
    command's modules are imported only when it is looked up to run (or to show its own help)."""

    _listing = False
    _built: tuple[Any, Any] | None = None

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(name for name in super().list_commands(ctx) if name not in COMMANDS)]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in COMMANDS and args[0] not in self.commands:  # a mistyped name: suggest from all
            for name, (_, help_text) in COMMANDS.items():
                self.commands.setdefault(name, TyperCommand(name, help=help_text))
        return super().resolve_command(ctx, args)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Click's own usage errors (a bad value, a missing option, an unknown command) in ascendkit's
        one-line form, ``ascendkit: COMMAND: what is wrong (see `COMMAND --help`)``, exit 2."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **kwargs)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **kwargs)
        except UsageError as exc:
            if exc.ctx is not None and type(exc).__name__ == "NoArgsIsHelpError":  # `ascendkit k8s`: its help
                typer.echo(exc.ctx.get_help(), err=True)
                sys.exit(int(ExitCode.INVALID_INPUT))
            typer.echo(f"ascendkit: {usage_message(exc)}", err=True)
            sys.exit(int(ExitCode.INVALID_INPUT))
        except Abort:  # Ctrl-C or end of input while click itself was reading
            typer.echo("ascendkit: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        modules, help_text = entry
        if self._listing and not all(m in sys.modules for m in modules):  # its line in the listing, nothing imported
            return TyperCommand(cmd_name, help=help_text, short_help=SUMMARIES[cmd_name])
        for module in modules:
            importlib.import_module(module)  # registers its commands on `app`
        command = self._converted().commands.get(cmd_name)
        if command is not None:
            command.short_help = SUMMARIES[cmd_name]
            polish(command)
        return command

    def _converted(self) -> Any:
        """The app as click commands, converted once per process for each set of registered commands
        (Typer reads every signature to convert them: looking up the fifteen commands one by one, as the
        reference page and completion do, would otherwise convert the whole app fifteen times; and each
        run of the app in one process, as the API and CliRunner do, makes a group of its own)."""
        key = (
            len(app.registered_commands),
            tuple(len(g.typer_instance.registered_commands) for g in app.registered_groups if g.typer_instance),
        )
        built = LazyGroup._built
        if built is None or built[0] != key:
            built = LazyGroup._built = (key, typer.main.get_group(app))
        return built[1]


app = typer.Typer(
    cls=LazyGroup,
    name="ascendkit",
    help="Build, verify and ship verl and OpenRLHF container images for Ascend NPUs from one compatibility matrix.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion: tab completion of commands, options and choices
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    epilog=(
        "Exit codes: 0 ok, 1 check failed (drift, stale lock, missing or conflicting pin), 2 invalid input, 3 output not writable, "
        "4 engine/base image/registry unreachable, 5 build failed, 6 verification failed, 7 publish failed, "
        "8 unverified (index unreachable; lock left unresolved), 9 smoke timed out or stalled, "
        "10 no Ascend devices (config check and preflight only), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM); "
        "ASCENDKIT_DEBUG=1 adds the underlying error to a message."
    ),
)
matrix_app = typer.Typer(help="Inspect and validate compat_matrix.yaml.", no_args_is_help=True)
app.add_typer(matrix_app, name="matrix")


def _matrix_or_released(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """No --matrix, no $ASCENDKIT_MATRIX and no ./compat_matrix.yaml: the matrix ascendkit was
    released with, said in one line (commands that only read the matrix; see WorkingMatrixPath)."""
    from buildkit.resources import released_matrix

    source = ctx.get_parameter_source(param.name) if param.name else None
    if getattr(source, "name", None) == "DEFAULT" and not value.exists():  # not given, not in the environment
        released = released_matrix()
        if released is not None:
            typer.echo(f"ascendkit: no ./{value} here; reading the matrix released with ascendkit {__version__} ({released})", err=True)
            return released
    return value


# Commands that only read the matrix fall back to the released one; commands that write beside it
# or need its locks (render, lock, build, plan, outdated) take WorkingMatrixPath and never do.
MatrixPath = Annotated[
    Path,
    typer.Option(
        "--matrix",
        "-m",
        help="Path of the compatibility matrix (default ./compat_matrix.yaml, else the one ascendkit was released with).",
        envvar="ASCENDKIT_MATRIX",
        callback=_matrix_or_released,
    ),
]
WorkingMatrixPath = Annotated[
    Path,
    typer.Option("--matrix", "-m", help="Path of the compatibility matrix; its locks/ are beside it.", envvar="ASCENDKIT_MATRIX"),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ArchChoice = Annotated[Arch | None, typer.Option("--arch", help="The image's CPU architecture (build default: this machine's).")]


def finite(value: Any) -> Any:
    """Option callback: refuse nan and inf, which click's ranges let through."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, float) and not math.isfinite(item):
            raise typer.BadParameter(f"{item} is not a finite number")
    return value


class _Out:
    """The commands' Rich console, made on first use (Rich stays out of a command that prints no table).

    On a terminal, tables are drawn with boxes; piped or redirected, each is plain aligned columns
    (its title, a header, one line per row, cells never wrapped) that ``grep``, ``cut`` and ``awk``
    read. Rich honours ``NO_COLOR``; nothing here adds colour of its own."""

    def __init__(self) -> None:
        self._console: Console | None = None

    def print(self, *objects: Any, **kwargs: Any) -> None:
        from rich.table import Table

        if not sys.stdout.isatty() and any(isinstance(o, Table) for o in objects):
            for o in objects:
                sys.stdout.write(plain_table(o) if isinstance(o, Table) else f"{plain_cell(o)}\n")
            return
        if self._console is None:
            from rich.console import Console

            # Piped output is not cut to 80 columns: lines stay whole in logs and CI.
            self._console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        kwargs.setdefault("markup", False)  # what is printed is text as given: "[mirrors]" stays
        self._console.print(*objects, **kwargs)


out = _Out()


def _fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"ascendkit: {message}", err=True)
    return typer.Exit(int(code))


def _debug(exc: BaseException) -> None:
    """With ASCENDKIT_DEBUG=1, the exception a message was made from, with its traceback (for a bug report)."""
    original = exc.__cause__ or exc.__context__
    if os.environ.get("ASCENDKIT_DEBUG") and original is not None:
        typer.echo("".join(traceback.format_exception(original)).rstrip(), err=True)


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every error about input or the machine into a message on stderr and its documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except MatrixError as exc:
            typer.echo(exc.format(), err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except AscendkitError as exc:
            _debug(exc)
            raise _fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (buildkit.cancel.Terminated)
            raise _fail(stopped_by(exc), ExitCode(signal_exit_code(exc))) from None
        # Not ours, but still about the input or the machine, never worth a traceback: a file the
        # command could not write, a value Python refused, input nested past the interpreter's stack.
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise _fail(f"{where}{exc.strerror or exc}", ExitCode.OUTPUT_ERROR) from None
        except RecursionError:
            raise _fail("input nested too deeply to process", ExitCode.INVALID_INPUT) from None
        except MemoryError:
            raise _fail("input too large to process in memory", ExitCode.INVALID_INPUT) from None
        except (ValueError, UnicodeError) as exc:
            raise _fail(f"invalid input: {exc}", ExitCode.INVALID_INPUT) from None

    return wrapper


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def finding_json(f: Finding) -> dict[str, Any]:
    return {
        "file": str(f.location.path),
        "line": f.location.line,
        "column": f.location.column,
        "field": f.field,
        "message": f.message,
        "valid": f.hint,
        "rule": f.rule,
        "severity": f.severity,
    }


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ascendkit {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """The exit codes are listed in the epilog of --help and in the README."""
