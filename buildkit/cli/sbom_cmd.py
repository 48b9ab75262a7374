"""``ascendkit sbom IMAGE`` and ``ascendkit sbom diff A B``: what is in an image, and what changed between two."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildkit.cli.base import ArchChoice, JsonFlag, app, out, print_json, user_errors
from buildkit.cli.tables import RichTable
from buildkit.errors import InputError

if TYPE_CHECKING:
    from buildkit.image.sbom import Entry


def _read(ref: str, arch: str | None, manifest_dir: Path) -> tuple[dict[str, Any], str]:
    from buildkit.imageref import registry_of
    from buildkit.ship.trust.attach import local_sbom, registry_sbom

    if registry_of(ref) is not None:  # HOST[:PORT]/REPO:TAG or @sha256:...: the registry's copy, no engine needed
        return registry_sbom(ref, arch)
    from buildkit.image.engine import connect

    return local_sbom(connect(), ref, manifest_dir)


def _row(entry: Entry) -> tuple[str, str, str, str]:
    return entry.kind, entry.name, entry.version, entry.detail


@app.command("sbom")
@user_errors
def sbom(
    images: Annotated[
        list[str],
        typer.Argument(
            help="IMAGE, or `diff` IMAGE_A IMAGE_B. An IMAGE is HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:... (its SBOM is "
            "read from the registry, no engine needed; for a multi-arch index give --arch) or a local image built by ascendkit "
            "(NAME[:TAG]; its SBOM is read from --manifest-dir).",
            metavar="IMAGE | diff A B",
        ),
    ],
    arch: ArchChoice = None,
    manifest_dir: Annotated[Path, typer.Option("--manifest-dir", help="Where the builds of local images wrote their SBOMs.")] = Path(
        "manifests"
    ),
    provenance: Annotated[
        bool,
        typer.Option(
            "--provenance",
            help="Show the image's SLSA provenance instead (from its registry; not checked here: `ascendkit verify` checks it).",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The components of an image (Python packages, OS packages, CANN, git checkouts, base image) from
    its CycloneDX SBOM; or, with `diff A B`, those added, removed and changed from A to B."""
    from buildkit.ship.trust.attach import check_sbom_ref

    is_diff = images[0] == "diff"
    refs = images[1:] if is_diff else images
    if len(refs) != (2 if is_diff else 1):
        raise InputError("give one IMAGE, or `diff` and two images: ascendkit sbom IMAGE | ascendkit sbom diff A B")
    for ref in refs:
        check_sbom_ref(ref)
    if provenance:
        if is_diff:
            raise InputError("--provenance shows one image's provenance: give one IMAGE, not diff")
        _show_provenance(refs[0], arch, as_json)
        return
    documents = [_read(ref, arch, manifest_dir) for ref in refs]
    if is_diff:
        _show_diff(documents, as_json)
    else:
        _show_components(*documents[0], as_json)


def _show_diff(documents: list[tuple[dict[str, Any], str]], as_json: bool) -> None:
    """What changed from the first SBOM to the second: added, removed and changed components."""
    from buildkit.image.sbom import diff, renamed

    (before, a_where), (after, b_where) = documents
    change = diff(before, after)
    if as_json:
        print_json({"from": a_where, "to": b_where, **change.describe()})
        return
    table = RichTable(
        title=f"{a_where} -> {b_where}: {len(change.added)} added, {len(change.removed)} removed, {len(change.changed)} changed"
    )
    for column in ("change", "kind", "name", "from", "to", "pin"):
        table.add_column(column)
    for a, b in change.changed:
        table.add_row("changed", a.kind, renamed(a, b), a.version, b.version, b.detail)
    for e in change.added:
        table.add_row("added", e.kind, e.name, "", e.version, e.detail)
    for e in change.removed:
        table.add_row("removed", e.kind, e.name, e.version, "", e.detail)
    out.print(table)


def _show_components(document: dict[str, Any], where: str, as_json: bool) -> None:
    """One SBOM's components, a row each."""
    from buildkit.image.sbom import entries

    if as_json:
        print_json(document)
        return
    found = entries(document)
    table = RichTable(title=f"{where}: {len(found)} components (CycloneDX {document.get('specVersion', '?')})")
    for column in ("kind", "name", "version", "pin / ref"):
        table.add_column(column)
    for entry in found:
        table.add_row(*_row(entry))
    out.print(table)


def _show_provenance(ref: str, arch: str | None, as_json: bool) -> None:
    from buildkit.ship.trust.checks import registry_provenance

    document, where = registry_provenance(ref, arch)
    if as_json:
        print_json(document)
        return
    definition = document.get("predicate", {}).get("buildDefinition", {})
    params = definition.get("externalParameters", {})
    source = params.get("source") or {}
    title = f"{where}: SLSA provenance (unverified; `ascendkit verify --key cosign.pub` checks it)"
    table = RichTable(title=title)
    for column in ("dependency", "uri", "digest"):
        table.add_column(column)
    for dep in definition.get("resolvedDependencies", []):
        digest = ", ".join(f"{k}:{v}" for k, v in (dep.get("digest") or {}).items())
        table.add_row(str(dep.get("name", "")), str(dep.get("uri", "")), digest)
    out.print(table)
    builder = document.get("predicate", {}).get("runDetails", {}).get("builder", {})
    made_by = f"{builder.get('id')} {builder.get('version', {}).get('ascendkit', '')}"
    typer.echo(
        f"stack {params.get('stack')} ({params.get('chip')}, {params.get('arch')}); "
        f"source {source.get('repository')}@{source.get('commit')}; builder {made_by}"
    )
