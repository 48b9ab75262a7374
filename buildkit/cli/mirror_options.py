"""The one way to name a mirror: the options every command that reaches an index, a git host or a
base registry takes (build, lock, wheelhouse, matrix verify, matrix outdated), shown together in
help under "Mirrors and indexes", each also settable by ``$ASCENDKIT_<NAME>`` or ``ascendkit.toml``
(flag, then environment, then the file: :func:`buildkit.settings.resolve_mirrors`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from buildkit.settings import Mirrors

PANEL = "Mirrors and indexes"

PipIndexUrl = Annotated[
    str | None, typer.Option("--pip-index-url", help="PyPI mirror; credentials in a URL stay out of the image.", rich_help_panel=PANEL)
]
PipExtraIndexUrl = Annotated[
    str | None, typer.Option("--pip-extra-index-url", help="Extra index(es), space separated.", rich_help_panel=PANEL)
]
PytorchIndexUrl = Annotated[
    str | None, typer.Option("--pytorch-index-url", help="Mirror of the PyTorch CPU index (x86_64 torch).", rich_help_panel=PANEL)
]
AscendIndexUrl = Annotated[str | None, typer.Option("--ascend-index-url", help="Mirror of Ascend's pip index.", rich_help_panel=PANEL)]
AptMirror = Annotated[
    str | None, typer.Option("--apt-mirror", help="OS package mirror (serves /ubuntu, /ubuntu-ports, ...).", rich_help_panel=PANEL)
]
GithubUrl = Annotated[str | None, typer.Option("--github-url", help="GitHub mirror for source checkouts.", rich_help_panel=PANEL)]
GitcodeUrl = Annotated[str | None, typer.Option("--gitcode-url", help="gitcode mirror for source checkouts.", rich_help_panel=PANEL)]
BaseRegistry = Annotated[
    str | None,
    typer.Option("--base-registry", help="Mirror of the CANN images, HOST/PATH (e.g. quay.nju.edu.cn/ascend).", rich_help_panel=PANEL),
]
CaBundle = Annotated[
    Path | None,
    typer.Option(
        "--ca-bundle",
        help="PEM bundle for the indexes (default: $PIP_CERT or $SSL_CERT_FILE); never stored in an image.",
        rich_help_panel=PANEL,
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Mirror settings file (default: $ASCENDKIT_CONFIG, ./ascendkit.toml, ~/.config/ascendkit/config.toml).",
        rich_help_panel=PANEL,
    ),
]


def mirrors_from(config: Path | None, ca_bundle: Path | None, **urls: str | None) -> Mirrors:
    """The mirror settings a command was given: its flags (``pip_index_url=...``), then the
    environment, then the config file; every URL checked."""
    from buildkit.settings import resolve_mirrors

    return resolve_mirrors({**urls, "ca_bundle": str(ca_bundle) if ca_bundle else None}, config=config)


# The mirror flags by their parameter names, as the commands that take them all name them.
MIRROR_URLS = ("pip_index_url", "pip_extra_index_url", "pytorch_index_url", "ascend_index_url", "apt_mirror", "github_url", "gitcode_url")


def mirrors_given(given: dict[str, Any]) -> Mirrors:
    """:func:`mirrors_from` for a command's arguments by name (``config``, ``ca_bundle``, the
    MIRROR_URLS it has, ``base_registry`` where it has one)."""
    urls = {name: given[name] for name in (*MIRROR_URLS, "base_registry") if name in given}
    return mirrors_from(given["config"], given["ca_bundle"], **urls)


def ca_bundle_of(mirrors: Mirrors) -> Path | None:
    """The CA bundle the settings name (flag, environment or file), checked to be a PEM file."""
    from buildkit.settings import checked_ca_bundle

    setting = mirrors.get("ca_bundle")
    return checked_ca_bundle(Path(setting) if setting else None)
