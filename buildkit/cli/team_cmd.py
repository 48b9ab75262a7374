"""``ascendkit team``: a team's image on top of a reference one (its packages, its fork, its files)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.arch import Arch
from buildkit.cli.base import JsonFlag, WorkingMatrixPath, app, out, print_json, user_errors
from buildkit.cli.mirror_options import (
    AscendIndexUrl,
    CaBundle,
    ConfigFile,
    PipIndexUrl,
    PytorchIndexUrl,
    ca_bundle_of,
    mirrors_from,
)
from buildkit.errors import ExitCode
from buildkit.resources import DEFAULT_MATRIX

team_app = typer.Typer(
    help="A team's image on top of a reference image: its packages, its framework fork, its files.", no_args_is_help=True
)
app.add_typer(team_app, name="team")

TeamFileOption = Annotated[
    Path, typer.Option("--file", "-f", help="The team file (ascendkit-team.yaml in the team's repository).", metavar="PATH")
]
TeamArchOption = Annotated[Arch, typer.Option("--arch", help="The image's CPU architecture.")]


@team_app.command("check", short_help="Validate the team file and say whether its lock is fresh.")
@user_errors
def team_check(
    file: TeamFileOption = Path("ascendkit-team.yaml"),
    arch: TeamArchOption = "x86_64",
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Validate the team file against the matrix (file, line and field of every problem: exit 2) and say
    whether its lock for --arch is fresh (exit 0), missing or stale (exit 1: the team file, a requirements
    file or the base's lock changed since `ascendkit team lock`)."""
    from buildkit.matrix.load import load_matrix
    from buildkit.team.resolve import lock_file, lock_state, team_base
    from buildkit.team.spec import load_team

    loaded = load_matrix(matrix)
    team = load_team(file, loaded)
    state = lock_state(team, team_base(loaded, team, arch))
    if as_json:
        print_json({"file": str(file), "arch": arch, "lock": str(lock_file(team, arch)), "state": state})
    else:
        out.print(f"{file}: valid; {lock_file(team, arch).name}: {state}")
    if state != "fresh":
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


@team_app.command("lock", short_help="Resolve the team's packages against the base, with hashes.")
@user_errors
def team_lock(
    file: TeamFileOption = Path("ascendkit-team.yaml"),
    arch: TeamArchOption = "x86_64",
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Write ascendkit-team-<arch>.lock beside the team file: what the team adds, with hashes, resolved by uv with
    every package of the base as a constraint (build dependencies too). Refused (exit 1, nothing written) when a
    team package needs another version of a base package, mainline triton or a CUDA package, naming who asked;
    `replace:` in the team file is the escape, each with its reason. Exit 4: an index cannot be reached."""
    from buildkit.lock.index import IndexClient
    from buildkit.lock.relock import index_urls_for
    from buildkit.matrix.load import load_matrix
    from buildkit.team.resolve import base_constraints, check_indexes, resolve_team, team_base, write_team_lock
    from buildkit.team.spec import load_team

    loaded = load_matrix(matrix)
    team = load_team(file, loaded)
    base = team_base(loaded, team, arch)
    mirrors = mirrors_from(
        config, ca_bundle, pip_index_url=pip_index_url, pytorch_index_url=pytorch_index_url, ascend_index_url=ascend_index_url
    )
    bundle = ca_bundle_of(mirrors)
    urls, client = index_urls_for(loaded, mirrors), IndexClient(ca_bundle=bundle)
    fork = None
    if team.spec.framework is not None:  # built to a wheel first: its requirements join the team's
        from buildkit.team.fork import build_fork

        check_indexes(team, base, urls, client)
        fork = build_fork(team, urls[base.indexes[0][0]], base_constraints(team, base))
    resolution = resolve_team(team, base, urls, client, fork)
    path = write_team_lock(team, base, resolution)
    added = [f"{p.key}=={p.version}" for p in resolution.added] + ([f"{fork.pin} (the team's fork)"] if fork else [])
    replaced = [f"{p.key} {was} -> {p.version}" for p, was, _ in resolution.replaced]
    if as_json:
        print_json({"lock": str(path), "added": added, "replaced": replaced})
    else:
        out.print(
            f"wrote {path}: {len(added)} package(s) added to {base.stack_id}" + (f"; replaced: {', '.join(replaced)}" if replaced else "")
        )


@team_app.command("build", short_help="Build the team image on its base, check the base did not move, tag it.")
@user_errors
def team_build(
    file: TeamFileOption = Path("ascendkit-team.yaml"),
    arch: TeamArchOption = "x86_64",
    base_image: Annotated[
        str | None,
        typer.Option(
            "--base-image",
            help="The base as this engine has it (default: the tag `ascendkit build` gives its stack and SKU).",
            metavar="REF",
        ),
    ] = None,
    ca_bundle: CaBundle = None,
    as_json: JsonFlag = False,
    matrix: WorkingMatrixPath = DEFAULT_MATRIX,
) -> None:
    """Build the team's layers on its base by digest (its locked packages, then its files), read every distribution of
    the base and of the new image (name, version, RECORD, direct_url), and tag NAME:team-... only when none of the
    base's moved (the team file's `replace:` excepted). Exit 1: the lock is missing or stale; 5: the build failed;
    6: the base moved (the image is removed, nothing tagged); 4: the engine or the base cannot be had."""
    from buildkit.image.engine import connect
    from buildkit.matrix.load import load_matrix
    from buildkit.plan import plan_image, plan_target
    from buildkit.resources import default_repository
    from buildkit.team.build import build_team
    from buildkit.team.resolve import team_base
    from buildkit.team.spec import load_team

    loaded = load_matrix(matrix)
    team = load_team(file, loaded)
    base = team_base(loaded, team, arch)
    if base_image is None:
        plan = plan_image(loaded, plan_target(loaded, team.spec.base.sku, base.stack_id, None), arch)
        base_image = f"{default_repository(base.framework)}:{plan.tags[0]}"
    from buildkit.settings import default_ca_bundle, read_ca_bundle

    bundle = ca_bundle or default_ca_bundle()
    built = build_team(connect(), loaded, team, base, base_image, read_ca_bundle(bundle) if bundle else b"")
    if as_json:
        print_json(
            {
                "image_id": built.image_id,
                "tags": list(built.refs),
                "base": built.base_ref,
                "added": list(built.added),
                "base_kept": built.kept,
            }
        )
    else:
        kept = f"{built.kept} of the base's as they were"
        out.print(f"built {built.refs[0]} ({built.image_id[:19]}) on {built.base_ref}: {len(built.added)} distribution(s) added, {kept}")
