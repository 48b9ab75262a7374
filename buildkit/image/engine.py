"""The Docker engine connection (DOCKER_HOST and friends honoured), failing fast when it is down."""

from __future__ import annotations

import os

import docker
import requests
from docker.errors import DockerException
from docker.utils import kwargs_from_env

from buildkit.errors import Unavailable

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
        raise Unavailable(
            f"cannot reach the Docker engine at {host} ({exc.__class__.__name__}: {exc}); start dockerd or point DOCKER_HOST at it"
        ) from None
    return client
