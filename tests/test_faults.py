"""Publishing through a registry that misbehaves on purpose: our fault proxy (tests/harness/faultproxy.py) in
front of the real second registry answers 503 and 429 (with Retry-After) to one request in three,
cuts one write in four half-way through its body, answers slowly, or all of that at once; or stays
down. Every result is read back from the registry behind the proxy with skopeo."""

from __future__ import annotations

import dataclasses
import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode, Unavailable
from buildkit.imageref import RegistryRef
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.oci.registry import Registry
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.publish import push_image
from buildkit.ship.trust.attach import fallback_tag
from buildkit.ship.trust.checks import verify_image
from buildkit.trust.keys import decrypt_private_key, generate
from tests.conftest import DockerEnv
from tests.harness import skopeo
from tests.harness.faultproxy import MODES, Faults, fault_proxy
from tests.harness.smallimage import build_small_image

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def one_blob_at_a_time(docker_env: DockerEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's cadence (one request in three, one write in four) is deterministic for one
    request at a time; blobs sent several at once would meet it at random, and a run could meet
    seven faults in a row on one call. So these tests send one blob at a time (in this process and
    in the commands they run); tests/test_resume.py sends several at once through a cut."""
    monkeypatch.setenv("ASCENDKIT_UPLOAD_PARALLEL", "1")
    monkeypatch.setitem(docker_env.env, "ASCENDKIT_UPLOAD_PARALLEL", "1")


@pytest.fixture(scope="module")
def small_image(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalImage]:
    image = build_small_image(docker_env.client, tmp_path_factory.mktemp("fault-manifests"))
    yield image
    docker_env.client.remove_image(image.identity.engine_id, force=True)


@pytest.fixture(scope="module")
def clean_digest(docker_env: DockerEnv, small_image: LocalImage) -> str:
    target = RegistryRef(docker_env.registry2, f"clean-{uuid.uuid4().hex[:8]}")
    outcome = push_image(docker_env.client, small_image, [Target.of(target)], ShipOptions())
    return outcome.pushed[0].digest


@pytest.mark.parametrize("mode", ["503", "429", "drop", "slow", "mixed"])
def test_a_publish_survives_the_fault(docker_env: DockerEnv, small_image: LocalImage, clean_digest: str, mode: str) -> None:
    repository = f"fault-{mode}-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, MODES[mode]) as proxy:
        outcome = push_image(docker_env.client, small_image, [Target.of(RegistryRef(proxy.host, repository))], ShipOptions())
    injected = {"503": "503", "429": "429", "drop": "dropped", "slow": "requests", "mixed": "dropped"}[mode]
    assert proxy.counts[injected] > 0, proxy.counts
    if mode == "mixed":
        assert proxy.counts["503"] and proxy.counts["429"], proxy.counts
    # what the registry behind the proxy holds, as skopeo reads it
    behind = f"{docker_env.registry2}/{repository}"
    assert {p.digest for p in outcome.pushed} == {clean_digest}, "the faults changed no byte of the manifest"
    for tag in small_image.tag_names:
        assert skopeo.digest(f"{behind}:{tag}") == clean_digest
    assert fallback_tag(clean_digest) in skopeo.tags(behind), "the SBOM landed with the image"


def test_a_signed_publish_through_every_fault_verifies_behind_the_proxy(docker_env: DockerEnv, small_image: LocalImage) -> None:
    """Signatures and provenance are written through the same retries: each lands whole, once."""
    signer = decrypt_private_key(generate(b"faults")[0], b"faults", "faults.key")
    repository = f"fault-signed-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, MODES["mixed"]) as proxy:
        outcome = push_image(docker_env.client, small_image, [Target.of(RegistryRef(proxy.host, repository))], ShipOptions(signer=signer))
        digest = outcome.pushed[0].digest
        _, checks = verify_image(f"{proxy.host}/{repository}@{digest}", signer.public, lambda _: None)  # the name it was signed for
    assert proxy.counts["dropped"] and proxy.counts["503"] and proxy.counts["429"], proxy.counts
    by_name = {c.name: c for c in checks}
    assert by_name[f"signature {digest}"].status == by_name[f"provenance {digest}"].status == "ok", checks
    _, behind = verify_image(f"{docker_env.registry2}/{repository}@{digest}", signer.public, lambda _: None)
    assert f"signed for repository {proxy.host}/{repository}" in behind[0].detail, "a signature names the repository it was made for"
    sig = Registry(docker_env.registry2).get_manifest(repository, fallback_tag(digest, "sig"))
    assert sig is not None and len(sig.json()["layers"]) == 1, "a retried write added no second signature"


def _publish_argv(built: dict[str, Any], registry: str) -> list[str]:
    return ["publish", built["tags"][0], "--registry", registry, "--no-index"]


def test_the_test_image_through_every_fault_at_once(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """The 700 MB image, its big layer sent whole through a proxy that cuts one write in four."""
    repository = f"mixed-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, MODES["mixed"]) as proxy:
        proc = docker_env.ascendkit(*_publish_argv(built, f"{proxy.host}/{repository}"), "--json", cwd=built["workdir"])
    assert proc.returncode == 0, proc.stderr
    assert proxy.counts["dropped"] and proxy.counts["503"] and proxy.counts["429"], proxy.counts
    assert "sent blob" in proc.stderr, "the layers went through the proxy, not around it"
    (outcome,) = json.loads(proc.stdout)
    digest = built["pushed"][0]["digest"]
    assert {p["digest"] for p in outcome["pushed"]} == {digest}, "the same digest as the clean push, under every tag"
    behind = f"{docker_env.registry2}/{repository}"
    for ref in built["tags"]:
        assert skopeo.digest(f"{behind}:{ref.rsplit(':', 1)[1]}") == digest
    assert fallback_tag(digest) in skopeo.tags(behind)


def test_a_registry_that_stays_down_is_exit_4_naming_it(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    repository = f"down-{uuid.uuid4().hex[:8]}"
    env = {**docker_env.env, "ASCENDKIT_REGISTRY_RETRIES": "2"}
    with fault_proxy(docker_env.registry2, MODES["down"]) as proxy:
        proc = DockerEnv(docker_env.client, docker_env.standin, docker_env.registry, env).ascendkit(
            *_publish_argv(built, f"{proxy.host}/{repository}"), cwd=built["workdir"]
        )
    assert proc.returncode == ExitCode.UNAVAILABLE, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ascendkit:")]
    assert len(errors) == 1 and errors[0].startswith(f"ascendkit: registry {proxy.host}: HTTP 503"), errors
    assert errors[0].endswith("(HEAD blobs, 3 attempts)"), "the call and the attempts it made: ASCENDKIT_REGISTRY_RETRIES=2"


def test_no_tag_without_its_sbom(docker_env: DockerEnv, small_image: LocalImage) -> None:
    """The registry takes the image but keeps refusing its SBOM: the command fails, and no tag names
    the image (a tag is written only after the SBOM landed)."""
    repository = f"nosbom-{uuid.uuid4().hex[:8]}"
    refuse_sbom = Faults(refuse=lambda method, path: method == "PUT" and path.endswith(".sbom"))
    with fault_proxy(docker_env.registry2, refuse_sbom) as proxy:
        target = Target.of(RegistryRef(proxy.host, repository))
        target.registry.policy = dataclasses.replace(target.registry.policy, retries=1)
        with pytest.raises(Unavailable, match=r"PUT manifests"):
            push_image(docker_env.client, small_image, [target], ShipOptions())
    assert proxy.counts["refused"] >= 2
    tags = Registry(docker_env.registry2).tags(repository)
    assert not set(small_image.tag_names) & set(tags), tags


@pytest.mark.parametrize("cache", ["cold", "warm"])
@pytest.mark.parametrize("down_first", [False, True], ids=["healthy-first", "down-first"])
def test_several_registries_one_of_them_down(
    docker_env: DockerEnv, small_image: LocalImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str, down_first: bool
) -> None:
    """Everything goes to every registry by digest before any tag: one registry down, no tag of any
    kind anywhere (the SBOM's and the provenance's included), whichever registry comes first and
    whatever the layer cache remembers. A cold cache means the healthy registry has to receive every
    blob; a warm one, that it could mount them all, so the publish reaches the dead one sooner."""
    monkeypatch.setenv("ASCENDKIT_CACHE", str(tmp_path / "cache"))
    if cache == "warm":  # the same layers already in another repository of the healthy registry, and the cache knows
        push_image(
            docker_env.client, small_image, [Target.of(RegistryRef(docker_env.registry, f"warm-{uuid.uuid4().hex[:8]}"))], ShipOptions()
        )
    repository = f"half-{uuid.uuid4().hex[:8]}"
    with fault_proxy(docker_env.registry2, MODES["down"]) as proxy:
        down = Target.of(RegistryRef(proxy.host, repository))
        down.registry.policy = dataclasses.replace(down.registry.policy, retries=1)
        healthy = Target.of(RegistryRef(docker_env.registry, repository))
        with pytest.raises(Unavailable, match=proxy.host):
            push_image(docker_env.client, small_image, [down, healthy] if down_first else [healthy, down], ShipOptions())
    assert Registry(docker_env.registry).tags(repository) == [], "the healthy registry got no tag either"
    assert Registry(docker_env.registry2).tags(repository) == []


def test_a_registry_that_refuses_an_attachment_leaves_no_tag_in_the_other(docker_env: DockerEnv, small_image: LocalImage) -> None:
    """The second registry takes every blob and the image's manifest, then refuses every other
    manifest (the SBOM, the provenance, the signature): the first, healthy one, which took its own
    attachments by then, gets no tag of any kind."""
    repository = f"attach-{uuid.uuid4().hex[:8]}"
    manifest_puts = itertools.count()
    refuse_after_the_image = Faults(refuse=lambda method, path: method == "PUT" and "/manifests/" in path and next(manifest_puts) > 0)
    signer = decrypt_private_key(generate(b"faults")[0], b"faults", "faults.key")
    with fault_proxy(docker_env.registry2, refuse_after_the_image) as proxy:
        refusing = Target.of(RegistryRef(proxy.host, repository))
        refusing.registry.policy = dataclasses.replace(refusing.registry.policy, retries=1)
        healthy = Target.of(RegistryRef(docker_env.registry, repository))
        with pytest.raises(Unavailable, match=r"PUT manifests"):
            push_image(docker_env.client, small_image, [healthy, refusing], ShipOptions(signer=signer))
    assert proxy.counts["refused"] >= 2
    assert Registry(docker_env.registry).tags(repository) == [], "no SBOM, signature, provenance or image tag in the healthy registry"
    assert Registry(docker_env.registry2).tags(repository) == []


def test_the_build_manifest_records_every_registry(small_image: LocalImage, clean_digest: str) -> None:
    assert small_image.manifest is not None
    recorded = json.loads(small_image.manifest.read_text())["published"]
    assert recorded["digest"] == clean_digest and recorded["registries"], recorded
    for entry in recorded["registries"].values():
        assert entry["gzip"]["digest"] == recorded["digest"] and entry["gzip"]["sbom"]["attached_as"].startswith("tag ")
