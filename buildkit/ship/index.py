"""``publish --index-only``: the multi-arch index from per-arch build manifests, through the registry alone.

Each arch of an image is built and pushed on its own runner; what reaches the index step is the
build manifests (with the digest each push recorded) and the SBOMs beside them, not the images.
Every member is checked in the registry before anything is written: its digest is served, it is
an image manifest, its config is the image the manifest verified, its config's platform is the
arch the manifest says, and its per-arch tag still names that digest. One failed check refuses
every index of the run; nothing is pushed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import InputError, PublishFailed
from buildkit.fsio import read_input_bytes
from buildkit.image.buildrecord import read_record
from buildkit.image.sbom import SBOM_SUFFIX, sbom_beside
from buildkit.imageref import RegistryRef
from buildkit.plan import arch_tag, tag_of, variant_tag
from buildkit.ship.layers.local import index_names
from buildkit.ship.oci.registry import IMAGE_MANIFESTS, Manifest
from buildkit.ship.oci.staged import StagedTag, write_all
from buildkit.ship.options import Published, ShipOptions, Target
from buildkit.ship.publish import stage_index
from buildkit.ship.trust.attach import Attached, stage_sbom
from buildkit.ship.trust.checks import stage_trust


@dataclass(frozen=True)
class Member:
    """One per-arch image as its build manifest recorded it."""

    path: Path
    arch: str
    arches: tuple[str, ...]
    names: tuple[str, ...]  # the index's names (the per-arch tags without -<arch>)
    image_id: str
    registries: dict[str, dict[str, str]]  # registry HOST/REPO -> compression -> the digest pushed there
    build: dict[str, Any]  # the whole record, as provenance reads it

    @property
    def repository(self) -> str:
        return next(iter(self.registries))

    @property
    def sbom(self) -> Path:
        return sbom_beside(self.path)


@dataclass(frozen=True)
class IndexGroup:
    names: tuple[str, ...]
    members: dict[str, Member]  # arch -> member


def read_member(path: Path) -> Member:
    record = read_record(path)
    if not record.passed:
        raise PublishFailed(f"{path}: the build's verification did not pass; only verified images are published")
    published = record.published
    if published is None or not published.digest:
        raise PublishFailed(f"{path}: records no push; build with --push --registry first (ascendkit build ... --push)")
    registries = {name: entry.digests() for name, entry in published.every_registry().items()}
    differing = sorted({d["gzip"] for d in registries.values()} - {published.digest})
    if differing:  # publishing writes the same manifest everywhere: two digests mean the file was edited, or is stale
        raise PublishFailed(
            f"{path}: records {published.digest} but also {', '.join(differing)} for the same image; "
            "publish it again (ascendkit publish IMAGE --registry ...) to record one digest"
        )
    if not record.arch:
        raise InputError(f"{path}: not an ascendkit build manifest (no arch)")
    return Member(
        path=path,
        arch=record.arch,
        arches=record.arches,
        names=index_names(tuple(tag_of(t) for t in record.image.tags), record.arch),
        image_id=published.config or record.image.id,  # the published config: the engine's, or its normalized form
        registries=registries,
        build=record.as_dict(),
    )


def read_groups(manifest_dir: Path) -> list[IndexGroup]:
    """Every build manifest in ``manifest_dir``, grouped by the index they belong to."""
    if not manifest_dir.is_dir():
        raise InputError(f"--manifest-dir {manifest_dir}: no such directory (the build jobs' manifests go there)")
    paths = sorted(p for p in manifest_dir.glob("*.json") if not p.name.endswith(SBOM_SUFFIX))
    if not paths:
        raise InputError(f"--manifest-dir {manifest_dir}: no build manifests (*.json from `ascendkit build --push`)")
    groups: dict[tuple[str, ...], dict[str, Member]] = {}
    for path in paths:
        member = read_member(path)
        group = groups.setdefault(member.names, {})
        if member.arch in group:
            raise InputError(f"{path} and {group[member.arch].path} are both the {member.arch} image of {member.names[0]}: keep one")
        group[member.arch] = member
    return [IndexGroup(names, members) for names, members in sorted(groups.items())]


def check_group(target: Target, group: IndexGroup, compression: str = "gzip") -> dict[str, Manifest]:
    """The members (their ``compression`` variant) as the registry serves them; PublishFailed naming the first problem."""
    name = f"{target.name}:{variant_tag(group.names[0], compression)}"
    wanted = next(iter(group.members.values())).arches
    missing = [arch for arch in wanted if arch not in group.members]
    if missing:
        raise PublishFailed(
            f"refusing to publish the multi-arch index {name}: no {', '.join(missing)} build manifest "
            f"(the {', '.join(missing)} job must build with --push and hand its manifest over)"
        )
    registry, repository = target.registry, target.ref.repository
    found = {}
    for arch, member in sorted(group.members.items()):
        where = f"{member.path.name} ({arch})"
        if target.name not in member.registries:
            raise PublishFailed(f"refusing {name}: {where} was pushed to {', '.join(member.registries)}, not {target.name}")
        digest = member.registries[target.name].get(compression)
        if digest is None:
            raise PublishFailed(f"refusing {name}: {where} was pushed to {target.name} without --compression {compression}")
        if not member.sbom.is_file():
            raise PublishFailed(f"refusing {name}: {where} has no SBOM beside it ({member.sbom.name})")
        manifest = registry.get_manifest(repository, digest)
        if manifest is None:
            raise PublishFailed(f"refusing {name}: {where} records {digest}, which {target.name} does not serve")
        if manifest.media_type not in IMAGE_MANIFESTS:
            raise PublishFailed(f"refusing {name}: {digest} is a {manifest.media_type}, not a per-arch image")
        config_digest = (manifest.json().get("config") or {}).get("digest")
        if config_digest != member.image_id:
            raise PublishFailed(f"refusing {name}: {digest} holds image {config_digest}, but {where} verified {member.image_id}")
        config = json.loads(registry.get_blob(repository, member.image_id) or b"{}")
        platform = f"{config.get('os')}/{config.get('architecture')}"
        if platform != f"linux/{DOCKER_ARCH[arch]}":
            raise PublishFailed(f"refusing {name}: {digest} is a {platform} image, but {where} says linux/{DOCKER_ARCH[arch]}")
        tag = variant_tag(arch_tag(group.names[0], arch), compression)
        tagged = registry.get_manifest(repository, tag)
        if tagged is not None and tagged.digest != digest:
            raise PublishFailed(
                f"refusing {name}: the tag {tag} names {tagged.digest}, not {digest} of {where} (another build was pushed since)"
            )
        found[arch] = manifest
    return found


@dataclass(frozen=True)
class IndexOutcome:
    names: tuple[str, ...]
    members: dict[str, str]  # arch -> digest (gzip; the same in every registry)
    indexes: dict[str, tuple[Published, ...]]  # registry -> its index tags (gzip, and zstd when asked); empty with --dry-run
    sboms: tuple[Attached, ...]

    @property
    def index(self) -> tuple[Published, ...]:
        first = next(iter(self.indexes.values()), ())
        return tuple(p for p in first if p.compression == "gzip")

    def describe(self) -> dict[str, Any]:
        return {
            "index": [p.describe() for p in self.index],
            "names": list(self.names),
            "members": dict(sorted(self.members.items())),
            "sboms": [a.describe() for a in self.sboms],
            "registries": [{"registry": name, "index": [p.describe() for p in index]} for name, index in self.indexes.items()],
        }


def publish_indexes(
    manifest_dir: Path,
    targets: list[RegistryRef],
    *,
    options: ShipOptions | None = None,
    dry_run: bool = False,
    say: Callable[[str], None] | None = None,
) -> list[IndexOutcome]:
    """Check every group's members in every registry, then (unless ``dry_run``) attach their SBOMs
    and publish each index under all its names, in every registry."""
    tell = say or (lambda _: None)
    options = options or ShipOptions()
    registries = [Target.of(ref) for ref in targets]
    groups = read_groups(manifest_dir)
    kinds = [c.name for c in options.compressions]
    # every check in every registry before any write
    checked = [(group, {(t.name, kind): check_group(t, group, kind) for t in registries for kind in kinds}) for group in groups]
    outcomes = []
    for group, found in checked:
        digests = {arch: m.digest for arch, m in found[(registries[0].name, "gzip")].items()}
        for target in registries:
            listed = ", ".join(f"{a} {d[:19]}" for a, d in sorted(digests.items()))
            tell(f"{target.name}:{group.names[0]}: {listed} checked in the registry")
        if dry_run:
            outcomes.append(IndexOutcome(group.names, digests, {}, ()))
            continue
        sboms: list[Attached] = []
        staged: list[StagedTag] = []  # every write by digest, in every registry, before any tag
        for target in registries:
            for kind in kinds:
                members = found[(target.name, kind)]
                form = options.form if kind == "gzip" else None
                for arch in sorted(members):
                    sbom = read_input_bytes(group.members[arch].sbom, "SBOM")
                    attached, tag = stage_sbom(target.registry, target.ref.repository, members[arch], sbom, form)
                    sboms.append(attached)
                    build = group.members[arch].build
                    _, tags = stage_trust(target.registry, target.ref.repository, members[arch].digest, build, options.signer, form)
                    staged += [*([tag] if tag is not None else []), *tags]
        staged_indexes = [
            stage_index(
                target,
                tuple(variant_tag(n, kind) for n in group.names),
                found[(target.name, kind)],
                options.form,
                kind,
                options.signer,
            )
            for target in registries
            for kind in kinds
        ]
        write_all(staged)
        indexes: dict[str, tuple[Published, ...]] = {}
        for staged_index in staged_indexes:
            index = tuple(staged_index.write())
            indexes[staged_index.target.name] = indexes.get(staged_index.target.name, ()) + index
            for p in index:
                tell(f"published index {p.ref}")
        outcomes.append(IndexOutcome(group.names, digests, indexes, tuple(sboms)))
    return outcomes
