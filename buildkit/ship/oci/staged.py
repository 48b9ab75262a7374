"""Tags written last: a manifest goes to the registry by digest first, and its tag is held back as a
:class:`StagedTag` until every registry of the run holds everything by digest.

A publish to several registries, or one that attaches an SBOM, a signature and provenance, writes
many manifests; on a registry without the referrers API each attachment also needs a tag
(``sha256-<hex>.sbom``, ``.sig``, ``.att``). Staging makes one rule hold for all of them: when any
write by digest fails, in any registry, no tag of any kind has been written anywhere. Only the tag
writes themselves (a manifest the registry already holds, named again) come after that point.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from buildkit.errors import PublishFailed
from buildkit.ship.oci.registry import Registry, digest_of


@dataclass(frozen=True)
class StagedTag:
    """``tag`` of ``repository`` to name ``body``, which the registry already holds by digest."""

    registry: Registry
    repository: str
    tag: str
    body: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return digest_of(self.body)

    @property
    def where(self) -> str:
        return f"{self.registry.host}/{self.repository}:{self.tag}"

    def write(self) -> str:
        """Write the tag and read it back; the digest it names."""
        digest = self.registry.put_manifest(self.repository, self.tag, self.body, self.media_type)
        back = self.registry.get_manifest(self.repository, self.tag)
        if back is None or back.digest != digest:
            raise PublishFailed(f"{self.where}: the registry serves {back.digest if back else 'nothing'}, not the pushed {digest}")
        return digest


def stage(registry: Registry, repository: str, tag: str, body: bytes, media_type: str) -> StagedTag:
    """Put ``body`` by digest now; its ``tag`` comes later (:meth:`StagedTag.write`)."""
    registry.put_manifest(repository, digest_of(body), body, media_type)
    return StagedTag(registry, repository, tag, body, media_type)


def commit(digest: str, staged: StagedTag | None) -> str:
    """``digest``, after writing its staged tag where there is one (for a single write that needs no staging)."""
    if staged is not None:
        staged.write()
    return digest


def write_all(staged: Iterable[StagedTag]) -> list[str]:
    """Every staged tag, in order, each read back; the digests they name."""
    return [s.write() for s in staged]
