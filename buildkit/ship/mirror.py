"""``ascendkit mirror SRC DST``: copy a published image from one registry to another, by digest,
byte for byte, with no engine: an index with all its members, the SBOM and every other attachment.

What the destination already has is not sent again: each blob is looked up first, and on the same
registry it is mounted from the source repository instead of sent. Everything goes by digest
before any tag moves (blobs, then members, attachments, the index, then the tags), so an
interrupted copy leaves no tag pointing at something missing, and running it again finishes it.

With ``form`` (``--media-types docker|oci``) manifests whose media types differ are rewritten
(same blobs, new digests); the SBOM is attached again in that form to each new digest, and
attachments that sign or name the old digests cannot follow, which is said. With ``signer``
(``--sign-key``) the copy is signed for the destination repository, the index and every member.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from buildkit.errors import InputError, PublishFailed
from buildkit.imageref import IMAGE_REFERENCE, RegistryRef, registry_of, split_ref
from buildkit.ship.layers.compose import OCI_TYPES, convert, dump, sbom_layer, sbom_of_layer
from buildkit.ship.oci.registry import DOCKER_MANIFEST, IMAGE_MANIFESTS, INDEXES, OCI_INDEX, Manifest, Registry, digest_of
from buildkit.ship.oci.staged import StagedTag
from buildkit.ship.oci.upload import each_at_once
from buildkit.ship.options import check_settings
from buildkit.ship.trust.attach import attach_sbom, fallback_tag
from buildkit.ship.trust.checks import sign_tree
from buildkit.ship.trust.sign import walk
from buildkit.trust.keys import Signer

Say = Callable[[str], None]
MAX_ATTACHMENT_DEPTH = 3  # an SBOM's signature's signature: deeper than anything that is pushed


@dataclass(frozen=True)
class Source:
    registry: Registry
    repository: str
    reference: str  # the tag or digest asked for
    tag: str  # "" when asked by digest

    @property
    def name(self) -> str:
        return f"{self.registry.host}/{self.repository}"


def parse_source(ref: str) -> Source:
    if not IMAGE_REFERENCE.match(ref) or registry_of(ref) is None:
        raise InputError(f"mirror SRC {ref!r}: give HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<64 hex>")
    host, repository = registry_of(ref) or ("", "")
    _, tag, digest = split_ref(ref)
    return Source(Registry(host), repository, digest or tag or "latest", "" if digest else tag or "latest")


def parse_destination(text: str) -> tuple[RegistryRef, str]:
    """``HOST[:PORT]/REPO[:TAG]`` -> the repository and the tag ("": the source's)."""
    name, tag, digest = split_ref(text)
    if digest:
        raise InputError(f"mirror DST {text!r}: a destination is HOST[:PORT]/REPO[:TAG]; the digest is the source's")
    return RegistryRef.parse(name, "mirror DST"), tag


@dataclass
class Node:
    """A manifest to copy, and what it becomes at the destination."""

    manifest: Manifest
    kind: Literal["image", "index", "attachment"]
    subject: str = ""  # for an attachment: the digest it is attached to
    tag: str = ""  # for an attachment found by its tag: that tag
    via_api: bool = False  # found by the source's referrers API
    body: bytes = b""
    media_type: str = ""

    @property
    def digest(self) -> str:
        return digest_of(self.body)


@dataclass
class MirrorOutcome:
    source: str
    destination: str
    digest: str  # the source's
    copied_digest: str  # the destination's: the same unless the media types were changed
    tags: list[str] = field(default_factory=list)
    sent: list[tuple[str, int]] = field(default_factory=list)
    mounted: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    attachments: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    signed: list[str] = field(default_factory=list)  # --sign-key: the digests signed for the destination repository
    dry_run: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "digest": self.digest,
            "copied_digest": self.copied_digest,
            "dry_run": self.dry_run,
            "tags": self.tags,
            "blobs": {
                "sent": [{"digest": d, "size": s} for d, s in self.sent],
                "mounted": self.mounted,
                "present": self.present,
                "bytes_sent": sum(s for _, s in self.sent),
            },
            "manifests": self.manifests,
            "attachments": self.attachments,
            "dropped": self.dropped,
            "signed": self.signed,
        }


def _walk(source: Source, manifest: Manifest, nodes: dict[str, Node]) -> None:
    """Members before the index that lists them (the index walk signing uses too: :func:`.sign.walk`)."""
    for digest, found in walk(source.registry, source.repository, manifest):
        if found is None:
            raise PublishFailed(f"{source.name}@{manifest.digest[:19]} lists {digest}, which the source does not serve")
        nodes.setdefault(digest, Node(found, "index" if found.is_index else "image"))


def _attachments(source: Source, subjects: list[str], nodes: dict[str, Node], tags: list[str], depth: int = 0) -> None:
    """Every attachment of ``subjects``: by the referrers API where the source has one; by the
    ``sha256-<hex>.<kind>`` tags (SBOMs, cosign's signatures and attestations); and by the OCI
    referrers tag ``sha256-<hex>`` (an index of them, where a registry has no referrers API)."""
    found: list[str] = []

    def add(manifest: Manifest, subject: str, tag: str = "", via_api: bool = False) -> None:
        node = nodes.setdefault(manifest.digest, Node(manifest, "attachment", subject, via_api=via_api))
        node.tag = node.tag or tag
        found.append(manifest.digest)

    for subject in subjects:
        for entry in source.registry.referrers(source.repository, subject) or []:
            manifest = source.registry.get_manifest(source.repository, str(entry["digest"]))
            if manifest is not None and manifest.digest not in nodes:
                add(manifest, subject, via_api=True)
        referrers_tag = subject.replace(":", "-", 1)
        for tag in tags:
            if not (tag == referrers_tag or tag.startswith(referrers_tag + ".")):
                continue
            manifest = source.registry.get_manifest(source.repository, tag)
            if manifest is None:
                continue
            add(manifest, subject, tag)
            if manifest.is_index:  # the referrers tag: the artifacts it lists go too
                for entry in manifest.json().get("manifests", []):
                    listed = source.registry.get_manifest(source.repository, str(entry["digest"]))
                    if listed is not None and listed.digest not in nodes:
                        add(listed, subject)
    if found and depth < MAX_ATTACHMENT_DEPTH:
        _attachments(source, list(dict.fromkeys(found)), nodes, tags, depth + 1)


def _referrers_indexes(nodes: dict[str, Node]) -> dict[str, bytes]:
    """For a destination without the referrers API: the OCI referrers tag (``sha256-<hex>``, an index
    of the artifacts that name a subject) of each subject whose attachments the source's API listed."""
    listed: dict[str, list[dict[str, Any]]] = {}
    for node in nodes.values():
        if node.kind == "attachment" and node.via_api and not node.tag:
            body = node.manifest.json()
            entry = {"mediaType": node.media_type, "digest": node.digest, "size": len(node.body)}
            if body.get("artifactType"):
                entry["artifactType"] = body["artifactType"]
            listed.setdefault(node.subject, []).append(entry)
    return {
        subject.replace(":", "-", 1): dump(
            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": sorted(entries, key=lambda e: e["digest"])}
        )
        for subject, entries in listed.items()
    }


def _blobs(manifest: Manifest) -> list[tuple[str, int]]:
    body = manifest.json()
    parts = [body.get("config") or {}, *body.get("layers", [])]
    return [(str(p["digest"]), int(p.get("size", 0))) for p in parts if p.get("digest")]


def mirror(
    src: str,
    dst: str,
    *,
    form: Literal["docker", "oci"] | None = None,
    dry_run: bool = False,
    signer: Signer | None = None,
    say: Say | None = None,
) -> MirrorOutcome:
    tell = say or (lambda _: None)
    check_settings()
    source = parse_source(src)
    target, dst_tag = parse_destination(dst)
    destination = Registry(target.host)
    root = source.registry.get_manifest(source.repository, source.reference)
    if root is None:
        raise InputError(f"{src}: the registry {source.registry.host} has no such image")
    if root.media_type not in (*IMAGE_MANIFESTS, *INDEXES):
        raise InputError(f"{src}: a {root.media_type or 'manifest of unknown type'}, not an image or an index")
    nodes: dict[str, Node] = {}
    _walk(source, root, nodes)
    try:
        source_tags = source.registry.tags(source.repository)
    except PublishFailed as exc:  # some registries do not list tags: attachments are then found by referrers only
        tell(f"ascendkit: warning: {exc}; attachments found by their sha256-<hex>.* tags are not copied")
        source_tags = []
    _attachments(source, list(nodes), nodes, source_tags)
    outcome = MirrorOutcome(f"{source.name}@{root.digest}", target.name, root.digest, root.digest, dry_run=dry_run)

    # What each manifest becomes at the destination (the same bytes unless the media types change).
    renamed: dict[str, Manifest] = {}
    sboms: list[tuple[str, bytes]] = []  # (new subject digest, SBOM) to attach again in the form asked
    for node in nodes.values():
        old = node.manifest
        if node.kind == "attachment":
            node.body, node.media_type = old.body, old.media_type
            continue
        if form is None:
            node.body, node.media_type = old.body, old.media_type
        else:
            members = renamed if node.kind == "index" else None
            node.body, node.media_type = convert(old, form, members)
        renamed[old.digest] = Manifest(node.digest, node.media_type, len(node.body), node.body)
    changed = {old: new.digest for old, new in renamed.items() if new.digest != old}
    for digest, node in list(nodes.items()):
        if node.kind != "attachment":
            continue
        config = None
        if node.manifest.media_type == DOCKER_MANIFEST:
            config = source.registry.get_blob(source.repository, str((node.manifest.json().get("config") or {}).get("digest")))
        layer = sbom_layer(node.manifest, node.subject, config)
        oci_typed = node.manifest.media_type in OCI_TYPES or any(t in OCI_TYPES for t in _layer_types(node.manifest))
        if layer is not None and (form is not None or node.subject in changed):
            sbom = sbom_of_layer(node.manifest, source.registry.get_blob(source.repository, layer) or b"")
            sboms.append((changed.get(node.subject, node.subject), sbom))
            del nodes[digest]
        elif node.subject in changed or (form == "docker" and oci_typed):
            why = "it names the source digest" if node.subject in changed else "it has OCI media types"
            outcome.dropped.append(f"{node.tag or digest} of {node.subject[:19]} ({why})")
            del nodes[digest]
    outcome.copied_digest = renamed[root.digest].digest

    # Blobs first: looked up, mounted on the same registry, else streamed across.
    blobs = dict.fromkeys(b for n in nodes.values() for b in _blobs(n.manifest))
    same_registry = source.registry.host == target.host

    def copy(blob: tuple[str, int]) -> str:
        digest, size = blob
        if dry_run:  # what would happen: looked up, a mount tried first on the same registry
            there = destination.blob_size(target.repository, digest) is not None
            return "present" if there else "mounted" if same_registry else "sent"
        mounts = [source.repository] if same_registry else []  # the blob copy publish uses too
        how = destination.ensure_blob(target.repository, digest, size, _opener(source, digest), mounts, tell)
        if how == "sent" and size > 1 << 20:
            tell(f"{target.name}: sent blob {digest[:19]} ({size / 1e6:.0f} MB)")
        return how

    for (digest, size), how in zip(blobs, each_at_once(copy, blobs), strict=True):  # several at a time
        if how == "sent":
            outcome.sent.append((digest, size))
        else:
            (outcome.present if how == "present" else outcome.mounted).append(digest)
    # Then manifests by digest: members before the index, attachments after their subjects.
    order = [n for n in nodes.values() if n.kind == "image"] + [n for n in nodes.values() if n.kind == "index"]
    order += sorted((n for n in nodes.values() if n.kind == "attachment"), key=lambda n: n.manifest.is_index)
    for node in order:
        outcome.manifests.append(node.digest)
        if node.kind == "attachment":
            outcome.attachments.append(node.tag or node.digest)
        if dry_run or destination.has_manifest(target.repository, node.digest):
            continue
        destination.put_manifest(target.repository, node.digest, node.body, node.media_type)
    for subject, sbom in sboms:
        outcome.attachments.append(fallback_tag(subject))
        if not dry_run:
            subject_manifest = destination.get_manifest(target.repository, subject)
            if subject_manifest is None:
                raise PublishFailed(f"{target.name}@{subject[:19]}: written, but the registry no longer serves it")
            attach_sbom(destination, target.repository, subject_manifest, sbom, form)
    # Tags last: the attachments' own tags (and, where the destination has no referrers API, the
    # referrers tag of what the source's API listed), then the image's.
    for node in order:
        if node.kind == "attachment" and node.tag and not dry_run:
            StagedTag(destination, target.repository, node.tag, node.body, node.media_type).write()  # read back, as every tag
    referrers = _referrers_indexes(nodes)
    if referrers and not dry_run and destination.referrers(target.repository, root.digest) is None:
        for tag, body in referrers.items():
            StagedTag(destination, target.repository, tag, body, OCI_INDEX).write()
            outcome.attachments.append(tag)
    # Signed for the destination repository (its name is what a signature claims), before its tag moves.
    if signer is not None:
        final = renamed[root.digest]
        if dry_run:
            outcome.signed = [n.digest for n in nodes.values() if n.kind != "attachment"]
        else:
            outcome.signed = sign_tree(destination, target.repository, final, signer, form, tell)
    tag = dst_tag or source.tag
    if tag:
        outcome.tags.append(tag)
        if not dry_run:
            final = renamed[root.digest]
            StagedTag(destination, target.repository, tag, final.body, final.media_type).write()
    return outcome


def _layer_types(manifest: Manifest) -> list[str]:
    body = manifest.json()
    return [str(p.get("mediaType")) for p in [body.get("config") or {}, *body.get("layers", [])]]


def _opener(source: Source, digest: str) -> Callable[[int], Any]:
    """The blob read from the source as it is stored (no decoding), from where the destination's
    upload stands: a range request, or the bytes before it read past where the source ignores ranges."""

    def open_stream(offset: int) -> Any:
        response = source.registry.open_blob(source.repository, digest, offset)
        response.raw.decode_content = False
        if offset and response.status_code != 206:
            left = offset
            while left > 0:
                skipped = response.raw.read(min(left, 1 << 20))
                if not skipped:
                    break
                left -= len(skipped)
        return response.raw

    return open_stream
