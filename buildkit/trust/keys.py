"""Signing keys in cosign's formats: an ECDSA P-256 key pair, the private key PKCS#8 DER sealed with
a passphrase (scrypt, then NaCl secretbox) in a PEM block of JSON, the public key PEM (PKIX).

``keygen`` writes the ``ENCRYPTED COSIGN PRIVATE KEY`` block with scrypt's legacy parameters
(N=2^15, r=8, p=1): the form every cosign and every containers/image (skopeo, podman) reads, the
older ones included. Keys that cosign wrote are read as they are: either PEM type, any of the three
scrypt parameter sets cosign's library accepts.

Signatures are ECDSA over SHA-256, ASN.1 DER, made deterministically (RFC 6979): the same key
signing the same bytes gives the same signature, so signing again writes nothing new.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.secret
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from buildkit.errors import InputError
from buildkit.fsio import read_input_bytes

PRIVATE_PEM_TYPES = ("ENCRYPTED COSIGN PRIVATE KEY", "ENCRYPTED SIGSTORE PRIVATE KEY")
WRITTEN_PEM_TYPE = PRIVATE_PEM_TYPES[0]
SCRYPT_WRITTEN = {"N": 32768, "r": 8, "p": 1}
SCRYPT_ACCEPTED = ({"N": 32768, "r": 8, "p": 1}, {"N": 65536, "r": 8, "p": 1}, {"N": 131072, "r": 8, "p": 1})
PASSWORD_ENV = "COSIGN_PASSWORD"  # cosign's own variable, so one secret serves both tools
ENV_PREFIX = "env://"  # --sign-key env://VAR: the key's PEM is in the environment (CI), never on disk


def _scrypt(password: bytes, salt: bytes, params: dict[str, int]) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=params["N"], r=params["r"], p=params["p"], maxmem=256 << 20, dklen=32)


def _pem(kind: str, data: bytes) -> bytes:
    body = base64.encodebytes(data).decode().replace("\n", "")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return ("\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----"]) + "\n").encode()


def _unpem(text: bytes, where: str) -> tuple[str, bytes]:
    lines = text.decode("ascii", errors="replace").strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith("-----BEGIN ") or not lines[-1].startswith("-----END "):
        raise InputError(f"{where}: not a PEM block")
    kind = lines[0].removeprefix("-----BEGIN ").removesuffix("-----")
    try:
        return kind, base64.b64decode("".join(line.strip() for line in lines[1:-1]), validate=True)
    except ValueError:
        raise InputError(f"{where}: the PEM block is not base64") from None


def fingerprint(public: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the key's PKIX DER: the ``keyid`` of DSSE signatures made with it."""
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


@dataclass(frozen=True)
class PublicKey:
    key: ec.EllipticCurvePublicKey
    where: str

    @property
    def keyid(self) -> str:
        return fingerprint(self.key)

    def pem(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def verifies(self, data: bytes, signature: bytes) -> bool:
        try:
            self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """A private key ready to sign; its repr names where it came from, never the key."""

    key: ec.EllipticCurvePrivateKey = field(repr=False)
    where: str

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key.public_key(), self.where)

    def sign(self, data: bytes) -> bytes:
        return self.key.sign(data, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))


def encrypt_private_key(key: ec.EllipticCurvePrivateKey, password: bytes) -> bytes:
    """cosign's encrypted private key: PKCS#8 DER, sealed by a key scrypt derives from ``password``."""
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    salt, nonce = secrets.token_bytes(32), secrets.token_bytes(24)
    sealed = nacl.secret.SecretBox(_scrypt(password, salt, SCRYPT_WRITTEN)).encrypt(der, nonce).ciphertext
    document = {
        "kdf": {"name": "scrypt", "params": SCRYPT_WRITTEN, "salt": base64.b64encode(salt).decode()},
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    return _pem(WRITTEN_PEM_TYPE, json.dumps(document).encode())


def decrypt_private_key(text: bytes, password: bytes, where: str) -> Signer:
    kind, body = _unpem(text, where)
    if kind not in PRIVATE_PEM_TYPES:
        raise InputError(f"{where}: a {kind} PEM block, not an encrypted cosign private key ({' or '.join(PRIVATE_PEM_TYPES)})")
    try:
        document = json.loads(body)
        kdf, cipher = document["kdf"], document["cipher"]
        params = {k: int(kdf["params"][k]) for k in ("N", "r", "p")}
        salt, nonce = base64.b64decode(kdf["salt"]), base64.b64decode(cipher["nonce"])
        sealed = base64.b64decode(document["ciphertext"])
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{where}: not cosign's encrypted key document (kdf, cipher, ciphertext)") from None
    if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox" or params not in SCRYPT_ACCEPTED:
        raise InputError(f"{where}: unsupported key encryption ({kdf.get('name')} {params}, {cipher.get('name')})")
    try:
        der = nacl.secret.SecretBox(_scrypt(password, salt, params)).decrypt(sealed, nonce)
    except (nacl.exceptions.CryptoError, ValueError):
        raise InputError(f"{where}: wrong passphrase (${PASSWORD_ENV} or the prompt), or a damaged key") from None
    key = serialization.load_der_private_key(der, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(f"{where}: an ECDSA P-256 key is needed (cosign's kind); this is {type(key).__name__}")
    return Signer(key, where)


def generate(password: bytes) -> tuple[bytes, bytes]:
    """A new key pair: (cosign.key, cosign.pub)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return encrypt_private_key(key, password), Signer(key, "new").public.pem()


def read_key_source(source: str) -> tuple[bytes, str]:
    """The bytes of ``--key``/``--sign-key``: a file, or ``env://VAR``: the PEM in an environment variable, or the PEM
    base64-encoded on one line (what a masked GitLab CI/CD variable can hold: it refuses several lines)."""
    if source.startswith(ENV_PREFIX):
        name = source.removeprefix(ENV_PREFIX)
        value = os.environ.get(name, "")
        if not value.strip():
            raise InputError(f"{source}: ${name} is not set or empty")
        if "-----BEGIN" in value:
            return value.encode(), f"${name}"
        try:
            decoded = base64.b64decode("".join(value.split()), validate=True)
        except ValueError:
            decoded = b""
        if b"-----BEGIN" not in decoded:
            raise InputError(f"{source}: ${name} holds neither a PEM key nor a PEM key base64-encoded")
        return decoded, f"${name} (base64)"
    path = Path(source)
    return read_input_bytes(path, "key"), str(path)


def read_private_key(source: str) -> tuple[bytes, str]:
    """The bytes of a private key source, refused at once when they are not an encrypted cosign key
    (so no passphrase is asked for a public key or a stray file)."""
    text, where = read_key_source(source)
    kind, _ = _unpem(text, where)
    if kind not in PRIVATE_PEM_TYPES:
        raise InputError(f"{where}: a {kind} PEM block, not an encrypted cosign private key ({' or '.join(PRIVATE_PEM_TYPES)})")
    return text, where


def load_signer(source: str, password: bytes | Callable[[str], bytes]) -> Signer:
    """The key of ``source``; ``password`` is the passphrase, or asks for it (given where the key is
    from) once the source is known to hold an encrypted cosign key."""
    text, where = read_private_key(source)
    return decrypt_private_key(text, password(where) if callable(password) else password, where)


def load_public_key(source: str) -> PublicKey:
    """A PEM public key, or the public half of a cosign private key is refused: give the .pub."""
    text, where = read_key_source(source)
    kind, _ = _unpem(text, where)
    if kind != "PUBLIC KEY":
        raise InputError(f"{where}: a {kind} PEM block; verification takes the public key (cosign.pub, PUBLIC KEY)")
    try:
        key = serialization.load_pem_public_key(text)
    except ValueError as exc:
        raise InputError(f"{where}: not a public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InputError(f"{where}: an ECDSA public key is needed (cosign's kind); this is {type(key).__name__}")
    return PublicKey(key, where)
