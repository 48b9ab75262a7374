"""Checking an image by rebuilding it: its inputs recovered (the stack, SKU, arch and OS, the base
image by digest, each lock section by sha256, the epoch), held to what is at hand here, built again
with nothing cached, published beside it, and the two compared: the same digest, or each differing
file named (:mod:`.imagediff`).

A published image's inputs come from the provenance publishing attached to it. A local one's
(``NAME:TAG`` on this engine, not yet published) come from its build record in ``--manifest-dir``,
the very record its provenance would be made from; it is published to the scratch repository first,
as ``publish`` would publish it, so that both sides are compared in the form a node pulls. Its
record is left as it was (the scratch push is not a publication), and the rebuild is tagged and
recorded apart (``<repository>-rebuilt``, ``<manifest-dir>/rebuilt/``): the user's tag and record
stay on the original.

An image whose inputs cannot be recovered is refused before anything is built: no provenance (or no
build record), one with no epoch (built before images were reproducible), a stack this matrix does
not hold, a lock section that is not the one it was built from, a base image this engine does not
have at its digest.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker

from buildkit.errors import InputError, PublishFailed
from buildkit.image.archive import identify
from buildkit.image.build import run_build
from buildkit.image.buildplan import check_outputs, plan_build
from buildkit.image.buildrecord import read_record
from buildkit.image.progress import Reporter
from buildkit.imageref import IMAGE_REFERENCE, RegistryRef, registry_of, split_ref
from buildkit.matrix.load import LoadedMatrix
from buildkit.settings import Mirrors
from buildkit.ship.extended import extended_base
from buildkit.ship.imagediff import Difference, diff_images, read_published
from buildkit.ship.layers.compressors import ZSTD
from buildkit.ship.layers.local import LocalImage, load_local_image
from buildkit.ship.oci.registry import OCI_MANIFEST, Manifest
from buildkit.ship.publish import publish_image
from buildkit.ship.request import PushRequest, push_built, push_request
from buildkit.ship.trust.attach import member_digest
from buildkit.ship.trust.checks import check_registry_ref, registry_provenance, resolve
from buildkit.trust.provenance import statement as provenance_statement

ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"


@dataclass(frozen=True)
class RecordedInputs:
    """What an image was built from, as its provenance recorded it."""

    where: str  # HOST/REPO@sha256:... of the image (of one arch)
    stack: str
    hw: str
    arch: str
    os: str
    base_image: str
    base_digest: str
    base_from_registry: bool
    epoch: int
    locks: dict[str, str]  # path in the checkout -> sha256
    source: str  # the repository and commit it was built from, where known
    media_types: str  # how it was published: default (Docker) or oci
    compression: str  # gzip or zstd: its layers'
    builder: str = "auto"  # buildkit or classic, as it was built (their RUN lines, so their images, differ)

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.where,
            "stack": self.stack,
            "hw": self.hw,
            "arch": self.arch,
            "os": self.os,
            "base_image": f"{self.base_image}@{self.base_digest}",
            "source_date_epoch": self.epoch,
            "builder": self.builder,
            "locks": self.locks,
            "source": self.source,
        }


def recorded_parts(statement: dict[str, Any], where: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], str]:
    """What every rebuild reads first from an image's provenance: (its external parameters, its resolved dependencies,
    the base image's dependency, the source it was built from or ""); InputError when it records no epoch or no base by
    digest, which no rebuild can do without."""
    definition = (statement.get("predicate") or {}).get("buildDefinition") or {}
    params = definition.get("externalParameters") or {}
    reproducible = params.get("reproducible")
    if not isinstance(reproducible, dict) or not isinstance(reproducible.get("source_date_epoch"), int):
        raise InputError(
            f"{where}: its provenance records no epoch: it was built before ascendkit's images were reproducible (or not by "
            "ascendkit), so it cannot be rebuilt to the same digest; rebuild it with `ascendkit build` and publish it again"
        )
    dependencies = [d for d in definition.get("resolvedDependencies") or [] if isinstance(d, dict)]
    base = next((d for d in dependencies if d.get("name") == "base-image"), None)
    if base is None or not (base.get("digest") or {}).get("sha256"):
        raise InputError(f"{where}: its provenance names no base image by digest: its inputs cannot be recovered")
    return params, dependencies, base, next((str(d.get("uri", "")) for d in dependencies if d.get("name") == "source"), "")


def recorded_inputs(statement: dict[str, Any], where: str, manifest: Manifest | None) -> RecordedInputs:
    """The inputs ``statement`` (the image's SLSA provenance) records; InputError naming what is missing.
    ``manifest``: the published image's (how it was published), None for a local image (as `publish` would)."""
    params, dependencies, base, source = recorded_parts(statement, where)
    if isinstance(params.get("team"), dict):  # its inputs are the team repository's: buildkit.team.rebuild takes it
        raise InputError(f"{where}: a team image: it is rebuilt from its team file (`ascendkit rebuild` in the team's repository)")
    missing = [key for key in ("stack", "chip", "arch", "os") if not params.get(key)]
    if missing:
        raise InputError(f"{where}: its provenance does not record {', '.join(missing)}: its inputs cannot be recovered")
    locks = {
        str(d["name"]).removeprefix("lock:"): str((d.get("digest") or {}).get("sha256", ""))
        for d in dependencies
        if str(d.get("name", "")).startswith("lock:")
    }
    if not locks:
        raise InputError(f"{where}: its provenance names no lock sections: its inputs cannot be recovered")
    skus = params.get("skus") or []
    media_types, compression = publication(manifest)
    return RecordedInputs(
        where=where,
        stack=str(params["stack"]),
        hw=str(skus[0]) if skus else str(params["chip"]),
        arch=str(params["arch"]),
        os=str(params["os"]),
        base_image=str(base.get("uri", "")),
        base_digest="sha256:" + str(base["digest"]["sha256"]),
        base_from_registry=base.get("mediaType") is None,
        epoch=int(params["reproducible"]["source_date_epoch"]),
        locks=locks,
        source=source,
        media_types=media_types,
        compression=compression,
        builder=str(params.get("builder") or "auto"),
    )


def publication(manifest: Manifest | None) -> tuple[str, str]:
    """How ``manifest`` was published: its media types (default: Docker's; or oci), its layers' compression (gzip or
    zstd). A local image (None): as `publish` publishes by default."""
    body = manifest.json() if manifest is not None else {}
    layers = [str(layer.get("mediaType", "")) for layer in body.get("layers") or []]
    media_types = "oci" if manifest is not None and manifest.media_type == OCI_MANIFEST and ZSTD_LAYER not in layers else "default"
    return media_types, "zstd" if ZSTD_LAYER in layers else "gzip"


def team_params(statement: dict[str, Any]) -> dict[str, Any] | None:
    """The team section of a team image's provenance (buildkit.team), None for a reference image's."""
    definition = (statement.get("predicate") or {}).get("buildDefinition") or {}
    team = (definition.get("externalParameters") or {}).get("team")
    return team if isinstance(team, dict) else None


def check_inputs(inputs: RecordedInputs, loaded: LoadedMatrix) -> None:
    """The inputs at hand are the recorded ones: the stack is in this matrix, each lock section is the one built from."""
    at = f" (it was built from {inputs.source})" if inputs.source else ""
    if inputs.stack not in loaded.matrix.stacks:
        raise InputError(f"{inputs.where}: built from stack {inputs.stack!r}, which {loaded.path} does not hold{at}")
    for path, sha256 in sorted(inputs.locks.items()):
        local = loaded.root / path
        if not local.is_file():
            raise InputError(f"{inputs.where}: built from lock section {path}, which is not here{at}")
        if hashlib.sha256(local.read_bytes()).hexdigest() != sha256:
            raise InputError(f"{inputs.where}: {path} is not the lock section it was built from (sha256 {sha256[:12]}...){at}")


def check_base(client: docker.APIClient, inputs: RecordedInputs) -> None:
    """The base this engine has under the recorded name is the recorded one (a pulled base by its registry digest)."""
    try:
        inspect = client.inspect_image(inputs.base_image)
    except docker.errors.ImageNotFound:
        raise InputError(f"{inputs.where}: built on {inputs.base_image}@{inputs.base_digest}, which this engine does not have") from None
    known = {str(inspect.get("Id", "")), identify(client, inputs.base_image, inspect).config}
    known |= {str(d).partition("@")[2] for d in inspect.get("RepoDigests") or []}
    if inputs.base_digest not in known:
        raise InputError(
            f"{inputs.where}: built on {inputs.base_image}@{inputs.base_digest}, but this engine's {inputs.base_image} is another "
            f"image ({str(inspect.get('Id', ''))[:19]}): pull or load the recorded one"
        )


def is_local(ref: str) -> bool:
    """``ref`` names an image on this engine (``NAME[:TAG]``, no registry host), as Docker reads references."""
    return bool(IMAGE_REFERENCE.match(ref)) and registry_of(ref) is None and "@" not in ref


def check_request(ref: str, to: str) -> None:
    """IMAGE and --to checked before any engine or registry is contacted (exit 2 naming what is wrong)."""
    if not is_local(ref):
        check_registry_ref(ref)
    RegistryRef.parse(to, "--to")  # HOST[:PORT]/REPO, refused as `build --registry` refuses it, under its own name


@dataclass(frozen=True)
class LocalOriginal:
    """A local image to rebuild: as publishing reads it, and its provenance as publishing would write it."""

    image: LocalImage
    statement: dict[str, Any]
    where: str
    repository: str  # where the engine has it tagged: the rebuild is tagged beside it, in <repository>-rebuilt


def local_original(client: docker.APIClient, ref: str, manifest_dir: Path) -> LocalOriginal:
    """``ref`` on this engine with its build record; InputError when its inputs cannot be recovered."""
    try:
        image = load_local_image(client, ref, manifest_dir)
    except PublishFailed as exc:  # no record, or one of another image or of a failed verification
        raise InputError(f"{exc}: its inputs cannot be recovered (a local image is rebuilt from its build record)") from None
    assert image.manifest is not None
    record = read_record(image.manifest).as_dict()
    name = split_ref(ref)[0]
    where = f"{ref} ({image.image_id[:19]}) on this engine, recorded in {image.manifest}"
    return LocalOriginal(image, provenance_statement(name, image.image_id, record), where, name)


def _publish_original(
    client: docker.APIClient, original: LocalOriginal, push: PushRequest, say: Callable[[str], None] | None
) -> dict[str, str]:
    """The local original published to the scratch repository (each compression's digest), from a copy
    of its record and SBOM: the user's record does not count a scratch push as a publication."""
    assert original.image.manifest is not None
    with tempfile.TemporaryDirectory(prefix="ascendkit-rebuild-") as tmp:
        copied = Path(tmp) / original.image.manifest.name
        shutil.copy2(original.image.manifest, copied)
        if original.image.sbom is not None and original.image.sbom.is_file():
            shutil.copy2(original.image.sbom, Path(tmp) / original.image.sbom.name)
        image = replace(original.image, manifest=copied)
        outcome = publish_image(client, image, list(push.targets), want_index=False, require_index=False, options=push.options, say=say)
    return {p.compression: p.digest for p in next(iter(outcome.registries.values()))}


@dataclass(frozen=True)
class Original:
    """The image to rebuild: its provenance, and where it is (a published one's manifest, or a local one)."""

    statement: dict[str, Any]
    where: str
    manifest: Manifest | None  # the published image's (one arch's), None for a local one
    local: LocalOriginal | None
    tag: str = ""  # the published image's tag, as given: its zstd variant is published beside it

    @property
    def arch(self) -> str:
        return str(((self.statement.get("predicate") or {}).get("buildDefinition") or {}).get("externalParameters", {}).get("arch") or "")


def read_original(client: docker.APIClient, ref: str, arch: str | None, manifest_dir: Path) -> Original:
    """``ref``'s provenance: a local image's from its build record, a published one's as attached (``arch``: its member)."""
    if is_local(ref):
        local = local_original(client, ref, manifest_dir)
        return Original(local.statement, local.where, None, local)
    statement, where = _provenance_of(ref, arch)
    manifest = resolve(where)[2]
    return Original(statement, where, manifest, None, split_ref(ref)[1] or "")


@dataclass(frozen=True)
class RebuildOutcome:
    inputs: dict[str, Any]  # what the image was built from, as its provenance records it
    original: str  # HOST/REPO@digest
    rebuilt: str  # HOST/REPO@digest
    zstd: tuple[str, str] | None  # the zstd variants' digests (original, rebuilt), where both were published
    differences: list[Difference]
    build: dict[str, Any]  # the rebuild, described

    @property
    def same(self) -> bool:
        return self.original.rpartition("@")[2] == self.rebuilt.rpartition("@")[2]

    def describe(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "original": self.original,
            "rebuilt": self.rebuilt,
            "zstd": list(self.zstd) if self.zstd else None,
            "inputs": self.inputs,
            "differences": [d.as_dict() for d in self.differences],
            "build": self.build,
        }


def scratch_push(to: str, media_types: str) -> PushRequest:
    """Where the rebuild (and a local original) goes: ``to``, in the original's media types, zstd beside, no index."""
    push = push_request([to], push=True, index=False, media_types=None if media_types == "default" else "oci", compression="zstd")
    assert push is not None
    return push


def compare(
    client: docker.APIClient,
    original: Original,
    push: PushRequest,
    rebuilt: dict[str, str],
    compression: str,
    say: Callable[[str], None] | None = None,
) -> tuple[str, str, tuple[str, str] | None, list[Difference]]:
    """The original beside the rebuild (``rebuilt``: its digest per compression, published to ``push``'s target): a local
    original published there first, as `publish` would publish it. (original, rebuilt, the zstd variants' digests where
    both are published, what differs)."""
    target, zstd = push.targets[0].name, None
    compared = f"{target}@{rebuilt[compression]}"
    if original.local is not None:
        published = _publish_original(client, original.local, push, say)
        first, zstd = f"{target}@{published[compression]}", (published["zstd"], rebuilt["zstd"])
    else:
        assert original.manifest is not None
        first = original.where
        if compression == "gzip" and original.tag:  # the zstd variant published beside it, where there is one
            registry, repository, _ = resolve(original.where)
            other = registry.get_manifest(repository, ZSTD.tag(original.tag))
            if other is not None:
                zstd = (member_digest(other, original.arch, f"{registry.host}/{repository}:{ZSTD.tag(original.tag)}"), rebuilt["zstd"])
    same = first.rpartition("@")[2] == rebuilt[compression]
    differences = [] if same else diff_images(read_published(first, original.arch), read_published(compared, original.arch))
    return first, compared, zstd, differences


def _provenance_of(ref: str, arch: str | None) -> tuple[dict[str, Any], str]:
    """The provenance ``rebuild`` starts from; an image without one that extends a published image says which."""
    try:
        return registry_provenance(ref, arch)
    except InputError as exc:
        if "no SLSA provenance" not in str(exc):
            raise
        extends = extended_base(ref, arch)
        if extends is None:
            raise
        raise InputError(f"{exc}: it is not an image ascendkit published; {extends}") from None


def rebuild(
    client: docker.APIClient,
    loaded: LoadedMatrix,
    original: Original,
    to: str,
    *,
    manifest_dir: Path = Path("manifests"),
    mirrors: Mirrors | None = None,
    reporter: Reporter | None = None,
    say: Callable[[str], None] | None = None,
) -> RebuildOutcome:
    """A reference image (``original``, :func:`read_original`) rebuilt from its recorded inputs with nothing cached,
    published to ``to`` as it was published (its media types, its compression) and compared. A local original (see the
    module's word) is published to ``to`` first, as `publish` would publish it."""
    local = original.local
    inputs = recorded_inputs(original.statement, original.where, original.manifest)
    check_inputs(inputs, loaded)
    check_base(client, inputs)
    push = scratch_push(to, inputs.media_types)
    plan = plan_build(
        loaded, inputs.hw, stack=inputs.stack, os_name=inputs.os, arch=inputs.arch, base_image=inputs.base_image,
        mirrors=mirrors, no_cache=True, builder=inputs.builder,
        manifest_dir=manifest_dir / "rebuilt" if local else manifest_dir, repository=f"{local.repository}-rebuilt" if local else None,
    )  # fmt: skip
    check_outputs(plan)
    result = run_build(client, plan, reporter)
    outcome = push_built(client, loaded, plan, result, push, say=say)
    rebuilt = {p.compression: p.digest for p in next(iter(outcome.registries.values()))}
    first, compared, zstd, differences = compare(client, original, push, rebuilt, inputs.compression, say)
    return RebuildOutcome(inputs.describe(), first, compared, zstd, differences, result.describe())
