"""Run one labelled container to the end or a deadline, streaming its log; always remove it."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from buildkit.errors import Unavailable
from buildkit.image.engine import remove_containers
from buildkit.plan import LABEL_PREFIX
from buildkit.reach import engine_said
from buildkit.run.jobwatch import JobWatch, Stall

SMOKE_LABEL = f"{LABEL_PREFIX}.smoke"


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when the container was killed (timeout or stall)
    timed_out: bool
    stdout: str  # the container's stdout, when asked for (doctor's JSON, the printed config)
    stalled: Stall | None = None  # the watcher stopped it: no progress


POLL_S = 5.0  # how often a waiting run looks at its watcher


def _stream(client: docker.APIClient, cid: str, log_path: Path, echo: Callable[[str], None] | None) -> None:
    with log_path.open("wb") as log:
        pending = b""
        for chunk in client.logs(cid, stream=True, follow=True, stdout=True, stderr=True):
            log.write(chunk)
            log.flush()
            if echo is None:
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                echo(line.decode("utf-8", "replace"))
        if echo is not None and pending:
            echo(pending.decode("utf-8", "replace"))


def _wait(client: docker.APIClient, cid: str, deadline: float, watch: JobWatch | None) -> tuple[int | None, Stall | None]:
    """The container's exit code; None when the deadline passed or the watcher saw a stall."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, None
        if watch is not None:
            stall = watch.stalled()
            if stall is not None:
                return None, stall
        poll = min(left, POLL_S) if watch is not None else left
        asked = time.monotonic()
        try:
            status = client.wait(cid, timeout=max(math.ceil(poll), 1))
            return int(status.get("StatusCode", -1)), None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            if time.monotonic() - asked < poll - 1:  # answered early without a status: the engine went away
                raise


def run_container(
    client: docker.APIClient,
    image: str,
    command: list[str],
    *,
    log_path: Path,
    deadline: float,
    host_config: dict[str, Any] | None = None,
    environment: dict[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
    want_stdout: bool = False,
    watch: JobWatch | None = None,
    user: str | None = None,
) -> RunResult:
    """Run ``command`` in ``image``, stream its output to ``log_path``, stop it at ``deadline``
    (a ``time.monotonic()`` value) or when ``watch`` sees a stall, and always remove it. ``user``
    overrides the image's own user (``root`` for ``smoke --as-root``)."""
    try:
        created = client.create_container(
            image,
            command=command,
            environment=environment or {},
            host_config=client.create_host_config(**(host_config or {})),
            labels={SMOKE_LABEL: "1"},
            user=user,
        )
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"cannot create the smoke container from {image}: {engine_said(exc)}") from None
    cid = created["Id"]
    code, stdout, stall = None, "", None
    streamer: threading.Thread | None = None

    def feed(line: str) -> None:
        if watch is not None:
            watch.feed(line)
        if echo is not None:
            echo(line)

    try:
        client.start(cid)
        streamer = threading.Thread(target=_stream, args=(client, cid, log_path, feed if (echo or watch) else None), daemon=True)
        streamer.start()
        code, stall = _wait(client, cid, deadline, watch)
        if code is None:
            with contextlib.suppress(NotFound, APIError):
                client.kill(cid)
        streamer.join(timeout=30)
        if want_stdout and code is not None:
            stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"the smoke container failed to run: {engine_said(exc)}") from None
    finally:
        remove_containers(client, [cid])
    return RunResult(code, code is None and stall is None, stdout, stall)


def engine_runtime(client: docker.APIClient) -> str:
    """The engine as Kubernetes names a node's runtime (``docker://20.10.24``), for doctor's zstd
    check; "" when it does not say."""
    try:
        version = str(client.version().get("Version") or "")
    except (DockerException, requests.exceptions.RequestException):
        return ""
    return f"docker://{version}" if version else ""
