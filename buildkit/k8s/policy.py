"""Admission policies that make a cluster run an image's repository only when the key signed it:
a Kyverno ``ClusterPolicy`` (``verifyImages``) or a sigstore policy-controller
``ClusterImagePolicy``. Both check the key offline (no transparency log, no certificate log: the
signatures are key-based, as ``ascendkit sign`` and ``--sign-key`` make them).

- Kyverno: every Pod whose image is the repository, by tag or digest, must carry a signature by
  the key; the tag is replaced by the digest it was verified at (``mutateDigest``), a digest is
  required (``verifyDigest``), and the admission fails closed (``failurePolicy: Fail``, ``Enforce``).
- policy-controller: ``mode: enforce`` for the repository; it judges the namespaces labelled
  ``policy.sigstore.dev/include=true`` (its own opt-in), and resolves tags to digests itself.

Only signatures are enforced here: provenance is attached to each per-arch image, and a Pod names
the multi-arch index, so a cluster would find none on the digest it checks (``ascendkit verify``
checks the provenance of every member).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from buildkit.errors import InputError
from buildkit.imageref import registry_of

PolicyKind = Literal["kyverno", "sigstore"]
POLICY_KINDS: tuple[PolicyKind, ...] = ("kyverno", "sigstore")


def _repository(image: str) -> str:
    where = registry_of(image)
    if where is None:
        raise InputError(f"--image {image!r}: give the registry's repository, HOST[:PORT]/REPO[:TAG|@sha256:...]")
    return f"{where[0]}/{where[1]}"


def policy_name(repository: str) -> str:
    """``ascendkit-signed-<repository as a DNS label>``, at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", repository.lower()).strip("-")
    return f"ascendkit-signed-{slug}"[:63].rstrip("-")


def kyverno_policy(repository: str, public_pem: str, name: str) -> dict[str, Any]:
    verify = {
        "imageReferences": [f"{repository}:*", f"{repository}@*"],
        "failureAction": "Enforce",
        "mutateDigest": True,
        "verifyDigest": True,
        "required": True,
        "attestors": [
            {
                "count": 1,
                "entries": [
                    {
                        "keys": {
                            "publicKeys": public_pem.strip(),
                            "signatureAlgorithm": "sha256",
                            "rekor": {"ignoreTlog": True},
                            "ctlog": {"ignoreSCT": True},
                        }
                    }
                ],
            }
        ],
    }
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": name,
            "annotations": {
                "policies.kyverno.io/title": f"Images of {repository} signed by the ascendkit key",
                "policies.kyverno.io/description": (
                    f"Pods may run {repository} only by a digest its cosign key signed (ascendkit sign / --sign-key); "
                    "checked offline, without a transparency log."
                ),
            },
            "labels": {"app.kubernetes.io/managed-by": "ascendkit"},
        },
        "spec": {
            "background": False,
            "failurePolicy": "Fail",
            "webhookTimeoutSeconds": 30,
            "rules": [
                {"name": "signed-by-key", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]}, "verifyImages": [verify]},
            ],
        },
    }


def sigstore_policy(repository: str, public_pem: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy.sigstore.dev/v1beta1",
        "kind": "ClusterImagePolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "ascendkit"}},
        "spec": {
            "images": [{"glob": f"{repository}:*"}, {"glob": f"{repository}@*"}],
            "authorities": [{"name": "ascendkit-key", "key": {"data": public_pem.strip() + "\n", "hashAlgorithm": "sha256"}}],
            "mode": "enforce",
        },
    }


def render_policy(kind: str, image: str, public_pem: str, name: str | None = None) -> dict[str, Any]:
    """The ``kind`` policy for ``image``'s repository and the public key ``public_pem``."""
    if kind not in POLICY_KINDS:
        raise InputError(f"--policy {kind!r}: give kyverno or sigstore")
    repository = _repository(image)
    name = name or policy_name(repository)
    return kyverno_policy(repository, public_pem, name) if kind == "kyverno" else sigstore_policy(repository, public_pem, name)
