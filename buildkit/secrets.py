"""Build-time secrets (a CA bundle, index credentials) served to the pip layers, never stored.

For the length of one build, :class:`SecretServer` serves ``ca.pem`` and ``env`` on 127.0.0.1 under
a random path. The build runs on the host network and passes that URL in the ``ftp_proxy`` build
arg, which the classic builder gives to RUN steps but keeps out of ``docker history`` and the cache
key. The image's build-env helper fetches both into /dev/shm and removes them when the step ends.
"""

from __future__ import annotations

import http.server
import os
import secrets
import shlex
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from buildkit.errors import InputError


@dataclass(frozen=True)
class BuildSecrets:
    ca_bundle: bytes = b""
    env: tuple[tuple[str, str], ...] = ()  # exported in each pip layer, e.g. PIP_INDEX_URL with credentials

    def __bool__(self) -> bool:
        return bool(self.ca_bundle or self.env)

    def env_script(self) -> bytes:
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.env).encode()


def default_ca_bundle() -> Path | None:
    """The host's bundle when the environment names one (what a TLS-intercepting proxy needs)."""
    for name in ("PIP_CERT", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


def read_ca_bundle(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--ca-bundle {path}: cannot read: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise InputError(f"--ca-bundle {path}: not a PEM certificate bundle (no BEGIN CERTIFICATE line)")
    return data


def split_credentials(url: str) -> tuple[str, str | None]:
    """``https://user:tok@host/simple`` -> (``https://host/simple``, the original URL) ."""
    parts = urllib.parse.urlsplit(url)
    if not parts.username and not parts.password:
        return url, None
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), url


class SecretServer:
    """Serves the secrets on 127.0.0.1 under an unguessable path, until closed."""

    def __init__(self, build_secrets: BuildSecrets) -> None:
        files = {"ca.pem": build_secrets.ca_bundle, "env": build_secrets.env_script()}
        token = secrets.token_urlsafe(24)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.removeprefix(f"/{token}/")
                body = files.get(name) if self.path.startswith(f"/{token}/") else None
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="ascendkit-secrets", daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/{token}"

    def __enter__(self) -> SecretServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
