"""``ascendkit lock`` and ``ascendkit wheelhouse``: hash-locked requirements and their artifacts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildkit.arch import Arch
from buildkit.cli.base import (
    JsonFlag,
    WorkingMatrixPath,
    app,
    out,
    print_json,
    user_errors,
)
from buildkit.cli.lock_options import (
    LockAllStacksOption,
    LockArchOption,
    LockExcludeNewerOption,
    LockJobsOption,
    LockStackOption,
    LockUpgradeOption,
)
from buildkit.cli.mirror_options import (
    AscendIndexUrl,
    CaBundle,
    ConfigFile,
    GitcodeUrl,
    GithubUrl,
    PipIndexUrl,
    PytorchIndexUrl,
    ca_bundle_of,
    mirrors_from,
)
from buildkit.cli.tables import RichTable
from buildkit.errors import ExitCode, InputError
from buildkit.fsio import check_output_dir
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from buildkit.lock.relock import LockOutcome


@app.command("lock")
@user_errors
def lock(
    stack: LockStackOption = None,
    all_stacks: LockAllStacksOption = False,
    arch: LockArchOption = None,
    upgrade: LockUpgradeOption = False,
    jobs: LockJobsOption = 4,
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    github_url: GithubUrl = None,
    gitcode_url: GitcodeUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    exclude_newer: LockExcludeNewerOption = None,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Write locks/<stack>-<arch>.txt: every package of the image, pinned with hashes, for the target.

    A framework built from a git checkout (OpenRLHF) has its requirements file read at the pinned
    commit from its git host (or --github-url / --gitcode-url) once, and kept in locks/_sources/.

    Exit 0: all resolved; 1: a stack's pins do not resolve together (its lock is left as it was);
    8: some lock is marked unresolved because its index or git host could not be reached.
    """
    from buildkit.lock.inputs import lock_targets
    from buildkit.lock.relock import check_exclude_newer, git_hosts_for, index_urls_for, lock_all
    from buildkit.matrix.load import load_matrix

    if stack and all_stacks:
        raise InputError("give --stack S or --all, not both")
    if exclude_newer is not None:
        check_exclude_newer(exclude_newer)
    loaded = load_matrix(matrix)
    targets = lock_targets(loaded, stack, arch)
    mirrors = mirrors_from(
        config, ca_bundle, pip_index_url=pip_index_url, pytorch_index_url=pytorch_index_url, ascend_index_url=ascend_index_url,
        github_url=github_url, gitcode_url=gitcode_url,
    )  # fmt: skip
    outcomes = lock_all(
        loaded, targets, index_urls=index_urls_for(loaded, mirrors), ca_bundle=ca_bundle_of(mirrors), upgrade=upgrade, jobs=jobs,
        on_done=None if as_json else _progress(), git_hosts=git_hosts_for(loaded, mirrors), exclude_newer=exclude_newer,
    )  # fmt: skip
    failed = [o for o in outcomes if o.status == "failed"]
    unresolved = [o for o in outcomes if o.status == "unresolved"]
    code = ExitCode.CHECK_FAILED if failed else ExitCode.UNVERIFIED if unresolved else ExitCode.OK
    if as_json:
        print_json({"exit_code": int(code), "locks": [o.describe() for o in outcomes]})
    else:
        _print_table(outcomes)
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


def _progress() -> Callable[[LockOutcome], None]:
    """A line on stderr as each target is done (the targets resolve at once: one line at a time)."""
    printing = threading.Lock()

    def progress(outcome: LockOutcome) -> None:
        with printing:
            typer.echo(f"{outcome.target.name}: {outcome.status} ({outcome.seconds:.1f}s) {outcome.detail.splitlines()[0]}", err=True)

    return progress


def _print_table(outcomes: list[LockOutcome]) -> None:
    table = RichTable(title="Locks (resolved: hashes enforced; unresolved: index unreachable; failed: pins conflict)")
    for column in ("lock", "status", "packages", "changed", "seconds"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.target.path, o.status, str(o.packages or ""), "yes" if o.changed else "no", f"{o.seconds:.1f}")
    out.print(table)
    for o in outcomes:
        if o.status != "resolved":
            out.print(f"{o.target.name} {o.status}: {o.detail}")


@app.command("wheelhouse")
@user_errors
def wheelhouse(
    stack: Annotated[str, typer.Option("--stack", "-s", help="Stack whose lock to download.")],
    arch: Annotated[Arch, typer.Option("--arch", help="The target's CPU architecture.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to fill (created if missing; files already there are reused).")],
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Download every locked artifact of one stack and arch, each checked against the lock's hashes."""
    from buildkit.lock.inputs import LockTarget, lock_targets
    from buildkit.lock.relock import index_urls_for
    from buildkit.lock.wheelhouse import make_wheelhouse
    from buildkit.matrix.load import load_matrix

    check_output_dir(output, "wheelhouse (-o)")
    loaded = load_matrix(matrix)
    target = lock_targets(loaded, stack, arch)[0]
    mirrors = mirrors_from(
        config, ca_bundle, pip_index_url=pip_index_url, pytorch_index_url=pytorch_index_url, ascend_index_url=ascend_index_url
    )
    report = make_wheelhouse(
        loaded, LockTarget(target.stack_id, target.arch), output, index_urls_for(loaded, mirrors), ca_bundle=ca_bundle_of(mirrors)
    )
    if as_json:
        print_json(report.describe())
        return
    for name in report.downloaded:
        typer.echo(f"downloaded {name}", err=True)
    typer.echo(
        f"wheelhouse {output}: {len(report.downloaded) + len(report.reused)} files ({len(report.downloaded)} downloaded, "
        f"{len(report.reused)} already there), {report.total_bytes / 1e6:.1f} MB, every one matching {target.path}",
        err=True,
    )
