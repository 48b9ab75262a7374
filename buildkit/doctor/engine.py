"""What a container engine is: Docker Engine or Podman, its version, API version and image store, from
the answers of its ``/version`` and ``/info`` (the Docker API, ``docker version`` and ``docker info``
print the same fields). One reading for doctor on a host, preflight's node list and the build
manifest (buildkit.image.engine reads the API through docker-py; doctor, on the standard library
alone, through the docker CLI)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from .base import Check, version_numbers

CONTAINERD_STORE = "containerd"  # Docker's containerd image store: image IDs are manifest digests, saves hold compressed blobs
GRAPH_DRIVER_STORE = "graph driver"  # Docker's classic store (overlay2, vfs, ...): image IDs are config digests
PODMAN_STORE = "containers-storage"  # Podman's (through its Docker-compatible API)
_SNAPSHOTTER = "io.containerd.snapshotter.v1"  # the driver-type `docker info` gives on the containerd store

# Docker Engine release -> the API version it serves (docker/docs, "Engine API version history").
DOCKER_API = {
    (20, 10): "1.41", (23, 0): "1.42", (24, 0): "1.43", (25, 0): "1.44", (26, 0): "1.45", (26, 1): "1.45",
    (27, 0): "1.46", (27, 1): "1.46", (27, 2): "1.46", (27, 3): "1.47", (27, 4): "1.47", (27, 5): "1.47",
    (28, 0): "1.48", (28, 1): "1.49", (28, 2): "1.50", (28, 3): "1.51", (28, 4): "1.51", (28, 5): "1.51", (29, 0): "1.52",
}  # fmt: skip
SUPPORTED_SINCE = (23, 0)  # older Docker Engine releases are past their end of life (20.10 since 2023-12) and pull no zstd


def engine_from(version: dict[str, Any], info: dict[str, Any]) -> dict[str, str]:
    """product, version, api_version, image_store and storage_driver from an engine's ``/version``
    and ``/info`` (fields an engine leaves out read as empty: API 1.52 omits empty ones)."""
    components = [str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict)]
    platform = version.get("Platform") if isinstance(version.get("Platform"), dict) else {}
    podman = any("podman" in name.lower() for name in [*components, str((platform or {}).get("Name", ""))])
    pairs = [p for p in info.get("DriverStatus") or [] if isinstance(p, list | tuple) and len(p) == 2]
    status = {str(key): str(value) for key, value in pairs}
    if podman:
        store = PODMAN_STORE
    elif status.get("driver-type") == _SNAPSHOTTER:
        store = CONTAINERD_STORE
    else:
        store = GRAPH_DRIVER_STORE
    return {
        "product": "Podman" if podman else "Docker Engine",
        "version": str(version.get("Version") or info.get("ServerVersion") or ""),
        "api_version": str(version.get("ApiVersion") or ""),
        "image_store": store,
        "storage_driver": str(info.get("Driver") or ""),
    }


def describe(engine: dict[str, str]) -> str:
    return (
        f"{engine['product']} {engine['version']} (API {engine['api_version'] or '?'}), "
        f"{engine['image_store']} image store ({engine['storage_driver'] or '?'})"
    )


def local_engine(timeout: float = 10) -> dict[str, str] | None:
    """The engine the docker CLI here reaches (DOCKER_HOST and its context honoured); None without one."""
    answers: list[dict[str, Any]] = []
    for what in ("version", "info"):
        try:
            out = subprocess.run(["docker", what, "--format", "{{json .}}"], capture_output=True, text=True, timeout=timeout, check=False)
            answer = json.loads(out.stdout) if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
        said = answer.get("Server") if isinstance(answer, dict) and what == "version" else answer
        if not isinstance(said, dict):
            return None
        answers.append(said)
    return engine_from(answers[0], answers[1])


def judge_engine(engine: dict[str, str]) -> Check:
    """The engine in one line; a warning where it is a Docker release past its end of life."""
    said = describe(engine)
    numbers = version_numbers(engine["version"])[:2]
    if engine["product"] == "Docker Engine" and len(numbers) == 2 and numbers < SUPPORTED_SINCE:
        return Check("engine", "warn", f"{said}: past its end of life, and it cannot pull zstd layers (Docker >= 23.0); upgrade Docker")
    return Check("engine", "ok", said)


def engine_of_runtime(runtime: str) -> dict[str, str]:
    """What a node list's ``containerRuntimeVersion`` (``containerd://1.7.24``, ``docker://26.1.5``)
    says of the node's engine; the image store is known for containerd and CRI-O, not for Docker."""
    name, _, version = runtime.strip().partition("://")
    numbers = version_numbers(version)[:2]
    product, api, store = {
        "docker": (
            "Docker Engine",
            DOCKER_API.get(numbers, "") if len(numbers) == 2 else "",
            "not in the node list: run `ascendkit doctor` on the node",
        ),
        "containerd": ("containerd", "CRI", CONTAINERD_STORE),
        "cri-o": ("CRI-O", "CRI", PODMAN_STORE),
    }.get(name, (name, "", ""))
    return {"product": product, "version": version, "api_version": api, "image_store": store, "storage_driver": ""}
