"""``ascendkit rebuild IMAGE --to HOST/REPO``: check an image, published or local, by building it again from its recorded inputs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildkit.cli.base import ArchChoice, JsonFlag, MatrixPath, app, out, print_json, user_errors
from buildkit.cli.build_options import QuietFlag
from buildkit.cli.mirror_options import (
    AptMirror,
    AscendIndexUrl,
    CaBundle,
    ConfigFile,
    GitcodeUrl,
    GithubUrl,
    PipExtraIndexUrl,
    PipIndexUrl,
    PytorchIndexUrl,
    mirrors_given,
)
from buildkit.cli.ship_options import ManifestDir, to_stderr
from buildkit.errors import ExitCode
from buildkit.resources import DEFAULT_MATRIX

if TYPE_CHECKING:
    from buildkit.ship.rebuild import RebuildOutcome


@app.command("rebuild")
@user_errors
def rebuild(
    image: Annotated[
        str,
        typer.Argument(
            help="HOST[:PORT]/REPO:TAG or @sha256:... as published by ascendkit, or NAME:TAG on this engine as built by it.",
            metavar="IMAGE",
        ),
    ],
    to: Annotated[
        str,
        typer.Option("--to", help="HOST[:PORT]/REPO the rebuilt image is published to, beside the original (a scratch repository)."),
    ],
    arch: ArchChoice = None,
    ca_bundle: CaBundle = None,
    pip_index_url: PipIndexUrl = None,
    pip_extra_index_url: PipExtraIndexUrl = None,
    pytorch_index_url: PytorchIndexUrl = None,
    ascend_index_url: AscendIndexUrl = None,
    apt_mirror: AptMirror = None,
    github_url: GithubUrl = None,
    gitcode_url: GitcodeUrl = None,
    config: ConfigFile = None,
    manifest_dir: ManifestDir = Path("manifests"),
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
    team_file: Annotated[
        Path,
        typer.Option("--team-file", help="A team image's team file: its repository's, at the commit it was built from.", metavar="PATH"),
    ] = Path("ascendkit-team.yaml"),
    matrix: MatrixPath = DEFAULT_MATRIX,
) -> None:
    """Rebuild an image from its recorded inputs (stack, SKU, arch, OS, the base by digest, each lock section
    by sha256, the epoch): a published one's from its provenance, a local one's from its build record in
    --manifest-dir (published to --to first, as `publish` would). Built with nothing cached, published to
    --to as the original was, and compared: exit 0 when it is the same image (the same digest), 1 when it differs, each
    differing file named with its layer and what differs. A team image is rebuilt in the team's repository from its
    team file (--team-file), lock, files and fork's wheel, held first to what the image records (name, lock and files by
    sha256, fork commit, index URLs, its version: a digest of the team file). An image whose inputs cannot be recovered
    here (no provenance or epoch, another stack or lock section, another team repository, a base this engine lacks)
    is refused (exit 2) before anything is built."""
    given = dict(locals())  # the mirror flags by name, as build reads them
    from buildkit.cli.build_cmd import StepPrinter
    from buildkit.image.engine import connect
    from buildkit.ship.rebuild import check_request, read_original, team_params

    check_request(image, to)  # before the engine is reached
    mirrors, original = mirrors_given(given), read_original(connect(), image, arch, manifest_dir)
    if team_params(original.statement) is not None:
        from buildkit.cli.team_cmd import rebuild_team_image

        outcome = rebuild_team_image(original, team_file, matrix, mirrors, to, manifest_dir, to_stderr)
    else:
        from buildkit.matrix.load import load_matrix
        from buildkit.ship.rebuild import rebuild as rebuild_image

        outcome = rebuild_image(
            connect(), load_matrix(matrix), original, to, manifest_dir=manifest_dir, mirrors=mirrors,
            reporter=StepPrinter(show_output=not quiet), say=to_stderr,
        )  # fmt: skip
    _say(outcome, as_json)


def _say(outcome: RebuildOutcome, as_json: bool) -> None:
    from buildkit.ship.imagediff import report_lines

    if as_json:
        print_json(outcome.describe())
    elif outcome.same:
        out.print(f"reproduced: {outcome.rebuilt} is {outcome.original}, the same image from the same inputs")
    else:
        out.print(f"NOT reproduced: {outcome.rebuilt} differs from {outcome.original} in {len(outcome.differences)} place(s):")
        for line in report_lines(outcome.differences):
            out.print(f"  {line}")
    if not outcome.same:
        raise typer.Exit(ExitCode.CHECK_FAILED)
