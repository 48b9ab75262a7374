"""Publish verified images by digest to one or more registries, with their SBOMs, and the
multi-arch index over their arches.

An image is published only when its build manifest says it passed verification. Its blobs come out
of the engine once (``layers``) and the same bytes go to every registry, so a manifest composed
here has one digest in all of them (``docker push`` cannot promise that). In three passes over
the registries: every blob (looked up first, mounted from another repository of that registry
where one has it, else sent) and the manifest by digest, read back, in each; then its SBOM,
provenance and signature by digest in each; and only when every registry holds all of that, the
tags, the attachments' (``sha256-<hex>.sbom`` where a registry has no referrers API) before the
image's (``staged``). So a publish that fails anywhere before its tags leaves no tag of any kind
in any registry, a tag never names an image without its SBOM, and an index is written only over
members the registry serves."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from buildkit.errors import PublishFailed
from buildkit.fsio import read_input_bytes
from buildkit.image.buildrecord import read_record
from buildkit.imageref import RegistryRef
from buildkit.plan import arch_tag
from buildkit.ship.layers.blobs import ImageBlobs, gather_blobs
from buildkit.ship.layers.compose import Form, image_manifest, index_manifest
from buildkit.ship.layers.compressing import Blob, Compression, CompressionCache
from buildkit.ship.layers.local import LocalImage, record_published
from buildkit.ship.lazy.soci import LazyIndex, Ztocs, from_registry, image_ztocs, stage_lazy_index
from buildkit.ship.oci.registry import IMAGE_MANIFESTS, Manifest, digest_of
from buildkit.ship.oci.staged import StagedTag, write_all
from buildkit.ship.oci.upload import each_at_once
from buildkit.ship.options import Published, ShipOptions, Target, check_settings
from buildkit.ship.trust.attach import Attached, stage_sbom
from buildkit.ship.trust.checks import stage_trust
from buildkit.ship.trust.sign import stage_signature
from buildkit.trust.keys import Signer

Say = Callable[[str], None]


# ---- blobs ------------------------------------------------------------------------------------------


def _send(target: Target, blob: Blob, *, cache: CompressionCache, tell: Say, present: set[tuple[str, str]]) -> None:
    """Make sure ``target`` has ``blob``: there already (``present`` holds what was found so this run), mounted, or sent."""
    if (target.name, blob.digest) not in present:
        mounts = reversed(cache.seen(target.ref.host, blob.digest))
        how = target.registry.ensure_blob(target.ref.repository, blob.digest, blob.size, blob.open, mounts, tell)
        if how == "sent" and blob.size > 1 << 20:
            tell(f"{target.name}: sent blob {blob.digest[:19]} ({blob.size / 1e6:.0f} MB)")
    cache.saw(target.ref.host, blob.digest, target.ref.repository)


# ---- publishing one image ---------------------------------------------------------------------------


@dataclass
class PublishOutcome:
    """What one image's publishing left in each registry."""

    registries: dict[str, list[Published]] = field(default_factory=dict)  # target name -> per-arch tags
    indexes: dict[str, list[Published]] = field(default_factory=dict)  # target name -> index tags
    sboms: dict[str, list[Attached]] = field(default_factory=dict)
    trust: dict[str, list[dict[str, str | None]]] = field(default_factory=dict)  # target name -> each digest's signature and provenance
    lazy: dict[str, list[LazyIndex]] = field(default_factory=dict)  # target name -> the SOCI index of each image (--lazy soci)
    index_missing: tuple[str, ...] = ()
    inputs_tag: str = ""  # the tag naming the image by its inputs (buildkit/image/inputs.py), where it was written
    reused: str = ""  # `build --push`: the image found under its inputs' tag and tagged, not built

    @property
    def pushed(self) -> list[Published]:
        """The gzip tags in the first registry (the same digests as in every other)."""
        first = next(iter(self.registries.values()), [])
        return [p for p in first if p.compression == "gzip"]

    @property
    def index(self) -> list[Published] | None:
        first = next(iter(self.indexes.values()), None)
        return None if first is None else [p for p in first if p.compression == "gzip"]

    def describe(self) -> dict[str, Any]:
        described = {
            "pushed": [p.describe() for p in self.pushed],
            "index": None if self.index is None else [p.describe() for p in self.index],
            "index_missing": list(self.index_missing),
            "registries": [
                {
                    "registry": name,
                    "pushed": [p.describe() for p in pushed],
                    "index": [p.describe() for p in self.indexes.get(name, [])],
                    "sboms": [a.describe() for a in self.sboms.get(name, [])],
                    "signed": [t for t in self.trust.get(name, []) if t.get("signature")],
                    "provenance": [t for t in self.trust.get(name, []) if t.get("provenance")],
                    "lazy": [i.describe() for i in self.lazy.get(name, [])],
                }
                for name, pushed in self.registries.items()
            ],
        }
        return described | ({"inputs_tag": self.inputs_tag} if self.inputs_tag else {}) | ({"reused": self.reused} if self.reused else {})


def push_image(
    client: docker.APIClient, image: LocalImage, targets: list[Target], options: ShipOptions, *, say: Say | None = None
) -> PublishOutcome:
    """Every tag of ``image`` (and ``<tag>-zstd`` with zstd) in every target, with the SBOM, signature
    and provenance. Three passes over the targets: blobs and manifests by digest; the attachments by
    digest; then, only when every registry holds all of it, every tag (the attachments' first)."""
    tell = say or (lambda _: None)
    check_settings()  # a bad setting is said before minutes of compression, not after
    cache = CompressionCache.load()
    outcome = PublishOutcome()
    build = read_record(image.manifest).as_dict() if image.manifest is not None else {}
    with tempfile.TemporaryDirectory(prefix="ascendkit-ship-") as tmp:
        try:
            blobs = gather_blobs(client, image, targets, options, cache, Path(tmp), tell)
            if image.normalization is not None:  # what the provenance says of how the published image differs from the engine's
                build["normalized"] = {"config": blobs.config.digest, **image.normalization.describe()}
            manifests = [
                (variant, *image_manifest(blobs.config, blobs.layers[variant.name], options.form, variant.name))
                for variant in options.compressions
            ]
            subjects: dict[tuple[str, str], Manifest] = {}
            every = [blobs.config, *{b.digest: b for layers in blobs.layers.values() for b in layers}.values()]
            every.sort(key=lambda b: -b.size)  # the biggest first: it sets the pace
            for target in targets:  # several blobs at a time
                each_at_once(functools.partial(_send, target, cache=cache, tell=tell, present=blobs.present), every)
                for variant, body, media_type in manifests:
                    subjects[(target.name, variant.name)] = _put_by_digest(target, body, media_type, blobs.config.digest)
            ztocs = _ztocs(blobs, targets[0], subjects[(targets[0].name, "gzip")], tell) if options.lazy == "soci" else None
        finally:
            cache.save()
    write_all(_attach(image, targets, subjects, build, options, outcome, tell, ztocs))  # the attachments' tags, then the image's
    for target in targets:
        for variant, body, media_type in manifests:
            tag_manifest(outcome, target, image, variant, body, media_type, tell, said="pushed")
    outcome.inputs_tag = _tag_inputs(image, build, targets, manifests, tell)
    record_published(image, _recorded(targets, outcome, options), blobs.config.digest)
    return outcome


def tag_manifest(
    outcome: PublishOutcome, target: Target, image: LocalImage, variant: Compression, body: bytes, media_type: str, tell: Say, *, said: str
) -> None:
    """The manifest ``body`` (``image``'s ``variant``) under each of the image's tag names in ``target``, each noted in ``outcome``."""
    for name in image.tag_names:
        digest = StagedTag(target.registry, target.ref.repository, variant.tag(name), body, media_type).write()
        published = Published(f"{target.name}:{variant.tag(name)}@{digest}", digest, image.arch, variant.name)
        outcome.registries.setdefault(target.name, []).append(published)
        tell(f"{said} {published.ref}")


def _tag_inputs(
    image: LocalImage, build: dict[str, Any], targets: list[Target], manifests: list[tuple[Compression, bytes, str]], tell: Say
) -> str:
    """The image tagged by its inputs too, where it was built to reproduce: a later `build --push` of
    the same inputs finds it there and tags it instead of building (:mod:`.reuse`)."""
    tag = str(((build.get("build") or {}).get("inputs") or {}).get("tag") or "")
    if image.normalization is None or not tag:
        return ""
    for target in targets:
        for variant, body, media_type in manifests:
            StagedTag(target.registry, target.ref.repository, variant.tag(tag), body, media_type).write()
    tell(f"tagged {tag} too: a build of the same inputs finds the image by it")
    return tag


def _attach(
    image: LocalImage,
    targets: list[Target],
    subjects: dict[tuple[str, str], Manifest],
    build: dict[str, Any],
    options: ShipOptions,
    outcome: PublishOutcome,
    tell: Say,
    ztocs: Ztocs | None = None,
) -> list[StagedTag]:
    """The SBOM, provenance and signature of each pushed manifest, by digest, in every target, and
    with ``ztocs`` the gzip image's SOCI index; the tags they need, staged."""
    sbom = read_input_bytes(image.sbom, "SBOM") if image.sbom is not None and image.sbom.is_file() else None
    staged: list[StagedTag] = []
    for target in targets:
        for variant in options.compressions:
            subject = subjects[(target.name, variant.name)]
            form = options.form if variant.name == "gzip" else None
            if sbom is not None:
                attached, tag = stage_sbom(target.registry, target.ref.repository, subject, sbom, form)
                staged += [tag] if tag is not None else []
                outcome.sboms.setdefault(target.name, []).append(attached)
                tell(f"{target.name}: attached the SBOM to {subject.digest[:19]} ({attached.how})")
            trusted, tags = stage_trust(target.registry, target.ref.repository, subject.digest, build, options.signer, form)
            staged += tags
            outcome.trust.setdefault(target.name, []).append(trusted)
            if ztocs is not None and variant.name == "gzip":
                lazy, tag = stage_lazy_index(target.registry, target.ref.repository, subject, ztocs)
                staged += [tag] if tag is not None else []
                outcome.lazy.setdefault(target.name, []).append(lazy)
                tell(f"{target.name}: SOCI index {lazy.digest[:19]} for {subject.digest[:19]} ({lazy.layers} layers lazily; {lazy.how})")
    return staged


def _ztocs(blobs: ImageBlobs, target: Target, subject: Manifest, tell: Say) -> Ztocs:
    """The zTOCs of the gzip image's layers: from the bytes this run compressed, or where a layer was
    not exported (every registry had it), from the first registry."""
    local = {b.digest: b.open for b in blobs.layers["gzip"] if b.path is not None}
    remote = from_registry(target.registry, target.ref.repository)
    return image_ztocs(subject, lambda digest: local.get(digest) or remote(digest), tell)


def _put_by_digest(target: Target, body: bytes, media_type: str, image_id: str) -> Manifest:
    repository = target.ref.repository
    digest = target.registry.put_manifest(repository, digest_of(body), body, media_type)
    back = target.registry.get_manifest(repository, digest)
    if back is None or back.body != body:
        raise PublishFailed(f"{target.name}@{digest}: the registry does not serve the manifest just written")
    config = (back.json().get("config") or {}).get("digest")
    if config != image_id:
        raise PublishFailed(f"{target.name}@{digest}: the registry's image config is {config}, not the one published {image_id}")
    return back


def _recorded(targets: list[Target], outcome: PublishOutcome, options: ShipOptions) -> dict[str, dict[str, Any]]:
    """What the build manifest keeps of each registry: the digest and SBOM of each variant."""
    recorded = {}
    for target in targets:
        entry: dict[str, Any] = {"media_types": options.form or "default"}
        sboms = {a.subject: a.describe() for a in outcome.sboms.get(target.name, [])}
        for published in outcome.registries.get(target.name, []):
            entry[published.compression] = {"digest": published.digest, "sbom": sboms.get(published.digest)}
        recorded[target.name] = {"digest": entry["gzip"]["digest"], "sbom": entry["gzip"]["sbom"], **entry}
    return recorded


# ---- the multi-arch index ---------------------------------------------------------------------------


def index_members(target: Target, image: LocalImage, variant: Compression) -> tuple[dict[str, Manifest], list[str]]:
    """The per-arch manifests the registry holds for ``image``'s names, and the arches it lacks."""
    members: dict[str, Manifest] = {}
    missing = []
    for arch in image.arches:
        manifest = target.registry.get_manifest(target.ref.repository, variant.tag(arch_tag(image.index_names[0], arch)))
        if manifest is None or manifest.media_type not in IMAGE_MANIFESTS:
            missing.append(arch)
        else:
            members[arch] = manifest
    return members, missing


@dataclass(frozen=True)
class StagedIndex:
    """A multi-arch index in a registry by digest (signed, with a key), its tags not yet written."""

    target: Target
    compression: str
    signature: StagedTag | None
    tags: tuple[StagedTag, ...]

    def write(self) -> list[Published]:
        """The signature's tag, then the index's names, each read back: no tag names an unsigned index."""
        if self.signature is not None:
            self.signature.write()
        return [Published(f"{self.target.name}:{t.tag}@{t.write()}", t.digest, None, self.compression) for t in self.tags]


def stage_index(
    target: Target,
    names: tuple[str, ...],
    members: dict[str, Manifest],
    form: Form,
    compression: str = "gzip",
    signer: Signer | None = None,
) -> StagedIndex:
    """The multi-arch index over ``members`` (every arch present) by digest, signed with a key; its ``names`` staged."""
    repository = target.ref.repository
    body, media_type = index_manifest(members, form if compression == "gzip" else "oci", f"{target.name}:{names[0]}")
    digest = target.registry.put_manifest(repository, digest_of(body), body, media_type)
    signature = None
    if signer is not None:
        _, signature = stage_signature(target.registry, repository, digest, signer, form if compression == "gzip" else None)
    tags = tuple(StagedTag(target.registry, repository, name, body, media_type) for name in names)
    return StagedIndex(target, compression, signature, tags)


def publish_image(
    client: docker.APIClient,
    image: LocalImage,
    targets: list[RegistryRef],
    *,
    want_index: bool,
    require_index: bool,
    options: ShipOptions | None = None,
    say: Say | None = None,
) -> PublishOutcome:
    """Push one image by digest to every target, then (``want_index``) the multi-arch index over its arches in each.

    With ``require_index`` a missing arch refuses the index (PublishFailed); without it the index
    waits for the other arch's push, and the outcome names what is missing. ``say`` hears each step."""
    tell = say or (lambda _: None)
    options = options or ShipOptions()
    registries = [Target.of(ref) for ref in targets]
    outcome = push_image(client, image, registries, options, say=tell)
    if want_index:
        complete_index(outcome, image, registries, options, require_index=require_index, say=tell)
    return outcome


def complete_index(
    outcome: PublishOutcome, image: LocalImage, registries: list[Target], options: ShipOptions, *, require_index: bool, say: Say
) -> None:
    """The multi-arch index over ``image``'s arches in each registry, just pushed (into ``outcome``);
    with ``require_index`` a missing arch refuses it, else the outcome names what is missing."""
    tell = say
    found = []
    for target in registries:
        for variant in options.compressions:
            members, missing = index_members(target, image, variant)
            if missing:
                if require_index:
                    raise PublishFailed(
                        f"refusing to publish the multi-arch index {target.name}:{variant.tag(image.index_names[0])}: "
                        f"no {', '.join(missing)} image in the registry (build it with --arch {missing[0]} --push)"
                    )
                tell(
                    f"multi-arch index not published yet: {', '.join(missing)} missing in {target.name} "
                    f"(build with --arch {missing[0]} --push, or `ascendkit publish` both images)"
                )
                outcome.index_missing = tuple(missing)
                continue
            found.append((target, variant, members))
    if outcome.index_missing:
        return
    staged = [  # every index by digest in every registry before any of their tags
        stage_index(
            target,
            tuple(variant.tag(n) for n in image.index_names),
            members,
            options.form,
            variant.name,
            options.signer,
        )
        for target, variant, members in found
    ]
    for index in staged:
        published = index.write()
        outcome.indexes.setdefault(index.target.name, []).extend(published)
        for p in published:
            tell(f"published index {p.ref}")


def closes_its_index(images: list[LocalImage]) -> list[bool]:
    """For images published together: whether each is the last of its multi-arch index's group
    (the index is published once, after every arch of the group was pushed)."""
    return [all(other.index_names[0] != image.index_names[0] for other in images[i + 1 :]) for i, image in enumerate(images)]


def publish_all(
    client: docker.APIClient,
    images: list[LocalImage],
    targets: list[RegistryRef],
    *,
    index: bool,
    options: ShipOptions | None = None,
    say: Say | None = None,
    done: list[PublishOutcome] | None = None,
) -> list[PublishOutcome]:
    """``ascendkit publish``: each image to every target, and (``index``) each multi-arch index once
    its last arch is pushed, refused while an arch is missing. ``done`` collects the outcomes as they
    come, for a caller that must say what was published when it is interrupted."""
    outcomes = done if done is not None else []
    for image, last_of_group in zip(images, closes_its_index(images), strict=True):
        outcomes.append(
            publish_image(client, image, targets, want_index=index and last_of_group, require_index=True, options=options, say=say)
        )
    return outcomes
