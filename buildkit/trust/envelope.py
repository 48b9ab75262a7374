"""The two signed documents: cosign's simple-signing payload (a signature of one manifest digest in
one repository) and a DSSE envelope (an in-toto statement, signed over DSSE's pre-authentication
encoding).

Both are compact JSON with sorted keys, so the bytes depend only on what they say.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from buildkit.trust.keys import PublicKey, Signer

SIGNATURE_TYPE = "cosign container image signature"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"


def compact(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def simple_signing_payload(repository: str, digest: str) -> bytes:
    """What a signature says: this repository's manifest ``digest`` (``optional`` null, as cosign writes it)."""
    return compact(
        {
            "critical": {"identity": {"docker-reference": repository}, "image": {"docker-manifest-digest": digest}, "type": SIGNATURE_TYPE},
            "optional": None,
        }
    )


@dataclass(frozen=True)
class SignedClaim:
    repository: str  # docker-reference without a tag or digest
    digest: str


def read_simple_signing(payload: bytes) -> SignedClaim | str:
    """The claim of a payload (cosign's or containers/image's, whose ``optional`` differs), or why it is none."""
    try:
        critical = json.loads(payload)["critical"]
        kind = critical["type"]
        reference = str(critical["identity"]["docker-reference"])
        digest = str(critical["image"]["docker-manifest-digest"])
    except (ValueError, KeyError, TypeError):
        return "not a simple-signing payload"
    if kind != SIGNATURE_TYPE:
        return f"payload type {kind!r}, not {SIGNATURE_TYPE!r}"
    name = reference.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:  # containers/image names the tag it pushed: the repository is what is claimed
        name = name.rsplit(":", 1)[0]
    return SignedClaim(name, digest)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what a DSSE signature signs."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def dsse_envelope(statement: dict[str, Any], signer: Signer | None) -> bytes:
    """``statement`` in a DSSE envelope, signed by ``signer`` (keyid: its public key's sha256); unsigned without one."""
    payload = compact(statement)
    signatures = []
    if signer is not None:
        signatures.append({"keyid": signer.public.keyid, "sig": base64.b64encode(signer.sign(pae(IN_TOTO, payload))).decode()})
    return compact({"payload": base64.b64encode(payload).decode(), "payloadType": IN_TOTO, "signatures": signatures})


def open_envelope(data: bytes, key: PublicKey) -> tuple[dict[str, Any] | None, str]:
    """The statement of an envelope, when ``key`` made one of its signatures; else None and why."""
    try:
        envelope = json.loads(data)
        payload = base64.b64decode(envelope["payload"], validate=True)
        payload_type = str(envelope["payloadType"])
        signatures = [base64.b64decode(s["sig"]) for s in envelope.get("signatures") or []]
    except (ValueError, KeyError, TypeError):
        return None, "not a DSSE envelope"
    if payload_type != IN_TOTO:
        return None, f"payload type {payload_type!r}, not {IN_TOTO}"
    if not signatures:
        return None, "the envelope is not signed (published without --sign-key)"
    if not any(key.verifies(pae(payload_type, payload), sig) for sig in signatures):
        return None, f"no signature by {key.where} (key {key.keyid[:12]})"
    try:
        statement = json.loads(payload)
    except ValueError:
        return None, "the signed payload is not JSON"
    return (statement, "") if isinstance(statement, dict) else (None, "the signed payload is not a statement")
