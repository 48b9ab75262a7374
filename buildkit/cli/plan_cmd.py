"""``ascendkit plan``: every image the matrix defines (or those the filters name), before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildkit.cli.base import ArchChoice, JsonFlag, WorkingMatrixPath, app, out, print_json, user_errors
from buildkit.cli.tables import RichTable
from buildkit.errors import InputError
from buildkit.resources import DEFAULT_MATRIX, default_repository

if TYPE_CHECKING:
    from buildkit.matrix.load import LoadedMatrix
    from buildkit.plan import ImagePlan


def describe_target(loaded: LoadedMatrix, plan: ImagePlan, repository: str, lock_status: str) -> dict[str, Any]:
    """One build target as people and CI read it (the same keys in the table and in --json)."""
    stack = loaded.matrix.stacks[plan.stack_id]
    return {
        "stack": plan.stack_id,
        "chip": plan.chip_id,
        "os": plan.os_name,
        "arch": plan.arch,
        "skus": list(plan.skus),
        "default_stack": stack.default,
        "base_image": plan.base_image,
        "dockerfile": plan.target.path,
        "tags": [f"{repository}:{tag}" for tag in plan.tags],
        "lock": plan.lock_path,
        "lock_status": lock_status,
    }


@app.command("plan")
@user_errors
def plan(
    every: Annotated[bool, typer.Option("--all", help="Every image of the matrix.")] = False,
    stack: Annotated[str | None, typer.Option("--stack", "-s", help="Only this stack.")] = None,
    hw: Annotated[str | None, typer.Option("--hw", help="Only this SKU's or chip family's images.")] = None,
    os_name: Annotated[str | None, typer.Option("--os", help="Only this base OS.")] = None,
    arch: ArchChoice = None,
    repository: Annotated[
        str | None, typer.Option("--repo", help="Image repository the tags are shown in (default ascendkit/<framework>).")
    ] = None,
    as_json: JsonFlag = False,
    ci: Annotated[
        str | None,
        typer.Option(
            "--ci",
            help="github: the GitHub workflow's job matrix as JSON (what .github/workflows/images.yml runs over); "
            "gitlab: the child pipeline ci/gitlab/images.gitlab-ci.yml runs, as YAML.",
        ),
    ] = None,
    stacks: Annotated[
        str | None, typer.Option("--stacks", help="With --ci: the stacks, comma separated, or all (the workflow's input).")
    ] = None,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """List the build targets (stack, chip, OS, arch) with base image, tags, lock status and SKUs."""
    from buildkit.lock.inputs import LockTarget
    from buildkit.lock.lockfile import lock_state
    from buildkit.matrix.load import load_matrix
    from buildkit.plan import plan_fleet

    if ci is not None or stacks is not None:
        _ci_matrix(ci, stacks, (every, stack, hw, os_name, arch, repository, as_json), matrix)
        return
    if every == any(v is not None for v in (stack, hw, os_name, arch)):
        raise InputError("give --all, or narrow with --stack/--hw/--os/--arch (not both)")
    loaded = load_matrix(matrix)
    fleet = plan_fleet(loaded, stack=stack, hw=hw, os_name=os_name, arch=arch)
    states = {(p.stack_id, p.arch): lock_state(loaded, LockTarget(p.stack_id, p.arch)) for p in fleet}  # a lock serves every chip and OS
    targets = [describe_target(loaded, p, repository or default_repository(p.framework), states[p.stack_id, p.arch]) for p in fleet]
    if as_json:
        print_json(targets)
        return
    table = RichTable(title=f"{len(targets)} image(s) of {Path(matrix)}")
    for column in ("stack", "chip", "os", "arch", "SKUs", "base image", "lock", "tag"):
        table.add_column(column)
    for t in targets:
        table.add_row(t["stack"], t["chip"], t["os"], t["arch"], ",".join(t["skus"]), t["base_image"], t["lock_status"], t["tags"][0])
    out.print(table)


def _ci_matrix(ci: str | None, stacks: str | None, others: tuple[object, ...], matrix: Path) -> None:
    import json

    from buildkit.ci.gitlab import child_pipeline, dump
    from buildkit.ci.workflow import ci_matrix
    from buildkit.matrix.load import load_matrix

    if ci not in ("github", "gitlab"):
        raise InputError(f"--ci {ci!r}: github or gitlab" if ci else "--stacks goes with --ci github or --ci gitlab")
    if any(o not in (None, False) for o in others):
        raise InputError(f"--ci {ci} prints the whole CI plan: narrow it with --stacks only")
    wanted = None if stacks in (None, "all") else {s.strip() for s in (stacks or "").split(",") if s.strip()}
    if wanted is not None and not wanted:
        raise InputError("--stacks: a comma separated list of stacks, or all")
    loaded = load_matrix(matrix)
    if ci == "gitlab":  # the child pipeline that ci/gitlab/images.gitlab-ci.yml triggers
        sys.stdout.write(dump(child_pipeline(loaded, wanted)))
        return
    print(json.dumps(ci_matrix(loaded, wanted), separators=(",", ":")))
