"""Failures to reach the engine, a registry or an index read as one short line: what, why, what to do.

Each cause is produced for real, not from a made-up exception: docker-py against a socket that is
not there and a port nobody listens on, requests against a name that cannot resolve, a local TLS
server with a self-signed certificate, and a server that accepts and never answers. What a user
would see is checked for length, for the cause in words and for the absence of any library repr.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildkit.errors import ExitCode, Unavailable
from buildkit.image.engine import connect
from buildkit.lock.index import IndexClient, IndexUnreachable
from buildkit.reach import cause, engine_failure, http_failure, text_cause
from buildkit.ship.oci.registry import Registry

REPR_MARKERS = ("Error(", "Exception(", "HTTPConnectionPool", "HTTPSConnectionPool", "Max retries", "object at 0x", "Errno", "'Connection")
MAX_LENGTH = 200


def readable(message: str) -> str:
    assert "\n" not in message and len(message) < MAX_LENGTH, message
    for marker in REPR_MARKERS:
        assert marker not in message, f"{marker!r} in {message!r}"
    return message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def self_signed_server(tmp_path: Path) -> Iterator[int]:
    """An HTTPS port on 127.0.0.2 (not a loopback name Registry talks plain HTTP to) with a
    certificate nobody trusts."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=untrusted.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.2", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate, as it should

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


def _engine_message(monkeypatch: pytest.MonkeyPatch, host: str) -> str:
    monkeypatch.setenv("DOCKER_HOST", host)
    for name in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Unavailable) as caught:
        connect(timeout=2)
    return readable(str(caught.value))


def test_an_absent_engine_says_the_socket_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # a short path nothing creates: the message shortens a long one (tmp_path's length varies by machine)
    where = f"unix:///tmp/ak-absent-{os.getpid()}/docker.sock"
    message = _engine_message(monkeypatch, where)
    todo = "start dockerd, or point DOCKER_HOST at a running engine"
    assert message == f"cannot reach the Docker engine at {where}: socket not found; {todo}"


def test_an_engine_port_nobody_listens_on_is_a_refused_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    message = _engine_message(monkeypatch, f"tcp://127.0.0.1:{port}")
    assert (
        message == f"cannot reach the Docker engine at tcp://127.0.0.1:{port}: connection refused; start dockerd or point DOCKER_HOST at it"
    )


def test_an_engine_that_never_answers_timed_out(monkeypatch: pytest.MonkeyPatch, silent_server: int) -> None:
    assert "timed out" in _engine_message(monkeypatch, f"tcp://127.0.0.1:{silent_server}")


def test_a_registry_port_nobody_listens_on() -> None:
    port = free_port()
    with pytest.raises(Unavailable) as caught:
        Registry(f"127.0.0.1:{port}", retries=1, backoff=0.01, timeout=2).get_manifest("x", "y")
    assert readable(str(caught.value)) == (
        f"registry 127.0.0.1:{port}: connection refused; is it running on that port? (GET manifests, 2 attempts)"
    )


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy: these tests are about what a direct connection meets (a name that cannot resolve,
    a certificate nobody signed), which a proxy in the way would answer instead. Nothing here leaves
    the machine: `.invalid` never resolves, and the servers are on the loopback."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("direct")
def test_a_registry_name_that_does_not_resolve() -> None:
    with pytest.raises(Unavailable) as caught:
        Registry("registry.invalid", retries=0, timeout=5).get_manifest("x", "y")
    message = readable(str(caught.value))
    assert message.startswith("registry registry.invalid: name not resolved; check the host name and the proxy settings"), message


@pytest.mark.usefixtures("direct")
def test_a_registry_with_an_untrusted_certificate(self_signed_server: int) -> None:
    host = f"127.0.0.2:{self_signed_server}"
    with pytest.raises(Unavailable) as caught:
        Registry(host, retries=0, timeout=5).get_manifest("x", "y")
    message = readable(str(caught.value))
    assert message.startswith(f"registry {host}: TLS certificate not trusted; trust its CA (REQUESTS_CA_BUNDLE"), message


def test_a_registry_that_never_answers(silent_server: int) -> None:
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        Registry(f"127.0.0.1:{silent_server}", retries=0, timeout=0.5).get_manifest("x", "y")
    assert time.monotonic() - started < 30
    assert readable(str(caught.value)).startswith(f"registry 127.0.0.1:{silent_server}: timed out;")


@pytest.mark.usefixtures("direct")
def test_an_index_says_which_host_why_and_what_to_do(self_signed_server: int) -> None:
    port = free_port()
    with pytest.raises(IndexUnreachable) as caught:
        IndexClient(retries=0, timeout=2).project(f"http://user:secret@127.0.0.1:{port}/simple", "torch")
    message = readable(str(caught.value))
    assert message == f"index 127.0.0.1:{port}: connection refused; use a mirror: --pip-index-url, or [mirrors] in ascendkit.toml"
    assert "secret" not in message
    with pytest.raises(IndexUnreachable) as caught:
        IndexClient(retries=0, timeout=5).project(f"https://127.0.0.2:{self_signed_server}/simple", "torch")
    assert readable(str(caught.value)).endswith("TLS certificate not trusted; give --ca-bundle PEM (or set PIP_CERT / SSL_CERT_FILE)")
    with pytest.raises(IndexUnreachable) as caught:
        IndexClient(retries=0, timeout=5).project("https://pypi.invalid/simple", "torch")
    assert readable(str(caught.value)).startswith("index pypi.invalid: name not resolved; use a mirror")


def test_http_failures_carry_the_registry_error_code() -> None:
    body = b'{"errors": [{"code": "UNAUTHORIZED", "message": "authentication required", "detail": [{"Type": "repository"}]}]}'
    assert http_failure(401, body) == "HTTP 401 UNAUTHORIZED: authentication required"
    assert http_failure(502, b"<html>bad gateway</html>") == "HTTP 502"
    assert http_failure(404, b'{"errors": "not a list"}') == "HTTP 404"


def test_text_from_other_programs_is_reduced_to_its_cause() -> None:
    engine = 'Get "https://registry.example/v2/": dial tcp: lookup registry.example on 127.0.0.53:53: no such host'
    assert text_cause(engine) == "name not resolved"
    assert text_cause("tls: failed to verify certificate: x509: certificate signed by unknown authority") == "TLS certificate not trusted"
    assert text_cause("denied: requested access to the resource is denied") == "denied: requested access to the resource is denied"


def test_an_unknown_failure_is_still_a_few_words() -> None:
    assert cause(RuntimeError("something odd")) == "cannot connect"
    assert engine_failure("unix:///x", RuntimeError("odd")).endswith("cannot connect; start dockerd or point DOCKER_HOST at it")


def test_the_cli_prints_one_line_and_debug_adds_the_original(tmp_path: Path) -> None:
    # a short path that cannot exist: the message's length must not depend on where the run keeps its temporary files
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/ascendkit/none.sock", "NO_COLOR": "1"}
    argv = [
        sys.executable,
        "-m",
        "buildkit",
        "publish",
        "ascendkit/verl:x",
        "--registry",
        "127.0.0.1:5000/x",
        "--manifest-dir",
        str(tmp_path),
    ]
    plain = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == ExitCode.UNAVAILABLE
    assert readable(plain.stderr.strip()).startswith("ascendkit: cannot reach the Docker engine at unix://")
    debug = subprocess.run(argv, env={**env, "ASCENDKIT_DEBUG": "1"}, capture_output=True, text=True, timeout=60)
    assert debug.returncode == ExitCode.UNAVAILABLE
    assert "Traceback" in debug.stderr and "DockerException" in debug.stderr, "the underlying error, for a bug report"
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()
