"""A STAND-IN registry for what the bundled registry cannot show: the OCI 1.1 referrers API, bearer
tokens, and answers a unit test scripts (a 503 now, a 429 with Retry-After, a body cut off).

CNCF distribution 2.8 (what `make test` runs) has no referrers endpoint and no auth, so the SBOM's
tag fallback and every fault are tested against it for real (tests/harness/faultproxy.py); this in-memory
server on 127.0.0.1 speaks just enough of the distribution API (blobs, uploads, mounts, manifests,
tags, and with ``referrers=True`` the referrers endpoint and the ``OCI-Subject`` answer) to test
the rest. It serves this process's tests only; it is the only fake registry of the tests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

OCI_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass
class Store:
    referrers: bool
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # digest -> (media type, body)
    tags: dict[tuple[str, str], str] = field(default_factory=dict)  # (repo, tag) -> digest
    subjects: dict[str, list[str]] = field(default_factory=dict)  # subject digest -> artifact digests
    requests: list[str] = field(default_factory=list)
    token: str | None = None  # set: every /v2/ call needs "Bearer <token>", handed out at /token per scope
    scopes: list[str] = field(default_factory=list)  # the scopes tokens were asked for
    # set: /token hands a token only to these (user, password) over Basic, or for this refresh token
    # (an identity token) POSTed as OAuth2's grant_type=refresh_token; else it answers 401
    users: tuple[str, str] | None = None
    refresh_token: str | None = None
    # scripted answers to the next requests, first first: (status, headers), or "drop" to close the
    # connection after reading half of a request's body (or at once)
    script: list[tuple[int, dict[str, str]] | str] = field(default_factory=list)
    served: dict[str, bytes] = field(default_factory=dict)  # path -> a body to serve as is (a wrong one, say)
    uploads: dict[str, bytearray] = field(default_factory=dict)  # upload session -> the bytes it holds
    chunks: bool = True  # False: PATCH is answered 405, as by a registry that takes blobs whole only
    forgets_cut_uploads: bool = False  # True: a session whose PATCH ended early is dropped, as distribution does
    cut_patches: set[int] = field(default_factory=set)  # PATCHes (1 = the first) whose connection is cut half-way
    patches: int = 0


def _handler(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _scripted(self) -> bool:
            """Answer from the script (or the token check) instead of the store; True when it did."""
            if not store.script:
                return False
            step = store.script.pop(0)
            store.requests.append(f"{self.command} {urlparse(self.path).path} ({step if isinstance(step, str) else step[0]})")
            if step == "drop":
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length // 2)
                self.close_connection = True
                self.connection.shutdown(2)
                return True
            assert isinstance(step, tuple)
            self._send(step[0], b'{"errors":[{"code":"UNAVAILABLE","message":"scripted"}]}', step[1])
            return True

        def _route(self) -> tuple[str, str, str, dict[str, list[str]]]:
            url = urlparse(self.path)
            store.requests.append(f"{self.command} {url.path}")
            match = re.match(r"^/v2/(?P<repo>.+?)/(?P<kind>blobs/uploads|blobs|manifests|referrers|tags)/?(?P<ref>[^/]*)$", url.path)
            if not match:
                return "", "", "", {}
            return match["repo"], match["kind"], match["ref"], parse_qs(url.query)

        def _token(self) -> None:
            url = urlparse(self.path)
            asked = parse_qs(url.query)
            if self.command == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                asked = parse_qs(self.rfile.read(length).decode())
                allowed = asked.get("grant_type") == ["refresh_token"] and asked.get("refresh_token") == [store.refresh_token]
            else:
                basic = "Basic " + base64.b64encode(":".join(store.users).encode()).decode() if store.users else None
                allowed = (store.users is None and store.refresh_token is None) or self.headers.get("Authorization") == basic
            if not allowed:
                return self._send(401, b'{"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}')
            store.scopes.append(asked.get("scope", [""])[0])
            key = "access_token" if self.command == "POST" else "token"
            self._send(200, json.dumps({key: store.token}).encode(), {"Content-Type": "application/json"})

        def _unauthorized(self) -> bool:
            url = urlparse(self.path)
            if url.path == "/token":
                self._token()
                return True
            if store.token is None or self.headers.get("Authorization") == f"Bearer {store.token}":
                return False
            port = self.server.server_address[1]  # type: ignore[index]  # an AF_INET server: (host, port)
            repo = self._route()[0]
            challenge = f'Bearer realm="http://127.0.0.1:{port}/token",service="fake",scope="repository:{repo}:pull,push"'
            self._send(401, b"{}", {"WWW-Authenticate": challenge})
            return True

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            if self._unauthorized() or self._scripted():
                return
            if self.path in store.served:
                body = store.served[self.path]
                return self._send(200, body, {"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"})
            repo, kind, ref, query = self._route()
            if kind == "tags":
                names = sorted(tag for (r, tag) in store.tags if r == repo)
                last = query.get("last", [""])[0]
                names = [n for n in names if n > last][: int(query.get("n", ["1000"])[0])]
                headers = {"Content-Type": "application/json"}
                if names and len(names) == int(query.get("n", ["1000"])[0]):
                    headers["Link"] = f'</v2/{repo}/tags/list?n={len(names)}&last={names[-1]}>; rel="next"'
                return self._send(200, json.dumps({"name": repo, "tags": names}).encode(), headers)
            if kind == "blobs/uploads":
                if ref not in store.uploads:
                    return self._send(404, b'{"errors":[{"code":"BLOB_UPLOAD_UNKNOWN"}]}')
                return self._send(204, headers=self._where(repo, ref))
            if kind == "blobs" and ref in store.blobs:
                return self._send(200, store.blobs[ref], {"Docker-Content-Digest": ref})
            if kind == "manifests":
                digest = ref if ref.startswith("sha256:") else store.tags.get((repo, ref), "")
                if digest in store.manifests:
                    media_type, body = store.manifests[digest]
                    return self._send(200, body, {"Content-Type": media_type, "Docker-Content-Digest": digest})
            if kind == "referrers" and store.referrers:
                wanted = query.get("artifactType", [None])[0]
                entries = []
                for digest in store.subjects.get(ref, []):
                    media_type, body = store.manifests[digest]
                    artifact_type = json.loads(body).get("artifactType")
                    if wanted in (None, artifact_type):
                        entries.append({"mediaType": media_type, "digest": digest, "size": len(body), "artifactType": artifact_type})
                index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
                return self._send(200, index, {"Content-Type": OCI_INDEX})
            return self._send(404, b'{"errors":[{"code":"NOT_FOUND"}]}', {"Content-Type": "application/json"})

        def do_POST(self) -> None:
            if self._unauthorized() or self._scripted():
                return
            repo, kind, _, query = self._route()
            if kind != "blobs/uploads":
                return self._send(404)
            mount = query.get("mount", [""])[0]
            if mount and mount in store.blobs:
                return self._send(201, headers={"Docker-Content-Digest": mount})
            session = uuid.uuid4().hex
            store.uploads[session] = bytearray()
            return self._send(202, headers={"Location": f"/v2/{repo}/blobs/uploads/{session}", "Range": "0-0"})

        def do_PATCH(self) -> None:
            """A chunk: refused at a range that is not where the session stands; cut half-way when asked."""
            if self._unauthorized() or self._scripted():
                return
            repo, _, session, _ = self._route()
            length = int(self.headers.get("Content-Length", "0"))
            if not store.chunks:
                self.rfile.read(length)
                return self._send(405, b'{"errors":[{"code":"UNSUPPORTED"}]}')
            held = store.uploads.get(session)
            if held is None:
                self.rfile.read(length)
                return self._send(404, b'{"errors":[{"code":"BLOB_UPLOAD_UNKNOWN"}]}')
            start = int(self.headers.get("Content-Range", "0-0").split("-")[0])
            if start != len(held):
                self.rfile.read(length)
                return self._send(416, b'{"errors":[{"code":"RANGE_INVALID"}]}', self._where(repo, session))
            store.patches += 1
            if store.patches in store.cut_patches:
                held += self.rfile.read(length // 2)
                if store.forgets_cut_uploads:
                    del store.uploads[session]
                self.close_connection = True
                self.connection.shutdown(2)
                return None
            held += self.rfile.read(length)
            return self._send(202, headers=self._where(repo, session))

        def _where(self, repo: str, session: str) -> dict[str, str]:
            held = len(store.uploads[session])
            return {"Location": f"/v2/{repo}/blobs/uploads/{session}", "Range": f"0-{max(0, held - 1)}"}

        def do_DELETE(self) -> None:
            self._route()
            self._send(204)

        def do_PUT(self) -> None:
            if self._unauthorized() or self._scripted():
                return
            repo, kind, ref, query = self._route()
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            if kind == "blobs/uploads":
                if ref not in store.uploads:
                    return self._send(404, b'{"errors":[{"code":"BLOB_UPLOAD_UNKNOWN"}]}')
                whole = bytes(store.uploads.pop(ref)) + body
                digest = "sha256:" + hashlib.sha256(whole).hexdigest()
                if query.get("digest", [""])[0] != digest:
                    return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
                store.blobs[digest] = whole
                return self._send(201, headers={"Docker-Content-Digest": digest})
            if kind != "manifests":
                return self._send(404)
            store.manifests[digest] = (self.headers.get("Content-Type", ""), body)
            if not ref.startswith("sha256:"):
                store.tags[(repo, ref)] = digest
            headers = {"Docker-Content-Digest": digest}
            subject = (json.loads(body).get("subject") or {}).get("digest")
            if subject and store.referrers:
                store.subjects.setdefault(subject, []).append(digest)
                headers["OCI-Subject"] = subject
            return self._send(201, headers=headers)

    return Handler


@contextmanager
def fake_registry(*, referrers: bool) -> Iterator[tuple[str, Store]]:
    """``HOST:PORT`` of a fresh in-memory registry on 127.0.0.1, and its store."""
    store = Store(referrers)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
