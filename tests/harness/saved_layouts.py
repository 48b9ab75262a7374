"""`docker save` archives in each engine's layout, made here from one image (its config and layers),
as the engines' sources and the archives seen from Docker 20.10, Docker 26.1.5 on overlay2 and on the
containerd image store, and Podman 4.3 write them (docs/engines.md): what the export and the
identity lookup are tested on without an engine, beside the docker tests that read the real ones.

An engine serves them the way docker-py is asked for them (:class:`SavingEngine`): the answer of
``GET /images/{id}/get``, in chunks of a chosen size, that the reader may close early.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

import zstandard


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None, *, sort: bool = False) -> bytes:
    """A tar of ``files`` (name -> bytes) and symlinks (name -> target), in order or sorted by name."""
    entries: list[tuple[str, bytes | None, str]] = [(n, d, "") for n, d in files.items()]
    entries += [(n, None, t) for n, t in (links or {}).items()]
    if sort:
        entries.sort(key=lambda e: e[0])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data, target in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def members_of(archive: bytes) -> dict[str, bytes]:
    """The regular files of a tar, name -> bytes (links left out), in order."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            source = tar.extractfile(member) if member.isfile() else None
            if source is not None:
                members[member.name] = source.read()
    return members


@dataclass(frozen=True)
class Image:
    """An image as an engine holds it: its config and its layers (each a tar), in order."""

    layers: tuple[bytes, ...]
    config: bytes

    @classmethod
    def of(cls, layers: list[bytes], arch: str = "amd64") -> Image:
        config = {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": [digest(x) for x in layers]}}
        return cls(tuple(layers), json.dumps(config).encode())

    @property
    def config_digest(self) -> str:
        return digest(self.config)

    @property
    def diff_ids(self) -> list[str]:
        return [digest(x) for x in self.layers]


def classic(image: Image) -> bytes:
    """Docker before 25: a directory per layer (named by a v1 id), its ``json`` naming the layer below as its
    parent (the first layer's names none); a layer met again a symlink to the first."""
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    paths: list[str] = []
    first: dict[str, str] = {}
    parent = ""
    for i, layer in enumerate(image.layers):
        directory = hashlib.sha256(f"legacy-{i}".encode()).hexdigest()
        if digest(layer) in first:
            links[f"{directory}/layer.tar"] = f"../{first[digest(layer)]}/layer.tar"
        else:
            first[digest(layer)] = directory
            files[f"{directory}/layer.tar"] = layer
        files[f"{directory}/VERSION"] = b"1.0"
        v1 = {"id": directory, **({"parent": parent} if parent else {}), "created": "1970-01-01T00:00:00Z", "os": "linux"}
        files[f"{directory}/json"] = json.dumps(v1).encode()
        parent = directory
        paths.append(f"{directory}/layer.tar")
    files[f"{image.config_digest[7:]}.json"] = image.config
    manifest = [{"Config": f"{image.config_digest[7:]}.json", "RepoTags": ["x/y:z"], "Layers": paths}]
    files["manifest.json"] = json.dumps(manifest).encode()
    files["repositories"] = b"{}"
    return tar_of(files, links, sort=True)


def _oci(image: Image, blobs: dict[str, bytes], layer_digests: list[str], index: dict[str, object]) -> bytes:
    files = {f"blobs/sha256/{d[7:]}": b for d, b in blobs.items()}
    files["index.json"] = json.dumps(index).encode()
    files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
    manifest = [
        {"Config": f"blobs/sha256/{image.config_digest[7:]}", "RepoTags": None, "Layers": [f"blobs/sha256/{d[7:]}" for d in layer_digests]}
    ]
    files["manifest.json"] = json.dumps(manifest).encode()
    return tar_of(files, sort=True)  # containerd's exporter and moby's write members in name order


def overlay2_oci(image: Image) -> bytes:
    """Docker 25+ on a graph driver: an OCI layout, the layers uncompressed and named by DiffID."""
    layers = {digest(x): x for x in image.layers}
    manifest = _manifest(image, [(digest(x), len(x), "application/vnd.oci.image.layer.v1.tar") for x in image.layers])
    blobs = {**layers, image.config_digest: image.config, digest(manifest): manifest}
    index = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest)}],
    }
    return _oci(image, blobs, [digest(x) for x in image.layers], index)


def _manifest(image: Image, layers: list[tuple[str, int, str]]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": image.config_digest, "size": len(image.config)},
            "layers": [{"mediaType": m, "digest": d, "size": s} for d, s, m in layers],
        }
    ).encode()


def compressed(layer: bytes, how: str) -> bytes:
    """``layer`` as the containerd store keeps it: gzip in two members, or zstd in two frames (what
    other writers than ours produce, and what the reader must take as one stream)."""
    half = len(layer) // 2
    if how == "gzip":
        return gzip.compress(layer[:half], mtime=0) + gzip.compress(layer[half:], mtime=0)
    if how == "zstd":
        zstd = zstandard.ZstdCompressor(level=3)
        return zstd.compress(layer[:half]) + zstd.compress(layer[half:])
    return layer


@dataclass(frozen=True)
class ContainerdSave:
    archive: bytes
    engine_id: str  # the index digest the containerd store names the image by
    stored: dict[str, str]  # stored digest -> DiffID


def containerd(image: Image, how: str = "gzip", *, attestation: bool = True) -> ContainerdSave:
    """Docker's containerd image store: the blobs as stored (compressed), named by their own digest;
    the image named by an index that holds its manifest and, as BuildKit writes it, an attestation."""
    media = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip", "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}[how]
    stored = [compressed(x, how) for x in image.layers]
    manifest = _manifest(image, [(digest(s), len(s), media) for s in stored])
    blobs = {digest(s): s for s in stored} | {image.config_digest: image.config, digest(manifest): manifest}
    entries: list[dict[str, object]] = [
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest),
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
        }
    ]
    if attestation:
        statement = b'{"_type":"https://in-toto.io/Statement/v0.1"}'
        att_config = b'{"architecture":"unknown","os":"unknown","rootfs":{"type":"layers","diff_ids":[]}}'
        att = json.dumps(
            {
                "schemaVersion": 2,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(att_config), "size": len(att_config)},
                "layers": [{"mediaType": "application/vnd.in-toto+json", "digest": digest(statement), "size": len(statement)}],
            }
        ).encode()
        blobs |= {digest(att): att, digest(att_config): att_config, digest(statement): statement}
        entries.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest(att),
                "size": len(att),
                "platform": {"architecture": "unknown", "os": "unknown"},
                "annotations": {"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": digest(manifest)},
            }
        )
    inner = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}).encode()
    blobs[digest(inner)] = inner
    outer = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest(inner), "size": len(inner)}],
    }
    archive = _oci(image, blobs, [digest(s) for s in stored], outer)
    return ContainerdSave(archive, digest(inner), {digest(s): digest(x) for s, x in zip(stored, image.layers, strict=True)})


def podman(image: Image) -> bytes:
    """Podman's docker-archive: ``<DiffID hex>.tar``, a legacy directory per layer whose layer.tar is a symlink to it."""
    files: dict[str, bytes] = {f"{digest(x)[7:]}.tar": x for x in image.layers}
    links = {}
    for i, layer in enumerate(image.layers):
        directory = hashlib.sha256(f"podman-{i}".encode()).hexdigest()
        links[f"{directory}/layer.tar"] = f"../{digest(layer)[7:]}.tar"
        files[f"{directory}/json"] = b"{}"
        files[f"{directory}/VERSION"] = b"1.0"
    files[f"{image.config_digest[7:]}.json"] = image.config
    manifest = [
        {
            "Config": f"{image.config_digest[7:]}.json",
            "RepoTags": ["localhost/x:y"],
            "Layers": [f"{digest(x)[7:]}.tar" for x in image.layers],
        }
    ]
    files["manifest.json"] = json.dumps(manifest).encode()
    files["repositories"] = b"{}"
    return tar_of(files, links)


class _Answer:
    def __init__(self, engine: SavingEngine) -> None:
        self.engine = engine
        self.status_code, self.reason, self.text = 200, "OK", ""
        self.closed = False

    def iter_content(self, chunk_size: int) -> Iterator[bytes]:
        del chunk_size  # the engine's own chunk size: tests vary it
        yield from self.engine.chunks()

    def close(self) -> None:
        self.closed = True
        self.engine.closed += 1


class SavingEngine:
    """What ``buildkit.image.stream.saved`` asks of an engine: ``GET /images/{id}/get``, answered with
    ``archive`` in chunks of ``chunk`` bytes; counts the exports, the bytes sent and the answers closed."""

    base_url = "http+docker://localhost"
    api_version = "1.45"

    def __init__(self, archive: bytes, chunk: int, engine_id: str) -> None:
        self.archive, self.chunk, self.engine_id = archive, chunk, engine_id
        self.exports = self.sent = self.closed = 0

    def get(self, url: str, stream: bool = False) -> _Answer:
        assert stream and url.endswith("/images/" + self.engine_id.replace(":", "%3A") + "/get"), url
        self.exports += 1
        return _Answer(self)

    def chunks(self) -> Iterator[bytes]:
        for start in range(0, len(self.archive), self.chunk):
            piece = self.archive[start : start + self.chunk]
            self.sent += len(piece)
            yield piece
