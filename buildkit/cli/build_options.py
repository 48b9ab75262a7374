"""Options of ``ascendkit build`` (and what they share with the commands that plan or name an image),
declared once as types; the command's signature lists them one per line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from buildkit.cli.mirror_options import PANEL
from buildkit.cli.ship_options import SHIPPING

HwOption = Annotated[str | None, typer.Option("--hw", help="SKU ({skus}) or chip family ({chips}).")]
EveryFlag = Annotated[
    bool, typer.Option("--all", help="Every image --stack/--hw/--os/--arch leave (see `plan`); go on past a failure; summary.")
]
StackOption = Annotated[str | None, typer.Option("--stack", "-s", help="Stack id ({stacks}); default: the matrix's default.")]
OsOption = Annotated[str | None, typer.Option("--os", help="Base OS; default: the stack's first.")]
BaseImageOption = Annotated[str | None, typer.Option("--base-image", help="Build FROM this image instead of the official CANN base.")]
NoCaBundleFlag = Annotated[bool, typer.Option("--no-ca-bundle", help="Do not pass the host's CA bundle.", rich_help_panel=PANEL)]
RepoOption = Annotated[
    str | None,
    typer.Option("--repo", help="Local image repository to tag (default ascendkit/<framework>: ascendkit/verl, ascendkit/openrlhf)."),
]
NoCacheFlag = Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")]
ReverifyFlag = Annotated[
    bool, typer.Option("--reverify", help="Verify even an unchanged image whose passed verification its build manifest records.")
]
InstallerOption = Annotated[
    Literal["uv", "pip"],
    typer.Option("--installer", help="What installs the locked packages: uv, or pip (the same hash-locked packages, slower)."),
]
BuilderOption = Annotated[
    Literal["auto", "buildkit", "classic"],
    typer.Option(
        "--builder",
        help="BuildKit (through buildx: cache and secret mounts, registry caches), the engine's classic builder, "
        "or auto: BuildKit where buildx and the engine give it, else classic.",
    ),
]
CacheRepoOption = Annotated[
    str | None,
    typer.Option(
        "--cache-repo",
        envvar="ASCENDKIT_CACHE_REPO",
        help="BuildKit registry cache (mode=max), imported and exported: HOST/PATH, one tag per stack, chip, OS and arch.",
    ),
]
CacheImportOnlyFlag = Annotated[
    bool, typer.Option("--cache-import-only", help="Read the --cache-repo cache but export nothing (a build without push rights).")
]
PushFlag = Annotated[
    bool, typer.Option("--push", help="Push the verified image to --registry, by digest, with its SBOM.", rich_help_panel=SHIPPING)
]
NoIndexFlag = Annotated[
    bool,
    typer.Option(
        "--no-index", help="With --push: leave the multi-arch index to `publish --index-only` (CI's index job).", rich_help_panel=SHIPPING
    ),
]
OfflineFlag = Annotated[
    bool,
    typer.Option(
        "--offline", help="Air-gapped: pip installs only from --wheelhouse, with no network in the pip steps.", rich_help_panel=PANEL
    ),
]
WheelhouseOption = Annotated[
    Path | None, typer.Option("--wheelhouse", help="Directory from `ascendkit wheelhouse` (with --offline).", rich_help_panel=PANEL)
]
DryRunFlag = Annotated[bool, typer.Option("--dry-run", help="Print the plan; do not build.")]
QuietFlag = Annotated[bool, typer.Option("--quiet", "-q", help="Show steps only, not their output.")]

# The options plan_build takes under the same names; the others are derived (see plan_options).
PLAN_OPTIONS = ("base_image", "repository", "no_cache", "manifest_dir", "wheelhouse", "reverify", "installer", "builder", "cache_repo")


def plan_options(given: dict[str, Any], mirrors: Any) -> dict[str, Any]:
    """What every target's plan_build gets from the command's options (``given``: its arguments by name)."""
    return {
        **{name: given[name] for name in PLAN_OPTIONS},
        "mirrors": mirrors,
        "use_default_ca": not given["no_ca_bundle"],
        "cache_export": not given["cache_import_only"],
    }
