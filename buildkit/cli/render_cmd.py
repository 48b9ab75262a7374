"""``ascendkit render``: one Dockerfile, or every generated file (--all), or the drift check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildkit.cli.base import WorkingMatrixPath, app, user_errors
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import STDOUT, check_output_file, write_output
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from buildkit.generate import GeneratedFile
    from buildkit.matrix.load import LoadedMatrix
    from buildkit.matrix.model import Matrix


@app.command("render")
@user_errors
def render(
    hw: Annotated[str | None, typer.Option("--hw", help="SKU ({skus}) or chip family ({chips}).")] = None,
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Stack id; default: the matrix's default stack.")] = None,
    os_name: Annotated[str | None, typer.Option("--os", help="Base OS; default: the stack's first OS.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE instead of stdout.")] = None,
    render_all: Annotated[
        bool,
        typer.Option(
            "--all", help="Write every generated file (Dockerfiles, locks' sections, schema, workflow, docs tables, docs/cli.md)."
        ),
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Re-render everything in memory (with or without --all); exit 1 with a diff if a file differs.")
    ] = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Render a Dockerfile for one SKU, or (with --all / --check) every generated file."""
    from buildkit.image.render import render_dockerfile
    from buildkit.matrix.load import load_matrix
    from buildkit.plan import plan_image, plan_target

    if (render_all or check) and (hw or stack or os_name or output):
        raise InputError("--all/--check cover every stack and SKU; drop --hw/--stack/--os/--output")
    if not (render_all or check) and hw is None:
        raise InputError("give --hw (e.g. --hw a3), or --all / --check")
    if output is not None and output != STDOUT:
        check_output_file(output)
    loaded = load_matrix(matrix)
    if render_all or check:
        _every_file(loaded, check=check)
        return
    assert hw is not None
    notes: list[str] = []
    target = plan_target(loaded, hw, stack, os_name, notes)
    for note in notes:
        typer.echo(f"ascendkit: {note}", err=True)
    text = render_dockerfile(loaded, plan_image(loaded, target))
    if write_output(output, text):
        typer.echo(f"wrote {output} ({target.stack_id}, chip {target.chip_id}, {target.os_name})", err=True)


def _every_file(loaded: LoadedMatrix, *, check: bool) -> None:
    """--check compares every generated file with a render in memory; --all writes those that changed.
    Only these need the generator and the pages made from the command line: one Dockerfile does not."""
    from buildkit import generate
    from buildkit.plan import all_targets

    extra = reference_page(loaded.root) + hardware_page_file(loaded.root, loaded.matrix)
    if check:
        expected = generate.expected_outputs(loaded, extra=extra)
        diffs = generate.check(loaded, expected=expected)
        if diffs:
            sys.stdout.write("".join(diffs))
            typer.echo(f"ascendkit: {len(diffs)} generated file(s) are out of date; run `ascendkit render --all`", err=True)
            raise typer.Exit(int(ExitCode.CHECK_FAILED))
        typer.echo(f"ascendkit: {len(expected)} generated files are up to date", err=True)
        return
    touched = generate.write_all(loaded, extra=extra)
    for path in touched:
        typer.echo(f"wrote {path}", err=True)
    typer.echo(f"ascendkit: {len(all_targets(loaded))} Dockerfiles rendered, {len(touched)} file(s) changed", err=True)


def reference_page(root: Path) -> tuple[GeneratedFile, ...]:
    """docs/cli.md, generated from this command line, where the matrix sits in a checkout with docs/."""
    from buildkit.cli.reference import REFERENCE_FILE, cli_reference
    from buildkit.generate import GeneratedFile

    return (GeneratedFile(REFERENCE_FILE, cli_reference()),) if (root / REFERENCE_FILE).parent.is_dir() else ()


def hardware_page_file(root: Path, matrix: Matrix) -> tuple[GeneratedFile, ...]:
    """docs/hardware.md, the host contract per chip, where the matrix sits in a checkout with docs/."""
    from buildkit.generate import GeneratedFile
    from buildkit.run.hardware import HARDWARE_FILE, hardware_page

    return (GeneratedFile(HARDWARE_FILE, hardware_page(matrix)),) if (root / HARDWARE_FILE).parent.is_dir() else ()
