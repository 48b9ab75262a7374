"""The registry client against a local fake registry: read-back, bearer auth, retries, index body."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.ship.publish import index_body
from buildkit.ship.registry import DOCKER_LIST, DOCKER_MANIFEST, Manifest, Registry, RegistryRef
from buildkit.ship.remote import image_labels

BODY = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": "sha256:cfg"}}).encode()


class FakeRegistry(http.server.BaseHTTPRequestHandler):
    state: typing.ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        st = self.state
        if self.path.split("?")[0] == "/token":
            self._send(200, json.dumps({"token": "tok"}).encode(), "application/json")
            return
        st["gets"] = st.get("gets", 0) + 1
        if st.get("fail_first", 0) >= st["gets"]:
            self._send(503, b"busy", "text/plain")
            return
        if st.get("auth") and self.headers.get("Authorization") != "Bearer tok":
            self.send_response(401)
            port = self.server.server_address[1]  # type: ignore[index]  # an AF_INET server: (host, port)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",service="fake",scope="repository:x:pull"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        stored = st.get("manifests", {}).get(self.path)
        if stored is None:
            self._send(404, b"{}", "application/json")
            return
        self._send(200, stored[0], stored[1], digest="sha256:" + hashlib.sha256(stored[0]).hexdigest())

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.state.setdefault("manifests", {})[self.path] = (body, self.headers["Content-Type"])
        self._send(201, b"", "text/plain", digest="sha256:" + hashlib.sha256(body).hexdigest())

    def _send(self, code: int, body: bytes, ctype: str, digest: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[tuple[Registry, dict[str, Any]]]:
    FakeRegistry.state = {"manifests": {"/v2/team/verl/manifests/t1": (BODY, DOCKER_MANIFEST)}}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Registry(f"127.0.0.1:{server.server_address[1]}", retries=3, backoff=0.01), FakeRegistry.state
    server.shutdown()
    server.server_close()


def test_read_back(fake: tuple[Registry, dict[str, Any]]) -> None:
    registry, _ = fake
    manifest = registry.get_manifest("team/verl", "t1")
    assert manifest is not None
    assert manifest.digest == "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert manifest.media_type == DOCKER_MANIFEST and manifest.json()["config"]["digest"] == "sha256:cfg"
    assert registry.get_manifest("team/verl", "missing") is None


def test_transient_errors_are_retried(fake: tuple[Registry, dict[str, Any]]) -> None:
    registry, state = fake
    state["fail_first"] = 2
    assert registry.get_manifest("team/verl", "t1") is not None
    assert state["gets"] == 3


def test_definitive_failure_after_retries(fake: tuple[Registry, dict[str, Any]]) -> None:
    registry, state = fake
    state["fail_first"] = 99
    with pytest.raises(Unavailable, match=r"HTTP 503 \(.*, 4 attempts\)"):
        registry.get_manifest("team/verl", "t1")


def test_bearer_token_challenge(fake: tuple[Registry, dict[str, Any]]) -> None:
    registry, state = fake
    state["auth"] = True
    assert registry.get_manifest("team/verl", "t1") is not None


def test_unreachable_registry() -> None:
    registry = Registry("127.0.0.1:9", retries=1, backoff=0.01, timeout=2)
    with pytest.raises(Unavailable, match=re.escape("127.0.0.1:9")):
        registry.get_manifest("x", "y")


def test_put_index_round_trip(fake: tuple[Registry, dict[str, Any]]) -> None:
    registry, _ = fake
    members = {
        "x86_64": Manifest("sha256:aaa", DOCKER_MANIFEST, 10, b""),
        "aarch64": Manifest("sha256:bbb", DOCKER_MANIFEST, 11, b""),
    }
    body, media_type = index_body(members)
    assert media_type == DOCKER_LIST
    data = json.loads(body)
    assert [m["platform"]["architecture"] for m in data["manifests"]] == ["arm64", "amd64"]
    assert index_body(dict(reversed(members.items()))) == (body, media_type)  # deterministic
    digest = registry.put_manifest("team/verl", "v1", body, media_type)
    back = registry.get_manifest("team/verl", "v1")
    assert back is not None and back.digest == digest and back.media_type == DOCKER_LIST


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


def test_image_labels_of_an_index_member_and_unreadable_answers(fake: tuple[Registry, dict[str, Any]]) -> None:
    """k8s render reads the labels of the --arch member of a multi-arch index; a body that is not
    JSON is the registry's failure, not a traceback."""
    registry, state = fake
    config = json.dumps({"config": {"Labels": {"io.ascendkit.stack": "cann8.3", "io.ascendkit.version.verl": "0.6.1"}}}).encode()
    arm = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": {"digest": "sha256:armcfg"}}).encode()
    index = json.dumps(
        {"mediaType": DOCKER_LIST, "manifests": [{"digest": "sha256:arm", "platform": {"architecture": "arm64", "os": "linux"}}]}
    ).encode()
    state["manifests"].update(
        {
            "/v2/team/verl/manifests/multi": (index, DOCKER_LIST),
            "/v2/team/verl/manifests/sha256:arm": (arm, DOCKER_MANIFEST),
            "/v2/team/verl/blobs/sha256:armcfg": (config, "application/json"),
            "/v2/team/verl/blobs/sha256:cfg": (b"<html>proxy error</html>", "text/html"),
        }
    )
    labels = image_labels(f"{registry.host}/team/verl:multi", "aarch64")
    assert labels == {"io.ascendkit.stack": "cann8.3", "io.ascendkit.version.verl": "0.6.1"}
    with pytest.raises(InputError, match="the index has no amd64 image"):
        image_labels(f"{registry.host}/team/verl:multi", "x86_64")
    with pytest.raises(PublishFailed, match="unreadable answer"):
        image_labels(f"{registry.host}/team/verl:t1", "x86_64")
    with pytest.raises(InputError, match="no registry host"):
        image_labels("ascendkit/verl:latest", "x86_64")
