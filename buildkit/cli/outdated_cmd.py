"""``ascendkit matrix outdated``: newer releases of each pin, which the rules accept, and a proposed stack."""

from __future__ import annotations

import typer

from buildkit.cli.base import JsonFlag, WorkingMatrixPath, matrix_app, out, print_json, user_errors
from buildkit.cli.mirror_options import AscendIndexUrl, CaBundle, ConfigFile, PipIndexUrl, PytorchIndexUrl, ca_bundle_of, mirrors_from
from buildkit.cli.outdated_options import OutdatedProposeOption, OutdatedStackOption
from buildkit.cli.tables import RichTable
from buildkit.errors import ExitCode, InputError
from buildkit.resources import DEFAULT_MATRIX


@matrix_app.command("outdated", short_help="Find newer releases of the pins.")
@user_errors
def matrix_outdated(
    stack: OutdatedStackOption = None,
    propose: OutdatedProposeOption = None,
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Ask each pin's index for newer stable releases every arch can install, and which of them the
    rules accept (exit 8 when an index could not be reached: nothing is guessed for its pins)."""
    from buildkit.lock.index import IndexClient
    from buildkit.lock.outdated import check_new_id, outdated
    from buildkit.lock.outdated import propose as propose_stanza
    from buildkit.lock.relock import index_urls_for
    from buildkit.matrix.load import load_matrix

    if propose is not None and stack is None:
        raise InputError("--propose NEW_ID starts from one stack: give --stack")
    loaded = load_matrix(matrix)
    if propose is not None:
        check_new_id(loaded, propose)
    given = {"pip_index_url": pip_index_url, "pytorch_index_url": pytorch_index_url, "ascend_index_url": ascend_index_url}
    mirrors = mirrors_from(config, ca_bundle, **given)
    client = IndexClient(ca_bundle=ca_bundle_of(mirrors))
    news = outdated(loaded, client, index_urls_for(loaded, mirrors), stack)
    unreachable = any(p.status == "unreachable" for n in news for p in n.pins)
    if propose is not None:
        (one,) = news
        if not one.bumps:
            typer.echo(f"ascendkit: nothing to propose: no newer pin of {one.stack} that the rules accept", err=True)
            raise typer.Exit(int(ExitCode.CHECK_FAILED))
        typer.echo(propose_stanza(loaded, one, propose), nl=False)
    elif as_json:
        print_json([{"stack": n.stack, "together": list(n.together), "pins": [p.describe() for p in n.pins]} for n in news])
    else:
        table = RichTable(title="newer releases on each pin's index (stable, installable on every arch of the stack)")
        for column in ("stack", "component", "package", "pinned", "newest", "rules accept", "note"):
            table.add_column(column)
        for n in news:
            for p in n.pins:
                note = p.detail or (f"{p.refused[0][0]}: {p.refused[0][1]}" if p.refused and p.accepted != p.newer[0] else "")
                table.add_row(
                    n.stack,
                    p.component,
                    p.package,
                    p.pinned,
                    p.newer[0] if p.newer else "",
                    p.accepted or "",
                    p.status + (f"; {note}" if note else ""),
                )
            for why in n.together:
                table.add_row(n.stack, "(together)", "", "", "", "", f"refused together: {why}")
        out.print(table)
    if unreachable:
        typer.echo("ascendkit: some indexes could not be reached; their pins are marked unreachable (nothing guessed)", err=True)
        raise typer.Exit(int(ExitCode.UNVERIFIED))
