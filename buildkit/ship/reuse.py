"""``build --push`` of inputs every registry already holds an image for: nothing is built. Images are
built to reproduce, so the same inputs (:mod:`buildkit.image.inputs`) would publish that very image;
a publish tags each image ``inputs-<digest>`` beside its names, and here that tag is looked up in
every registry, for every compression asked (and, when signing, with a signature by the same key),
and the image found is given the build's names (and its index is completed) instead of building,
verifying and publishing it again.

An unchanged rebuild on a cold CI runner then costs a few registry requests, not a build."""

from __future__ import annotations

from collections.abc import Callable

import docker
import requests
from docker.errors import DockerException, NotFound

from buildkit.image.buildplan import BuildPlan
from buildkit.image.buildx import choose_builder
from buildkit.image.engine import engine_facts
from buildkit.image.inputs import build_inputs, inputs_digest, inputs_tag
from buildkit.image.sbom import BaseImage
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.oci.registry import Manifest
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.publish import PublishOutcome, complete_index, tag_manifest
from buildkit.ship.trust.checks import signed_by

Say = Callable[[str], None]


def planned_inputs_tag(client: docker.APIClient, plan: BuildPlan, base: BaseImage | None = None) -> str | None:
    """The inputs tag the build of ``plan`` would publish under, on this engine with its builder; None
    where the base's digest cannot be told without pulling it (then the build goes on). ``base``: the
    engine's own base, when the caller already found it (:func:`buildkit.image.build.local_base`)."""
    from buildkit.image.build import base_for, registry_digest

    try:
        engine = engine_facts(client)
        builder = choose_builder(plan.builder, engine, cache=bool(plan.cache_ref), export=plan.cache_export)
        try:
            digest = base_for(client, plan.base_image, engine, base).digest
        except NotFound:
            digest = registry_digest(plan.base_image) or ""
    except (DockerException, requests.exceptions.RequestException):
        return None
    return inputs_tag(inputs_digest(build_inputs(plan, builder.name, digest))) if digest else None


def find_built(targets: list[Target], tag: str, options: ShipOptions) -> dict[tuple[str, str], Manifest] | None:
    """Each target's image (per compression) tagged ``tag``, when every target holds one for every
    compression asked, signed by ``options.signer``'s key where it signs; else None."""
    found = {}
    for target in targets:
        for variant in options.compressions:
            manifest = target.registry.get_manifest(target.ref.repository, variant.tag(tag))
            if manifest is None or manifest.is_index:
                return None
            if options.signer is not None and not signed_by(target.registry, target.ref.repository, manifest.digest, options.signer):
                return None
            found[(target.name, variant.name)] = manifest
    return found


def tag_built(
    image: LocalImage,
    targets: list[Target],
    found: dict[tuple[str, str], Manifest],
    options: ShipOptions,
    tag: str,
    *,
    want_index: bool,
    say: Say,
) -> PublishOutcome:
    """The image ``found`` under ``tag`` given ``image``'s names in every target, then its index."""
    outcome = PublishOutcome(inputs_tag=tag, reused=tag)
    for target in targets:
        for variant in options.compressions:
            manifest = found[(target.name, variant.name)]
            tag_manifest(outcome, target, image, variant, manifest.body, manifest.media_type, say, said="tagged")
    if want_index:
        complete_index(outcome, image, targets, options, require_index=False, say=say)
    return outcome
