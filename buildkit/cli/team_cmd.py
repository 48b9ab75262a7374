"""``ascendkit team``: a team's image on top of a reference one (its packages, its fork, its files)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildkit.arch import Arch
from buildkit.cli.base import JsonFlag, MatrixPath, app, out, print_json, user_errors
from buildkit.cli.build_options import BuilderOption
from buildkit.cli.mirror_options import (
    AscendIndexUrl,
    CaBundle,
    ConfigFile,
    PipIndexUrl,
    PytorchIndexUrl,
    ca_bundle_of,
    mirrors_from,
)
from buildkit.cli.ship_options import ManifestDir
from buildkit.errors import ExitCode, InputError
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from collections.abc import Callable

    from buildkit.lock.index import IndexClient
    from buildkit.matrix.load import LoadedMatrix
    from buildkit.settings import Mirrors
    from buildkit.ship.rebuild import Original, RebuildOutcome
    from buildkit.team.build import TeamBuilt
    from buildkit.team.resolve import TeamBase
    from buildkit.team.spec import LoadedTeam

team_app = typer.Typer(
    help="A team's image on top of a reference image: its packages, its framework fork, its files.", no_args_is_help=True
)
app.add_typer(team_app, name="team")

TeamFileOption = Annotated[
    Path, typer.Option("--file", "-f", help="The team file (ascendkit-team.yaml in the team's repository).", metavar="PATH")
]
TeamArchOption = Annotated[Arch, typer.Option("--arch", help="The image's CPU architecture.")]
BaseImageOption = Annotated[
    str | None,
    typer.Option(
        "--base-image",
        help="The base as this engine has it (default: the team file's image, else the tag `ascendkit build` gives its stack and SKU).",
        metavar="REF",
    ),
]


def _team_and_base(matrix: Path, file: Path, arch: str) -> tuple[LoadedMatrix, LoadedTeam, TeamBase]:
    """The team file, validated, and its base: a stack's lock beside the matrix, or what a published image carries."""
    from buildkit.matrix.load import load_matrix
    from buildkit.team.resolve import team_base
    from buildkit.team.spec import load_team

    loaded = load_matrix(matrix)
    team = load_team(file, loaded)
    if team.spec.arches and arch not in team.spec.arches:
        raise InputError(f"{file}: the team builds for {', '.join(team.spec.arches)} (arches:), not {arch}: give --arch")
    if team.spec.base.image is None:
        base = team_base(loaded, team, arch)
    else:
        from buildkit.image.engine import connect
        from buildkit.team.inimage import image_base

        base = image_base(connect(), team, arch, {name: index.url for name, index in loaded.matrix.indexes.items()})
    stack = loaded.matrix.stacks.get(base.stack_id)
    if stack is None:  # a published base of a stack this matrix does not have: `verify` will say so
        return loaded, team, base
    from dataclasses import replace

    from buildkit.plan.layers import expected_packages

    return loaded, team, replace(base, pins=tuple(sorted(expected_packages(stack).items())))


def _index_urls(loaded: LoadedMatrix, base: TeamBase, mirrors: Mirrors) -> dict[str, str]:
    """Each index of the base by name: a mirror given for it (flag, environment, config file), else the base's own URL."""
    from buildkit.lock.relock import index_urls_for

    urls = dict(base.indexes)
    urls.update((name, url) for name, url in index_urls_for(loaded, mirrors).items() if name in urls)
    return urls


@team_app.command("check", short_help="Validate the team file and say whether its lock is fresh.")
@user_errors
def team_check(
    file: TeamFileOption = Path("ascendkit-team.yaml"),
    arch: TeamArchOption = "x86_64",
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Validate the team file (file, line and field of every problem: exit 2) and say whether its lock for --arch is
    fresh (exit 0), missing or stale (exit 1: the team file, a requirements file or the base changed since
    `ascendkit team lock`). A base given as `image:` is read from the engine (exit 4 when it is not there)."""
    from buildkit.team.resolve import lock_file, lock_state

    _, team, base = _team_and_base(matrix, file, arch)
    state = lock_state(team, base)
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
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Write ascendkit-team-<arch>.lock beside the team file: what the team adds, with hashes, resolved by uv with
    every package of the base as a constraint (build dependencies too); a framework fork is cloned at its commit,
    built to a wheel in .ascendkit/wheels/ and locked by its hash. Refused (exit 1, nothing written) when a team
    package needs another version of a base package, mainline triton or a CUDA package, naming who asked;
    `replace:` in the team file is the escape, each with its reason. Exit 4: an index or the fork's git host cannot
    be reached."""
    from buildkit.lock.index import IndexClient
    from buildkit.team.resolve import base_constraints, check_indexes, resolve_team, write_team_lock

    loaded, team, base = _team_and_base(matrix, file, arch)
    mirrors = mirrors_from(
        config, ca_bundle, pip_index_url=pip_index_url, pytorch_index_url=pytorch_index_url, ascend_index_url=ascend_index_url
    )
    urls, client = _index_urls(loaded, base, mirrors), IndexClient(ca_bundle=ca_bundle_of(mirrors))
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
    base_image: BaseImageOption = None,
    pip_index_url: PipIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    ca_bundle: CaBundle = None,
    config: ConfigFile = None,
    manifest_dir: ManifestDir = Path("manifests"),
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every team layer again (a clean build).")] = False,
    builder: BuilderOption = "auto",
    as_json: JsonFlag = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Build the team's layers on its base by digest (its locked packages, its fork, then its files), read every
    distribution of the base and of the new image (name, version, the files RECORD lists, direct_url), import the
    team's packages as the image's user, and tag NAME:team-...-ARCH with its build record and SBOM
    (--manifest-dir/<tag>.json and .cdx.json, as a reference build's: `ascendkit publish`, `sign`, `verify` and `sbom
    diff` take the image; the record's team section names the base by digest, the lock, files and fork, each escape)
    only when none of the base's moved (the fork's framework and `replace:` excepted) and every team package
    imported. Before anything is built, the files of each locked wheel (read from its index by HTTP ranges) are held
    to the files the base's distributions own: a package that would overwrite one is refused, naming who asked for it.
    Index credentials and the CA bundle reach the build as secrets, never in a layer or its history. Exit 1: the lock
    is missing or stale, or a team package would overwrite a file of the base; 5: the build failed; 6: the base moved
    (the image is removed, nothing tagged); 4: the engine, the base or an index cannot be had."""
    from buildkit.image.engine import connect
    from buildkit.team.build import build_team

    loaded, team, base = _team_and_base(matrix, file, arch)
    if base_image is None and team.spec.base.image is not None:
        base_image = team.spec.base.image
    elif base_image is None:
        from buildkit.plan import plan_image, plan_target
        from buildkit.resources import default_repository

        plan = plan_image(loaded, plan_target(loaded, base.sku, base.stack_id, None), arch)
        base_image = f"{default_repository(base.framework)}:{plan.tags[0]}"
    mirrors = mirrors_from(
        config, ca_bundle, pip_index_url=pip_index_url, pytorch_index_url=pytorch_index_url, ascend_index_url=ascend_index_url
    )
    urls, ca, client = build_settings(loaded, base, mirrors)
    built = build_team(connect(), team, base, base_image, urls, ca, manifest_dir, no_cache, builder, client)
    _say_built(built, as_json)


def build_settings(loaded: LoadedMatrix, base: TeamBase, mirrors: Mirrors) -> tuple[dict[str, str], bytes, IndexClient]:
    """What a team build reaches its indexes with: each index's URL (a mirror where given), the CA bundle's bytes (the
    settings', else the host's) and the index client the pre-build check reads wheels with."""
    from buildkit.lock.index import IndexClient
    from buildkit.settings import default_ca_bundle, read_ca_bundle

    bundle = ca_bundle_of(mirrors) or default_ca_bundle()
    ca = read_ca_bundle(bundle) if bundle else b""
    return _index_urls(loaded, base, mirrors), ca, IndexClient(ca_bundle=ca_bundle_of(mirrors))


def rebuild_team_image(
    original: Original, team_file: Path, matrix: Path, mirrors: Mirrors, to: str, manifest_dir: Path, say: Callable[[str], None]
) -> RebuildOutcome:
    """`ascendkit rebuild` of a team image: in the team's repository, from its team file (buildkit.team.rebuild)."""
    from buildkit.image.engine import connect
    from buildkit.ship.rebuild import team_params
    from buildkit.team.rebuild import rebuild_team

    if not team_file.is_file():
        team = team_params(original.statement) or {}
        raise InputError(
            f"{original.where}: a team image ({team.get('name')}): rebuild it in the team's repository, where its team file "
            f"is (--team-file; {team_file} is not here)"
        )
    loaded, team_, base = _team_and_base(matrix, team_file, original.arch)
    urls, ca, client = build_settings(loaded, base, mirrors)
    return rebuild_team(connect(), original, team_, base, urls, to, ca_bundle=ca, manifest_dir=manifest_dir, index_client=client, say=say)


def _say_built(built: TeamBuilt, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "image_id": built.image_id,
                "tags": list(built.refs),
                "base": built.base_ref,
                "added": list(built.added),
                "base_kept": built.kept,
                "record": str(built.record),
                "files_checked_after_the_build_only": list(built.unread),
            }
        )
        return
    for note in built.unread:
        out.print(f"note: {note}")
    kept = f"{built.kept} of the base's as they were"
    out.print(f"built {built.refs[0]} ({built.image_id[:19]}) on {built.base_ref}: {len(built.added)} distribution(s) added, {kept}")


@team_app.command("ci", short_help="Write the team repository's GitHub workflow.")
@user_errors
def team_ci(
    file: TeamFileOption = Path("ascendkit-team.yaml"),
    arch: TeamArchOption = "x86_64",
    gitlab: Annotated[
        bool, typer.Option("--gitlab", help="Write the GitLab pipeline (ci/gitlab/team-image.gitlab-ci.yml) instead.")
    ] = False,
    check: Annotated[bool, typer.Option("--check", help="Write nothing: exit 1 when the committed workflow differs.")] = False,
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Write .github/workflows/team-image.yml beside the team file (with --gitlab, ci/gitlab/team-image.gitlab-ci.yml
    for self-hosted GitLab): it installs this ascendkit release from PyPI, pulls the base (the team file's base.image),
    checks the team file and its lock, and builds and checks the team image on a runner of --arch. With --check,
    exit 1 when it is out of date."""
    from buildkit.fsio import write_atomic
    from buildkit.matrix.load import load_matrix
    from buildkit.team.ci import TEAM_GITLAB, TEAM_WORKFLOW, team_gitlab, team_workflow
    from buildkit.team.spec import load_team

    team = load_team(file, load_matrix(matrix))
    if gitlab:
        text, path = team_gitlab(team, arch), team.root / TEAM_GITLAB
    else:
        text, path = team_workflow(team, arch), team.root / TEAM_WORKFLOW
    if check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.print(f"{path}: out of date; run `ascendkit team ci --arch {arch}{' --gitlab' if gitlab else ''}`")
            raise typer.Exit(int(ExitCode.CHECK_FAILED))
        out.print(f"{path}: up to date")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    out.print(f"wrote {path}")
