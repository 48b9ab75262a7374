"""Keys, signatures and provenance without a registry or an engine: cosign's key format read and
written, deterministic signatures, the simple-signing payload in both its writers' shapes, DSSE
envelopes checked by securesystemslib and statements by in-toto's own bindings, attachments that
keep other signatures, and the admission policies against their upstream CRDs."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey  # type: ignore[attr-defined]
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import InputError, PublishFailed
from buildkit.image.record import source_of
from buildkit.k8s.crd import crd_for, validate
from buildkit.k8s.policy import policy_name, render_policy
from buildkit.ship.oci.registry import OCI_INDEX, OCI_MANIFEST, Registry
from buildkit.ship.trust.checks import sign_tree, verify_image
from buildkit.ship.trust.sign import attached, attest_digest, sign_digest
from buildkit.trust import keys
from buildkit.trust.envelope import (
    DSSE_ENVELOPE,
    SIMPLE_SIGNING,
    SignedClaim,
    dsse_envelope,
    open_envelope,
    read_simple_signing,
    simple_signing_payload,
)
from buildkit.trust.provenance import SLSA_PROVENANCE, pins_of, statement
from tests.harness.fake_registry import fake_registry

PASSWORD = b"s3cret"
DIGEST = "sha256:" + "ab" * 32
BUILD: dict[str, Any] = {
    "stack": "teststack",
    "chip": "a3",
    "arch": "x86_64",
    "passed": True,
    "image": {"id": "sha256:" + "cd" * 32},
    "build": {
        "source": {"repository": "https://example.org/ascendkit.git", "commit": "f" * 40, "dirty": False},
        "framework": "verl",
        "pins": [{"name": "torch", "version": "2.7.1"}, {"name": "torch-npu", "version": "2.7.1"}],
        "checkouts": [{"name": "mindspeed", "uri": "git+https://gitcode.com/Ascend/MindSpeed.git", "ref": "f2b0977e"}],
        "lock_files": {"locks/teststack-x86_64.torch.txt": "12" * 32},
        "base_image": {"ref": "quay.io/ascend/cann:8.3.rc1", "digest": "sha256:" + "34" * 32, "from_registry": True},
        "build_args": {"PIP_INDEX_URL": "https://mirror.example/simple"},
    },
}


@pytest.fixture(scope="module")
def signer() -> keys.Signer:
    private_pem, _ = keys.generate(PASSWORD)
    return keys.decrypt_private_key(private_pem, PASSWORD, "cosign.key")


# ---- keys -------------------------------------------------------------------------------------------


def test_a_new_key_is_cosigns_encrypted_form_and_opens_only_with_its_passphrase() -> None:
    private_pem, public_pem = keys.generate(PASSWORD)
    kind, body = keys._unpem(private_pem, "k")
    document = json.loads(body)
    assert kind == "ENCRYPTED COSIGN PRIVATE KEY"
    assert document["kdf"] == {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": document["kdf"]["salt"]}
    assert document["cipher"]["name"] == "nacl/secretbox" and len(base64.b64decode(document["cipher"]["nonce"])) == 24
    opened = keys.decrypt_private_key(private_pem, PASSWORD, "k")
    assert opened.public.pem() == public_pem
    with pytest.raises(InputError, match="wrong passphrase"):
        keys.decrypt_private_key(private_pem, b"nope", "k")


def _rewrap(private_pem: bytes, kind: str, params: dict[str, int] | None = None) -> bytes:
    """The same key under another PEM type, or re-sealed with other scrypt parameters (as newer cosigns write)."""
    key = keys.decrypt_private_key(private_pem, PASSWORD, "k").key
    if params is None:
        return keys._pem(kind, keys._unpem(private_pem, "k")[1])
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    import nacl.secret

    salt, nonce = os.urandom(32), os.urandom(24)
    sealed = nacl.secret.SecretBox(keys._scrypt(PASSWORD, salt, params)).encrypt(der, nonce).ciphertext
    document = {
        "kdf": {"name": "scrypt", "params": params, "salt": base64.b64encode(salt).decode()},
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    return keys._pem(kind, json.dumps(document).encode())


def test_keys_cosign_wrote_are_read_as_they_are() -> None:
    private_pem, public_pem = keys.generate(PASSWORD)
    for variant in (
        _rewrap(private_pem, "ENCRYPTED SIGSTORE PRIVATE KEY"),
        _rewrap(private_pem, "ENCRYPTED SIGSTORE PRIVATE KEY", {"N": 65536, "r": 8, "p": 1}),
    ):
        assert keys.decrypt_private_key(variant, PASSWORD, "k").public.pem() == public_pem
    with pytest.raises(InputError, match="unsupported key encryption"):
        keys.decrypt_private_key(_rewrap(private_pem, "ENCRYPTED COSIGN PRIVATE KEY", {"N": 1024, "r": 8, "p": 1}), PASSWORD, "k")
    with pytest.raises(InputError, match="not an encrypted cosign private key"):
        keys.decrypt_private_key(public_pem, PASSWORD, "k")


def test_only_ecdsa_p256_public_keys_verify(tmp_path: Path) -> None:
    rsa_pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    (tmp_path / "rsa.pub").write_bytes(rsa_pem)
    with pytest.raises(InputError, match="ECDSA"):
        keys.load_public_key(str(tmp_path / "rsa.pub"))
    private_pem, _ = keys.generate(PASSWORD)
    (tmp_path / "cosign.key").write_bytes(private_pem)
    with pytest.raises(InputError, match="verification takes the public key"):
        keys.load_public_key(str(tmp_path / "cosign.key"))


def test_a_key_in_the_environment_is_read_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    private_pem, public_pem = keys.generate(PASSWORD)
    monkeypatch.setenv("SIGNING_KEY", private_pem.decode())
    signer = keys.load_signer("env://SIGNING_KEY", PASSWORD)
    assert signer.where == "$SIGNING_KEY" and signer.public.pem() == public_pem
    assert private_pem.decode() not in repr(signer), "a signer's repr never shows the key"
    with pytest.raises(InputError, match=r"\$UNSET_KEY is not set"):
        keys.load_signer("env://UNSET_KEY", PASSWORD)
    # a masked GitLab variable holds one line: the PEM base64-encoded (base64 -w0 cosign.key)
    monkeypatch.setenv("MASKED_KEY", base64.b64encode(private_pem).decode())
    masked = keys.load_signer("env://MASKED_KEY", PASSWORD)
    assert masked.where == "$MASKED_KEY (base64)" and masked.public.pem() == public_pem
    monkeypatch.setenv("NOT_A_KEY", "c2VjcmV0")  # base64 of something that is not a PEM key
    with pytest.raises(InputError, match=r"\$NOT_A_KEY holds neither a PEM key nor a PEM key base64-encoded"):
        keys.load_signer("env://NOT_A_KEY", PASSWORD)


def test_signatures_are_deterministic_and_verify(signer: keys.Signer) -> None:
    payload = simple_signing_payload("127.0.0.1:5000/verl", DIGEST)
    assert signer.sign(payload) == signer.sign(payload)
    assert signer.public.verifies(payload, signer.sign(payload))
    assert not signer.public.verifies(payload + b" ", signer.sign(payload))


# ---- the CLI's keygen ---------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"COSIGN_PASSWORD": PASSWORD.decode()}
    result = runner.invoke(app, ["keygen", "-o", str(tmp_path / "keys")], env=env)
    assert result.exit_code == 0, result.output
    key, pub = tmp_path / "keys" / "cosign.key", tmp_path / "keys" / "cosign.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert keys.decrypt_private_key(key.read_bytes(), PASSWORD, "k").public.pem() == pub.read_bytes()
    before = key.read_bytes()
    again = runner.invoke(app, ["keygen", "-o", str(tmp_path / "keys")], env=env)
    assert again.exit_code == 2 and "already exist" in again.output and key.read_bytes() == before
    unset = runner.invoke(app, ["keygen", "-o", str(tmp_path / "other")], env={"COSIGN_PASSWORD": None})
    assert unset.exit_code == 2 and "COSIGN_PASSWORD" in unset.output and not (tmp_path / "other").exists()


# ---- payloads -----------------------------------------------------------------------------------------


def test_the_simple_signing_payload_is_cosigns() -> None:
    payload = json.loads(simple_signing_payload("quay.io/ascendkit/verl", DIGEST))
    assert payload == {
        "critical": {
            "identity": {"docker-reference": "quay.io/ascendkit/verl"},
            "image": {"docker-manifest-digest": DIGEST},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    # containers/image (skopeo, podman) names the tag it pushed and adds who signed and when
    theirs = dict(payload, optional={"creator": "containers/image 5.34", "timestamp": 1764000000})
    theirs["critical"]["identity"]["docker-reference"] = "127.0.0.1:5000/verl:by-skopeo"
    assert read_simple_signing(json.dumps(theirs).encode()) == SignedClaim("127.0.0.1:5000/verl", DIGEST)
    theirs["critical"]["type"] = "atomic container signature"
    assert "not 'cosign container image signature'" in str(read_simple_signing(json.dumps(theirs).encode()))
    assert read_simple_signing(b"[]") == "not a simple-signing payload"


def test_the_provenance_envelope_passes_securesystemslib_and_in_totos_statement(signer: keys.Signer) -> None:
    document = statement("127.0.0.1:5000/verl", DIGEST, BUILD)
    envelope = dsse_envelope(document, signer)
    public = signer.public.key
    key = SSlibKey.from_crypto(public, keyid=keys.fingerprint(public))
    parsed = Envelope.from_dict(json.loads(envelope))
    assert list(parsed.verify([key], 1)) == [key.keyid]
    proto = json_format.Parse(parsed.payload, statement_pb2.Statement())
    Statement.copy_from_pb(proto).validate()
    assert proto.predicate_type == SLSA_PROVENANCE and proto.subject[0].digest["sha256"] == "ab" * 32
    deps = {d["name"]: d for d in document["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["source"]["digest"] == {"gitCommit": "f" * 40}
    assert deps["base-image"]["digest"] == {"sha256": "34" * 32}
    assert deps["lock:locks/teststack-x86_64.torch.txt"]["digest"] == {"sha256": "12" * 32}
    assert deps["git:mindspeed"]["uri"].endswith("MindSpeed.git@f2b0977e")
    assert pins_of(document) == {"torch": "2.7.1", "torch-npu": "2.7.1"}
    assert statement("127.0.0.1:5000/verl", DIGEST, BUILD) == document, "depends on its inputs alone"


def test_an_envelope_opens_only_for_its_key_and_untouched(signer: keys.Signer) -> None:
    document = statement("r/verl", DIGEST, BUILD)
    envelope = dsse_envelope(document, signer)
    assert open_envelope(envelope, signer.public) == (document, "")
    other = keys.decrypt_private_key(keys.generate(PASSWORD)[0], PASSWORD, "other.key")
    assert open_envelope(envelope, other.public)[1].startswith("no signature by other.key")
    tampered = json.loads(envelope)
    tampered["payload"] = base64.b64encode(json.dumps({**document, "subject": []}).encode()).decode()
    assert open_envelope(json.dumps(tampered).encode(), signer.public)[0] is None
    assert "not signed" in open_envelope(dsse_envelope(document, None), signer.public)[1]


# ---- attachments ----------------------------------------------------------------------------------------


def test_signing_keeps_other_signatures_and_signing_again_writes_nothing(signer: keys.Signer) -> None:
    other = keys.decrypt_private_key(keys.generate(PASSWORD)[0], PASSWORD, "other.key")
    with fake_registry(referrers=False) as (host, store):
        registry = Registry(host, retries=1)
        first = sign_digest(registry, "verl", DIGEST, other)
        both = sign_digest(registry, "verl", DIGEST, signer)
        puts = len([r for r in store.requests if r.startswith("PUT")])
        assert sign_digest(registry, "verl", DIGEST, signer) == both and first != both
        assert len([r for r in store.requests if r.startswith("PUT")]) == puts, "the same signature again: nothing written"
        found = attached(registry, "verl", DIGEST, "sig", SIMPLE_SIGNING)
        assert len(found) == 2 and all(read_simple_signing(p) == SignedClaim(f"{host}/verl", DIGEST) for p, _ in found)
        attest_digest(registry, "verl", DIGEST, b'{"a": 1}', SLSA_PROVENANCE)
        attest_digest(registry, "verl", DIGEST, b'{"a": 2}', SLSA_PROVENANCE)
        attest_digest(registry, "verl", DIGEST, b'{"v": 1}', "https://cyclonedx.org/bom")
        kept = attached(registry, "verl", DIGEST, "att", DSSE_ENVELOPE)
        assert sorted(data for data, _ in kept) == [b'{"a": 2}', b'{"v": 1}'], "the provenance replaced, another kind kept"


def test_the_docker_form_of_a_signature_names_no_oci_media_type(signer: keys.Signer) -> None:
    with fake_registry(referrers=False) as (host, store):
        sign_digest(Registry(host, retries=1), "verl", DIGEST, signer, "docker")
        media_type, body = next(m for m in store.manifests.values())
        manifest = json.loads(body)
        assert media_type == manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
        assert manifest["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
        assert [layer["mediaType"] for layer in manifest["layers"]] == [SIMPLE_SIGNING]


# ---- what the build records, and the cluster's policies -------------------------------------------------


def test_the_source_is_github_actions_own_in_a_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_SHA", "a" * 40)
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/ascendkit")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    assert source_of() == {"repository": "https://github.com/org/ascendkit", "commit": "a" * 40, "dirty": False}
    monkeypatch.delenv("GITHUB_ACTIONS")
    found = source_of()
    assert found is not None and len(found["commit"]) == 40, "a checkout: its own HEAD"
    assert source_of(Path("/")) is None, "no checkout, no source"


@pytest.mark.parametrize("kind", ["kyverno", "sigstore"])
def test_each_policy_is_valid_against_its_upstream_crd_and_names_the_key(kind: str, signer: keys.Signer) -> None:
    pem = signer.public.pem().decode()
    document = render_policy(kind, f"swr.cn-south-1.myhuaweicloud.com/ascendkit/verl@{DIGEST}", pem)
    crd, schema = crd_for(document["apiVersion"], document["kind"])
    assert crd is not None and schema, f"no vendored CRD for {document['kind']}"
    assert validate(document, schema) == []
    text = json.dumps(document)
    assert "BEGIN PUBLIC KEY" in text and "swr.cn-south-1.myhuaweicloud.com/ascendkit/verl@*" in text
    if kind == "kyverno":
        verify = document["spec"]["rules"][0]["verifyImages"][0]
        assert verify["verifyDigest"] and verify["mutateDigest"] and verify["required"] and verify["failureAction"] == "Enforce"
        assert verify["attestors"][0]["entries"][0]["keys"]["rekor"] == {"ignoreTlog": True}
        assert document["spec"]["failurePolicy"] == "Fail"
    else:
        assert document["spec"]["mode"] == "enforce" and "ctlog" not in document["spec"]["authorities"][0]
    broken = json.loads(text)
    broken["spec"]["strict"] = True
    assert validate(broken, schema) == [("spec.strict", 'unknown field "strict"')]


def test_policy_names_are_dns_labels_and_the_cli_wants_both_options(tmp_path: Path, signer: keys.Signer) -> None:
    name = policy_name("registry.example.com:5000/a/very/long/path/to/the/ascendkit/verl/images/for/the/a3")
    assert len(name) <= 63 and not name.endswith("-") and name.startswith("ascendkit-signed-registry-example-com-5000")
    runner = CliRunner()
    pub = tmp_path / "cosign.pub"
    pub.write_bytes(signer.public.pem())
    alone = runner.invoke(app, ["k8s", "render", "--image", "quay.io/a/verl:1", "--policy", "kyverno"])
    assert alone.exit_code == 2 and "--policy and --key go together" in alone.output
    wrong = runner.invoke(app, ["k8s", "render", "--image", "quay.io/a/verl:1", "--policy", "opa", "--key", str(pub)])
    assert wrong.exit_code == 2 and "give kyverno or sigstore" in wrong.output
    out = tmp_path / "policy.yaml"
    done = runner.invoke(app, ["k8s", "render", "--image", "quay.io/a/verl:1", "--policy", "sigstore", "--key", str(pub), "-o", str(out)])
    assert done.exit_code == 0, done.output
    checked = runner.invoke(app, ["k8s", "validate", str(out)])
    assert checked.exit_code == 0 and "1 document(s) valid" in checked.output


def test_an_index_member_the_registry_lacks_is_a_failed_check_and_is_not_signed(signer: keys.Signer) -> None:
    missing = "sha256:" + "ef" * 32
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{"mediaType": OCI_MANIFEST, "digest": missing, "size": 10}]}
    ).encode()
    with fake_registry(referrers=False) as (host, _):
        registry = Registry(host, retries=1)
        digest = registry.put_manifest("verl", "idx", index, OCI_INDEX)
        sign_digest(registry, "verl", digest, signer)
        _, checks = verify_image(f"{host}/verl:idx", signer.public, lambda _: None)
        assert [(c.name, c.status) for c in checks] == [(f"signature {digest}", "ok"), (f"member {missing}", "error")]
        with pytest.raises(PublishFailed, match="which the registry does not serve"):
            sign_tree(registry, "verl", registry.get_manifest("verl", "idx"), signer)  # type: ignore[arg-type]


def test_a_loaded_base_is_named_as_such_in_the_provenance(signer: keys.Signer) -> None:
    """A base loaded into the engine, not pulled, has no registry digest: its config's digest is
    recorded with the config's media type and said to be one, in a form in-toto's own Statement takes."""
    build: dict[str, Any] = dict(BUILD["build"])
    build["base_image"] = {"ref": "cann:local", "digest": "sha256:" + "56" * 32, "from_registry": False}
    document = statement("127.0.0.1:5000/verl", DIGEST, {**BUILD, "build": build})
    parsed = Envelope.from_dict(json.loads(dsse_envelope(document, signer)))
    Statement.copy_from_pb(json_format.Parse(parsed.payload, statement_pb2.Statement())).validate()
    base = next(d for d in document["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == "base-image")
    assert base["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert "not pulled" in base["annotations"]["ascendkit.base"]
    pulled = next(
        d for d in statement("r/v", DIGEST, BUILD)["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == "base-image"
    )
    assert "mediaType" not in pulled and "annotations" not in pulled
