"""`ascendkit describe`: a repository's description set through the API each registry product
documents (quay's, Harbor's, Docker Hub's), against a fake of each on loopback that checks method,
path, credentials and body; faults tried again; a registry without such an API is a note or an error."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode, PublishFailed, Unavailable
from buildkit.ship import describe as module
from buildkit.ship.describe import NoDescriptionApi, describe


class Fake:
    """A registry's API: records every call; ``faults`` answers (status codes) come first."""

    def __init__(self, harbor: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.faults: list[int] = []
        self.harbor = harbor
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                fake.calls.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if self.path == "/api/v2.0/systeminfo":
                    status, text = (200, '{"harbor_version": "v2.13.0"}') if fake.harbor else (404, "{}")
                elif fake.faults:
                    status, text = fake.faults.pop(0), "{}"
                elif self.path == "/v2/users/login":
                    status, text = 200, '{"token": "jwt-1"}'
                else:
                    status, text = 200, "{}"
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            def do_GET(self) -> None:
                self._answer()

            def do_PUT(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def do_PATCH(self) -> None:
                self._answer()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def writes(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["method"] != "GET"]


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = Fake()
    yield server
    server.server.shutdown()


@pytest.fixture
def harbor() -> Iterator[Fake]:
    server = Fake(harbor=True)
    yield server
    server.server.shutdown()


PAGE = "# `ascendkit/verl`\n\n| tag | ... |\n"


def test_quay_takes_the_page_with_the_bearer_token(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_REGISTRY_TOKEN", "quay-oauth-1")
    done = describe(f"{fake.host}/ascendkit/verl", PAGE, flavor="quay")
    (call,) = fake.writes()
    assert (call["method"], call["path"]) == ("PUT", "/api/v1/repository/ascendkit/verl")
    assert call["auth"] == "Bearer quay-oauth-1" and call["body"] == {"description": PAGE}
    assert (done.flavor, done.characters) == ("quay", len(PAGE)) and "quay-oauth-1" not in done.url


def test_harbor_is_told_by_its_systeminfo_and_takes_the_name_escaped_twice(harbor: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_REGISTRY_USERNAME", "robot$ci")
    monkeypatch.setenv("ASCENDKIT_REGISTRY_PASSWORD", "s3cret")
    done = describe(f"{harbor.host}/rl/ascendkit/verl", PAGE)
    (call,) = harbor.writes()
    assert done.flavor == "harbor"
    assert (call["method"], call["path"]) == ("PUT", "/api/v2.0/projects/rl/repositories/ascendkit%252Fverl")
    assert call["auth"].startswith("Basic ") and call["body"] == {"description": PAGE}


def test_docker_hub_logs_in_then_patches_the_full_description(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "DOCKER_HUB_API", f"http://{fake.host}")
    monkeypatch.setenv("ASCENDKIT_REGISTRY_USERNAME", "ascendkit")
    monkeypatch.setenv("ASCENDKIT_REGISTRY_PASSWORD", "hub-pat")
    describe("docker.io/ascendkit/verl", PAGE)
    login, patch = fake.writes()
    assert login["path"] == "/v2/users/login" and login["body"] == {"username": "ascendkit", "password": "hub-pat"}
    assert (patch["method"], patch["path"], patch["auth"]) == ("PATCH", "/v2/repositories/ascendkit/verl/", "JWT jwt-1")
    assert patch["body"] == {"full_description": PAGE}


def test_503_and_429_are_tried_again_and_a_registry_that_stays_down_is_unavailable(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDKIT_REGISTRY_TOKEN", "t")
    monkeypatch.setenv("ASCENDKIT_REGISTRY_RETRIES", "3")  # the bound every registry call keeps: 4 attempts here
    waits: list[float] = []
    fake.faults = [503, 429]
    describe(f"{fake.host}/ascendkit/verl", PAGE, flavor="quay", sleep=waits.append)
    assert [c["path"] for c in fake.writes()] == ["/api/v1/repository/ascendkit/verl"] * 3 and len(waits) == 2
    fake.faults = [503] * 4
    with pytest.raises(Unavailable, match="after 4 attempts: HTTP 503"):
        describe(f"{fake.host}/ascendkit/verl", PAGE, flavor="quay", sleep=waits.append)
    fake.faults = [403]
    with pytest.raises(PublishFailed, match="HTTP 403: the credentials may not change this repository's description"):
        describe(f"{fake.host}/ascendkit/verl", PAGE, flavor="quay", sleep=waits.append)


def test_a_plain_registry_has_no_description_and_the_command_says_so(fake: Fake, tmp_path: Path) -> None:
    """distribution (no such API): an error naming the products that have one, or with --if-supported a note, exit 0."""
    page = tmp_path / "verl.md"
    page.write_text(PAGE)
    runner = CliRunner()
    failed = runner.invoke(app, ["describe", f"{fake.host}/ascendkit/verl", "--page", str(page)])
    assert failed.exit_code == ExitCode.UNAVAILABLE
    assert "keeps no repository description ascendkit can set (quay.io, Harbor and Docker Hub do)" in failed.output
    noted = runner.invoke(app, ["describe", f"{fake.host}/ascendkit/verl", "--page", str(page), "--if-supported", "--json"])
    assert noted.exit_code == 0 and json.loads(noted.stdout)["set"] is False
    assert fake.writes() == []
    with pytest.raises(NoDescriptionApi, match=r"needs \$ASCENDKIT_REGISTRY_TOKEN"):
        describe(f"{fake.host}/ascendkit/verl", PAGE, flavor="quay")
