"""``ascendkit doctor`` on a host; images carry the same module behind a small wrapper."""

from __future__ import annotations

from typing import Annotated

import typer

from buildkit.cli.base import JsonFlag, app, print_json


@app.command("doctor")
def doctor(
    as_json: JsonFlag = False,
    links: Annotated[bool, typer.Option("--links", help="Fail when an NPU port's link is not UP (hccn_tool; multi-node jobs).")] = False,
) -> None:
    """Check pins, the CANN environment, the driver, the NPUs and their links here (exit 1: failed, 10: no devices, preflight only)."""
    from buildkit.doctor.report import format_report, run

    code, report = run(links=links)
    if as_json:
        print_json(report)
    else:
        typer.echo(format_report(report))
    raise typer.Exit(code)
