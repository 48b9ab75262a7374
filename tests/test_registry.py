"""The distribution client against the fake registry: read-back, bearer tokens per repository,
retries (503, 429 with Retry-After, a connection dropped mid-upload), the bound on them, mounts, tags."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.imageref import RegistryRef
from buildkit.retry import retry_after
from buildkit.ship.mirror import mirror
from buildkit.ship.oci.registry import DOCKER_LIST, DOCKER_MANIFEST, Registry
from buildkit.ship.oci.remote import image_labels
from tests.harness.fake_registry import Store, fake_registry

BODY = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": "sha256:cfg"}}).encode()


@pytest.fixture
def fake() -> Iterator[tuple[Registry, Store, list[float]]]:
    """The client (its pauses recorded, not slept) and the fake it talks to, holding team/verl:t1."""
    with fake_registry(referrers=False) as (host, store):
        digest = "sha256:" + hashlib.sha256(BODY).hexdigest()
        store.manifests[digest] = (DOCKER_MANIFEST, BODY)
        store.tags[("team/verl", "t1")] = digest
        waits: list[float] = []
        yield Registry(host, retries=3, backoff=0.01, sleep=waits.append), store, waits


def test_read_back(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, _, _ = fake
    manifest = registry.get_manifest("team/verl", "t1")
    assert manifest is not None
    assert manifest.digest == "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert manifest.media_type == DOCKER_MANIFEST and manifest.json()["config"]["digest"] == "sha256:cfg"
    assert registry.get_manifest("team/verl", "missing") is None


def test_a_manifest_that_is_not_the_digest_asked_for_is_refused(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    wrong = "sha256:" + "0" * 64
    store.served[f"/v2/team/verl/manifests/{wrong}"] = BODY
    with pytest.raises(PublishFailed, match="served a manifest whose digest is"):
        registry.get_manifest("team/verl", wrong)


def test_transient_errors_are_retried(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, waits = fake
    store.script = [(503, {}), (502, {}), "drop"]
    assert registry.get_manifest("team/verl", "t1") is not None
    assert len(waits) == 3 and registry.retried == 3


def test_429_waits_as_long_as_retry_after_says_capped(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, waits = fake
    store.script = [(429, {"Retry-After": "7"}), (503, {"Retry-After": "3600"})]
    assert registry.get_manifest("team/verl", "t1") is not None
    assert waits == [7.0, registry.max_wait], "Retry-After is honoured, up to max_wait"


def test_retry_after_as_an_http_date() -> None:
    answer = requests.Response()
    answer.headers["Retry-After"] = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after(answer) == 0.0  # in the past: no wait
    answer.headers["Retry-After"] = "soon"
    assert retry_after(answer) is None


def test_definitive_failure_after_retries(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    store.script = [(503, {})] * 10
    with pytest.raises(Unavailable, match=r"^registry 127\.0\.0\.1:\d+: HTTP 503 UNAVAILABLE: scripted \(GET manifests, 4 attempts\)$"):
        registry.get_manifest("team/verl", "t1")


def test_bearer_token_challenge_per_repository(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    store.token = "tok"
    assert registry.get_manifest("team/verl", "t1") is not None
    assert registry.get_manifest("team/other", "t1") is None  # another repository: a token of its own scope
    assert store.scopes == ["repository:team/verl:pull,push", "repository:team/other:pull,push"]
    assert registry.get_manifest("team/verl", "t1") is not None
    assert len(store.scopes) == 2, "each repository's token is kept"


def test_unreachable_registry() -> None:
    registry = Registry("127.0.0.1:9", retries=1, backoff=0.01, timeout=2)
    with pytest.raises(Unavailable, match=re.escape("127.0.0.1:9")):
        registry.get_manifest("x", "y")


MIB = 1 << 20
LAYER = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(7 * MIB // 64))  # 3.5 MiB


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _upload(registry: Registry, data: bytes = LAYER, said: list[str] | None = None) -> None:
    opener = lambda offset: io.BytesIO(data[offset:])  # noqa: E731
    registry.upload_blob("team/verl", _digest(data), len(data), opener, None if said is None else said.append)


@pytest.fixture
def one_mib_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_UPLOAD_CHUNK_MB", "1")


def _calls(store: Store, method: str) -> int:
    return sum(r.startswith(method) for r in store.requests)


@pytest.mark.usefixtures("one_mib_chunks")
def test_a_blob_goes_up_in_chunks(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    _upload(registry)
    assert store.blobs[_digest(LAYER)] == LAYER
    assert _calls(store, "PATCH") == 4 and _calls(store, "PUT") == 1 and registry.sent == len(LAYER)


@pytest.mark.usefixtures("one_mib_chunks")
def test_a_chunk_cut_off_is_resumed_where_the_registry_stands(fake: tuple[Registry, Store, list[float]]) -> None:
    """The third chunk is cut half-way, and half of it landed: the upload asks, and sends the rest from there."""
    registry, store, _ = fake
    store.cut_patches, said = {3}, list[str]()
    _upload(registry, said=said)
    assert store.blobs[_digest(LAYER)] == LAYER
    assert len(said) == 1 and said[0].endswith("resuming at 3 MB, where the registry stands"), said
    assert "GET /v2/team/verl/blobs/uploads/" in "\n".join(store.requests), "it asked where the upload stands"
    assert _calls(store, "POST") == 1, "one session throughout"
    assert len(LAYER) < registry.sent <= len(LAYER) + MIB, "no more than one chunk sent twice"
    assert registry.retried == 1 and registry.restarted == 0


@pytest.mark.usefixtures("one_mib_chunks")
def test_a_registry_that_drops_a_cut_upload_gets_the_blob_whole(fake: tuple[Registry, Store, list[float]]) -> None:
    """As distribution does: the session is gone once part of a chunk landed. The blob goes again
    from byte 0 in one request (chunks gain nothing there), and that is counted."""
    registry, store, _ = fake
    store.cut_patches, store.forgets_cut_uploads, said = {3}, True, list[str]()
    _upload(registry, said=said)
    assert store.blobs[_digest(LAYER)] == LAYER and registry.restarted == 1
    assert "BLOB_UPLOAD" not in said[0] and said[0].endswith("sending it again, whole"), said
    assert _calls(store, "POST") == 2 and _calls(store, "PATCH") == 3
    assert 2 * MIB + len(LAYER) < registry.sent <= 3 * MIB + len(LAYER), "two chunks and what left of the third, then the blob"


@pytest.mark.usefixtures("one_mib_chunks")
def test_a_registry_that_refuses_chunks_gets_the_blob_in_one_request(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    store.chunks = False
    _upload(registry)
    assert store.blobs[_digest(LAYER)] == LAYER and registry.retried == 0
    assert _calls(store, "PATCH") == 1 and registry.sent == len(LAYER) + MIB, "the refused chunk, then the blob"


@pytest.mark.usefixtures("one_mib_chunks")
def test_a_token_that_expires_mid_upload_is_fetched_again(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    store.token = "first"
    registry.get_manifest("team/verl", "t1")
    store.token = "second"  # the first expired while the layer went up
    _upload(registry)
    assert store.blobs[_digest(LAYER)] == LAYER and registry.retried == 0
    assert store.scopes[-1] == "repository:team/verl:pull,push"


def test_an_upload_answered_429_waits_as_retry_after_says(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, waits = fake
    data = b"y" * 1000
    store.script = [(202, {"Location": "/v2/team/verl/blobs/uploads/busy"}), (429, {"Retry-After": "7"})]
    store.uploads["busy"] = bytearray()
    _upload(registry, data)
    assert waits == [7.0] and store.blobs[_digest(data)] == data


def test_an_upload_that_never_lands_is_unavailable(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    store.script = [s for _ in range(4) for s in ((202, {"Location": "/v2/team/verl/blobs/uploads/u"}), (503, {}))]
    with pytest.raises(Unavailable, match=r"uploading blob sha256:.*, 4 attempts"):
        _upload(registry, b"x" * 1000)


def test_put_blob_looks_first_and_mount_links_without_sending(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    digest = registry.put_blob("team/verl", b"config")
    assert registry.put_blob("team/verl", b"config") == digest
    assert sum(r.startswith("PUT") for r in store.requests) == 1, "a blob the registry has is not sent again"
    assert registry.mount_blob("team/other", digest, "team/verl")
    assert not registry.mount_blob("team/other", "sha256:" + "1" * 64, "team/verl")


def test_tags_follow_the_link_pages(fake: tuple[Registry, Store, list[float]]) -> None:
    registry, store, _ = fake
    for n in range(2500):
        store.tags[("many", f"t{n:04d}")] = "sha256:x"
    tags = registry.tags("many")
    assert len(tags) == 2500 and tags[0] == "t0000" and tags[-1] == "t2499"
    assert registry.tags("nothing-here") == []


@pytest.mark.parametrize(
    ("text", "host", "repo"),
    [
        ("127.0.0.1:5000/ascendkit", "127.0.0.1:5000", "ascendkit"),
        ("registry.example.com/ml/verl", "registry.example.com", "ml/verl"),
        ("localhost/x", "localhost", "x"),
    ],
)
def test_registry_ref(text: str, host: str, repo: str) -> None:
    ref = RegistryRef.parse(text)
    assert (ref.host, ref.repository) == (host, repo)


@pytest.mark.parametrize("text", ["ascendkit", "ascendkit/verl", "127.0.0.1:5000", "host.com/UPPER", "host.com/a b"])
def test_registry_ref_rejects(text: str) -> None:
    with pytest.raises(InputError, match=r"expected HOST\[:PORT\]/REPO"):
        RegistryRef.parse(text)


def _put(store: Store, repo: str, ref: str, body: bytes, media_type: str) -> str:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    store.manifests[digest] = (media_type, body)
    store.tags[(repo, ref)] = digest
    return digest


def test_image_labels_of_an_index_member_and_unreadable_answers(fake: tuple[Registry, Store, list[float]]) -> None:
    """k8s render reads the labels of the --arch member of a multi-arch index; a body that is not
    JSON is the registry's failure, not a traceback."""
    registry, store, _ = fake
    config = json.dumps({"config": {"Labels": {"io.ascendkit.stack": "cann8.3", "io.ascendkit.version.verl": "0.6.1"}}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    store.blobs[config_digest] = config
    arm = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": config_digest}}).encode()
    arm_digest = _put(store, "team/verl", "arm", arm, DOCKER_MANIFEST)
    index: dict[str, Any] = {"mediaType": DOCKER_LIST, "manifests": [{"digest": arm_digest, "platform": {"architecture": "arm64"}}]}
    _put(store, "team/verl", "multi", json.dumps(index).encode(), DOCKER_LIST)
    broken = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": "sha256:" + "2" * 64}}).encode()
    store.blobs["sha256:" + "2" * 64] = b"<html>proxy error</html>"
    _put(store, "team/verl", "broken", broken, DOCKER_MANIFEST)
    labels = image_labels(f"{registry.host}/team/verl:multi", "aarch64")
    assert labels == {"io.ascendkit.stack": "cann8.3", "io.ascendkit.version.verl": "0.6.1"}
    with pytest.raises(InputError, match="the index has no amd64 image"):
        image_labels(f"{registry.host}/team/verl:multi", "x86_64")
    with pytest.raises(PublishFailed, match="unreadable answer"):
        image_labels(f"{registry.host}/team/verl:broken", "x86_64")
    with pytest.raises(InputError, match="no registry host"):
        image_labels("ascendkit/verl:latest", "x86_64")


@pytest.mark.parametrize("name", ["ASCENDKIT_UPLOAD_CHUNK_MB", "ASCENDKIT_UPLOAD_PARALLEL", "ASCENDKIT_COMPRESS_THREADS"])
def test_a_shipping_setting_out_of_range_is_said_before_anything_is_sent(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "0")
    with pytest.raises(InputError, match=f"{name}='0': give a whole number from 1 to"):
        mirror("127.0.0.1:9/never/contacted:tag", "127.0.0.1:9/nor/this")
