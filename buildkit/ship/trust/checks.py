"""Sign what is in a registry, attach provenance, and check both with no engine: ``ascendkit sign``,
the ``--sign-key`` of publishing and mirroring, and ``ascendkit verify``.

What ``verify`` checks, each a named line that passes or fails:

- ``signature <digest>``: for the index and every member, a signature by the key naming this
  repository and that digest (cosign's, skopeo's, or ours);
- ``provenance <digest>``: for every image, an SLSA v1 statement in a DSSE envelope the key signed,
  whose subject is that digest;
- ``sbom <digest>``: the SBOM attached to it holds every pin the provenance records, at that version;
- ``matrix <digest>``: the stack the image's labels name is in the matrix, with the same pins.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from buildkit.doctor.base import Check
from buildkit.errors import InputError
from buildkit.image.sbom import loads
from buildkit.image.verify import normalize, version_matches
from buildkit.imageref import IMAGE_REFERENCE, registry_of, split_ref
from buildkit.ship.layers.compose import Form
from buildkit.ship.oci.registry import Manifest, Registry
from buildkit.ship.oci.staged import StagedTag
from buildkit.ship.trust.attach import fetch_sbom, member_digest
from buildkit.ship.trust.sign import PREDICATE_ANNOTATION, attached, members_of, sign_digest, stage_attestation, stage_signature, walk
from buildkit.trust.envelope import DSSE_ENVELOPE, SIGNATURE_ANNOTATION, SIMPLE_SIGNING, dsse_envelope, open_envelope, read_simple_signing
from buildkit.trust.keys import PublicKey, Signer
from buildkit.trust.provenance import SLSA_PROVENANCE, STATEMENT_TYPE, pins_of, statement

Say = Callable[[str], None]
StackPins = Callable[[str], dict[str, str] | None]  # stack id -> its pins (distribution -> version), None when unknown


def _trust(name: str, ok: bool, detail: str) -> Check:
    return Check(name, "ok" if ok else "error", detail)


def stage_trust(
    registry: Registry, repository: str, digest: str, build: dict[str, Any], signer: Signer | None, form: Form = None
) -> tuple[dict[str, str | None], list[StagedTag]]:
    """Image ``digest``'s provenance (built as build manifest ``build`` says; signed with a key) and, with
    a key, its signature, by digest: what publishing attaches before any tag names the image. Their
    tags are staged, to be written once every registry holds everything."""
    envelope = dsse_envelope(statement(f"{registry.host}/{repository}", digest, build), signer)
    provenance, staged = stage_attestation(registry, repository, digest, envelope, SLSA_PROVENANCE, form)
    tags = [staged]
    signature = None
    if signer is not None:
        signature, staged = stage_signature(registry, repository, digest, signer, form)
        tags.append(staged)
    return {"subject": digest, "signature": signature, "provenance": provenance}, [t for t in tags if t is not None]


def sign_tree(
    registry: Registry, repository: str, manifest: Manifest, signer: Signer, form: Form = None, say: Say | None = None
) -> list[str]:
    """Sign every member of ``manifest`` and then it; the digests signed."""
    signed = members_of(registry, repository, manifest)
    for digest in signed:
        sign_digest(registry, repository, digest, signer, form)
        if say is not None:
            say(f"{registry.host}/{repository}: signed {digest[:19]}")
    return signed


def check_registry_ref(ref: str) -> tuple[str, str]:
    """(host, repository) of a registry image reference; refused, with no contact, when it names none."""
    where = registry_of(ref) if IMAGE_REFERENCE.match(ref) else None
    if where is None:
        raise InputError(f"{ref!r}: give a registry image, HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex>")
    return where


def resolve(ref: str) -> tuple[Registry, str, Manifest]:
    host, repository = check_registry_ref(ref)
    _, tag, digest = split_ref(ref)
    registry = Registry(host, timeout=20.0)
    manifest = registry.get_manifest(repository, digest or tag or "latest")
    if manifest is None:
        said = f"{host}/{repository}" + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "" if tag else ":latest")
        raise InputError(f"{said}: the registry has no such image")
    return registry, repository, manifest


def signed_by(registry: Registry, repository: str, digest: str, signer: Signer) -> bool:
    """Whether ``digest`` carries a valid signature by ``signer``'s key for this repository."""
    return _signature(registry, repository, digest, signer.public).status == "ok"


def _signature(registry: Registry, repository: str, digest: str, key: PublicKey) -> Check:
    name = f"signature {digest}"
    found = attached(registry, repository, digest, "sig", SIMPLE_SIGNING)
    if not found:
        return _trust(name, False, "no signature attached")
    why = []
    for payload, notes in found:
        claim = read_simple_signing(payload)
        try:
            signature = base64.b64decode(notes.get(SIGNATURE_ANNOTATION, ""), validate=True)
        except ValueError:
            signature = b""
        if not key.verifies(payload, signature):
            why.append(f"not by {key.where}")
        elif isinstance(claim, str):
            why.append(claim)
        elif claim.digest != digest:
            why.append(f"signed for {claim.digest}")
        elif claim.repository != f"{registry.host}/{repository}":
            why.append(f"signed for repository {claim.repository}")
        else:
            return _trust(name, True, f"signed by {key.where} (key {key.keyid[:12]}) for {claim.repository}")
    return _trust(name, False, f"{len(found)} signature(s), none valid: {'; '.join(sorted(set(why)))}")


def _provenance(registry: Registry, repository: str, digest: str, key: PublicKey) -> tuple[Check, dict[str, Any] | None]:
    name = f"provenance {digest}"
    found = [
        data
        for data, notes in attached(registry, repository, digest, "att", DSSE_ENVELOPE)
        if notes.get(PREDICATE_ANNOTATION) == SLSA_PROVENANCE
    ]
    if not found:
        return _trust(name, False, "no SLSA provenance attached"), None
    why = []
    for data in found:
        opened, reason = open_envelope(data, key)
        if opened is None:
            why.append(reason)
            continue
        subjects = [s.get("digest", {}).get("sha256") for s in opened.get("subject", []) if isinstance(s, dict)]
        if opened.get("_type") != STATEMENT_TYPE or opened.get("predicateType") != SLSA_PROVENANCE:
            why.append(f"a {opened.get('predicateType')} statement, not SLSA v1 provenance")
        elif digest.removeprefix("sha256:") not in subjects:
            why.append(f"its subject is {', '.join(str(s) for s in subjects)}, not this image")
        else:
            return _trust(name, True, f"SLSA v1, signed by {key.where}, {len(pins_of(opened))} pins"), opened
    return _trust(name, False, "; ".join(why)), None


def _labels(registry: Registry, repository: str, manifest: Manifest) -> dict[str, str]:
    config = registry.get_blob(repository, str((manifest.json().get("config") or {}).get("digest")))
    try:
        return dict((json.loads(config or b"{}").get("config") or {}).get("Labels") or {})
    except ValueError:
        return {}


def _materials(registry: Registry, repository: str, manifest: Manifest, provenance: dict[str, Any], stack_pins: StackPins) -> list[Check]:
    digest = manifest.digest
    pins = pins_of(provenance)
    checks = []
    sbom_data = fetch_sbom(registry, repository, digest)
    if sbom_data is None:
        checks.append(_trust(f"sbom {digest}", False, "no SBOM attached"))
    else:
        document = loads(sbom_data, f"{registry.host}/{repository}@{digest} SBOM")
        versions = {  # the Python distributions only: an OS package may share a name
            normalize(str(c.get("name"))): str(c.get("version"))
            for c in document["components"]
            if isinstance(c, dict) and str(c.get("bom-ref", "")).startswith("pypi:")
        }
        wrong = [
            f"{n} {v} (SBOM: {versions.get(normalize(n), 'absent')})"
            for n, v in sorted(pins.items())
            if not version_matches(versions.get(normalize(n)), v)
        ]
        detail = f"all {len(pins)} pins at their versions" if not wrong else "differs: " + ", ".join(wrong[:8])
        checks.append(_trust(f"sbom {digest}", bool(pins) and not wrong, detail if pins else "the provenance records no pins"))
    stack = _labels(registry, repository, manifest).get("io.ascendkit.stack", "")
    said = provenance.get("predicate", {}).get("buildDefinition", {}).get("externalParameters", {}).get("stack")
    expected = stack_pins(stack) if stack else None
    if not stack:
        checks.append(_trust(f"matrix {digest}", False, "the image's labels name no matrix stack (io.ascendkit.stack)"))
    elif said != stack:
        checks.append(_trust(f"matrix {digest}", False, f"the labels name stack {stack}, the provenance {said}"))
    elif expected is None:
        checks.append(_trust(f"matrix {digest}", False, f"stack {stack} is not in the matrix"))
    else:
        team = provenance.get("predicate", {}).get("buildDefinition", {}).get("externalParameters", {}).get("team")
        checks.append(_matrix_check(digest, stack, expected, pins, team if isinstance(team, dict) else None))
    return checks


def _matrix_check(digest: str, stack: str, expected: dict[str, str], pins: dict[str, str], team: dict[str, Any] | None) -> Check:
    """The provenance's pins against the matrix stack's. A team image (its provenance names the team) holds every
    pin of its base's stack but those it replaced, each with its reason; what it added is its own, not the matrix's."""
    want = {normalize(n): v for n, v in expected.items()}
    got = {normalize(n): v for n, v in pins.items()}
    replaced = {normalize(n) for n in (team or {}).get("replaces") or {}}
    added = {normalize(n) for n in (team or {}).get("added") or {}} - set(want)
    wrong = sorted(
        f"{n} {got.get(n, 'absent')} (matrix: {want.get(n, 'absent')})"
        for n in set(want) | set(got)
        if want.get(n) != got.get(n) and n not in replaced and n not in added
    )
    if wrong:
        return _trust(f"matrix {digest}", False, f"stack {stack} differs: " + ", ".join(wrong[:8]))
    if team is None:
        return _trust(f"matrix {digest}", True, f"stack {stack}: the provenance's {len(got)} pins are the matrix's")
    held = len(set(want) - replaced)
    escapes = "; ".join(
        f"{n} {r.get('base')} -> {r.get('team')} ({r.get('reason')})" for n, r in sorted((team.get("replaces") or {}).items())
    )
    return _trust(
        f"matrix {digest}",
        True,
        f"team {team.get('name')} on stack {stack}: {held} of the matrix's pins held, {len(added)} added"
        + (f"; replaced: {escapes}" if escapes else ""),
    )


def registry_provenance(ref: str, arch: str | None) -> tuple[dict[str, Any], str]:
    """The provenance statement attached to ``ref`` (for an index, to its ``arch`` member), unverified, and where it was found."""
    registry, repository, manifest = resolve(ref)
    digest = member_digest(manifest, arch, f"{registry.host}/{repository}@{manifest.digest}")
    where = f"{registry.host}/{repository}@{digest}"
    for data, notes in attached(registry, repository, digest, "att", DSSE_ENVELOPE):
        if notes.get(PREDICATE_ANNOTATION) == SLSA_PROVENANCE:
            try:
                document = json.loads(base64.b64decode(json.loads(data)["payload"]))
            except (ValueError, KeyError, TypeError):
                raise InputError(f"{where}: its provenance is not a DSSE envelope of a statement") from None
            if isinstance(document, dict):
                return document, where
    raise InputError(f"{where}: no SLSA provenance is attached (`ascendkit publish` attaches it)")


def verify_image(ref: str, key: PublicKey, stack_pins: StackPins) -> tuple[str, list[Check]]:
    """Every check of image ``ref`` (an index: it and each member), with no engine."""
    registry, repository, top = resolve(ref)
    checks = []
    for digest, manifest in reversed(walk(registry, repository, top)):  # the index first, then its members
        if manifest is None:
            checks.append(_trust(f"member {digest}", False, "the index lists it; the registry does not serve it"))
            continue
        checks.append(_signature(registry, repository, digest, key))
        if manifest.is_index:
            continue
        check, provenance = _provenance(registry, repository, digest, key)
        checks.append(check)
        if provenance is not None:
            checks += _materials(registry, repository, manifest, provenance, stack_pins)
    return f"{registry.host}/{repository}@{top.digest}", checks
