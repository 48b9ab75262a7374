"""Build-time secrets (a CA bundle, index credentials) served to the pip layers, never stored.

For the length of one build, :class:`SecretServer` serves ``ca.pem`` and ``env`` on 127.0.0.1 under
a random path (and, for ``build --offline``, the wheelhouse as pip's only package source). The
build runs on the host network and passes that URL in the ``ftp_proxy`` build arg, which the
classic builder gives to RUN steps but keeps out of ``docker history`` and the cache key. The
image's build-env helper fetches both into /dev/shm and removes them when the step ends.
"""

from __future__ import annotations

import html
import http.server
import secrets
import shlex
import shutil
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

# For an offline build: pip takes packages from the served wheelhouse only, and every other
# address pip could try goes to a proxy that is not there, so the pip steps cannot use the network.
DEAD_PROXY = "http://127.0.0.1:9"


@dataclass(frozen=True)
class BuildSecrets:
    ca_bundle: bytes = b""
    env: tuple[tuple[str, str], ...] = ()  # exported in each pip layer, e.g. PIP_INDEX_URL with credentials
    wheelhouse: Path | None = None  # offline build: served as pip's only source of packages

    def __bool__(self) -> bool:
        return bool(self.ca_bundle or self.env or self.wheelhouse)

    def env_script(self, wheels_url: str = "") -> bytes:
        env = list(self.env)
        if self.wheelhouse is not None:
            env += [("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", wheels_url)]
            env += [(name, DEAD_PROXY) for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")]
            env += [(name, "127.0.0.1,localhost") for name in ("no_proxy", "NO_PROXY")]
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env).encode()


class SecretServer:
    """Serves the secrets on 127.0.0.1 under an unguessable path, until closed."""

    def __init__(self, build_secrets: BuildSecrets) -> None:
        token = secrets.token_urlsafe(24)
        # Bound first: the env script names the wheelhouse URL, so the port must be known before
        # the handler (which serves that script) exists.
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/{token}"
        files = {"ca.pem": build_secrets.ca_bundle, "env": build_secrets.env_script(f"{self.url}/wheels/")}
        wheelhouse = build_secrets.wheelhouse
        wheels = {p.name: p for p in sorted(wheelhouse.iterdir()) if p.is_file()} if wheelhouse is not None else {}
        if wheelhouse is not None:  # pip's find-links page: one link per file
            listing = "".join(f'<a href="{urllib.parse.quote(name)}">{html.escape(name)}</a><br>\n' for name in wheels)
            files["wheels/"] = f"<!DOCTYPE html>\n<html><body>\n{listing}</body></html>\n".encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            # HEAD too: uv asks a find-links server whether a wheel can be read in ranges first.
            def do_GET(self) -> None:
                self._serve(with_body=True)

            def do_HEAD(self) -> None:
                self._serve(with_body=False)

            def _serve(self, *, with_body: bool) -> None:
                name = urllib.parse.unquote(self.path.removeprefix(f"/{token}/")) if self.path.startswith(f"/{token}/") else ""
                wheel = wheels.get(name.removeprefix("wheels/")) if name.startswith("wheels/") else None
                body = files.get(name) if name and wheel is None else None
                if wheel is None and body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(wheel.stat().st_size if wheel is not None else len(body or b"")))
                self.send_header("Content-Type", "text/html; charset=utf-8" if name == "wheels/" else "application/octet-stream")
                self.end_headers()
                if not with_body:
                    return
                if wheel is None:
                    self.wfile.write(body or b"")
                    return
                with wheel.open("rb") as handle:
                    shutil.copyfileobj(handle, self.wfile, 1 << 20)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server.RequestHandlerClass = Handler
        self._thread = threading.Thread(target=self._server.serve_forever, name="ascendkit-secrets", daemon=True)

    def __enter__(self) -> SecretServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
