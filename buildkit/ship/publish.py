"""Publish verified images to a registry by digest, and one multi-arch index over their arches.

An image is published only when its build manifest says it passed verification. Every push is
read back from the registry: the digest must be the one pushed and the manifest's config must be
the local image. Its SBOM is attached to that digest, and the build manifest records where the
image went (what ``publish --index-only`` reads later, on another machine). The index is refused
while any arch of the stack is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException

from buildkit.errors import PublishFailed
from buildkit.fsio import read_input_bytes, write_atomic
from buildkit.image.engine import ascendkit_image
from buildkit.image.sbom import sbom_beside
from buildkit.matrix.model import DOCKER_ARCH, normalize_arch
from buildkit.reach import engine_said, text_cause
from buildkit.ship.attach import Attached, attach_sbom
from buildkit.ship.registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, Manifest, Registry, RegistryRef


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
    return tuple(name.removesuffix(f"-{arch}") for name in tag_names)


@dataclass(frozen=True)
class Published:
    ref: str
    digest: str
    arch: str | None  # None for the multi-arch index

    def describe(self) -> dict[str, Any]:
        return {"ref": self.ref, "digest": self.digest, "arch": self.arch or "index"}


def load_local_image(client: docker.APIClient, ref: str, manifest_dir: Path) -> LocalImage:
    inspect, name = ascendkit_image(client, ref, "build it with `ascendkit build` first")
    labels = inspect["Config"]["Labels"]
    arch = normalize_arch(inspect.get("Architecture", ""))
    manifest_path = manifest_dir / f"{name}.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        raise PublishFailed(f"{ref}: no build manifest at {manifest_path}; only verified images are published (rebuild it)") from None
    if manifest.get("image", {}).get("id") != inspect["Id"] or not manifest.get("passed"):
        raise PublishFailed(f"{ref}: {manifest_path} does not record a passed verification of image {inspect['Id'][:19]}; rebuild it")
    names = tuple(tag.rsplit(":", 1)[1] for tag in manifest["image"]["tags"])
    return LocalImage(inspect["Id"], arch, tuple(labels.get("io.ascendkit.arches", arch).split(",")), names, manifest_path)


def _push_tag(client: docker.APIClient, repository: str, tag: str, retries: int, backoff: float) -> str:
    last = ""
    for attempt in range(retries + 1):
        digest = None
        try:
            for event in client.push(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    last = text_cause(str(event["error"]))
                    break
                aux = event.get("aux")
                if isinstance(aux, dict) and aux.get("Digest"):
                    digest = aux["Digest"]
        except DockerException as exc:
            last = engine_said(exc)
        if digest:
            return str(digest)
        if attempt < retries:
            time.sleep(backoff * 2**attempt)
    raise PublishFailed(f"push of {repository}:{tag} failed after {retries + 1} attempts: {last}")


def push_image(
    client: docker.APIClient, image: LocalImage, target: RegistryRef, registry: Registry, *, retries: int = 3, backoff: float = 1.0
) -> list[Published]:
    """Push every tag of ``image`` and confirm each one by reading it back from the registry."""
    published = []
    for name in image.tag_names:
        client.tag(image.image_id, target.name, name, force=True)
        digest = _push_tag(client, target.name, name, retries, backoff)
        manifest = registry.get_manifest(target.repository, name)
        if manifest is None or manifest.digest != digest:
            raise PublishFailed(
                f"{target.name}:{name}: the registry serves {manifest.digest if manifest else 'nothing'}, not the pushed {digest}"
            )
        config = manifest.json().get("config", {}).get("digest")
        if config != image.image_id:
            raise PublishFailed(f"{target.name}:{name}: the registry's image config is {config}, not the local image {image.image_id}")
        published.append(Published(f"{target.name}:{name}@{digest}", digest, image.arch))
    return published


def attach_and_record(registry: Registry, target: RegistryRef, image: LocalImage, digest: str) -> Attached | None:
    """Attach the image's SBOM to ``digest`` and note the push in its build manifest (read by
    ``publish --index-only``). An image built before SBOMs existed has none: nothing is attached."""
    attached = None
    if image.sbom is not None and image.sbom.is_file():
        subject = registry.get_manifest(target.repository, digest)
        if subject is None:
            raise PublishFailed(f"{target.name}@{digest}: pushed, but the registry no longer serves it")
        attached = attach_sbom(registry, target.repository, subject, read_input_bytes(image.sbom, "SBOM"))
    if image.manifest is not None and image.manifest.is_file():
        data = json.loads(image.manifest.read_text(encoding="utf-8"))
        data["published"] = {"repository": target.name, "digest": digest, "sbom": attached.describe() if attached else None}
        write_atomic(image.manifest, json.dumps(data, indent=2) + "\n")
    return attached


def index_body(members: dict[str, Manifest]) -> tuple[bytes, str]:
    """A manifest list (or OCI index, matching the members' format) with one entry per arch."""
    oci = all(m.media_type == OCI_MANIFEST for m in members.values())
    entries = [
        {
            "mediaType": m.media_type,
            "digest": m.digest,
            "size": m.size,
            "platform": {"architecture": DOCKER_ARCH[arch], "os": "linux"},
        }
        for arch, m in sorted(members.items())
    ]
    media_type = OCI_INDEX if oci else DOCKER_LIST
    body = {"schemaVersion": 2, "mediaType": media_type, "manifests": entries}
    return json.dumps(body, indent=2, sort_keys=True).encode(), media_type


def index_members(registry: Registry, target: RegistryRef, image: LocalImage) -> tuple[dict[str, Manifest], list[str]]:
    """The per-arch manifests the registry holds for ``image``'s names, and the arches it lacks."""
    members: dict[str, Manifest] = {}
    missing = []
    for arch in image.arches:
        manifest = registry.get_manifest(target.repository, f"{image.index_names[0]}-{arch}")
        if manifest is None or manifest.media_type not in (DOCKER_MANIFEST, OCI_MANIFEST):
            missing.append(arch)
        else:
            members[arch] = manifest
    return members, missing


def publish_index(
    registry: Registry, target: RegistryRef, names: tuple[str, ...], members: dict[str, Manifest], missing: list[str]
) -> list[Published]:
    """Publish the multi-arch index under ``names``; refuse while any arch is missing."""
    if missing:
        raise PublishFailed(
            f"refusing to publish the multi-arch index {target.name}:{names[0]}: "
            f"no {', '.join(missing)} image in the registry (build it with --arch {missing[0]} --push)"
        )
    body, media_type = index_body(members)
    published = []
    for name in names:
        digest = registry.put_manifest(target.repository, name, body, media_type)
        back = registry.get_manifest(target.repository, name)
        if back is None or back.digest != digest:
            raise PublishFailed(f"{target.name}:{name}: the registry does not serve the index just written")
        published.append(Published(f"{target.name}:{name}@{digest}", digest, None))
    return published


@dataclass(frozen=True)
class PublishOutcome:
    pushed: tuple[Published, ...]
    index: tuple[Published, ...] | None = None  # None: not published (not asked for, or an arch is missing)
    index_missing: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "pushed": [p.describe() for p in self.pushed],
            "index": None if self.index is None else [p.describe() for p in self.index],
            "index_missing": list(self.index_missing),
        }


def publish_image(
    client: docker.APIClient,
    image: LocalImage,
    target: RegistryRef,
    *,
    want_index: bool,
    require_index: bool,
    say: Callable[[str], None] | None = None,
) -> PublishOutcome:
    """Push one image by digest, then (``want_index``) the multi-arch index over its arches.

    With ``require_index`` a missing arch refuses the index (PublishFailed); without it the index
    waits for the other arch's push, and the outcome names what is missing. ``say`` hears each step."""
    tell = say or (lambda _: None)
    registry = Registry(target.host)
    pushed = tuple(push_image(client, image, target, registry))
    for p in pushed:
        tell(f"pushed {p.ref}")
    attached = attach_and_record(registry, target, image, pushed[0].digest)
    if attached is not None:
        tell(f"attached the SBOM to {target.name}@{attached.subject} ({attached.how})")
    if not want_index:
        return PublishOutcome(pushed)
    members, missing = index_members(registry, target, image)
    if missing and not require_index:
        tell(
            f"multi-arch index not published yet: {', '.join(missing)} missing in {target.name} "
            f"(build with --arch {missing[0]} --push, or `ascendkit publish` both images)"
        )
        return PublishOutcome(pushed, None, tuple(missing))
    index = tuple(publish_index(registry, target, image.index_names, members, missing))
    for p in index:
        tell(f"published index {p.ref}")
    return PublishOutcome(pushed, index)


def closes_its_index(images: list[LocalImage]) -> list[bool]:
    """For images published together: whether each is the last of its multi-arch index's group
    (the index is published once, after every arch of the group was pushed)."""
    return [all(other.index_names[0] != image.index_names[0] for other in images[i + 1 :]) for i, image in enumerate(images)]
