"""Options shared by the commands that ship images (``build --push``, ``publish``, ``mirror``), and
the summary they print: which registry got which digest."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Literal

import typer


class MediaTypes(str, enum.Enum):
    docker = "docker"
    oci = "oci"


SHIPPING = "Publishing"  # the help panel of the options that say where and how images go

RegistriesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--registry",
        metavar="HOST[:PORT]/REPO",
        help="Where to push (repeat for several: the same digests in each), e.g. 127.0.0.1:5000/ascendkit.",
        rich_help_panel=SHIPPING,
    ),
]
MediaTypesOption = Annotated[
    MediaTypes | None,
    typer.Option(
        "--media-types",
        help="docker: nothing with an OCI media type (registries that refuse them); oci: all OCI. "
        "Default: Docker images and index, the SBOM as an OCI artifact.",
        rich_help_panel=SHIPPING,
    ),
]
ManifestDir = Annotated[Path, typer.Option("--manifest-dir", help="Where build manifests are written and read.")]
LazyOption = Annotated[
    Literal["soci"] | None,
    typer.Option(
        "--lazy",
        help="soci: also a SOCI index of the gzip image (zTOCs of its layers of 10 MiB and more), found by the referrers API "
        "or the sha256-<digest> tag: nodes running the SOCI snapshotter start it before its layers are pulled.",
        rich_help_panel=SHIPPING,
    ),
]
CompressionOption = Annotated[  # the name is the ship layer's Compression's (layers.PUBLISHED), passed as is
    Literal["gzip", "zstd"],
    typer.Option(
        "--compression",
        help="zstd: also publish each tag as <tag>-zstd, zstd layers (OCI; Docker >= 23, containerd >= 1.5).",
        rich_help_panel=SHIPPING,
    ),
]


SignKeyOption = Annotated[
    str | None,
    typer.Option(
        "--sign-key",
        metavar="KEY",
        help="Sign every image and index, and their provenance, with this cosign key (a file, or env://VAR holding the PEM); "
        "the passphrase from $COSIGN_PASSWORD, else a prompt (a build's or --index-only's dry run does not open it).",
        rich_help_panel=SHIPPING,
    ),
]


# `ascendkit publish` alone
PublishImagesArgument = Annotated[list[str] | None, typer.Argument(help="Local images built by ascendkit (any of their tags).")]

PublishNoIndexOption = Annotated[bool, typer.Option("--no-index", help="Push the per-arch images only.")]

PublishIndexOnlyOption = Annotated[
    bool,
    typer.Option(
        "--index-only",
        help="No engine: from the build manifests in --manifest-dir (pushed by each arch's `build --push`), check every "
        "member in each registry, attach their SBOMs and publish each multi-arch index.",
    ),
]

PublishDryRunOption = Annotated[bool, typer.Option("--dry-run", help="With --index-only: check everything in the registry, push nothing.")]


def load_sign_key(source: str | None) -> Any:
    """The signer of ``--sign-key`` (None without one), its passphrase from $COSIGN_PASSWORD or, on a terminal, a prompt."""
    if source is None:
        return None
    from buildkit.trust.keys import load_signer

    return load_signer(source, lambda where: passphrase(f"Passphrase of {where}"))


def passphrase(prompt: str, *, confirm: bool = False) -> bytes:
    """$COSIGN_PASSWORD (set and empty means no passphrase, as cosign reads it), else asked on the terminal."""
    import os
    import sys

    from buildkit.errors import InputError
    from buildkit.trust.keys import PASSWORD_ENV

    if PASSWORD_ENV in os.environ:
        return os.environ[PASSWORD_ENV].encode()
    if not sys.stdin.isatty():
        raise InputError(f"no passphrase: set ${PASSWORD_ENV} (no terminal to ask on)")
    text: str = typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm, default="", show_default=False)
    return text.encode()


def to_stderr(line: str) -> None:
    typer.echo(line, err=True)


def print_summary(outcomes: list[dict[str, Any]]) -> None:
    """Every registry with the digest of each image and index it now serves (stderr)."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for outcome in outcomes:
        for entry in outcome.get("registries", []):
            for published in [*entry.get("pushed", []), *entry.get("index", [])]:
                tag = published["ref"].split("@", 1)[0].rsplit(":", 1)[1]
                rows.setdefault(entry["registry"], []).append((tag, published["digest"]))
    if not rows:
        return
    signed: dict[str, int] = {}
    for outcome in outcomes:
        for entry in outcome.get("registries", []):
            signed[entry["registry"]] = signed.get(entry["registry"], 0) + len(entry.get("signed", []))
    typer.echo(f"published to {len(rows)} registr{'y' if len(rows) == 1 else 'ies'}:", err=True)
    for registry, tags in rows.items():
        count = signed.get(registry, 0)
        typer.echo(f"  {registry}" + (f"  ({count} image(s) signed, with provenance)" if count else ""), err=True)
        width = max(len(tag) for tag, _ in tags)
        for tag, digest in tags:
            typer.echo(f"    {tag:<{width}}  {digest}", err=True)
