"""One front door for publishing: what ``ascendkit publish`` and ``build --push`` are asked, and
what :func:`buildkit.publish` and :func:`buildkit.build` are asked, checked in one place before
anything is contacted, so the command and the API refuse the same request with the same words
(tests/test_api.py holds them to it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker

from buildkit.errors import InputError
from buildkit.image.buildplan import BuildPlan, BuildResult
from buildkit.image.buildrecord import read_record
from buildkit.image.sbom import BaseImage
from buildkit.imageref import IMAGE_REFERENCE, RegistryRef
from buildkit.matrix.load import LoadedMatrix
from buildkit.ship.layers.local import LocalImage, normalization_of
from buildkit.ship.options import ShipOptions, Target, ship_options
from buildkit.ship.publish import PublishOutcome, publish_image
from buildkit.trust.keys import Signer


@dataclass(frozen=True)
class PublishRequest:
    """Local images (or, ``index_only``, the build manifests of ``manifest_dir``) into ``targets``."""

    images: tuple[str, ...]
    targets: tuple[RegistryRef, ...]
    manifest_dir: Path
    options: ShipOptions
    index: bool = True
    index_only: bool = False
    dry_run: bool = False


def registry_targets(registries: Sequence[str]) -> tuple[RegistryRef, ...]:
    """``--registry`` values as references, each repository once."""
    targets = tuple(RegistryRef.parse(r) for r in registries)
    if len({t.name for t in targets}) != len(targets):
        raise InputError(f"--registry names the same repository twice: {', '.join(sorted(t.name for t in targets))}")
    return targets


def publish_request(
    images: Sequence[str],
    registries: Sequence[str],
    *,
    manifest_dir: Path,
    index: bool = True,
    index_only: bool = False,
    dry_run: bool = False,
    media_types: str | None = None,
    compression: str = "gzip",
    signer: Signer | Callable[[], Signer | None] | None = None,
    lazy: str | None = None,
) -> PublishRequest:
    """The request ``ascendkit publish`` and :func:`buildkit.publish` make, or the reason it cannot be
    made. ``signer`` may be a function that loads it: called once the options hold (it may prompt)."""
    if not registries:
        raise InputError("give --registry HOST[:PORT]/REPO (repeat it to publish to several registries)")
    if index_only and (images or not index):
        raise InputError("--index-only reads the build manifests in --manifest-dir: give no IMAGES and no --no-index")
    if index_only and lazy:
        raise InputError("--lazy soci indexes the images a push sends: give it to `build --push` or `publish IMAGES`, not --index-only")
    if dry_run and not index_only:
        raise InputError("--dry-run goes with --index-only (a push of local images has no dry run; see `ascendkit build --dry-run`)")
    if not index_only and not images:
        raise InputError("give the local IMAGES to push, or --index-only to publish indexes from --manifest-dir")
    targets = registry_targets(registries)
    unsigned = ship_options(media_types, compression, lazy=lazy)  # the options refused before a key is opened
    options = unsigned.signed_by(None if dry_run else signer() if callable(signer) else signer)
    for ref in images:
        if not IMAGE_REFERENCE.match(ref):
            raise InputError(f"{ref!r} is not an image reference: give local images as NAME[:TAG], as `ascendkit build` tagged them")
    if not index_only and not manifest_dir.is_dir():  # (--index-only checks its own)
        raise InputError(f"--manifest-dir {manifest_dir}: no such directory (where `ascendkit build` wrote the build manifests)")
    return PublishRequest(tuple(images), targets, manifest_dir, options, index, index_only, dry_run)


@dataclass(frozen=True)
class PushRequest:
    """What ``build --push`` adds to a build: where the verified image goes, and in which forms."""

    targets: tuple[RegistryRef, ...]
    options: ShipOptions
    index: bool = True

    def signed_by(self, signer: Signer | None) -> PushRequest:
        return dataclasses.replace(self, options=self.options.signed_by(signer))


def push_request(
    registries: Sequence[str],
    *,
    push: bool,
    index: bool = True,
    media_types: str | None = None,
    compression: str = "gzip",
    signed: bool = False,
    lazy: str | None = None,
) -> PushRequest | None:
    """``build --push``'s options checked together (None: no push); ``signed``: a signing key was
    given (loaded by the caller only once the request holds, since it may ask for a passphrase)."""
    if push and not registries:
        raise InputError("--push needs --registry HOST[:PORT]/REPO")
    targets = registry_targets(registries)  # a malformed one is said first, whatever else is wrong
    if registries and not push:
        raise InputError("--registry is where --push sends the image: give --push too, or drop --registry")
    if not index and not push:
        raise InputError("--no-index only changes what --push does: give --push too")
    if (media_types or compression != "gzip" or signed or lazy) and not push:
        raise InputError("--media-types, --compression, --lazy and --sign-key change what --push does: give --push too")
    options = ship_options(media_types, compression, lazy=lazy)  # refused now (docker + zstd, say), before the build
    return PushRequest(targets, options, index) if push else None


def push_built(
    client: docker.APIClient,
    loaded: LoadedMatrix,
    plan: BuildPlan,
    result: BuildResult,
    push: PushRequest,
    say: Callable[[str], None] | None = None,
) -> PublishOutcome:
    """What a build just verified and tagged, pushed as ``build --push`` and :func:`buildkit.build_and_push` do:
    the index over the arches the registries already have, not refused while one is missing."""
    arches = tuple(loaded.matrix.stacks[plan.stack_id].arches)
    engine_id = "" if result.engine_id in ("", result.image_id) else result.engine_id
    normalization = normalization_of(read_record(result.manifest_json))
    image = LocalImage(result.image_id, plan.arch, arches, plan.tags, result.manifest_json, engine_id, normalization)
    return publish_image(client, image, list(push.targets), want_index=push.index, require_index=False, options=push.options, say=say)


def reuse_built(
    client: docker.APIClient,
    loaded: LoadedMatrix,
    plan: BuildPlan,
    push: PushRequest,
    say: Callable[[str], None] | None = None,
    base: BaseImage | None = None,
) -> PublishOutcome | None:
    """``build --push`` without a build: when every registry holds the image these very inputs publish
    (:mod:`.reuse`), that image given the build's names and its index completed; None when it must be
    built (some registry lacks it, or ``--no-cache`` / ``--reverify`` ask for a build). ``base``: the
    engine's own base, when the caller found it already (it hands the same to the build)."""
    from buildkit.ship.reuse import find_built, planned_inputs_tag, tag_built

    tell = say or (lambda _: None)
    if plan.no_cache or plan.reverify:
        return None
    tag = planned_inputs_tag(client, plan, base)
    targets = [Target.of(ref) for ref in push.targets]
    found = find_built(targets, tag, push.options) if tag else None
    if tag is None or found is None:
        return None
    manifest = found[(targets[0].name, "gzip")]
    tell(f"{targets[0].name}:{tag}@{manifest.digest} was built from these very inputs: tagging it, not building")
    config = str(manifest.json().get("config", {}).get("digest", ""))
    image = LocalImage(config, plan.arch, tuple(loaded.matrix.stacks[plan.stack_id].arches), plan.tags)
    return tag_built(image, targets, found, push.options, tag, want_index=push.index, say=tell)
