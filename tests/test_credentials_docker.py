"""A push to a real registry that demands a login (CNCF distribution with htpasswd, as a company's
Harbor or SWR would), with the credentials where a Docker user keeps them: a `docker-credential-*`
helper named by credHelpers (a STAND-IN helper program on PATH). skopeo, logged in on its own,
reads the result back; without credentials the push fails naming the registry and the login."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildkit.errors import PublishFailed
from buildkit.imageref import RegistryRef
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.options import ShipOptions, Target
from buildkit.ship.publish import push_image
from tests.conftest import DockerEnv
from tests.harness.smallimage import build_small_image
from tests.test_credentials import SECRET, stand_in_helper

pytestmark = pytest.mark.docker


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except OSError:
        return False
    return False


@pytest.fixture(scope="module")
def guarded_registry(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """distribution on a port of its own, every call behind Basic auth for robot / SECRET."""
    for exe in ("docker-registry", "htpasswd"):
        if shutil.which(exe) is None:
            pytest.fail(f"{exe} is missing: `make test` (tests/harness/services.py) installs it")
    root = tmp_path_factory.mktemp("guarded-registry")
    users = subprocess.run(["htpasswd", "-Bbn", "robot", SECRET], capture_output=True, text=True, check=True).stdout
    (root / "htpasswd").write_text(users)
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: ascendkit-test\n    path: {root / 'htpasswd'}\n"
    )
    with (root / "registry.log").open("wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/v2/"):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the guarded registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def small_image(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalImage]:
    image = build_small_image(docker_env.client, tmp_path_factory.mktemp("credential-manifests"))
    yield image
    docker_env.client.remove_image(image.identity.engine_id, force=True)


def _skopeo_tags(repository: str) -> list[str]:
    proc = subprocess.run(
        ["skopeo", "list-tags", "--tls-verify=false", "--creds", f"robot:{SECRET}", f"docker://{repository}"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        return []
    return sorted(json.loads(proc.stdout)["Tags"])


def test_a_push_with_a_credential_helper(
    docker_env: DockerEnv, guarded_registry: str, small_image: LocalImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"credHelpers": {guarded_registry: "company"}}))
    asked = stand_in_helper(tmp_path / "bin", "company", "robot", SECRET)
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    repository = f"helper-{uuid.uuid4().hex[:8]}"
    outcome = push_image(docker_env.client, small_image, [Target.of(RegistryRef(guarded_registry, repository))], ShipOptions())
    assert set(asked.read_text().split()) == {guarded_registry}
    tags = _skopeo_tags(f"{guarded_registry}/{repository}")
    assert set(small_image.tag_names) <= set(tags), tags
    assert outcome.pushed[0].digest


def test_a_push_without_credentials_names_the_registry_and_the_login(
    docker_env: DockerEnv, guarded_registry: str, small_image: LocalImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no config.json: nothing to send
    repository = f"anonymous-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PublishFailed) as failed:
        push_image(docker_env.client, small_image, [Target.of(RegistryRef(guarded_registry, repository))], ShipOptions())
    message = str(failed.value)
    assert f"registry {guarded_registry}: " in message and "HTTP 401" in message, message
    assert f"no credentials were sent: log in with `docker login {guarded_registry}`" in message, message
    assert _skopeo_tags(f"{guarded_registry}/{repository}") == [], "nothing was tagged"
