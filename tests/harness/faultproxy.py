"""A fault-injecting HTTP proxy of our own, in front of a real registry: what busy registries do,
on purpose and deterministically, so that the tests and the benchmark can prove a publish survives it.

    with fault_proxy("127.0.0.1:5000", MODES["mixed"]) as proxy:
        ...  # talk to proxy.host instead of 127.0.0.1:5000

Modes (``MODES``):

* ``503``: one request in three is answered 503 Service Unavailable (never forwarded);
* ``429``: one request in three is answered 429 Too Many Requests with ``Retry-After: 1``;
* ``drop``: one write in four (a request with a body: an upload, a manifest) has its connection
  cut half-way through the body, after that half reached the registry;
* ``slow``: every answer comes ``delay`` seconds late;
* ``mixed``: all of them at once (503 and 429 alternating on one request in three);
* ``down``: every request answered 503 (a registry that stays down);
* ``cut``: the connection that carries the ``cut_after``-th byte of request bodies is reset there,
  once, in the manner of a front proxy that holds each request body until it is whole (nginx's
  default, ``proxy_request_buffering on``): the registry never sees the request that was cut;
* ``cut-through``: the same cut, the bytes before it reaching the registry first (nginx with
  request buffering off, as Harbor configures it).

The cadence counts requests as they arrive: it is deterministic for a client that sends one request
at a time (``ASCENDKIT_UPLOAD_PARALLEL=1``), and the same density at random for one that sends several.

Each request is forwarded on a connection of its own, bodies streamed both ways (blobs of
hundreds of MB pass through), the Host header kept, so the upload locations the registry hands
out point back at the proxy. ``proxy.counts`` says what was injected.
"""

from __future__ import annotations

import http.client
import itertools
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 1 << 20
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass(frozen=True)
class Faults:
    status_every: int = 0  # answer a fault status to every Nth request (0: never)
    statuses: tuple[int, ...] = (503,)  # the statuses used in turn
    retry_after: str | None = None  # the Retry-After header sent with 429
    drop_every: int = 0  # cut the connection of every Nth write half-way through its body
    delay: float = 0.0  # seconds before every answer
    refuse: Callable[[str, str], bool] | None = None  # (method, path) -> answer 503, always
    cut_after: int = 0  # reset the connection carrying this byte of all request bodies, once (0: never)
    cut_through: bool = False  # the bytes before the cut reach the registry (else the cut request never does)


MODES: dict[str, Faults] = {
    "clean": Faults(),
    "503": Faults(status_every=3),
    "429": Faults(status_every=3, statuses=(429,), retry_after="1"),
    "drop": Faults(drop_every=4),
    "slow": Faults(delay=0.3),
    "mixed": Faults(status_every=3, statuses=(503, 429), retry_after="1", drop_every=4, delay=0.1),
    "down": Faults(status_every=1),
    "cut": Faults(cut_after=200 << 20),
    "cut-through": Faults(cut_after=200 << 20, cut_through=True),
}


@dataclass
class Proxy:
    host: str  # HOST:PORT to talk to
    upstream: str
    faults: Faults
    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    writes: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    body_bytes: int = 0  # request body bytes that reached the proxy (or were promised, for a request under way)
    received: int = 0  # request body bytes read from clients (what they sent, as the other end counts it)
    writes_in_flight: int = 0
    most_writes_in_flight: int = 0  # the most requests with a body under way at once
    cut: bool = False


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    faults = proxy.faults

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _count(self, what: str) -> None:
            with proxy.lock:
                proxy.counts[what] += 1

        def _body_reader(self) -> Iterator[bytes]:
            """The request body in pieces, whether sent with Content-Length or chunked."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return
                    yield self.rfile.read(size)
                    self.rfile.readline()
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                piece = self.rfile.read(min(CHUNK, remaining))
                if not piece:
                    return
                remaining -= len(piece)
                with proxy.lock:
                    proxy.received += len(piece)
                yield piece

        def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
            for _ in self._body_reader():  # drained, so that the connection can carry the next request
                pass
            body = b'{"errors":[{"code":"UNAVAILABLE","message":"injected by the fault proxy"}]}'
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _handle(self) -> None:
            with proxy.lock:
                number = next(proxy.requests)
                proxy.counts["requests"] += 1
            if faults.refuse is not None and faults.refuse(self.command, self.path):
                self._count("refused")
                return self._answer(503)
            if faults.status_every and number % faults.status_every == 0:
                status = faults.statuses[(number // faults.status_every) % len(faults.statuses)]
                self._count(str(status))
                headers = {"Retry-After": faults.retry_after} if status == 429 and faults.retry_after else {}
                return self._answer(status, headers)
            is_write = bool(int(self.headers.get("Content-Length") or 0)) or "chunked" in self.headers.get("Transfer-Encoding", "")
            drop = False
            if is_write and faults.drop_every:
                with proxy.lock:
                    drop = next(proxy.writes) % faults.drop_every == 0
            cut_at = None
            if faults.cut_after and is_write:
                length = int(self.headers.get("Content-Length") or 0)
                with proxy.lock:
                    start, proxy.body_bytes = proxy.body_bytes, proxy.body_bytes + length
                    if not proxy.cut and start + length > faults.cut_after:
                        proxy.cut, cut_at = True, faults.cut_after - start
            if faults.delay:
                time.sleep(faults.delay)
            with proxy.lock:
                proxy.writes_in_flight += is_write
                proxy.most_writes_in_flight = max(proxy.most_writes_in_flight, proxy.writes_in_flight)
            try:
                if cut_at is not None and not faults.cut_through:
                    return self._cut_here(cut_at)
                self._forward(drop, cut_at)
            finally:
                with proxy.lock:
                    proxy.writes_in_flight -= is_write

        def _reset(self) -> None:
            """Close our side with a reset, not an answer: the client sees its connection drop."""
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.close()

        def _cut_here(self, cut_at: int) -> None:
            """Read the body up to the cut, forward none of it, and reset the connection."""
            taken = 0
            for piece in self._body_reader():
                taken += len(piece)
                if taken >= cut_at:
                    break
            self._count("cut")
            self._reset()

        def _forward(self, drop: bool, cut_at: int | None = None) -> None:
            upstream = http.client.HTTPConnection(proxy.upstream, timeout=300)
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            for key, value in self.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    upstream.putheader(key, value)
            if chunked:
                upstream.putheader("Transfer-Encoding", "chunked")
            upstream.endheaders()
            length = int(self.headers.get("Content-Length") or 0)
            sent = 0
            stop_at = length // 2 if drop else cut_at
            for piece in self._body_reader():
                if stop_at is not None and (sent + len(piece) >= stop_at or chunked):
                    piece = piece[: max(0, stop_at - sent)]
                    upstream.send(piece)
                    self._count("dropped" if drop else "cut")
                    upstream.close()  # the registry sees its client vanish mid-upload
                    self._reset()  # and so does ours
                    return
                upstream.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                upstream.send(b"0\r\n\r\n")
            answer = upstream.getresponse()
            self.send_response(answer.status, answer.reason)
            headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP]
            known = answer.getheader("Content-Length")
            data = b"" if known is not None or self.command == "HEAD" else answer.read()
            for key, value in headers:
                self.send_header(key, value)
            if known is None and self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                if known is None:
                    self.wfile.write(data)
                else:
                    while piece := answer.read(CHUNK):
                        self.wfile.write(piece)
            upstream.close()

        def do_GET(self) -> None:
            self._handle()

        def do_HEAD(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def do_PUT(self) -> None:
            self._handle()

        def do_PATCH(self) -> None:
            self._handle()

        def do_DELETE(self) -> None:
            self._handle()

    return Handler


@contextmanager
def fault_proxy(upstream: str, faults: Faults) -> Iterator[Proxy]:
    """A proxy on 127.0.0.1 (a free port) in front of ``upstream`` (HOST:PORT), for the ``with`` block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    proxy = Proxy(f"127.0.0.1:{server.server_address[1]}", upstream, faults)
    server.RequestHandlerClass = _handler(proxy)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
