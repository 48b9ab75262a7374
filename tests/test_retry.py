"""The one retry policy (buildkit/retry.py) as each HTTP client meets it: the package index, a
download from it, and the registry (tests/test_registry.py covers the registry's own faults).
A scripted local server answers 503 and 429 with Retry-After, or drops the connection mid-body."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from buildkit.lock.index import IndexClient, IndexUnreachable, download
from buildkit.retry import MAX_WAIT, RetryPolicy

PAYLOAD = b"a wheel's bytes " * 4096
PROJECT = json.dumps({"name": "demo", "files": [{"filename": "demo-1.0.tar.gz", "url": "demo-1.0.tar.gz", "hashes": {}}]}).encode()


@pytest.fixture
def server() -> Iterator[tuple[str, list[object]]]:
    """http://127.0.0.1:PORT and its script: (status, headers) or "cut" (half the body, then the connection closed), first first."""
    script: list[object] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = PROJECT if self.path.startswith("/simple/") else PAYLOAD
            step = script.pop(0) if script else None
            if step == "cut":
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.close()
                return
            status, headers = step if isinstance(step, tuple) else (200, {})
            self.send_response(status)
            for key, value in {**headers, "Content-Type": "application/vnd.pypi.simple.v1+json"}.items():
                self.send_header(key, value)
            data = body if status == 200 else b"busy"
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def test_the_index_waits_as_retry_after_asks(server: tuple[str, list[object]]) -> None:
    url, script = server
    waits: list[float] = []
    script += [(503, {"Retry-After": "3"}), (429, {"Retry-After": "120"})]
    client = IndexClient(policy=RetryPolicy(2, sleep=waits.append))
    project = client.project(f"{url}/simple", "demo")
    assert [f.filename for f in project.files] == ["demo-1.0.tar.gz"]
    assert waits == [3.0, MAX_WAIT], "the index's Retry-After is honoured, capped, as a registry's is"


def test_an_index_that_stays_busy_is_unreachable_in_one_line(server: tuple[str, list[object]]) -> None:
    url, script = server
    waits: list[float] = []
    script += [(503, {})] * 3
    with pytest.raises(IndexUnreachable, match="HTTP 503"):
        IndexClient(policy=RetryPolicy(2, backoff=0.01, sleep=waits.append)).project(f"{url}/simple", "demo")
    assert len(waits) == 2 and all(0.01 <= w <= 0.04 for w in waits), waits
    script.clear()
    script += [(403, {})]
    with pytest.raises(IndexUnreachable, match="HTTP 403"):  # not a fault that passes: no second try
        IndexClient(policy=RetryPolicy(2, sleep=waits.append)).project(f"{url}/simple", "other")
    assert len(waits) == 2


def test_a_download_cut_off_or_refused_starts_again(server: tuple[str, list[object]], tmp_path: Path) -> None:
    url, script = server
    waits: list[float] = []
    script += ["cut", (503, {"Retry-After": "1"})]
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    dest = tmp_path / "demo.whl"
    found = download(requests.Session(), f"{url}/demo.whl", dest, frozenset({sha}), policy=RetryPolicy(2, sleep=waits.append))
    assert found == sha and dest.read_bytes() == PAYLOAD and waits[1] == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["demo.whl"], "no partial file left"
    script += ["cut"] * 3
    with pytest.raises(IndexUnreachable, match=r"for other\.whl"):
        download(
            requests.Session(), f"{url}/other.whl", tmp_path / "other.whl", frozenset({sha}), policy=RetryPolicy(2, sleep=waits.append)
        )
    assert not (tmp_path / "other.whl").exists() and not list(tmp_path.glob(".*part"))
