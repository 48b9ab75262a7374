"""What publishing is asked to do (the options the command line and the API share) and what it
reports: where an image goes, in which forms, signed with which key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from buildkit.errors import InputError
from buildkit.imageref import RegistryRef
from buildkit.ship.layers.compose import Form, image_form
from buildkit.ship.layers.compressing import GZIP, PUBLISHED, Compression
from buildkit.ship.layers.compressors import compress_threads
from buildkit.ship.oci.registry import Registry
from buildkit.ship.oci.upload import chunk_size, parallel_uploads
from buildkit.trust.keys import Signer


@dataclass(frozen=True)
class ShipOptions:
    form: Form = None  # --media-types: None (the default), docker or oci
    compressions: tuple[Compression, ...] = (GZIP,)  # --compression zstd: (GZIP, ZSTD), zstd under <tag>-zstd
    signer: Signer | None = None  # --sign-key: sign every image and index, and the provenance
    lazy: str | None = None  # --lazy soci: a SOCI index beside the gzip image (buildkit/ship/lazy/soci.py)

    def __post_init__(self) -> None:
        for compression in self.compressions:
            image_form(self.form, compression.name)  # refuses docker + zstd before anything is contacted
        if self.lazy not in (None, "soci"):
            raise InputError(f"--lazy {self.lazy!r}: give soci (or leave it out)")
        if self.lazy and self.form == "docker":
            raise InputError(
                "--lazy soci with --media-types docker: a SOCI index is an OCI manifest, "
                "which a registry that refuses OCI media types refuses too"
            )

    def signed_by(self, signer: Signer | None) -> ShipOptions:
        """These options with ``signer`` (loaded once the rest of a request holds: it may prompt)."""
        return dataclasses.replace(self, signer=signer)


@dataclass(frozen=True)
class Target:
    ref: RegistryRef
    registry: Registry

    @classmethod
    def of(cls, ref: RegistryRef) -> Target:
        return cls(ref, Registry(ref.host))

    @property
    def name(self) -> str:
        return self.ref.name


@dataclass(frozen=True)
class Published:
    ref: str
    digest: str
    arch: str | None  # None for the multi-arch index
    compression: str = "gzip"

    def describe(self) -> dict[str, Any]:
        return {"ref": self.ref, "digest": self.digest, "arch": self.arch or "index", "compression": self.compression}


def ship_options(media_types: str | None, compression: str, signer: Signer | None = None, lazy: str | None = None) -> ShipOptions:
    """The options as the command line and the API spell them, checked before anything is contacted."""
    if media_types not in (None, "default", "docker", "oci"):
        raise InputError(f"media types {media_types!r}: give docker or oci (or leave it out for the default)")
    if compression not in PUBLISHED:
        raise InputError(f"compression {compression!r}: give {' or '.join(PUBLISHED)}")
    form: Form = None if media_types in (None, "default") else media_types  # type: ignore[assignment]
    return ShipOptions(form=form, compressions=PUBLISHED[compression], signer=signer, lazy=lazy)


def check_settings() -> None:
    """InputError (exit 2) for a shipping setting of the environment that is not a number in range
    (the upload's chunk and parallel uploads, the compressors' threads)."""
    chunk_size(), parallel_uploads(), compress_threads()
