"""The manifests ascendkit writes, in the media types a registry takes: image manifests, multi-arch
indexes and the SBOM attachment, each a deterministic function of its parts.

Three forms, as ``--media-types`` names them:

* default: Docker image manifests and manifest list (what ``docker push`` writes, which every
  registry and engine reads), the SBOM as an OCI 1.1 artifact whose ``subject`` is the image;
* ``docker``: nothing with an OCI media type, for registries that refuse them (some SWR, Harbor
  and mirror setups). The SBOM goes as a plain one-layer Docker image: its layer a tar of
  ``sbom.cdx.json``, its config naming the subject in a label. A registry that stores Docker
  images stores it, and every client reads it (skopeo refuses the form cosign writes with
  ``COSIGN_DOCKER_MEDIA_TYPES=1``, a Docker manifest whose layer is not a tar). It is found by the
  ``sha256-<hex>.sbom`` tag, as on any registry without the referrers API;
* ``oci``: OCI image manifests, index and the SBOM artifact.

zstd layers exist only as OCI media types (Docker's schema has no zstd layer), so a ``-zstd``
image is OCI whatever the form, and ``docker`` refuses zstd.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from typing import Any, Literal

from buildkit.arch import DOCKER_ARCH
from buildkit.errors import InputError, PublishFailed
from buildkit.image.sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE
from buildkit.ship.layers.compressing import Blob
from buildkit.ship.oci.registry import DOCKER_LIST, DOCKER_MANIFEST, IMAGE_MANIFESTS, OCI_INDEX, OCI_MANIFEST, Manifest, digest_of

Form = Literal["docker", "oci"] | None  # None: the default form
FORMS = ("docker", "oci")

DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
SUBJECT_LABEL = "io.ascendkit.sbom.subject"  # the Docker form's link from the SBOM to its image
# Every media type with an OCI name that ascendkit can write: what `--media-types docker` keeps out.
OCI_TYPES = frozenset({OCI_MANIFEST, OCI_INDEX, OCI_CONFIG, OCI_LAYER_GZIP, OCI_LAYER_ZSTD, OCI_EMPTY})
_TO_OCI = {DOCKER_MANIFEST: OCI_MANIFEST, DOCKER_LIST: OCI_INDEX, DOCKER_CONFIG: OCI_CONFIG, DOCKER_LAYER: OCI_LAYER_GZIP}
_TO_DOCKER = {oci: docker for docker, oci in _TO_OCI.items()}


def dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, indent=2, sort_keys=True).encode()


def image_form(form: Form, compression: str) -> Literal["docker", "oci"]:
    """The form of an image manifest: zstd is OCI; the default form's gzip images are Docker's."""
    if compression == "zstd":
        if form == "docker":
            raise InputError("--compression zstd needs OCI media types (Docker's manifest has no zstd layer): drop --media-types docker")
        return "oci"
    return form or "docker"


def image_manifest(config: Blob, layers: list[Blob], form: Form, compression: str) -> tuple[bytes, str]:
    """An image manifest over ``config`` and the compressed ``layers``, in ``form``."""
    oci = image_form(form, compression) == "oci"
    layer_type = OCI_LAYER_ZSTD if compression == "zstd" else OCI_LAYER_GZIP if oci else DOCKER_LAYER
    media_type = OCI_MANIFEST if oci else DOCKER_MANIFEST
    body = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {"mediaType": OCI_CONFIG if oci else DOCKER_CONFIG, "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": layer_type, "digest": b.digest, "size": b.size} for b in layers],
    }
    return dump(body), media_type


def index_manifest(members: dict[str, Manifest], form: Form, where: str) -> tuple[bytes, str]:
    """A multi-arch index with one entry per arch; the default form follows its members (an OCI
    index over OCI members, else a Docker manifest list)."""
    oci = form == "oci" or (form is None and all(m.media_type == OCI_MANIFEST for m in members.values()))
    wanted = OCI_MANIFEST if oci else DOCKER_MANIFEST
    for arch, member in sorted(members.items()):
        if form is not None and member.media_type != wanted:
            raise PublishFailed(
                f"refusing the {form} index {where}: its {arch} member {member.digest[:19]} is a {member.media_type} "
                f"(push the members with --media-types {form})"
            )
    entries = [
        {"mediaType": m.media_type, "digest": m.digest, "size": m.size, "platform": {"architecture": DOCKER_ARCH[arch], "os": "linux"}}
        for arch, m in sorted(members.items())
    ]
    media_type = OCI_INDEX if oci else DOCKER_LIST
    return dump({"schemaVersion": 2, "mediaType": media_type, "manifests": entries}), media_type


def descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data)}


SBOM_FILE = "sbom.cdx.json"  # the file the Docker form's layer holds


def _sbom_layer_tar(sbom: bytes) -> bytes:
    """A gzipped tar of one file, the SBOM, with nothing of the clock or the machine in it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(SBOM_FILE)
        info.size, info.mode, info.mtime = len(sbom), 0o644, 0
        tar.addfile(info, io.BytesIO(sbom))
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip, mtime 0
    return compressor.compress(raw.getvalue()) + compressor.flush()


def sbom_artifact(
    subject: Manifest, sbom: bytes, form: Form, platform: tuple[str, str] = ("amd64", "linux")
) -> tuple[bytes, str, list[bytes]]:
    """The SBOM's manifest for ``subject``, its media type and the blobs it references.

    The Docker form is a plain one-layer image, the only kind of manifest every registry and
    client takes (skopeo refuses a Docker manifest whose layer is not a tar): the layer is a tar of
    ``sbom.cdx.json``, the config names the subject in a label, ``platform`` is the subject's."""
    if form == "docker":
        layer = _sbom_layer_tar(sbom)
        config = dump(
            {
                "architecture": platform[0],
                "os": platform[1],
                "config": {"Labels": {SUBJECT_LABEL: subject.digest, "org.opencontainers.image.title": SBOM_FILE}},
                "rootfs": {"type": "layers", "diff_ids": [digest_of(gzip.decompress(layer))]},
                "history": [{"created_by": f"ascendkit: the SBOM of {subject.digest}"}],
            }
        )
        body = {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": descriptor(DOCKER_CONFIG, config),
            "layers": [descriptor(DOCKER_LAYER, layer)],
        }
        return dump(body), DOCKER_MANIFEST, [config, layer]
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SBOM_MEDIA_TYPE,
        "config": descriptor(OCI_EMPTY, EMPTY_CONFIG),
        "layers": [{**descriptor(SBOM_MEDIA_TYPE, sbom), "annotations": {"org.opencontainers.image.title": SBOM_FILE}}],
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
    }
    return dump(body), OCI_MANIFEST, [EMPTY_CONFIG, sbom]


def sbom_layer(manifest: Manifest, subject: str, config: bytes | None) -> str | None:
    """The digest of the layer holding the SBOM when ``manifest`` is the SBOM of image ``subject`` in
    either form (``config``: the Docker form's config, which names the subject); else None."""
    body = manifest.json()
    if manifest.media_type == OCI_MANIFEST and body.get("artifactType") == SBOM_MEDIA_TYPE:
        if (body.get("subject") or {}).get("digest") != subject:
            return None
        wanted = SBOM_MEDIA_TYPE
    elif manifest.media_type == DOCKER_MANIFEST and config is not None:
        labels = (json.loads(config).get("config") or {}).get("Labels") or {}
        if labels.get(SUBJECT_LABEL) != subject:
            return None
        wanted = DOCKER_LAYER
    else:
        return None
    layers = [layer for layer in body.get("layers", []) if layer.get("mediaType") == wanted]
    return str(layers[0]["digest"]) if len(layers) == 1 else None


def sbom_of_layer(manifest: Manifest, layer: bytes) -> bytes:
    """The SBOM in the layer :func:`sbom_layer` found: the blob itself, or the Docker form's file."""
    if manifest.media_type != DOCKER_MANIFEST:
        return layer
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer)), mode="r:") as tar:
            member = tar.extractfile(SBOM_FILE)
            if member is None:
                raise KeyError(SBOM_FILE)
            return member.read()
    except (OSError, EOFError, KeyError, tarfile.TarError) as exc:
        raise PublishFailed(f"{manifest.digest[:19]}: its layer holds no readable {SBOM_FILE} ({exc})") from None


def convert(manifest: Manifest, form: Literal["docker", "oci"], members: dict[str, Manifest] | None = None) -> tuple[bytes, str]:
    """``manifest`` (an image manifest, or an index whose members became ``members``: old digest ->
    new manifest) in ``form``'s media types; its own bytes when nothing changes."""
    table = _TO_OCI if form == "oci" else _TO_DOCKER
    body = manifest.json()
    new = json.loads(manifest.body)  # a deep copy to edit
    new["mediaType"] = table.get(manifest.media_type, manifest.media_type)
    if manifest.media_type in IMAGE_MANIFESTS:
        if form == "docker" and any(layer.get("mediaType") == OCI_LAYER_ZSTD for layer in new.get("layers", [])):
            raise InputError(f"{manifest.digest[:19]} has zstd layers, which Docker media types cannot name: keep OCI media types for it")
        for part in [new["config"], *new.get("layers", [])]:
            part["mediaType"] = table.get(part["mediaType"], part["mediaType"])
    else:
        for entry in new.get("manifests", []):
            member = (members or {}).get(entry["digest"])
            if member is not None:
                entry.update(mediaType=member.media_type, digest=member.digest, size=member.size)
    if form == "docker":  # Docker's schema has no annotations
        for part in [new, new.get("config") or {}, *new.get("layers", []), *new.get("manifests", [])]:
            part.pop("annotations", None)
    if new == body:
        return manifest.body, manifest.media_type
    return dump(new), str(new["mediaType"])
