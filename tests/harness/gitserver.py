"""A git host for tests: git's own ``git http-backend`` (the smart HTTP protocol, what GitHub and
a corporate mirror speak) behind a standard-library HTTP server, serving a directory of
repositories on ``http://HOST:PORT/<path>.git``.

CI cannot reach GitHub, so the checkouts the images build (the OpenRLHF-shaped test source) and the
requirement files ``ascendkit lock`` reads at a commit come from here, through the code paths a
user's ``--github-url`` mirror takes. Also usable by hand:

    python -m tests.harness.gitserver ROOT [--port 8418]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIT_BACKEND = "http-backend"


class _Handler(BaseHTTPRequestHandler):
    root: Path  # set on the subclass made per server

    def do_GET(self) -> None:
        self._cgi()

    def do_POST(self) -> None:
        self._cgi()

    def log_message(self, format: str, *args: object) -> None:  # quiet, as tests want it
        pass

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(length),
            "REMOTE_ADDR": self.client_address[0],
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        done = subprocess.run(["git", GIT_BACKEND], input=body, env=env, capture_output=True, check=False)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def serve(root: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve the repositories under ``root``; yields the base URL (``http://HOST:PORT``)."""
    with serving(type("Handler", (_Handler,), {"root": root}), host, port) as url:
        yield url


@contextmanager
def serving(handler: Callable[..., BaseHTTPRequestHandler], host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """An HTTP server of ``handler`` on a thread for the length of the block; yields its base URL."""
    server = ThreadingHTTPServer((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# A repository made from files with a fixed author, committer and date, so the same files always
# give the same commit id (the matrix pins it).
FIXED = {
    "GIT_AUTHOR_NAME": "ascendkit tests",
    "GIT_AUTHOR_EMAIL": "tests@ascendkit.invalid",
    "GIT_COMMITTER_NAME": "ascendkit tests",
    "GIT_COMMITTER_EMAIL": "tests@ascendkit.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
}


def make_repository(files: Path, bare: Path, message: str) -> str:
    """A bare repository at ``bare`` whose one commit holds the tree of ``files``; returns its id."""
    env = {**os.environ, **FIXED, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    work = bare.with_name(bare.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(files, work)
    for path in work.rglob("*"):
        if path.is_file():
            path.chmod(0o644)  # the tree records modes: umask must not change the commit id

    def git(*argv: str, cwd: Path = work) -> str:
        return subprocess.run(["git", *argv], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "--quiet", "--initial-branch=main")
    git("add", "--all")
    git("commit", "--quiet", "--no-gpg-sign", "-m", message)
    commit = git("rev-parse", "HEAD")
    shutil.rmtree(bare, ignore_errors=True)
    bare.parent.mkdir(parents=True, exist_ok=True)
    git("clone", "--quiet", "--bare", str(work), str(bare), cwd=bare.parent)
    shutil.rmtree(work)
    return commit


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the git repositories under ROOT over smart HTTP.")
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8418)
    args = parser.parse_args()
    with serve(args.root.resolve(), args.host, args.port) as url:
        print(f"serving {args.root} at {url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
