"""Registry credentials as Docker keeps them (buildkit/ship/oci/credentials.py): a credential helper named
by credHelpers or credsStore, run from PATH through docker-py's own code, before auths; an identity
token as OAuth2's refresh token; and a refusal that names the registry and the login command.

The helper here is a STAND-IN `docker-credential-*` program speaking the helpers' protocol (the
server URL on stdin, ``{"ServerURL", "Username", "Secret"}`` on stdout); the registry is the fake
one's token service. The docker test (test_publish.py) pushes to a real registry that demands it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildkit.errors import InputError, PublishFailed
from buildkit.ship.oci.credentials import credentials_for
from buildkit.ship.oci.registry import DOCKER_MANIFEST, Registry
from tests.harness.fake_registry import Store, fake_registry

BODY = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": "sha256:cfg"}}).encode()
SECRET = "s3cret-never-printed"


def stand_in_helper(directory: Path, name: str, username: str, secret: str) -> Path:
    """A ``docker-credential-<name>`` on ``directory`` that answers ``get`` with these and logs what it was asked."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"{name}.asked"
    helper = directory / f"docker-credential-{name}"
    helper.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "assert sys.argv[1:] == ['get'], sys.argv\n"
        "server = sys.stdin.read().strip()\n"
        f"open({str(log)!r}, 'a').write(server + '\\n')\n"
        f"print(json.dumps({{'ServerURL': server, 'Username': {username!r}, 'Secret': {secret!r}}}))\n"
    )
    helper.chmod(0o755)
    return log


@pytest.fixture
def docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty $DOCKER_CONFIG and a PATH with the stand-in helpers' directory first."""
    config = tmp_path / "docker"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    yield config


@pytest.fixture
def guarded() -> Iterator[tuple[str, Store]]:
    """A registry whose token service hands tokens to robot / SECRET (Basic) or the refresh token SECRET only."""
    with fake_registry(referrers=False) as (host, store):
        digest = "sha256:" + hashlib.sha256(BODY).hexdigest()
        store.manifests[digest] = (DOCKER_MANIFEST, BODY)
        store.tags[("team/verl", "t1")] = digest
        store.token, store.users, store.refresh_token = "tok", ("robot", SECRET), SECRET
        yield host, store


def write_config(config: Path, data: dict[str, object]) -> None:
    (config / "config.json").write_text(json.dumps(data))


def test_a_cred_helper_is_asked_before_auths(docker_config: Path, guarded: tuple[str, Store], tmp_path: Path) -> None:
    host, store = guarded
    asked = stand_in_helper(tmp_path / "bin", "standin", "robot", SECRET)
    wrong = base64.b64encode(b"robot:stale").decode()
    write_config(docker_config, {"credHelpers": {host: "standin"}, "auths": {host: {"auth": wrong}}})
    registry = Registry(host, retries=0)
    assert registry.get_manifest("team/verl", "t1") is not None
    assert asked.read_text().split() == [host], "the helper is asked for the registry's host, once"
    assert store.scopes == ["repository:team/verl:pull,push"]
    credentials = registry.credentials()
    assert credentials is not None and credentials.source == "docker-credential-standin"
    assert SECRET not in repr(credentials)


def test_creds_store_with_an_identity_token(docker_config: Path, guarded: tuple[str, Store], tmp_path: Path) -> None:
    """A helper's ``<token>`` user is an identity token: exchanged at the token service as a refresh token."""
    host, store = guarded
    stand_in_helper(tmp_path / "bin", "desktop", "<token>", SECRET)
    write_config(docker_config, {"credsStore": "desktop"})
    assert Registry(host, retries=0).get_manifest("team/verl", "t1") is not None
    assert store.scopes == ["repository:team/verl:pull,push"]


def test_auths_as_docker_login_writes_them(docker_config: Path, guarded: tuple[str, Store]) -> None:
    host, _ = guarded
    write_config(docker_config, {"auths": {f"http://{host}/v2/": {"auth": base64.b64encode(f"robot:{SECRET}".encode()).decode()}}})
    assert Registry(host, retries=0).get_manifest("team/verl", "t1") is not None
    write_config(docker_config, {"auths": {host: {"identitytoken": SECRET}}})
    assert Registry(host, retries=0).get_manifest("team/verl", "t1") is not None


def test_no_credentials_names_the_registry_and_the_login(docker_config: Path, guarded: tuple[str, Store]) -> None:
    host, _ = guarded
    with pytest.raises(PublishFailed) as failed:
        Registry(host, retries=0).get_manifest("team/verl", "t1")
    message = str(failed.value)
    assert message.startswith(f"registry {host}: reading team/verl:t1 gave HTTP 401"), message
    assert f"no credentials were sent: log in with `docker login {host}`" in message
    assert str(docker_config / "config.json") in message


def test_refused_credentials_say_where_they_came_from(docker_config: Path, guarded: tuple[str, Store], tmp_path: Path) -> None:
    host, _ = guarded
    stand_in_helper(tmp_path / "bin", "standin", "robot", "expired-" + SECRET)
    write_config(docker_config, {"credHelpers": {host: "standin"}})
    with pytest.raises(PublishFailed) as failed:
        Registry(host, retries=0).get_manifest("team/verl", "t1")
    message = str(failed.value)
    assert f"the credentials from docker-credential-standin were refused: log in with `docker login {host}`" in message
    assert SECRET not in message


def test_a_missing_helper_is_named(docker_config: Path, guarded: tuple[str, Store]) -> None:
    host, _ = guarded
    write_config(docker_config, {"credHelpers": {host: "ecr-login"}})
    with pytest.raises(InputError, match=rf"^registry {host}: the credential helper docker-credential-ecr-login named in .* failed"):
        Registry(host, retries=0).get_manifest("team/verl", "t1")


def test_docker_config_is_the_only_file_read(docker_config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$DOCKER_CONFIG without a config.json means no credentials, as for Docker (not ~/.docker's)."""
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {"r.example": {"auth": base64.b64encode(b"a:b").decode()}}}))
    monkeypatch.setenv("HOME", str(home))
    assert credentials_for("r.example") is None
    monkeypatch.delenv("DOCKER_CONFIG")
    found = credentials_for("r.example")
    assert found is not None and found.basic == ("a", "b") and found.source.startswith("auths in ")
