"""Signatures and attestations in a registry, where cosign puts them: beside manifest ``sha256:<hex>``,
an image manifest under the tag ``sha256-<hex>.sig`` whose layers are simple-signing payloads (the
signature in the ``dev.cosignproject.cosign/signature`` annotation), and one under
``sha256-<hex>.att`` whose layers are DSSE envelopes (``predicateType`` annotated).

A new signature is added to those already there (another key's, or skopeo's, stay); signing again
with the same key changes nothing, since the signature is deterministic. An attestation replaces
the one of the same predicate type. In the Docker form (``--media-types docker``) the attachment
is a Docker manifest, as cosign writes it with ``COSIGN_DOCKER_MEDIA_TYPES``; containers/image
(skopeo, podman) reads the OCI form only.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from buildkit.errors import PublishFailed
from buildkit.ship.layers.compose import DOCKER_CONFIG, OCI_CONFIG, Form, descriptor, dump
from buildkit.ship.oci.registry import DOCKER_MANIFEST, OCI_MANIFEST, Manifest, Registry, digest_of
from buildkit.ship.oci.staged import StagedTag, commit, stage
from buildkit.ship.trust.attach import fallback_tag
from buildkit.trust.envelope import DSSE_ENVELOPE, SIGNATURE_ANNOTATION, SIMPLE_SIGNING, simple_signing_payload
from buildkit.trust.keys import Signer

PREDICATE_ANNOTATION = "predicateType"


@dataclass(frozen=True)
class Layer:
    media_type: str
    data: bytes
    annotations: dict[str, str]

    def descriptor(self) -> dict[str, Any]:
        return {**descriptor(self.media_type, self.data), "annotations": dict(sorted(self.annotations.items()))}


def _attachment(layers: list[dict[str, Any]], form: Form) -> tuple[bytes, str, bytes]:
    """An attachment manifest over layer descriptors: (body, media type, config), a config like cosign's."""
    config = dump(
        {
            "architecture": "",
            "config": {},
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [str(layer["digest"]) for layer in layers]},
        }
    )
    media_type, config_type = (DOCKER_MANIFEST, DOCKER_CONFIG) if form == "docker" else (OCI_MANIFEST, OCI_CONFIG)
    body = {"schemaVersion": 2, "mediaType": media_type, "config": descriptor(config_type, config), "layers": layers}
    return dump(body), media_type, config


def _existing_layers(registry: Registry, repository: str, tag: str) -> list[dict[str, Any]]:
    manifest = registry.get_manifest(repository, tag)
    if manifest is None or manifest.is_index:
        return []
    return [layer for layer in manifest.json().get("layers", []) if isinstance(layer, dict)]


def _stage(
    registry: Registry, repository: str, subject: str, kind: str, layer: Layer, keep: list[dict[str, Any]], form: Form
) -> tuple[str, StagedTag | None]:
    """The attachment manifest by digest, its blobs first; its tag staged (None: the tag already names it)."""
    layers = [*keep, layer.descriptor()]
    body, media_type, config = _attachment(layers, form)
    tag = fallback_tag(subject, kind)
    current = registry.get_manifest(repository, tag)
    if current is not None and current.body == body:
        return current.digest, None
    registry.put_blob(repository, config)
    registry.put_blob(repository, layer.data)
    return digest_of(body), stage(registry, repository, tag, body, media_type)


def stage_signature(registry: Registry, repository: str, subject: str, signer: Signer, form: Form = None) -> tuple[str, StagedTag | None]:
    """The signature of manifest ``subject`` (named as ``registry.host/repository``) by digest, its ``.sig`` tag staged."""
    payload = simple_signing_payload(f"{registry.host}/{repository}", subject)
    signature = base64.b64encode(signer.sign(payload)).decode()
    layer = Layer(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: signature})
    existing = _existing_layers(registry, repository, fallback_tag(subject, "sig"))
    return _stage(registry, repository, subject, "sig", layer, [d for d in existing if d != layer.descriptor()], form)


def sign_digest(registry: Registry, repository: str, subject: str, signer: Signer, form: Form = None) -> str:
    """Sign manifest ``subject`` of ``repository``; the digest of the ``.sig`` manifest."""
    return commit(*stage_signature(registry, repository, subject, signer, form))


def stage_attestation(
    registry: Registry, repository: str, subject: str, envelope: bytes, predicate_type: str, form: Form = None
) -> tuple[str, StagedTag | None]:
    """A DSSE ``envelope`` for ``subject`` by digest, replacing an attestation of the same predicate type; its ``.att`` tag staged."""
    layer = Layer(DSSE_ENVELOPE, envelope, {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type})
    existing = _existing_layers(registry, repository, fallback_tag(subject, "att"))
    keep = [d for d in existing if (d.get("annotations") or {}).get(PREDICATE_ANNOTATION) != predicate_type]
    return _stage(registry, repository, subject, "att", layer, keep, form)


def attest_digest(registry: Registry, repository: str, subject: str, envelope: bytes, predicate_type: str, form: Form = None) -> str:
    """Attach a DSSE ``envelope`` to ``subject`` now; the digest of the ``.att`` manifest."""
    return commit(*stage_attestation(registry, repository, subject, envelope, predicate_type, form))


def attached(registry: Registry, repository: str, subject: str, kind: str, media_type: str) -> list[tuple[bytes, dict[str, str]]]:
    """The layers of ``media_type`` attached to ``subject`` as ``kind`` (sig, att): (bytes, annotations) each."""
    found = []
    for layer in _existing_layers(registry, repository, fallback_tag(subject, kind)):
        if layer.get("mediaType") != media_type:
            continue
        data = registry.get_blob(repository, str(layer.get("digest")))
        if data is not None and digest_of(data) == layer.get("digest"):
            found.append((data, {str(k): str(v) for k, v in (layer.get("annotations") or {}).items()}))
    return found


def walk(registry: Registry, repository: str, manifest: Manifest) -> list[tuple[str, Manifest | None]]:
    """Each member of an index (nested ones too) and then the index itself, by digest; a member the
    registry does not serve comes with None."""
    if not manifest.is_index:
        return [(manifest.digest, manifest)]
    found: dict[str, Manifest | None] = {}
    for entry in manifest.json().get("manifests", []):
        digest = str(entry.get("digest"))
        member = registry.get_manifest(repository, digest)
        for sub, sub_manifest in [(digest, None)] if member is None else walk(registry, repository, member):
            found.setdefault(sub, sub_manifest)
    return [*found.items(), (manifest.digest, manifest)]


def members_of(registry: Registry, repository: str, manifest: Manifest) -> list[str]:
    """The digests to sign for ``manifest``: each member of an index, then itself; refused when a member is missing."""
    walked = walk(registry, repository, manifest)
    missing = [digest for digest, found in walked if found is None]
    if missing:
        raise PublishFailed(f"{registry.host}/{repository}@{manifest.digest} lists {', '.join(missing)}, which the registry does not serve")
    return [digest for digest, _ in walked]
