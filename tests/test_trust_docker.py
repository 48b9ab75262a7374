"""Signed images on the real registries, proved by clients nobody here wrote: skopeo's
``sigstoreSigned`` policy accepts what ``--sign-key`` signed and refuses an unsigned image and
another key; skopeo signs with a key ``keygen`` wrote and ``ascendkit verify`` accepts it; the
provenance's DSSE envelope is verified by securesystemslib and its statement by in-toto's own
bindings; a mirror carries signatures and provenance, and ``--sign-key`` signs it for its new home."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey  # type: ignore[attr-defined]

from buildkit.ship.layers.compose import index_manifest
from buildkit.ship.oci.registry import Registry
from buildkit.ship.trust.attach import fallback_tag
from buildkit.trust.envelope import DSSE_ENVELOPE, SIMPLE_SIGNING
from buildkit.trust.keys import fingerprint
from tests.conftest import TEST_MATRIX, DockerEnv, build_and_push

pytestmark = pytest.mark.docker
PASSWORD = "correct horse battery staple"


@dataclasses.dataclass(frozen=True)
class Signed:
    env: DockerEnv  # with $COSIGN_PASSWORD, without an engine for the commands that need none
    keys: Path  # cosign.key, cosign.pub
    other: Path  # another key pair
    repo: str  # HOST:PORT/REPO
    member: str  # the per-arch image's digest
    index: str  # the index's digest (tag "idx")
    unsigned: str  # HOST:PORT/REPO:TAG of the same image published without a key
    workdir: Path


def _skopeo() -> str:
    """Debian trixie's skopeo, which `make services` fetches (bookworm's has sigstore cut out)."""
    found = os.environ.get("ASCENDKIT_SKOPEO_SIGSTORE", "")
    if not found or not Path(found).is_file():
        pytest.fail("ASCENDKIT_SKOPEO_SIGSTORE names no skopeo with sigstore: `python -m tests.harness.services start` fetches one")
    return found


def _keygen(env: DockerEnv, where: Path) -> Path:
    env.ascendkit("keygen", "-o", str(where), cwd=where.parent, check=True)
    return where


@pytest.fixture(scope="module")
def signed(docker_env: DockerEnv, built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Signed:
    workdir = tmp_path_factory.mktemp("trust")
    env = dataclasses.replace(docker_env, env={**docker_env.env, "COSIGN_PASSWORD": PASSWORD})
    keys, other = _keygen(env, workdir / "keys"), _keygen(env, workdir / "other")
    repo = f"trust-{uuid.uuid4().hex[:8]}"
    # its own local repository: a rebuild under `built`'s tags would move them off the image `built` recorded
    # (after test_publish re-pulls that image, the rebuild is another image), and a later test of `built` would fail
    args = ("--hw", "a3", "--repo", f"ascendkit-{repo}/verl", "--sign-key", str(keys / "cosign.key"))
    result = build_and_push(env, workdir, repo, *args)
    member = result["pushed"][0]["digest"]
    registry = Registry(docker_env.registry)
    body, media_type = index_manifest({"x86_64": registry.get_manifest(repo, member)}, None, f"{repo}:idx")  # type: ignore[dict-item]
    index = registry.put_manifest(repo, "idx", body, media_type)
    no_engine = dataclasses.replace(env, env={**env.env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    no_engine.ascendkit("sign", f"{docker_env.registry}/{repo}:idx", "--key", str(keys / "cosign.key"), cwd=workdir, check=True)
    unsigned = f"{docker_env.registry}/{built['repo']}:{built['tags'][0].rsplit(':', 1)[1]}"
    return Signed(no_engine, keys, other, f"{docker_env.registry}/{repo}", member, index, unsigned, workdir)


def _verify(signed: Signed, ref: str, key: Path) -> tuple[int, dict[str, Any], str]:
    proc = signed.env.ascendkit("verify", ref, "--key", str(key), "--matrix", str(TEST_MATRIX), "--json", cwd=signed.workdir)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def _skopeo_policy(signed: Signed, key: Path) -> tuple[Path, Path]:
    """A policy that admits registry images only with a sigstore signature by ``key`` (containers-policy.json(5))."""
    where = signed.workdir / f"policy-{key.parent.name}"
    (where / "registries.d").mkdir(parents=True, exist_ok=True)
    host = signed.repo.split("/", 1)[0]
    requirement = {"type": "sigstoreSigned", "keyPath": str(key), "signedIdentity": {"type": "matchRepository"}}
    policy = {"default": [{"type": "reject"}], "transports": {"docker": {host: [requirement]}}}
    (where / "policy.json").write_text(json.dumps(policy))
    (where / "registries.d" / "default.yaml").write_text(f"docker:\n  {host}:\n    use-sigstore-attachments: true\n")
    return where / "policy.json", where / "registries.d"


def _skopeo_admits(signed: Signed, ref: str, key: Path) -> subprocess.CompletedProcess[str]:
    """skopeo copies ``ref`` within its registry only if the policy admits it (the check is on the source)."""
    policy, registries_d = _skopeo_policy(signed, key)
    target = f"{signed.repo}:admitted-{uuid.uuid4().hex[:6]}"
    argv = [
        _skopeo(),
        "copy",
        "--policy",
        str(policy),
        "--registries.d",
        str(registries_d),
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
    ]
    return subprocess.run([*argv, f"docker://{ref}", f"docker://{target}"], capture_output=True, text=True, timeout=300, check=False)


def test_verify_accepts_what_publish_and_sign_signed_with_no_engine(signed: Signed) -> None:
    code, report, stderr = _verify(signed, f"{signed.repo}:idx", signed.keys / "cosign.pub")
    assert code == 0, stderr
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and report["image"] == f"{signed.repo}@{signed.index}"
    for name in (f"signature {signed.index}", f"signature {signed.member}", f"provenance {signed.member}"):
        assert checks[name]["status"] == "ok", checks
    assert checks[f"sbom {signed.member}"]["status"] == checks[f"matrix {signed.member}"]["status"] == "ok", checks
    assert "the matrix's" in checks[f"matrix {signed.member}"]["detail"]


def test_verify_with_another_key_names_every_failing_check(signed: Signed) -> None:
    code, report, stderr = _verify(signed, f"{signed.repo}:idx", signed.other / "cosign.pub")
    assert code == 1
    failed = [c["name"] for c in report["checks"] if c["status"] == "error"]
    assert failed == [f"signature {signed.index}", f"signature {signed.member}", f"provenance {signed.member}"]
    assert all(name in stderr for name in failed)


def test_verify_refuses_an_unsigned_image(signed: Signed) -> None:
    code, report, _ = _verify(signed, signed.unsigned, signed.keys / "cosign.pub")
    assert code == 1
    assert [c["detail"] for c in report["checks"] if c["name"].startswith("signature")] == ["no signature attached"]
    provenance = next(c for c in report["checks"] if c["name"].startswith("provenance"))
    assert "not signed" in provenance["detail"], "published without a key: the provenance is there, unsigned"


def test_skopeo_policy_admits_the_signed_image_and_refuses_others(signed: Signed) -> None:
    for ref in (f"{signed.repo}:idx", f"{signed.repo}@{signed.member}"):
        proc = _skopeo_admits(signed, ref, signed.keys / "cosign.pub")
        assert proc.returncode == 0, f"{ref}: {proc.stderr}"
    refused = _skopeo_admits(signed, signed.unsigned, signed.keys / "cosign.pub")
    assert refused.returncode != 0 and "signature" in refused.stderr.lower(), refused.stderr
    other = _skopeo_admits(signed, f"{signed.repo}:idx", signed.other / "cosign.pub")
    assert other.returncode != 0 and "signature" in other.stderr.lower(), other.stderr


def test_skopeo_signs_with_a_keygen_key_and_verify_accepts_that_signature_alone(signed: Signed) -> None:
    host, repo = signed.repo.split("/", 1)
    copy = f"{repo}-skopeo"
    signed.env.ascendkit("mirror", f"{signed.repo}@{signed.member}", f"{host}/{copy}", cwd=signed.workdir, check=True)
    registry = Registry(host)
    ours = registry.get_manifest(copy, fallback_tag(signed.member, "sig"))
    assert ours is not None, "the mirror carried our signature"
    assert registry.request("DELETE", f"/{copy}/manifests/{ours.digest}").status_code == 202  # only skopeo's will be left
    secret = signed.workdir / "passphrase"
    secret.write_text(PASSWORD)
    _, registries_d = _skopeo_policy(signed, signed.keys / "cosign.pub")
    proc = subprocess.run(
        [_skopeo(), "copy", "--registries.d", str(registries_d), "--src-tls-verify=false", "--dest-tls-verify=false",
         "--sign-by-sigstore-private-key", str(signed.keys / "cosign.key"), "--sign-passphrase-file", str(secret),
         f"docker://{host}/{copy}@{signed.member}", f"docker://{host}/{copy}:by-skopeo"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    theirs = registry.get_manifest(copy, fallback_tag(signed.member, "sig"))
    assert theirs is not None and len(theirs.json()["layers"]) == 1
    payload = registry.get_blob(copy, theirs.json()["layers"][0]["digest"])
    assert payload is not None and json.loads(payload)["critical"]["identity"]["docker-reference"] == f"{host}/{copy}:by-skopeo"
    code, report, stderr = _verify(signed, f"{host}/{copy}:by-skopeo", signed.keys / "cosign.pub")
    assert code == 0, stderr
    assert report["checks"][0]["name"] == f"signature {signed.member}" and report["checks"][0]["status"] == "ok"


def test_a_key_skopeo_generated_signs_with_ascendkit_and_skopeo_admits_it(signed: Signed) -> None:
    """A cosign-format key nobody here wrote (containers/image's generator, Go's scrypt and secretbox) works as it is."""
    where = signed.workdir / "skopeo-key"
    where.mkdir()
    (where / "passphrase").write_text("their passphrase")
    proc = subprocess.run(
        [_skopeo(), "generate-sigstore-key", "--output-prefix", str(where / "theirs"), "--passphrase-file", str(where / "passphrase")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = dataclasses.replace(signed.env, env={**signed.env.env, "COSIGN_PASSWORD": "their passphrase"})
    env.ascendkit("sign", f"{signed.repo}:idx", "--key", str(where / "theirs.private"), cwd=signed.workdir, check=True)
    code, report, _ = _verify(signed, f"{signed.repo}:idx", where / "theirs.pub")
    signatures = [c for c in report["checks"] if c["name"].startswith("signature")]
    assert len(signatures) == 2 and all(c["status"] == "ok" for c in signatures), report
    provenance = next(c for c in report["checks"] if c["name"].startswith("provenance"))
    assert code == 1 and provenance["status"] == "error", "keygen's key signed the provenance, not theirs"
    admitted = _skopeo_admits(signed, f"{signed.repo}:idx", where / "theirs.pub")
    assert admitted.returncode == 0, admitted.stderr


def test_the_provenance_envelope_and_statement_pass_in_totos_own_libraries(signed: Signed) -> None:
    host, repo = signed.repo.split("/", 1)
    registry = Registry(host)
    attestation = registry.get_manifest(repo, fallback_tag(signed.member, "att"))
    assert attestation is not None
    layer = attestation.json()["layers"][0]
    assert layer["mediaType"] == DSSE_ENVELOPE and layer["annotations"]["predicateType"] == "https://slsa.dev/provenance/v1"
    envelope = Envelope.from_dict(json.loads(registry.get_blob(repo, layer["digest"]) or b""))
    public = serialization.load_pem_public_key((signed.keys / "cosign.pub").read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    key = SSlibKey.from_crypto(public, keyid=fingerprint(public))
    assert list(envelope.verify([key], 1)) == [key.keyid]
    assert envelope.payload_type == "application/vnd.in-toto+json"
    proto = json_format.Parse(envelope.payload, statement_pb2.Statement())
    statement = Statement.copy_from_pb(proto)
    statement.validate()
    assert proto.subject[0].digest["sha256"] == signed.member.removeprefix("sha256:")
    predicate = json_format.MessageToDict(proto.predicate)
    deps = {d["name"]: d for d in predicate["buildDefinition"]["resolvedDependencies"]}
    assert deps["base-image"]["digest"]["sha256"] and any(name.startswith("lock:") for name in deps)
    assert predicate["buildDefinition"]["externalParameters"]["stack"] == "teststack"
    assert predicate["runDetails"]["builder"]["version"]["ascendkit"]


def test_a_mirror_carries_signatures_and_provenance_and_sign_key_signs_it_for_its_new_home(signed: Signed) -> None:
    registry2 = signed.env.registry2
    repo = signed.repo.split("/", 1)[1]
    copied = f"{registry2}/{repo}:idx"
    signed.env.ascendkit("mirror", f"{signed.repo}:idx", copied, cwd=signed.workdir, check=True)
    code, report, _ = _verify(signed, copied, signed.keys / "cosign.pub")
    assert code == 1
    failing = {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "error"}
    assert set(failing) == {f"signature {signed.index}", f"signature {signed.member}"}, "the provenance travelled and still holds"
    assert all(f"signed for repository {signed.repo}" in detail for detail in failing.values())
    key = str(signed.keys / "cosign.key")
    proc = signed.env.ascendkit("mirror", f"{signed.repo}:idx", copied, "--sign-key", key, "--json", cwd=signed.workdir, check=True)
    assert set(json.loads(proc.stdout)["signed"]) == {signed.index, signed.member}
    code, report, stderr = _verify(signed, copied, signed.keys / "cosign.pub")
    assert code == 0, stderr
    source = Registry(signed.repo.split("/", 1)[0]).get_manifest(repo, fallback_tag(signed.member, "sig"))
    sig = Registry(registry2).get_manifest(repo, fallback_tag(signed.member, "sig"))
    assert source is not None and sig is not None
    kept = source.json()["layers"]
    assert sig.json()["layers"][: len(kept)] == kept, "the copied signatures stay"
    assert [layer["mediaType"] for layer in sig.json()["layers"]] == [SIMPLE_SIGNING] * (len(kept) + 1), "and one for the new home"
