"""The files of a team's locked wheels, held to the files its base owns before anything is built: read from a simple
index (PEP 503) by HTTP ranges, or whole where the server answers none; an sdist said; an index down is exit 4."""

from __future__ import annotations

import hashlib
import http.server
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode, Unavailable
from buildkit.lock.index import IndexClient
from buildkit.matrix.load import load_matrix
from buildkit.retry import RetryPolicy
from buildkit.team.prebuild import check_team_wheels
from buildkit.team.resolve import TEAM_LAYER, TeamBase, lock_file, team_base
from buildkit.team.spec import LoadedTeam, load_team
from tests.conftest import TEST_MATRIX
from tests.harness.localhttp import serving
from tests.test_team import GOOD, team_repo

SITE = "/usr/local/lib/python3.11/dist-packages"
BEFORE: dict[str, list[Any]] = {
    "six": ["1.16.0", "r1", "", [f"{SITE}/six.py", f"{SITE}/six-1.16.0.dist-info/RECORD"], SITE],
    "idna": ["3.7", "r2", "", [f"{SITE}/idna/__init__.py", f"{SITE}/idna/core.py"], SITE],
}


def _wheel(name: str, version: str, members: list[str], padding: int = 0) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member in members:
            archive.writestr(member, "# planted\n")
        if padding:  # a large member, stored, so that reading the names by ranges is far less than the wheel
            archive.writestr(f"{name}/blob.bin", bytes(padding), zipfile.ZIP_STORED)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return buffer.getvalue()


class _Index(http.server.BaseHTTPRequestHandler):
    """A simple index: /simple/<project>/ lists its files (with their sha256), /files/<name> serves them, by ranges
    unless the file is in ``whole_only``."""

    files: dict[str, bytes] = {}  # noqa: RUF012  # per server (a subclass each)
    projects: dict[str, list[str]] = {}  # noqa: RUF012
    whole_only: set[str] = set()  # noqa: RUF012
    sent: dict[str, int] = {}  # noqa: RUF012
    faults: list[str] = []  # noqa: RUF012  # what the next requests for a file get instead: "503", "drop"

    def _file(self) -> tuple[str, bytes] | None:
        name = self.path.removeprefix("/files/")
        return (name, self.files[name]) if self.path.startswith("/files/") and name in self.files else None

    def do_HEAD(self) -> None:
        found = self._file()
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(found[1]) if found else 0))
        self.end_headers()

    def do_GET(self) -> None:
        if self.path.startswith("/simple/"):
            project = self.path.removeprefix("/simple/").strip("/")
            if project not in self.projects:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            links = "".join(
                f'<a href="/files/{n}#sha256={hashlib.sha256(self.files[n]).hexdigest()}">{n}</a>\n' for n in self.projects[project]
            )
            body = f"<html><body>\n{links}</body></html>\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        else:
            found = self._file()
            if found is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            name, data = found
            if self.faults:
                fault = self.faults.pop(0)
                if fault == "drop":  # the connection closed before any answer
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(int(fault))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes=") and name not in self.whole_only:
                start, end = (int(v) for v in wanted[6:].split("-"))
                body = data[start : end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            else:
                body = data
                self.send_response(200)
            self.sent[name] = self.sent.get(name, 0) + len(body)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[tuple[str, type[_Index]]]:
    files = {
        # vendors six.py (a module the base's six owns) and writes idna/core.py through .data/purelib
        "acme_shim-1.0-py3-none-any.whl": _wheel(
            "acme_shim",
            "1.0",
            ["acme_shim/__init__.py", "six.py", "acme_shim-1.0.data/purelib/idna/core.py", "acme_shim-1.0.data/scripts/six"],
        ),
        # its own files only, on a server that answers no ranges
        "acme_clean-2.0-py3-none-any.whl": _wheel("acme_clean", "2.0", ["acme_clean/__init__.py"], padding=3_000_000),
        "acme_big-1.0-py3-none-any.whl": _wheel("acme_big", "1.0", ["acme_big/__init__.py"], padding=3_000_000),
        "acme_src-0.1.tar.gz": b"not read",
        # a package that ships a tree of the test stack's triton-ascend stand-in (wcwidth): as a kernels package that
        # vendors triton/ would
        "acme_kernels-1.0-py3-none-any.whl": _wheel("acme_kernels", "1.0", ["acme_kernels/__init__.py", "wcwidth/__init__.py"]),
    }
    projects = {
        "acme-shim": ["acme_shim-1.0-py3-none-any.whl"],
        "acme-clean": ["acme_clean-2.0-py3-none-any.whl"],
        "acme-big": ["acme_big-1.0-py3-none-any.whl"],
        "acme-src": ["acme_src-0.1.tar.gz"],
        "acme-kernels": ["acme_kernels-1.0-py3-none-any.whl"],
    }
    handler = type(
        "Index", (_Index,), {"files": files, "projects": projects, "whole_only": {"acme_clean-2.0-py3-none-any.whl"}, "sent": {}}
    )
    with serving(handler) as url:
        yield f"{url}/simple", handler


def _team(tmp_path: Path, handler: type[_Index], packages: list[str]) -> tuple[LoadedTeam, TeamBase]:
    team = load_team(team_repo(tmp_path, GOOD), load_matrix(TEST_MATRIX))
    base = team_base(load_matrix(TEST_MATRIX), team, "x86_64")
    lines = ["# format: 1", "# inputs-sha256: test", "# status: resolved", "", f"# layer: {TEAM_LAYER}"]
    for spec in packages:
        name, version = spec.split("==")
        dist = name.replace("-", "_")
        (file,) = [f for f in handler.files if f.startswith(f"{dist}-{version}")]
        lines += [
            f"{spec} \\",
            f"    --hash=sha256:{hashlib.sha256(handler.files[file]).hexdigest()}",
            f"    # via: requirements-team.txt:{len(lines)}",
        ]
    lock_file(team, "x86_64").write_text("\n".join(lines) + "\n")
    return team, base


def test_a_wheel_that_writes_a_file_the_base_owns_is_named_with_who_asked_before_the_build(
    index: tuple[str, type[_Index]], tmp_path: Path
) -> None:
    url, handler = index
    team, base = _team(tmp_path, handler, ["acme-shim==1.0", "acme-clean==2.0", "acme-big==1.0", "acme-src==0.1"])
    found = check_team_wheels(team, base, dict.fromkeys(("pypi", "pypi-again"), url), BEFORE)
    what = "acme-shim 1.0 (asked for by requirements-team.txt:5; wheel acme_shim-1.0-py3-none-any.whl)"
    assert found.overlaps == (
        f"{SITE}/six.py: {what} writes it, and the base's six owns it",
        f"{SITE}/idna/core.py: {what} writes it, and the base's idna owns it",
    ), "site-packages files, .data/purelib included; its scripts are left to the check after the build"
    assert found.read == 3
    assert found.unread == ("acme-src==0.1: the lock holds its sdist, built in the image: its files are checked after the build",)
    big = len(handler.files["acme_big-1.0-py3-none-any.whl"])
    assert handler.sent["acme_big-1.0-py3-none-any.whl"] < big // 4, "the names are read by ranges, not the wheel"
    assert handler.sent["acme_clean-2.0-py3-none-any.whl"] == len(handler.files["acme_clean-2.0-py3-none-any.whl"]), (
        "a server without ranges: the wheel once, whole"
    )


def test_a_file_the_lock_does_not_allow_is_never_read(index: tuple[str, type[_Index]], tmp_path: Path) -> None:
    url, handler = index
    team, base = _team(tmp_path, handler, ["acme-shim==1.0"])
    path = lock_file(team, "x86_64")
    text = path.read_text()
    digest = text.split("--hash=sha256:")[1].split()[0]
    path.write_text(text.replace(digest, "f" * 64))
    found = check_team_wheels(team, base, dict.fromkeys(("pypi", "pypi-again"), url), BEFORE)
    assert found.overlaps == () and found.read == 0
    assert found.unread == ("acme-shim==1.0: no file the lock allows was found on the base's indexes",)


def test_an_index_that_cannot_be_reached_is_exit_4(tmp_path: Path, index: tuple[str, type[_Index]]) -> None:
    _, handler = index
    team, base = _team(tmp_path, handler, ["acme-shim==1.0"])
    with pytest.raises(Unavailable) as caught:
        check_team_wheels(
            team, base, dict.fromkeys(("pypi", "pypi-again"), "http://127.0.0.1:9/simple"), BEFORE, IndexClient(policy=RetryPolicy(0))
        )
    assert caught.value.exit_code == ExitCode.UNAVAILABLE and "cannot be reached to read acme-shim's wheel" in str(caught.value)


def test_a_503_and_a_dropped_connection_on_a_wheels_ranges_are_tried_again(index: tuple[str, type[_Index]], tmp_path: Path) -> None:
    url, handler = index
    team, base = _team(tmp_path, handler, ["acme-shim==1.0"])
    handler.faults[:] = ["503", "drop"]
    found = check_team_wheels(
        team, base, dict.fromkeys(("pypi", "pypi-again"), url), BEFORE, IndexClient(policy=RetryPolicy(2, sleep=lambda _: None))
    )
    assert len(found.overlaps) == 2 and found.read == 1 and handler.faults == []
    # a server that stays down for the wheel: the files are left to the check after the build, and said so
    handler.faults[:] = ["503"] * 10
    found = check_team_wheels(
        team, base, dict.fromkeys(("pypi", "pypi-again"), url), BEFORE, IndexClient(policy=RetryPolicy(2, sleep=lambda _: None))
    )
    assert found.overlaps == () and found.read == 0
    assert found.unread[0].startswith("acme-shim==1.0: its wheel could not be read (") and "503" in found.unread[0]
