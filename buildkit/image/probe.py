"""The verification probe: a Python program (:mod:`buildkit.image.probe_program`) run inside the
image, as its own user, that prints what the image holds as one JSON document; and the
short-lived containers it runs in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException

from buildkit.errors import VerifyFailed
from buildkit.image.engine import remove_containers
from buildkit.reach import engine_said

PROBE_LABEL = "io.ascendkit.probe"

# The program itself is a real module, read and passed to the image's Python as ``python3 -c``
# (linted, type-checked and unit-tested here; the standard library only, as it runs there).
PROGRAM = Path(__file__).with_name("probe_program.py")


def run_in_image(client: docker.APIClient, image_id: str, command: list[str], timeout: int = 300) -> tuple[int, str, str]:
    """Run ``command`` in a short-lived container (no network, the image's entrypoint); always removed."""
    container = client.create_container(image_id, command=command, network_disabled=True, labels={PROBE_LABEL: "1"})
    cid = container["Id"]
    try:
        client.start(cid)
        status = client.wait(cid, timeout=timeout)
        stdout = client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = client.logs(cid, stdout=False, stderr=True).decode("utf-8", "replace")
    except (DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise VerifyFailed(f"could not run the verification container: {engine_said(exc)}") from None
    finally:
        remove_containers(client, [cid])
    return int(status.get("StatusCode", -1)), stdout, stderr


def run_probe(
    client: docker.APIClient,
    image_id: str,
    distributions: tuple[str, ...] = (),
    extensions: tuple[str, ...] = (),
    imports: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The probe, run as the image's own user; it also finds the top-level modules of ``distributions``,
    for each compiled extension module of ``extensions`` its file and the shared libraries it needs,
    and imports each module of ``imports`` for real."""
    source = PROGRAM.read_text(encoding="utf-8")
    argv = ["python3", "-c", source, *distributions, *(f"ext:{name}" for name in extensions), *(f"imp:{name}" for name in imports)]
    code, stdout, stderr = run_in_image(client, image_id, argv)
    if code != 0:
        raise VerifyFailed(f"the verification probe exited with {code}:\n{stderr[-2000:]}")
    try:
        data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VerifyFailed(f"the verification probe printed no JSON:\n{stdout[-1000:]}{stderr[-1000:]}") from None
    return data
