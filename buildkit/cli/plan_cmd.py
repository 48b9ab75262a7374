"""``ascendkit plan``: every image the matrix defines (or those the filters name), before anything is built."""

from __future__ import annotations

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
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """List the build targets (stack, chip, OS, arch) with base image, tags, lock status and SKUs."""
    from buildkit.lock.inputs import LockTarget
    from buildkit.lock.lockfile import lock_state
    from buildkit.matrix.load import load_matrix
    from buildkit.plan import plan_fleet

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
