"""``ascendkit publish`` and ``ascendkit mirror``: verified images into registries, and from one registry to another."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildkit.cancel import interrupted
from buildkit.cli.base import JsonFlag, app, print_json, user_errors
from buildkit.cli.ship_options import (
    CompressionOption,
    LazyOption,
    ManifestDir,
    MediaTypesOption,
    PublishDryRunOption,
    PublishImagesArgument,
    PublishIndexOnlyOption,
    PublishNoIndexOption,
    RegistriesOption,
    SignKeyOption,
    load_sign_key,
    print_summary,
    to_stderr,
)
from buildkit.errors import InputError
from buildkit.fsio import read_input_text

if TYPE_CHECKING:
    from buildkit.imageref import RegistryRef
    from buildkit.ship.options import ShipOptions


@app.command("publish")
@user_errors
def publish(
    images: PublishImagesArgument = None,
    registry: RegistriesOption = None,
    no_index: PublishNoIndexOption = False,
    index_only: PublishIndexOnlyOption = False,
    media_types: MediaTypesOption = None,
    compression: CompressionOption = "gzip",
    lazy: LazyOption = None,
    dry_run: PublishDryRunOption = False,
    sign_key: SignKeyOption = None,
    manifest_dir: ManifestDir = Path("manifests"),
    as_json: JsonFlag = False,
) -> None:
    """Push verified images by digest with their SBOMs to each registry, then the multi-arch index
    (refused if an arch is missing); or, with --index-only, only the indexes of images already pushed."""
    from buildkit.ship.request import publish_request

    request = publish_request(
        images or [],
        registry or [],
        manifest_dir=manifest_dir,
        index=not no_index,
        index_only=index_only,
        dry_run=dry_run,
        media_types=media_types.value if media_types else None,
        compression=compression,
        signer=lambda: load_sign_key(sign_key),
        lazy=lazy,
    )
    if index_only:
        _publish_indexes(manifest_dir, list(request.targets), request.options, dry_run=dry_run, as_json=as_json)
    else:
        assert images is not None
        _publish_images(images, list(request.targets), request.options, manifest_dir, index=not no_index, as_json=as_json)


def _publish_indexes(manifest_dir: Path, targets: list[RegistryRef], options: ShipOptions, *, dry_run: bool, as_json: bool) -> None:
    """``publish --index-only``: every multi-arch index from the build manifests, no engine."""
    from buildkit.ship.index import publish_indexes

    outcomes = publish_indexes(manifest_dir, targets, options=options, dry_run=dry_run, say=to_stderr)
    if dry_run:
        typer.echo(f"ascendkit: dry run: {len(outcomes)} index(es) checked, nothing pushed", err=True)
    described = [o.describe() for o in outcomes]
    print_summary(described)
    if as_json:
        print_json(described)


def _publish_images(
    images: list[str], targets: list[RegistryRef], options: ShipOptions, manifest_dir: Path, *, index: bool, as_json: bool
) -> None:
    """Local images by digest to every registry, then their indexes; what reached them said if stopped."""
    from buildkit.image.engine import connect
    from buildkit.ship.layers.local import load_local_image
    from buildkit.ship.publish import PublishOutcome, publish_all

    client = connect()
    local = [load_local_image(client, ref, manifest_dir) for ref in images]
    done: list[PublishOutcome] = []
    try:
        publish_all(client, local, targets, index=index, options=options, say=to_stderr, done=done)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say exactly what reached the registries
        published = [p.ref for o in done for ps in [*o.registries.values(), *o.indexes.values()] for p in ps]
        rest = images[len(done) :]
        raise interrupted(
            exc, f"published {', '.join(published) or 'nothing'}; not published (or not confirmed): {', '.join(rest)}"
        ) from None
    results: list[dict[str, Any]] = [o.describe() for o in done]
    print_summary(results)
    if as_json:
        print_json(results)


@app.command("mirror")
@user_errors
def mirror(
    src: Annotated[str, typer.Argument(metavar="SRC", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<digest>.")],
    dst: Annotated[str, typer.Argument(metavar="DST", help="HOST[:PORT]/REPO[:TAG] (default: the source's tag).")],
    media_types: MediaTypesOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Look everything up and say what would be sent; write nothing.")] = False,
    sign_key: SignKeyOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Copy a published image (an index with every member, the SBOM and every other attachment) from
    one registry to another by digest, byte for byte, with no engine; what the destination has is not sent again."""
    from buildkit.ship.mirror import mirror as copy_image

    signer = load_sign_key(sign_key)  # a dry run opens it too: it says what it would sign
    outcome = copy_image(src, dst, form=media_types.value if media_types else None, dry_run=dry_run, signer=signer, say=to_stderr)
    sent = sum(size for _, size in outcome.sent)
    verb = "would send" if dry_run else "sent"
    tags = ", ".join(f"{outcome.destination}:{t}" for t in outcome.tags) or f"{outcome.destination}@{outcome.copied_digest}"
    typer.echo(
        f"{'dry run: ' if dry_run else ''}{outcome.source} -> {tags}\n"
        f"  blobs: {verb} {len(outcome.sent)} ({sent / 1e6:.1f} MB), "
        f"{'would mount (else send)' if dry_run else 'mounted'} {len(outcome.mounted)}, already there {len(outcome.present)}\n"
        f"  manifests: {len(outcome.manifests)} (attachments: {len(outcome.attachments)}); digest {outcome.copied_digest}"
        + ("" if outcome.copied_digest == outcome.digest else f" (the source's was {outcome.digest}: media types changed)"),
        err=True,
    )
    if outcome.signed:
        typer.echo(f"  {'would sign' if dry_run else 'signed'} {len(outcome.signed)} manifest(s) for {outcome.destination}", err=True)
    for dropped in outcome.dropped:
        typer.echo(f"ascendkit: warning: not copied: {dropped}", err=True)
    if as_json:
        print_json(outcome.describe())


@app.command("describe")
@user_errors
def describe(
    repository: Annotated[str, typer.Argument(metavar="REPOSITORY", help="HOST/REPO, e.g. quay.io/ascendkit/verl.")],
    page: Annotated[
        Path,
        typer.Option(
            "--page", help="The Markdown to set (render --all writes docs/repositories/<framework>.md).", exists=True, dir_okay=False
        ),
    ],
    flavor: Annotated[
        str | None, typer.Option("--flavor", help="quay, harbor or dockerhub (default: told by the host).", metavar="KIND")
    ] = None,
    if_supported: Annotated[
        bool, typer.Option("--if-supported", help="A registry with no description to set (or no credentials for it) is a note, exit 0.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Set a repository's description on quay.io, Harbor or Docker Hub to an overview page; credentials
    from $ASCENDKIT_REGISTRY_TOKEN (quay) or $ASCENDKIT_REGISTRY_USERNAME / _PASSWORD, never an argument."""
    from buildkit.ship.describe import FLAVORS, NoDescriptionApi
    from buildkit.ship.describe import describe as set_description

    if flavor is not None and flavor not in FLAVORS:
        raise InputError(f"--flavor {flavor!r}: one of {', '.join(FLAVORS)}")
    text = read_input_text(page, "overview page")
    try:
        done = set_description(repository, text, flavor=flavor)
    except NoDescriptionApi as exc:
        if not if_supported:
            raise
        typer.echo(f"ascendkit: note: {repository}: nothing set: {exc}", err=True)
        if as_json:
            print_json({"repository": repository, "set": False, "reason": str(exc)})
        return
    typer.echo(f"{done.repository}: description set from {page} ({done.characters} characters, {done.flavor} API)", err=True)
    if as_json:
        print_json({"repository": done.repository, "set": True, "flavor": done.flavor, "url": done.url, "characters": done.characters})
