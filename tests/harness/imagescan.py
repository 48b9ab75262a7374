"""What an image holds, read from the engine's own `docker save` in any engine's layout: every
layer file (decompressed where the store keeps it compressed), the config and the manifests."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import docker

from buildkit.ship.layers.compressors import StoredLayer


def _is_tar(content: bytes) -> bool:
    try:
        with tarfile.open(fileobj=io.BytesIO(content)):
            return True
    except tarfile.TarError:
        return False


def saved_entries(client: docker.APIClient, image_id: str) -> Iterator[tuple[str, str, bytes]]:
    """(archive member, path inside the layer or "" for a JSON member, content) for everything saved."""
    blob = b"".join(client.get_image(image_id))
    with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
        for member in outer.getmembers():
            data = outer.extractfile(member)
            if data is None:
                continue
            content = b"".join(iter(StoredLayer(data).read, b""))
            if member.name.endswith(".json") or content.startswith((b"{", b"[")) or not _is_tar(content):
                yield member.name, "", content
                continue
            with tarfile.open(fileobj=io.BytesIO(content)) as layer:
                for entry in layer.getmembers():
                    handle = layer.extractfile(entry) if entry.isfile() else None
                    yield member.name, f"{entry.name} {entry.linkname}".strip(), handle.read() if handle else b""


def scan_saved_image(client: docker.APIClient, image_id: str, needles: dict[str, bytes]) -> dict[str, list[str]]:
    """Every place (layer file or its name, config, manifest) where each needle occurs."""
    found: dict[str, list[str]] = {name: [] for name in needles}
    for member, entry, body in saved_entries(client, image_id):
        for name, needle in needles.items():
            if needle in body or needle in entry.encode():
                found[name].append(f"{member}:{entry}" if entry else member)
    return found
