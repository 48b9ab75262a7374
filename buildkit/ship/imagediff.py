"""Two published images compared file by file, as diffoci does: which layer, which file, and what
differs (content, mtime, mode, owner, link target, kind, or a file on one side only), and the config
field by field. What ``ascendkit diff`` prints and ``rebuild`` reports when a rebuild does not match.

Layers are read from the registry as they stream (decompressed on the way, never stored whole), one
image's layer beside the other's at the same position; a file's content is compared by its sha256.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from buildkit.errors import InputError, PublishFailed
from buildkit.imageref import registry_of, split_ref
from buildkit.ship.layers.compressors import BLOCK, StoredLayer
from buildkit.ship.oci.registry import Manifest, Registry
from buildkit.ship.trust.attach import member_digest

# The config fields compared (rootfs is the layers, compared file by file instead); created and history
# differ between builds at other moments unless publishing normalized them.
CONFIG_FIELDS = ("architecture", "os", "config", "rootfs", "history", "created")


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    owner: str
    mtime: int
    size: int
    link: str
    sha256: str


@dataclass(frozen=True)
class Difference:
    layer: int  # 1-based position; 0 for the config, -1 for the layer count
    path: str
    what: str  # content, mtime, mode, owner, link, kind, only in A, only in B, a config field, layers
    a: str = ""
    b: str = ""

    def line(self) -> str:
        where = "config" if self.layer == 0 else "layers" if self.layer < 0 else f"layer {self.layer}"
        detail = f": {self.a} != {self.b}" if self.a or self.b else ""
        return f"{where}: {self.path}: {self.what}{detail}" if self.path else f"{where}: {self.what}{detail}"

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "path": self.path, "what": self.what, "a": self.a, "b": self.b}


@dataclass
class Published:
    """One image (one platform) as a registry serves it."""

    ref: str
    registry: Registry
    repository: str
    manifest: Manifest
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[dict[str, Any]]:
        return list(self.manifest.json().get("layers") or [])


_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}


def check_ref(ref: str) -> tuple[str, str]:
    """(host, repository) of a published image's reference; refused, with no contact, when it names no registry."""
    where = registry_of(ref)
    if where is None:
        raise InputError(f"{ref}: not a registry reference (HOST[:PORT]/REPO[:TAG][@sha256:...]): a published image is compared")
    return where


def read_published(ref: str, arch: str | None) -> Published:
    """``HOST[:PORT]/REPO[:TAG][@DIGEST]`` as its registry serves it; of an index, its ``arch`` image."""
    host, repository = check_ref(ref)
    _, tag, digest = split_ref(ref)
    registry = Registry(host)
    manifest = registry.get_manifest(repository, digest or tag or "latest")
    if manifest is None:
        raise InputError(f"{ref}: the registry {host} has no such image")
    if manifest.is_index:  # its arch's image (member_digest refuses an index without --arch, or without that arch)
        digest = member_digest(manifest, arch, ref)
        member = registry.get_manifest(repository, digest)
        if member is None:
            raise PublishFailed(f"{ref}: the index names {digest}, which the registry does not serve")
        manifest = member
    config_digest = (manifest.json().get("config") or {}).get("digest")
    body = registry.get_blob(repository, str(config_digest)) if config_digest else None
    if body is None:
        raise PublishFailed(f"{ref}: the registry does not serve its config {config_digest}")
    return Published(ref, registry, repository, manifest, json.loads(body))


def _entries(stream: IO[bytes]) -> Iterator[tuple[str, Entry]]:
    layer = StoredLayer(stream)  # gzip, zstd or a plain tar, told by its first bytes
    with tarfile.open(fileobj=layer.reader, mode="r|") as archive:
        for member in archive:
            sha = ""
            if member.isfile():
                source = archive.extractfile(member)
                digest = hashlib.sha256()
                while source is not None and (chunk := source.read(BLOCK)):
                    digest.update(chunk)
                sha = digest.hexdigest()
            kind = _KINDS.get(member.type, f"type {member.type.decode(errors='replace')}")
            entry = Entry(kind, member.mode, f"{member.uid}:{member.gid}", int(member.mtime), member.size, member.linkname, sha)
            yield member.name.rstrip("/"), entry


def layer_files(image: Published, position: int) -> dict[str, Entry]:
    """The entries of the image's layer at ``position`` (0-based), read from the registry."""
    descriptor = image.layers[position]
    response = image.registry.open_blob(image.repository, str(descriptor["digest"]))
    try:
        return dict(_entries(cast(IO[bytes], response.raw)))
    except (tarfile.TarError, ValueError, EOFError, OSError) as exc:
        raise PublishFailed(f"{image.ref}: layer {position + 1} ({descriptor['digest']}) is unreadable: {exc}") from None
    finally:
        response.close()


def _compare_entries(position: int, a: dict[str, Entry], b: dict[str, Entry]) -> list[Difference]:
    found = []
    for path in sorted(set(a) | set(b)):
        left, right = a.get(path), b.get(path)
        if left is None or right is None:
            found.append(Difference(position, path, "only in A" if right is None else "only in B"))
            continue
        for what, x, y in (
            ("kind", left.kind, right.kind),
            ("content", left.sha256, right.sha256),
            ("link", left.link, right.link),
            ("mode", oct(left.mode), oct(right.mode)),
            ("owner", left.owner, right.owner),
            ("mtime", str(left.mtime), str(right.mtime)),
        ):
            if x != y:
                found.append(Difference(position, path, what, x[:19] if what == "content" else x, y[:19] if what == "content" else y))
    return found


def diff_images(a: Published, b: Published) -> list[Difference]:
    """Every difference between two published images: each layer whose digest differs read file by file."""
    found: list[Difference] = []
    for key in CONFIG_FIELDS:
        left, right = a.config.get(key), b.config.get(key)
        if key == "rootfs" or left == right:
            continue
        if isinstance(left, dict) and isinstance(right, dict):
            for sub in sorted(set(left) | set(right)):
                if left.get(sub) != right.get(sub):
                    shown = json.dumps(left.get(sub))[:80], json.dumps(right.get(sub))[:80]
                    found.append(Difference(0, f"{key}.{sub}", "differs", *shown))
        else:
            found.append(Difference(0, key, "differs", json.dumps(left)[:80], json.dumps(right)[:80]))
    if len(a.layers) != len(b.layers):
        found.append(Difference(-1, "", "layer count", str(len(a.layers)), str(len(b.layers))))
    for position, (left, right) in enumerate(zip(a.layers, b.layers, strict=False)):
        if left.get("digest") == right.get("digest"):
            continue
        before = len(found)
        found += _compare_entries(position + 1, layer_files(a, position), layer_files(b, position))
        if len(found) == before:  # the same files, other bytes: the tar headers (a field no entry shows) or the compression
            what = "the same files, other bytes (tar headers or compression)"
            found.append(Difference(position + 1, "", what, left["digest"][:19], right["digest"][:19]))
    if not found and a.manifest.digest != b.manifest.digest:  # the same config and layers: the manifest's own fields
        found.append(Difference(-1, "", "the manifest (media types or annotations)", a.manifest.media_type, b.manifest.media_type))
    return found
