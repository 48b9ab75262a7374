"""Why something outside could not be reached (the Docker engine, a registry, a package index), in one line.

Every failure to reach a server reads the same way: what was being reached, the cause in a few
words, what to do. The cause is found by walking the exception chain (requests wraps urllib3,
which wraps the socket error; docker-py wraps requests), so a message never carries a library's
repr. ``ASCENDKIT_DEBUG=1`` makes the CLI print the original exception too.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
from collections.abc import Iterator
from typing import Any

SOCKET_NOT_FOUND = "socket not found"
PERMISSION_DENIED = "permission denied"
NAME_NOT_RESOLVED = "name not resolved"
REFUSED = "connection refused"
TIMED_OUT = "timed out"
CERT_NOT_TRUSTED = "TLS certificate not trusted"
TLS_TO_PLAIN_HTTP = "TLS spoken to a plain-HTTP port"
PROXY_FAILED = "the proxy failed"
CANNOT_CONNECT = "cannot connect"

_ERRNO = {
    errno.ECONNREFUSED: REFUSED,
    errno.ENOENT: SOCKET_NOT_FOUND,
    errno.EACCES: PERMISSION_DENIED,
    errno.EPERM: PERMISSION_DENIED,
    errno.ETIMEDOUT: TIMED_OUT,
    errno.ECONNRESET: "connection reset",
    errno.EPIPE: "connection dropped",  # the other end closed while we were still sending (an upload cut off)
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
}
# Text of the wrapped errors, for chains that were flattened into strings (docker-py, pip, git).
_TEXT = (
    ("CERTIFICATE_VERIFY_FAILED", CERT_NOT_TRUSTED),
    ("certificate verify failed", CERT_NOT_TRUSTED),
    ("x509:", CERT_NOT_TRUSTED),
    ("WRONG_VERSION_NUMBER", TLS_TO_PLAIN_HTTP),
    ("server gave HTTP response to HTTPS client", TLS_TO_PLAIN_HTTP),
    ("Name or service not known", NAME_NOT_RESOLVED),
    ("Temporary failure in name resolution", NAME_NOT_RESOLVED),
    ("nodename nor servname", NAME_NOT_RESOLVED),
    ("Failed to resolve", NAME_NOT_RESOLVED),
    ("no such host", NAME_NOT_RESOLVED),
    ("Could not resolve host", NAME_NOT_RESOLVED),
    ("Connection refused", REFUSED),
    ("RemoteDisconnected", "connection dropped"),
    ("Connection aborted", "connection dropped"),
    ("connection refused", REFUSED),
    ("No such file or directory", SOCKET_NOT_FOUND),
    ("Permission denied", PERMISSION_DENIED),
    ("timed out", TIMED_OUT),
    ("Timeout", TIMED_OUT),
    ("Connection reset", "connection reset"),
    ("No route to host", "no route to host"),
    ("Network is unreachable", "network unreachable"),
    ("ProxyError", PROXY_FAILED),
    ("Unable to connect to proxy", PROXY_FAILED),
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps: causes, contexts, exception arguments, urllib3's ``reason``."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        item = todo.pop(0)
        if isinstance(item, tuple | list):  # ('Connection aborted.', FileNotFoundError(2, ...))
            todo += item
            continue
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]


def cause(exc: BaseException) -> str:
    """The cause of a failed connection in a few words (socket not found, connection refused, ...)."""
    chain = list(_chain(exc))
    for error in chain:
        if isinstance(error, ssl.SSLCertVerificationError):
            return CERT_NOT_TRUSTED
        if isinstance(error, socket.gaierror):
            return NAME_NOT_RESOLVED
    for error in chain:
        if isinstance(error, OSError) and error.errno in _ERRNO:
            return _ERRNO[error.errno]
    for error in chain:
        if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__:
            return TIMED_OUT
        if "ProxyError" in type(error).__name__:
            return PROXY_FAILED
    text = " ".join(f"{type(e).__name__} {e}" for e in chain)
    for needle, words in _TEXT:
        if needle in text:
            return words
    return CANNOT_CONNECT


def engine_failure(host: str, exc: BaseException) -> str:
    """``cannot reach the Docker engine at HOST: CAUSE; WHAT TO DO``."""
    why = cause(exc)
    if why == SOCKET_NOT_FOUND:
        todo = "start dockerd, or point DOCKER_HOST at a running engine"
    elif why == PERMISSION_DENIED:
        todo = "add this user to the docker group, or run as root"
    elif why == CERT_NOT_TRUSTED:
        todo = "set DOCKER_CERT_PATH to the engine's CA and client certificates"
    else:
        todo = "start dockerd or point DOCKER_HOST at it"
    return f"cannot reach the Docker engine at {_short(host)}: {why}; {todo}"


def registry_failure(host: str, exc: BaseException | str) -> str:
    """``registry HOST: CAUSE; WHAT TO DO`` (``exc`` may be a cause already found)."""
    why = exc if isinstance(exc, str) else cause(exc)
    return f"registry {_short(host)}: {why}{_registry_todo(why, host)}"


def _registry_todo(why: str, host: str) -> str:
    if why == CERT_NOT_TRUSTED:
        return f"; trust its CA (REQUESTS_CA_BUNDLE, and /etc/docker/certs.d/{_short(host, 40)}/ca.crt for the engine)"
    if why == TLS_TO_PLAIN_HTTP:
        return "; a plain-HTTP registry must be in the engine's insecure-registries"
    if why in (NAME_NOT_RESOLVED, TIMED_OUT, PROXY_FAILED):
        return "; check the host name and the proxy settings (HTTPS_PROXY, NO_PROXY)"
    if why == REFUSED:
        return "; is it running on that port?"
    return ""


def index_failure(url_or_host: str, exc: BaseException | str) -> str:
    """``index HOST: CAUSE; WHAT TO DO`` for a Python package index."""
    why = exc if isinstance(exc, str) else cause(exc)
    host = url_or_host.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]  # never the credentials
    if why == CERT_NOT_TRUSTED:
        todo = "; give --ca-bundle PEM (or set PIP_CERT / SSL_CERT_FILE)"
    elif why.startswith("HTTP "):
        todo = ""
    else:
        todo = "; use a mirror: --pip-index-url, or [mirrors] in ascendkit.toml"
    return f"index {_short(host)}: {why}{todo}"


def http_failure(status: int, body: bytes | str = b"") -> str:
    """``HTTP 401 UNAUTHORIZED: authentication required``: the status and the registry's own error
    code and message when it sent the distribution API's ``{"errors": [...]}`` body."""
    try:
        errors = json.loads(body or b"{}").get("errors") or []
        first = errors[0] if isinstance(errors[0], dict) else {}
    except (ValueError, AttributeError, IndexError, TypeError):
        first = {}
    code, message = str(first.get("code") or ""), str(first.get("message") or "")
    text = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    return _short(" ".join(text.split()), 120)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def engine_said(exc: BaseException) -> str:
    """What the engine answered, in one line (docker-py's ``explanation``), or why it did not answer."""
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    if isinstance(explanation, str) and explanation.strip():
        return _short(" ".join(explanation.split()), 160)
    return f"the engine did not answer: {cause(exc)}"


def text_cause(text: str) -> str:
    """The cause in a few words from a message another program printed (the engine's push error, git),
    or that message cut to one short line when no known cause is in it."""
    found = cause(Exception(text))
    return found if found != CANNOT_CONNECT else _short(" ".join(text.split()), 120)
