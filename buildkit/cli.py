"""The ``ascendkit`` command: a thin layer that parses options, calls one function, prints the result.

User mistakes are printed as messages (never tracebacks) and mapped to the exit codes in
:class:`buildkit.errors.ExitCode`.
"""

from __future__ import annotations

import enum
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table as RichTable

from buildkit import __version__, generate, tables
from buildkit.errors import AscendkitError, ExitCode, Finding, InputError, MatrixError
from buildkit.fsio import write_atomic
from buildkit.matrix import DEFAULT_MATRIX, load_matrix, resolve_stack
from buildkit.render import all_targets, base_image_ref, plan_target, render_dockerfile

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="ascendkit",
    help="Build, verify and ship verl-on-Ascend container images from one compatibility matrix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
matrix_app = typer.Typer(help="Inspect and validate compat_matrix.yaml.", no_args_is_help=True)
app.add_typer(matrix_app, name="matrix")

MatrixPath = Annotated[
    Path,
    typer.Option("--matrix", "-m", help="Path of the compatibility matrix.", envvar="ASCENDKIT_MATRIX"),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

# Piped output is not cut to 80 columns: tables stay readable in logs and CI.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _fail(message: str, code: ExitCode) -> typer.Exit:
    typer.echo(f"ascendkit: {message}", err=True)
    return typer.Exit(int(code))


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn :class:`AscendkitError` into a message on stderr and its documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except MatrixError as exc:
            typer.echo(exc.format(), err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except AscendkitError as exc:
            raise _fail(str(exc), exc.exit_code) from None

    return wrapper


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _finding_json(f: Finding) -> dict[str, Any]:
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
    """Exit codes: 0 ok, 1 check failed (drift), 2 invalid input, 3 output not writable."""


# ---- matrix ----------------------------------------------------------------------------------


@matrix_app.command("validate")
@user_errors
def matrix_validate(matrix: MatrixPath = DEFAULT_MATRIX, as_json: JsonFlag = False) -> None:
    """Check the matrix's structure and every compatibility rule; report all problems at once."""
    try:
        loaded = load_matrix(matrix)
    except MatrixError as exc:
        if not as_json:
            raise
        errors = [f for f in exc.findings if f.severity == "error"]
        warnings = [f for f in exc.findings if f.severity != "error"]
        _print_json({"valid": False, "errors": [_finding_json(f) for f in errors], "warnings": [_finding_json(f) for f in warnings]})
        raise typer.Exit(int(ExitCode.INVALID_INPUT)) from None
    m = loaded.matrix
    if as_json:
        _print_json({"valid": True, "errors": [], "warnings": [_finding_json(f) for f in loaded.warnings]})
        return
    for warning in loaded.warnings:
        typer.echo(warning.format(), err=True)
    out.print(
        f"{matrix}: valid — {len(m.stacks)} stacks (default {loaded.default_stack()}), "
        f"{len(m.skus)} SKUs, {len(m.chips)} chips, {len(loaded.warnings)} warning(s)"
    )


@matrix_app.command("list")
@user_errors
def matrix_list(matrix: MatrixPath = DEFAULT_MATRIX, as_json: JsonFlag = False) -> None:
    """List the release lines (stacks)."""
    loaded = load_matrix(matrix)
    rows = [
        {
            "stack": name,
            "default": s.default,
            "cann": s.cann,
            "python": s.python,
            "torch_npu": s.torch_npu.version,
            "vllm_ascend": s.vllm_ascend.version,
            "verl": s.verl.version,
            "os": list(s.os),
            "arches": list(s.arches),
            "skus": list(s.skus),
        }
        for name, s in loaded.matrix.stacks.items()
    ]
    if as_json:
        _print_json(rows)
        return
    table = RichTable(title=f"Stacks in {matrix}")
    for column in ("stack", "CANN", "Python", "torch_npu", "vllm-ascend", "verl", "OS", "arches", "SKUs"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            f"{r['stack']} (default)" if r["default"] else str(r["stack"]),
            str(r["cann"]),
            str(r["python"]),
            str(r["torch_npu"]),
            str(r["vllm_ascend"]),
            str(r["verl"]),
            ", ".join(r["os"]),  # type: ignore[arg-type]
            ", ".join(r["arches"]),  # type: ignore[arg-type]
            ", ".join(r["skus"]),  # type: ignore[arg-type]
        )
    out.print(table)


@matrix_app.command("show")
@user_errors
def matrix_show(
    stack: Annotated[str, typer.Argument(help="Stack id, e.g. cann8.3.")],
    matrix: MatrixPath = DEFAULT_MATRIX,
    as_json: JsonFlag = False,
) -> None:
    """Show every pin of one stack, its base images and known issues."""
    loaded = load_matrix(matrix)
    name, s = resolve_stack(loaded, stack)
    m = loaded.matrix
    chips = sorted({m.skus[k].chip for k in s.skus})
    bases = {f"{chip}/{os_name}": base_image_ref(m, s, chip, os_name) for chip in chips for os_name in s.os}
    issues = [
        {"severity": i.severity, "reason": i.reason}
        for i in m.compat.known_issues
        if i.torch_npu == s.torch_npu.version and i.cann == s.cann
    ]
    data = {"stack": name, **s.model_dump(mode="json", exclude_none=True), "base_images": bases, "known_issues": issues}
    if as_json:
        _print_json(data)
        return
    table = RichTable(title=f"{name}{' (default)' if s.default else ''}: {s.description}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key in ("cann", "python", "os", "arches", "skus", "atb_cxx_abi"):
        value = getattr(s, key)
        table.add_row(key, ", ".join(value) if isinstance(value, tuple) else str(value))
    for component, pin in s.pins().items():
        extra = [f"index {pin.index}"] + [f"{a}: {i}" for a, i in pin.index_by_arch.items()]
        if pin.build_from_source:
            extra.append("built from sdist")
        table.add_row(component, f"{pin.version}  ({'; '.join(extra)})")
    for component, git in s.git_pins().items():
        repo = m.repos[git.repo]
        table.add_row(component, f"{git.ref}  ({m.git_hosts[repo.host].url}/{repo.path}, {git.install})")
    for pkg, spec in s.constraints.items():
        table.add_row(f"constraint {pkg}", spec)
    for arch, specs in s.constraints_by_arch.items():
        for pkg, spec in specs.items():
            table.add_row(f"constraint {pkg} ({arch})", spec)
    for key, value in s.env.items():
        table.add_row(f"env {key}", value)
    for label, ref in bases.items():
        table.add_row(f"base {label}", ref)
    for issue in issues:
        table.add_row(f"known issue ({issue['severity']})", issue["reason"])
    out.print(table)


class TableFormatChoice(str, enum.Enum):
    md = "md"
    rst = "rst"


@matrix_app.command("table")
@user_errors
def matrix_table(
    fmt: Annotated[TableFormatChoice, typer.Option("--format", "-f", help="Markdown or reStructuredText.")] = TableFormatChoice.md,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Print the support tables (release lines and SKUs) generated from the matrix."""
    loaded = load_matrix(matrix)
    sys.stdout.write(tables.support_tables(loaded.matrix, fmt.value))


@matrix_app.command("schema")
@user_errors
def matrix_schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the matrix (for editor completion and validation)."""
    text = generate.schema_text()
    if output is None:
        sys.stdout.write(text)
    else:
        write_atomic(output, text)


# ---- render ----------------------------------------------------------------------------------


@app.command("render")
@user_errors
def render(
    hw: Annotated[str | None, typer.Option("--hw", help="SKU (a2-box16, 900-podc, a3) or chip family (a2, a3).")] = None,
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Stack id; default: the matrix's default stack.")] = None,
    os_name: Annotated[str | None, typer.Option("--os", help="Base OS; default: the stack's first OS.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    render_all: Annotated[bool, typer.Option("--all", help="Write every generated file (Dockerfiles, schema, README tables).")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Re-render everything in memory (with or without --all); exit 1 with a diff if a file differs.")
    ] = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Render a Dockerfile for one SKU, or (with --all / --check) every generated file."""
    if (render_all or check) and (hw or stack or os_name or output):
        raise InputError("--all/--check cover every stack and SKU; drop --hw/--stack/--os/--output")
    if not (render_all or check) and hw is None:
        raise InputError("give --hw (e.g. --hw a3), or --all / --check")
    loaded = load_matrix(matrix)
    if check:
        diffs = generate.check(loaded)
        if diffs:
            sys.stdout.write("".join(diffs))
            typer.echo(f"ascendkit: {len(diffs)} generated file(s) are out of date; run `ascendkit render --all`", err=True)
            raise typer.Exit(int(ExitCode.CHECK_FAILED))
        count = len(generate.expected_outputs(loaded))
        typer.echo(f"ascendkit: {count} generated files are up to date", err=True)
        return
    if render_all:
        touched = generate.write_all(loaded)
        for path in touched:
            typer.echo(f"wrote {path}", err=True)
        typer.echo(f"ascendkit: {len(all_targets(loaded))} Dockerfiles rendered, {len(touched)} file(s) changed", err=True)
        return
    assert hw is not None
    target = plan_target(loaded, hw, stack, os_name)
    text = render_dockerfile(loaded, target)
    if output is None:
        sys.stdout.write(text)
    else:
        write_atomic(output, text)
        typer.echo(f"wrote {output} ({target.stack_id}, chip {target.chip_id}, {target.os_name})", err=True)


def main() -> None:
    app(prog_name="ascendkit")
