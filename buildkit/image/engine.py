"""The Docker engine connection (DOCKER_HOST and friends honoured), failing fast when it is down,
and what the engine is: product, version, API version and image store (:class:`EngineFacts`, as
:mod:`buildkit.doctor.engine` reads them)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import docker
import requests
from docker.errors import DockerException, NotFound
from docker.utils import kwargs_from_env

from buildkit.arch import normalize_arch
from buildkit.doctor.engine import CONTAINERD_STORE, GRAPH_DRIVER_STORE, PODMAN_STORE, describe, engine_from
from buildkit.errors import InputError, Unavailable
from buildkit.reach import engine_failure

# A build step can be silent for a long time (vllm-ascend compiles its kernels without output);
# the read timeout must outlast it, or a healthy build would be reported as a lost engine.
BUILD_READ_TIMEOUT = 4 * 3600


def connect(timeout: int = BUILD_READ_TIMEOUT) -> docker.APIClient:
    """A low-level docker-py client for the engine named by DOCKER_HOST (default: the local socket)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.APIClient(version="auto", timeout=timeout, **kwargs_from_env())
        client.ping()
    except (DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise Unavailable(engine_failure(host, exc)) from None
    return client


REMOVE_TRIES = 6  # attempts to remove one container, 0.5 s to 8 s apart: about 15 s in all


def remove_containers(client: docker.APIClient, ids: list[str]) -> None:
    """Remove containers (killing them if they run), each until the engine no longer has it. A failed removal
    is tried again on a fresh connection, with growing pauses (bounded, :data:`REMOVE_TRIES`): the engine may
    still be tearing a build step down, an overlay2 engine may answer that a layer is busy for a moment after the
    container exited, a removal already under way answers 409 until it is done, and after Ctrl-C or SIGTERM the
    client's connection may have been cut mid-answer. One still there after every try is named on stderr (this
    runs in clean-up, where raising would hide the error that brought it there). Used wherever ascendkit
    removes its own."""
    for cid in ids:
        pause, conn = 0.5, client
        for attempt in range(REMOVE_TRIES):
            try:
                if attempt:
                    conn = connect(timeout=60)
                conn.remove_container(cid, force=True)
                conn.inspect_container(cid)  # still there: a removal under way elsewhere, or the engine's own lag
            except NotFound:
                break
            except (DockerException, requests.exceptions.RequestException, Unavailable):
                pass
            if attempt + 1 < REMOVE_TRIES:
                time.sleep(pause)
                pause = min(pause * 2, 8.0)
        else:
            print(f"ascendkit: could not remove container {cid[:12]}: remove it with `docker rm -f {cid[:12]}`", file=sys.stderr)


def ascendkit_image(client: docker.APIClient, ref: str, missing_hint: str) -> tuple[dict[str, Any], str]:
    """A local image built by ascendkit: its inspect data, and the name its build wrote the manifest
    and SBOM under (``<org.opencontainers.image.version>-<arch>``)."""
    try:
        inspect: dict[str, Any] = client.inspect_image(ref)
    except NotFound:
        raise InputError(f"image {ref} is not on this engine; {missing_hint}") from None
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    version = labels.get("org.opencontainers.image.version")
    if not version or "io.ascendkit.stack" not in labels:
        raise InputError(f"image {ref} was not built by ascendkit (no io.ascendkit.* labels)")
    return inspect, f"{version}-{normalize_arch(str(inspect.get('Architecture', '')))}"


@dataclass(frozen=True)
class EngineFacts:
    """What a build or publish ran on: recorded in the build manifest, printed by doctor."""

    product: str  # "Docker Engine" or "Podman"
    version: str
    api_version: str
    image_store: str  # CONTAINERD_STORE, GRAPH_DRIVER_STORE or PODMAN_STORE
    storage_driver: str  # overlay2, overlayfs (the containerd snapshotter), vfs, ...

    def describe(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return describe(self.describe())


def engine_facts(client: docker.APIClient) -> EngineFacts:
    """The engine behind ``client``, from its ``/version`` and ``/info``."""
    return EngineFacts(**engine_from(client.version() or {}, client.info() or {}))


__all__ = [
    "BUILD_READ_TIMEOUT", "CONTAINERD_STORE", "GRAPH_DRIVER_STORE", "PODMAN_STORE", "EngineFacts", "ascendkit_image", "connect",
    "engine_facts", "remove_containers",
]  # fmt: skip
