"""mirror where the real registry cannot go: a source with the OCI referrers API (the SBOM and a
signature listed by it, not tagged) copied into a registry without it, on two fake registries.
The copy keeps every digest, and writes the OCI referrers tag so the attachments can be found."""

from __future__ import annotations

import json

from buildkit.ship.layers.compose import EMPTY_CONFIG, OCI_EMPTY, descriptor, dump, image_manifest
from buildkit.ship.layers.compressing import Blob
from buildkit.ship.mirror import mirror
from buildkit.ship.oci.registry import OCI_INDEX, OCI_MANIFEST, Registry, digest_of
from buildkit.ship.trust.attach import attach_sbom, fetch_sbom
from tests.harness.fake_registry import fake_registry

SBOM = b'{"bomFormat": "CycloneDX", "specVersion": "1.6"}'
SIGNATURE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def test_attachments_listed_by_the_referrers_api_follow_the_image() -> None:
    with fake_registry(referrers=True) as (src_host, src_store), fake_registry(referrers=False) as (dst_host, dst_store):
        source = Registry(src_host, retries=1, backoff=0.01)
        config, layer = b'{"architecture": "arm64", "os": "linux"}', b"a layer, compressed" * 1000
        for blob in (config, layer):
            source.put_blob("ml/verl", blob)
        body, media_type = image_manifest(Blob(digest_of(config), len(config)), [Blob(digest_of(layer), len(layer))], None, "gzip")
        image_digest = source.put_manifest("ml/verl", "latest-a3", body, media_type)
        subject = source.get_manifest("ml/verl", image_digest)
        assert subject is not None
        assert attach_sbom(source, "ml/verl", subject, SBOM).how == "referrer"
        bundle = b'{"signature": "not a real one"}'
        source.put_blob("ml/verl", bundle)
        source.put_blob("ml/verl", EMPTY_CONFIG)
        signature = dump(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "artifactType": SIGNATURE_TYPE,
                "config": descriptor(OCI_EMPTY, EMPTY_CONFIG),
                "layers": [descriptor(SIGNATURE_TYPE, bundle)],
                "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
            }
        )
        signature_digest = source.put_manifest("ml/verl", digest_of(signature), signature, OCI_MANIFEST)
        assert fetch_sbom(Registry(dst_host, retries=0), "mirrored", image_digest) is None

        outcome = mirror(f"{src_host}/ml/verl:latest-a3", f"{dst_host}/mirrored")
        destination = Registry(dst_host, retries=1, backoff=0.01)
        copied = destination.get_manifest("mirrored", "latest-a3")
        assert copied is not None and copied.digest == image_digest == outcome.copied_digest
        assert destination.get_manifest("mirrored", signature_digest) is not None, "the signature, by its digest"
        referrers_tag = image_digest.replace(":", "-", 1)
        index = destination.get_manifest("mirrored", referrers_tag)
        assert index is not None and index.media_type == OCI_INDEX
        listed = {m["artifactType"]: m["digest"] for m in index.json()["manifests"]}
        assert listed[SIGNATURE_TYPE] == signature_digest and "application/vnd.cyclonedx+json" in listed
        assert fetch_sbom(destination, "mirrored", image_digest) == SBOM, "found through the referrers tag"
        assert sorted(d for d, _ in outcome.sent) == sorted({digest_of(b) for b in (config, layer, bundle, EMPTY_CONFIG, SBOM)})

        uploads = sum(r.startswith("PUT /v2/mirrored/blobs/uploads/") for r in dst_store.requests)
        again = mirror(f"{src_host}/ml/verl:latest-a3", f"{dst_host}/mirrored")
        assert again.sent == [] and len(again.present) == len(outcome.sent)
        assert sum(r.startswith("PUT /v2/mirrored/blobs/uploads/") for r in dst_store.requests) == uploads, "nothing sent twice"
        assert json.loads(src_store.manifests[image_digest][1])["mediaType"] == media_type
