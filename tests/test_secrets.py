"""Build secrets: credential splitting, the CA bundle check, and the one-build loopback server."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from buildkit.errors import InputError
from buildkit.image.secrets import BuildSecrets, SecretServer
from buildkit.settings import read_ca_bundle, split_credentials

PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def test_split_credentials() -> None:
    assert split_credentials("https://pypi.org/simple") == ("https://pypi.org/simple", None)
    public, full = split_credentials("https://bot:t0k3n@mirror.example.com:8443/pypi/simple")
    assert public == "https://mirror.example.com:8443/pypi/simple"
    assert full == "https://bot:t0k3n@mirror.example.com:8443/pypi/simple"


def test_ca_bundle_must_be_pem(tmp_path: Path) -> None:
    good = tmp_path / "ca.pem"
    good.write_bytes(PEM)
    assert read_ca_bundle(good) == PEM
    bad = tmp_path / "ca.der"
    bad.write_bytes(b"\x30\x82")
    with pytest.raises(InputError, match="not a PEM certificate bundle"):
        read_ca_bundle(bad)
    with pytest.raises(InputError, match="not found"):
        read_ca_bundle(tmp_path / "missing.pem")


def test_env_script_quotes_values() -> None:
    secrets = BuildSecrets(PEM, (("PIP_INDEX_URL", "https://u:p'q@h/simple"),))
    assert secrets.env_script() == b"export PIP_INDEX_URL='https://u:p'\"'\"'q@h/simple'\n"
    assert not BuildSecrets()


def test_server_serves_only_under_its_token_and_stops() -> None:
    secrets = BuildSecrets(PEM, (("PIP_INDEX_URL", "https://u:p@h/simple"),))
    with SecretServer(secrets) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert urllib.request.urlopen(f"{server.url}/ca.pem").read() == PEM
        assert urllib.request.urlopen(f"{server.url}/env").read() == b"export PIP_INDEX_URL=https://u:p@h/simple\n"
        base = server.url.rsplit("/", 1)[0]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/wrong-token/ca.pem")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{server.url}/other")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{server.url}/ca.pem", timeout=2)


def test_offline_build_serves_the_wheelhouse_as_pips_only_source(tmp_path: Path) -> None:
    (tmp_path / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"wheel bytes")
    (tmp_path / "MarkupSafe-2.0.1.tar.gz").write_bytes(b"sdist bytes")
    with SecretServer(BuildSecrets(wheelhouse=tmp_path)) as server:
        env = urllib.request.urlopen(f"{server.url}/env").read().decode()
        assert "export PIP_NO_INDEX=1\n" in env
        assert f"export PIP_FIND_LINKS={server.url}/wheels/\n" in env
        # anything pip tries besides the wheelhouse goes to a proxy that is not there
        assert "export https_proxy=http://127.0.0.1:9\n" in env and "export no_proxy=127.0.0.1,localhost\n" in env
        listing = urllib.request.urlopen(f"{server.url}/wheels/").read().decode()
        assert '<a href="MarkupSafe-2.0.1.tar.gz">' in listing and '<a href="six-1.16.0-py2.py3-none-any.whl">' in listing
        assert urllib.request.urlopen(f"{server.url}/wheels/six-1.16.0-py2.py3-none-any.whl").read() == b"wheel bytes"
        # uv asks with HEAD before it downloads a wheel: the size, no body
        head = urllib.request.urlopen(urllib.request.Request(f"{server.url}/wheels/six-1.16.0-py2.py3-none-any.whl", method="HEAD"))
        assert head.headers["Content-Length"] == str(len(b"wheel bytes")) and head.read() == b""
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{server.url}/wheels/../ca.pem.whl")
    with SecretServer(BuildSecrets(PEM)) as server:  # an online build has no wheelhouse to list
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{server.url}/wheels/")
        assert b"PIP_NO_INDEX" not in urllib.request.urlopen(f"{server.url}/env").read()
