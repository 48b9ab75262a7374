"""The local image as its build recorded it: what publishing reads from the build manifest (only a
passed verification is published), and what it writes back into it (where the image went, which
``publish --index-only`` reads later, on another machine)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from buildkit.arch import normalize_arch
from buildkit.errors import PublishFailed
from buildkit.image.archive import ImageIdentity, identify
from buildkit.image.buildrecord import BuildRecord, RecordedPush, read_record, write_record
from buildkit.image.engine import ascendkit_image
from buildkit.image.sbom import sbom_beside
from buildkit.plan import index_tag, tag_of
from buildkit.ship.layers.normalize import Normalization, epoch_of


@dataclass(frozen=True)
class LocalImage:
    """A built, verified image and the tag names (``<name>-<arch>``) its build gave it."""

    image_id: str  # its config's digest: what it is on every engine (buildkit.image.archive)
    arch: str
    arches: tuple[str, ...]  # every arch its stack is built for
    tag_names: tuple[str, ...]
    manifest: Path | None = None  # its build manifest; the SBOM sits beside it
    engine_id: str = ""  # what the engine holding it calls it, where that is not the config digest (the containerd store)
    normalization: Normalization | None = None  # how it is published: its times clamped to its epoch above its base

    @property
    def identity(self) -> ImageIdentity:
        return ImageIdentity(self.image_id, self.engine_id or self.image_id)

    @property
    def index_names(self) -> tuple[str, ...]:
        return index_names(self.tag_names, self.arch)

    @property
    def sbom(self) -> Path | None:
        return None if self.manifest is None else sbom_beside(self.manifest)


def index_names(tag_names: tuple[str, ...], arch: str) -> tuple[str, ...]:
    """The arch-less names the multi-arch index of per-arch tags ``<name>-<arch>`` is published under."""
    return tuple(index_tag(name, arch) for name in tag_names)


def load_local_image(client: docker.APIClient, ref: str, manifest_dir: Path) -> LocalImage:
    inspect, name = ascendkit_image(client, ref, "build it with `ascendkit build` first")
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    arch = normalize_arch(inspect.get("Architecture", ""))
    manifest_path = manifest_dir / f"{name}.json"
    if not manifest_path.is_file():
        raise PublishFailed(f"{ref}: no build manifest at {manifest_path}; only verified images are published (rebuild it)")
    record = read_record(manifest_path)
    # The record names the image by its config digest; this engine may call it otherwise (the containerd store).
    engine_id = str(inspect["Id"])
    if engine_id == record.image.id:
        config = engine_id
    elif record.image.engine_id and engine_id == record.image.engine_id:
        config = record.image.id
    else:
        config = identify(client, ref, inspect).config
    if record.image.id != config or not record.passed:
        raise PublishFailed(f"{ref}: {manifest_path} does not record a passed verification of image {config[:19]}; rebuild it")
    names = tuple(tag_of(tag) for tag in record.image.tags)
    arches = tuple(labels.get("io.ascendkit.arches", arch).split(","))
    engine = "" if engine_id == config else engine_id
    return LocalImage(config, arch, arches, names, manifest_path, engine, normalization_of(record))


def normalization_of(record: BuildRecord) -> Normalization | None:
    """How an image is published: with its epoch label and its build's record of its base's layers,
    normalized; an image built before either (by an older ascendkit) as the engine has it."""
    epoch = epoch_of(record.labels)
    base = record.build.get("base_image")
    layers = base.get("layers") if isinstance(base, dict) else None
    if epoch is None or not isinstance(layers, int) or layers < 0:
        return None
    return Normalization(epoch, layers)


def record_published(image: LocalImage, registries: dict[str, dict[str, Any]], config: str = "") -> None:
    """Note in the build manifest where the image went, each registry with its digests and SBOMs;
    registries published to before stay listed. ``config``: the published image's config digest, where
    publishing normalized the image (the engine's is ``image.id``; ``reproducible`` says what differs)."""
    if image.manifest is None or not image.manifest.is_file():
        return
    record = read_record(image.manifest)
    merged = dict(record.published.every_registry()) if record.published is not None else {}
    first_name = next(iter(registries))
    first = registries[first_name]
    # Registries published to before stay listed when they hold this same manifest; one that got a
    # manifest composed otherwise (by an older ascendkit, through the engine) is no longer a record of this push.
    kept = {name: entry.as_dict() for name, entry in merged.items() if name and entry.digest == first["digest"]}
    kept.update(registries)
    push: dict[str, Any] = {"repository": first_name, "digest": first["digest"], "sbom": first["sbom"], "registries": kept}
    if image.normalization is not None and config:
        push["config"] = config
        push["reproducible"] = image.normalization.describe()
    write_record(image.manifest, record.model_copy(update={"published": RecordedPush.model_validate(push)}))
