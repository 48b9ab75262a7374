"""The manifests ascendkit composes: deterministic bytes, the media types of each form, the SBOM's
two forms found again, conversion between Docker and OCI; and layer compression (gzip and zstd
that decompress to the layer, the same bytes from the same layer, the cache)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path

import pytest
import zstandard

from buildkit.errors import InputError, PublishFailed
from buildkit.ship.layers.compose import (
    DOCKER_CONFIG,
    DOCKER_LAYER,
    OCI_CONFIG,
    OCI_LAYER_GZIP,
    OCI_LAYER_ZSTD,
    OCI_TYPES,
    convert,
    image_manifest,
    index_manifest,
    sbom_artifact,
    sbom_layer,
    sbom_of_layer,
)
from buildkit.ship.layers.compressing import GZIP, ZSTD, Blob, CompressionCache
from buildkit.ship.oci.registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, Manifest, digest_of

CONFIG = Blob("sha256:" + "c" * 64, 1234)
LAYERS = [Blob("sha256:" + "a" * 64, 10), Blob("sha256:" + "b" * 64, 20)]


def _manifest(body: bytes, media_type: str) -> Manifest:
    return Manifest(digest_of(body), media_type, len(body), body)


@pytest.mark.parametrize(
    ("form", "compression", "manifest_type", "config_type", "layer_type"),
    [
        (None, "gzip", DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER),
        ("docker", "gzip", DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER),
        ("oci", "gzip", OCI_MANIFEST, OCI_CONFIG, OCI_LAYER_GZIP),
        (None, "zstd", OCI_MANIFEST, OCI_CONFIG, OCI_LAYER_ZSTD),
        ("oci", "zstd", OCI_MANIFEST, OCI_CONFIG, OCI_LAYER_ZSTD),
    ],
)
def test_image_manifest_media_types(form: str | None, compression: str, manifest_type: str, config_type: str, layer_type: str) -> None:
    body, media_type = image_manifest(CONFIG, LAYERS, form, compression)  # type: ignore[arg-type]
    data = json.loads(body)
    assert media_type == data["mediaType"] == manifest_type
    assert data["config"] == {"mediaType": config_type, "digest": CONFIG.digest, "size": CONFIG.size}
    assert [(layer["mediaType"], layer["digest"], layer["size"]) for layer in data["layers"]] == [
        (layer_type, b.digest, b.size) for b in LAYERS
    ]
    assert image_manifest(CONFIG, LAYERS, form, compression) == (body, media_type), "the same parts, the same bytes"  # type: ignore[arg-type]


def test_docker_media_types_refuse_zstd() -> None:
    with pytest.raises(InputError, match="zstd needs OCI media types"):
        image_manifest(CONFIG, LAYERS, "docker", "zstd")


def test_index_follows_its_members_in_the_default_form_and_refuses_a_mismatch_in_the_others() -> None:
    docker_member = _manifest(image_manifest(CONFIG, LAYERS, None, "gzip")[0], DOCKER_MANIFEST)
    oci_member = _manifest(image_manifest(CONFIG, LAYERS, "oci", "gzip")[0], OCI_MANIFEST)
    body, media_type = index_manifest({"x86_64": docker_member, "aarch64": docker_member}, None, "r:t")
    assert media_type == DOCKER_LIST
    assert [m["platform"]["architecture"] for m in json.loads(body)["manifests"]] == ["arm64", "amd64"]
    assert index_manifest({"aarch64": docker_member, "x86_64": docker_member}, None, "r:t")[0] == body, "deterministic"
    assert index_manifest({"x86_64": oci_member}, None, "r:t")[1] == OCI_INDEX
    assert index_manifest({"x86_64": oci_member}, "oci", "r:t")[1] == OCI_INDEX
    with pytest.raises(PublishFailed, match=r"refusing the docker index r:t: its x86_64 member .* is a application/vnd\.oci"):
        index_manifest({"x86_64": oci_member}, "docker", "r:t")


def test_the_sbom_in_both_forms_names_its_subject() -> None:
    subject = _manifest(image_manifest(CONFIG, LAYERS, None, "gzip")[0], DOCKER_MANIFEST)
    sbom = b'{"bomFormat": "CycloneDX"}'
    for form in (None, "oci", "docker"):
        body, media_type, blobs = sbom_artifact(subject, sbom, form)
        artifact = _manifest(body, media_type)
        config = blobs[0]
        layer = sbom_layer(artifact, subject.digest, config)
        assert layer == digest_of(blobs[1]) and sbom_of_layer(artifact, blobs[1]) == sbom
        assert sbom_artifact(subject, sbom, form) == (body, media_type, blobs), "the same SBOM, the same bytes"
        assert sbom_layer(artifact, "sha256:" + "9" * 64, config) is None, "another image's SBOM is not this one's"
        types = {artifact.media_type, *(p["mediaType"] for p in [artifact.json()["config"], *artifact.json()["layers"]])}
        if form == "docker":
            assert media_type == DOCKER_MANIFEST and not types & OCI_TYPES and "subject" not in artifact.json()
        else:
            assert media_type == OCI_MANIFEST and artifact.json()["subject"]["digest"] == subject.digest


def test_convert_between_docker_and_oci_and_back() -> None:
    docker = _manifest(image_manifest(CONFIG, LAYERS, None, "gzip")[0], DOCKER_MANIFEST)
    assert convert(docker, "docker") == (docker.body, docker.media_type), "already Docker: the same bytes"
    oci_body, oci_type = convert(docker, "oci")
    assert (oci_body, oci_type) == image_manifest(CONFIG, LAYERS, "oci", "gzip"), "what publishing writes in OCI"
    back = convert(_manifest(oci_body, oci_type), "docker")
    assert back == (docker.body, docker.media_type), "round trip"
    index_body, index_type = index_manifest({"x86_64": docker}, None, "r:t")
    index = _manifest(index_body, index_type)
    new_member = _manifest(oci_body, oci_type)
    converted_body, converted_type = convert(index, "oci", {docker.digest: new_member})
    assert converted_type == OCI_INDEX
    assert json.loads(converted_body)["manifests"][0]["digest"] == new_member.digest
    zstd = _manifest(image_manifest(CONFIG, LAYERS, "oci", "zstd")[0], OCI_MANIFEST)
    with pytest.raises(InputError, match="zstd layers"):
        convert(zstd, "docker")


def test_compression_decompresses_to_the_layer_and_repeats_byte_for_byte() -> None:
    layer = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(40_000)) + b"\0" * 500_000
    outputs = {}
    for compression in (GZIP, ZSTD):
        first, second = io.BytesIO(), io.BytesIO()
        compression.compress(io.BytesIO(layer), first)
        compression.compress(io.BytesIO(layer), second)
        assert first.getvalue() == second.getvalue(), f"{compression.key}: the same layer, the same blob"
        outputs[compression.name] = first.getvalue()
    assert gzip.decompress(outputs["gzip"]) == layer
    assert outputs["gzip"][4:8] == b"\0\0\0\0", "gzip's mtime is zero: no clock in the blob"
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(outputs["zstd"])).read() == layer


def test_the_cache_remembers_blobs_and_where_they_were_pushed(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    cache = CompressionCache.load(path)
    assert cache.get(GZIP, "sha256:d") is None
    cache.put(GZIP, "sha256:d", Blob("sha256:" + "e" * 64, 42))
    for n in range(10):
        cache.saw("host:5000", "sha256:" + "e" * 64, f"repo{n}")
    cache.save()
    again = CompressionCache.load(path)
    assert again.get(GZIP, "sha256:d") == Blob("sha256:" + "e" * 64, 42)
    assert again.get(ZSTD, "sha256:d") is None, "per compression"
    assert again.seen("host:5000", "sha256:" + "e" * 64) == [f"repo{n}" for n in range(2, 10)], "the newest eight"
    path.write_text("not json")
    assert CompressionCache.load(path).entries == {}, "a damaged cache is an empty one"
