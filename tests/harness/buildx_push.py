"""Pushing an image with buildx to one of the services' registries, as the tests and benchmarks set up.

Docker 26's buildx on the containerd store pushes a tag twice at once: BuildKit and the engine each
HEAD and PUT it. Debian's registry (distribution 2.8) writes a tag's link file in place, so a HEAD
that lands between another PUT's truncate and write reads it empty and answers 500 "invalid
checksum digest format". Seen once in CI under full load (prepull-94745e1d/verl:2.0). A push is
idempotent, so that one answer is tried again, a bounded number of times; any other failure is
returned at once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

RACED = "500 Internal Server Error"
ATTEMPTS = 3


def buildx_push(argv: list[str], env: Mapping[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `argv` (a buildx build whose output pushes); again, up to ATTEMPTS in all, while it fails on RACED."""
    for _ in range(ATTEMPTS):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=timeout)
        if proc.returncode == 0 or RACED not in proc.stderr:
            break
    return proc
