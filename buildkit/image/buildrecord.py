"""The build record: ``manifests/<tag>.json``, what a build verified and, once pushed, where it went;
a typed, versioned model read in one place (:func:`read_record`) by everything after the build
(reuse of a verification, publish, ``publish --index-only``, provenance). Its JSON Schema is
``build_manifest.schema.json`` (``ascendkit render --all`` writes it; ``render --check`` guards it).

Version 1 is the form every ascendkit so far wrote (a file without ``schema_version`` is read as
1). Fields this version does not name are kept as they are (a newer ascendkit's, a user's note), so
reading and writing a record back loses nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from buildkit.errors import InputError
from buildkit.fsio import read_input_text, write_atomic

SCHEMA_VERSION = 1
RECORD_SCHEMA_FILE = "build_manifest.schema.json"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")

    def as_dict(self) -> dict[str, Any]:
        """As JSON data: what was read (unknown fields and nulls too) and what was set since, nothing
        added by a default, so a record read and written back is the same file but for the change."""
        return self.model_dump(mode="json", exclude_unset=True)


class RecordedImage(_Open):
    id: str = Field(description="The image's config digest: what was verified, whichever engine holds it.")
    engine_id: str = Field(
        default="",
        description="What the engine that built it calls it, where that is not the config digest "
        "(Docker's containerd image store names an image by its manifest's digest).",
    )
    tags: list[str] = Field(min_length=1, description="The local NAME:TAG references the build gave it, per arch.")
    architecture: str = ""


class RecordedEngine(_Open):
    """The engine a build ran on."""

    product: str = Field(description="Docker Engine or Podman.")
    version: str
    api_version: str
    image_store: str = Field(
        description="containerd (Docker's containerd image store), graph driver (Docker's classic store) or containers-storage (Podman)."
    )
    storage_driver: str = ""


class RecordedBuilder(_Open):
    """The builder a build ran with, and how much of the build its cache gave."""

    name: str = Field(description="buildkit (through buildx) or classic (the engine's legacy builder).")
    version: str = Field(description="buildx and BuildKit versions, or the engine's for the classic builder.")
    steps_total: int = Field(ge=0, description="Dockerfile steps that could come from cache (FROM does not count).")
    steps_cached: int = Field(ge=0, description="Of those, how many came from cache (local or the registry cache).")
    cache: str | None = Field(
        default=None, description="The registry cache imported (BuildKit), and exported with mode=max where cache_exported."
    )
    cache_exported: bool = Field(
        default=False, description="Whether this build exported its cache to the registry (not with --cache-import-only)."
    )


class RecordedVariant(_Open):
    digest: str
    sbom: dict[str, Any] | None = None


class RecordedRegistry(_Open):
    """One registry (HOST/REPO) the image was pushed to: the gzip digest, and each compression's."""

    digest: str
    sbom: dict[str, Any] | None = None
    media_types: str = "default"
    gzip: RecordedVariant | None = None
    zstd: RecordedVariant | None = None

    def digests(self) -> dict[str, str]:
        """compression name -> digest (gzip always: the record's own ``digest``)."""
        return {"gzip": self.digest, **{name: v.digest for name, v in (("gzip", self.gzip), ("zstd", self.zstd)) if v is not None}}


class RecordedPush(_Open):
    repository: str = ""  # the first registry (what older records named alone)
    digest: str
    sbom: dict[str, Any] | None = None
    registries: dict[str, RecordedRegistry] = Field(default_factory=dict)
    config: str = Field(
        default="",
        description="The published image's config digest where publishing normalized the image (its times clamped): "
        "the engine's is image.id, and `reproducible` says how the two differ. Empty: the same as image.id.",
    )
    reproducible: dict[str, Any] | None = Field(default=None, description="How the published image differs from the engine's.")

    def every_registry(self) -> dict[str, RecordedRegistry]:
        """Each registry with its digests; a record from before several registries names one."""
        return self.registries or {self.repository: RecordedRegistry(digest=self.digest, sbom=self.sbom)}


class BuildRecord(_Open):
    """What ``ascendkit build`` verified (and, after ``--push`` or ``publish``, where it went)."""

    schema_version: int = SCHEMA_VERSION
    image: RecordedImage
    passed: bool = Field(description="Every check passed: only then was the image tagged, and only then is it published.")
    stack: str = ""
    chip: str = ""
    skus: list[str] = Field(default_factory=list)
    os: str = ""
    arch: str = ""
    base_image: str = ""
    python: str = ""
    expected_sha256: str = ""
    checks: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    packages: list[dict[str, str]] = Field(default_factory=list)
    build: dict[str, Any] = Field(default_factory=dict, description="What the build ran from: provenance's parameters.")
    engine: RecordedEngine | None = Field(default=None, description="The engine the image was built and verified on.")
    builder: RecordedBuilder | None = Field(default=None, description="The builder that made the image (records before 0.x: none).")
    published: RecordedPush | None = None

    @property
    def arches(self) -> tuple[str, ...]:
        """Every arch of the stack (the multi-arch index's members), from the image's label."""
        return tuple(self.labels.get("io.ascendkit.arches", self.arch).split(","))

    def text(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"


def read_record(path: Path) -> BuildRecord:
    """The build record at ``path``; InputError naming the file and the field when it is not one."""
    text = read_input_text(path, "build manifest")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or "image" not in data:
        raise InputError(f"{path}: not an ascendkit build manifest (no image)")
    version = data.get("schema_version", 1)
    if version != SCHEMA_VERSION:
        raise InputError(f"{path}: a build manifest of schema_version {version!r}; this ascendkit reads version {SCHEMA_VERSION}")
    try:
        return BuildRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{path}: not an ascendkit build manifest: {field}: {first['msg']}") from None


def write_record(path: Path, record: BuildRecord) -> None:
    write_atomic(path, record.text())


def record_schema_text() -> str:
    return json.dumps(BuildRecord.model_json_schema(), indent=2, ensure_ascii=False) + "\n"
