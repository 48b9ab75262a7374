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
from buildkit.image.buildrecord import RecordedPush, read_record, write_record
from buildkit.image.engine import ascendkit_image
from buildkit.image.sbom import sbom_beside
from buildkit.plan import index_tag, tag_of


@dataclass(frozen=True)
class LocalImage:
    """A built, verified image and the tag names (``<name>-<arch>``) its build gave it."""

    image_id: str
    arch: str
    arches: tuple[str, ...]  # every arch its stack is built for
    tag_names: tuple[str, ...]
    manifest: Path | None = None  # its build manifest; the SBOM sits beside it

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
    labels = inspect["Config"]["Labels"]
    arch = normalize_arch(inspect.get("Architecture", ""))
    manifest_path = manifest_dir / f"{name}.json"
    if not manifest_path.is_file():
        raise PublishFailed(f"{ref}: no build manifest at {manifest_path}; only verified images are published (rebuild it)")
    record = read_record(manifest_path)
    if record.image.id != inspect["Id"] or not record.passed:
        raise PublishFailed(f"{ref}: {manifest_path} does not record a passed verification of image {inspect['Id'][:19]}; rebuild it")
    names = tuple(tag_of(tag) for tag in record.image.tags)
    return LocalImage(inspect["Id"], arch, tuple(labels.get("io.ascendkit.arches", arch).split(",")), names, manifest_path)


def record_published(image: LocalImage, registries: dict[str, dict[str, Any]]) -> None:
    """Note in the build manifest where the image went, each registry with its digests and SBOMs;
    registries published to before stay listed."""
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
    push = {"repository": first_name, "digest": first["digest"], "sbom": first["sbom"], "registries": kept}
    write_record(image.manifest, record.model_copy(update={"published": RecordedPush.model_validate(push)}))
