"""An image without ascendkit's provenance that is an image ascendkit published with layers added on top (a
``FROM ours`` plus ``RUN pip install``, say): which published image and digest it extends, for ``rebuild``'s refusal."""

from __future__ import annotations

from buildkit.errors import InputError, PublishFailed
from buildkit.imageref import registry_of
from buildkit.ship.imagediff import read_published
from buildkit.ship.trust.checks import registry_provenance


def extended_base(ref: str, arch: str | None) -> str | None:
    """Where an image without provenance is an image ascendkit published with layers added on top: the sentence that
    says which published image and digest it extends, how many layers were added and how to see them; else None.

    The candidates are the tags ascendkit publishes the image its labels name under (a ``FROM`` keeps the labels),
    in the image's own repository; one extends it when its DiffIDs are the first ones of the image's and that one
    carries ascendkit's provenance."""
    try:
        copy = read_published(ref, arch)
    except (InputError, PublishFailed):
        return None
    labels = (copy.config.get("config") or {}).get("Labels") or {}
    version = labels.get("org.opencontainers.image.version")
    host, repository = registry_of(ref) or ("", "")
    if not version or labels.get("org.opencontainers.image.vendor") != "ascendkit" or not host:
        return None
    ours = list((copy.config.get("rootfs") or {}).get("diff_ids") or [])
    machine = str(copy.config.get("architecture", ""))
    arches = {"amd64": "x86_64", "arm64": "aarch64"}
    for tag in (f"{version}-{arches.get(machine, machine)}", version):
        candidate = f"{host}/{repository}:{tag}"
        try:
            base = read_published(candidate, arch or arches.get(machine))
        except (InputError, PublishFailed):
            continue
        theirs = list((base.config.get("rootfs") or {}).get("diff_ids") or [])
        if not theirs or len(theirs) >= len(ours) or ours[: len(theirs)] != theirs:
            continue
        try:
            registry_provenance(f"{host}/{repository}@{base.manifest.digest}", arch)
        except (InputError, PublishFailed):
            continue
        added = len(ours) - len(theirs)
        return (
            f"its lower {len(theirs)} layers are {candidate} ({base.manifest.digest}), which ascendkit published, and "
            f"{added} layer(s) were added on top; what they hold: ascendkit diff {host}/{repository}@{base.manifest.digest} "
            f"{host}/{repository}@{copy.manifest.digest}"
        )
    return None
