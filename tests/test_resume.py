"""Uploads at real size through a connection that is cut: our fault proxy (tests/harness/faultproxy.py) in
front of the real second registry (CNCF distribution) resets the connection carrying the Nth MB.

Behind a proxy that holds request bodies until whole (nginx's default), the registry never sees the
cut chunk, and a 1.5 GB blob resumes where the registry stands: no more than one chunk goes twice.
Straight to distribution, the part that landed makes it drop the session: the blob goes again,
whole, and that is counted. `mirror` resumes the same way, and sends several blobs at a time."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import IO, cast

import pytest

from buildkit.ship.mirror import mirror
from buildkit.ship.oci.registry import OCI_MANIFEST, Registry
from tests.conftest import DockerEnv
from tests.harness.faultproxy import Faults, fault_proxy

pytestmark = pytest.mark.docker

MIB = 1 << 20
CHUNK_MB = 64


class Generated:
    """``size`` bytes that compress like nothing (each MiB its own), made on the fly from ``offset``:
    a blob of GBs with no file behind it."""

    def __init__(self, seed: bytes, size: int, offset: int = 0) -> None:
        self.seed, self.size, self.position = seed, size, offset
        self.base = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(MIB // 32))

    def block(self, index: int) -> bytes:
        head = hashlib.sha256(self.seed + b"block" + index.to_bytes(8, "big")).digest()
        return head + self.base[len(head) :]

    def close(self) -> None:
        pass

    def read(self, size: int = -1) -> bytes:
        size = self.size - self.position if size < 0 else min(size, self.size - self.position)
        parts, left = [], size
        while left > 0:
            index, within = divmod(self.position, MIB)
            piece = self.block(index)[within : within + left]
            parts.append(piece)
            left -= len(piece)
            self.position += len(piece)
        return b"".join(parts)

    def digest(self) -> str:
        sha = hashlib.sha256()
        reader = Generated(self.seed, self.size)
        while piece := reader.read(8 * MIB):
            sha.update(piece)
        return "sha256:" + sha.hexdigest()


def _opener(seed: bytes, size: int) -> tuple[str, Callable[[int], IO[bytes]]]:
    def open_at(offset: int) -> IO[bytes]:
        return cast(IO[bytes], Generated(seed, size, offset))

    return Generated(seed, size).digest(), open_at


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_UPLOAD_CHUNK_MB", str(CHUNK_MB))


@pytest.mark.usefixtures("chunks")
def test_a_15_gb_blob_cut_at_700_mb_resumes_with_at_most_one_chunk_sent_twice(docker_env: DockerEnv) -> None:
    size = 1536 * MIB
    digest, open_at = _opener(b"resume", size)
    repository = f"resume-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, Faults(cut_after=700 * MIB)) as proxy:
        registry = Registry(proxy.host, backoff=0.05)
        registry.upload_blob(repository, digest, size, open_at)
    assert proxy.counts["cut"] == 1, proxy.counts
    assert registry.restarted == 0, "the registry kept the session: resumed, not restarted"
    assert size < proxy.received <= size + CHUNK_MB * MIB, f"{proxy.received - size} bytes sent twice"
    assert Registry(docker_env.registry2).blob_size(repository, digest) == size, "distribution checked the digest and holds it"


@pytest.mark.usefixtures("chunks")
def test_a_cut_that_reaches_distribution_sends_the_blob_again_whole(docker_env: DockerEnv) -> None:
    size = 200 * MIB
    digest, open_at = _opener(b"through", size)
    repository = f"through-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, Faults(cut_after=100 * MIB, cut_through=True)) as proxy:
        registry = Registry(proxy.host, backoff=0.05)
        registry.upload_blob(repository, digest, size, open_at)
    assert proxy.counts["cut"] == 1 and registry.restarted == 1
    assert proxy.received <= 100 * MIB + size
    assert Registry(docker_env.registry2).blob_size(repository, digest) == size


def _push_synthetic(registry: Registry, repository: str, layers: list[tuple[bytes, int]]) -> tuple[str, int, list[str]]:
    """An image of generated layers (``(seed, size)``), pushed by the registry API: its manifest's
    digest, its blobs' bytes and its layers' digests."""
    descriptors = []
    for seed, size in layers:
        digest, open_at = _opener(seed, size)
        registry.upload_blob(repository, digest, size, open_at)
        descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size})
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descriptors]}}
    )
    config_digest = registry.put_blob(repository, config.encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
        "layers": descriptors,
    }
    body = json.dumps(manifest).encode()
    registry.put_manifest(repository, "synthetic", body, OCI_MANIFEST)
    total = sum(size for _, size in layers) + len(config)
    return "sha256:" + hashlib.sha256(body).hexdigest(), total, [str(d["digest"]) for d in descriptors]


@pytest.mark.usefixtures("chunks")
def test_mirror_resumes_through_a_cut_and_sends_blobs_several_at_a_time(docker_env: DockerEnv) -> None:
    repository = f"mirror-resume-{uuid.uuid4().hex[:8]}"
    layers = [(b"big", 400 * MIB), *((f"small{i}".encode(), (8 + i) * MIB) for i in range(6))]
    digest, total, _ = _push_synthetic(Registry(docker_env.registry), repository, layers)
    with fault_proxy(docker_env.registry2, Faults(cut_after=250 * MIB, delay=0.05)) as proxy:
        outcome = mirror(f"{docker_env.registry}/{repository}:synthetic", f"{proxy.host}/{repository}")
    assert outcome.copied_digest == digest and proxy.counts["cut"] == 1
    assert total < proxy.received <= total + CHUNK_MB * MIB + MIB, "one chunk at most went twice (and the manifest)"
    assert 1 < proxy.most_writes_in_flight <= 4, "several blobs at a time, bounded"
    copied = Registry(docker_env.registry2).get_manifest(repository, "synthetic")
    assert copied is not None and copied.digest == digest
