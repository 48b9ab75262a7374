"""What every doctor check shares: the :class:`Check` a check returns, the :class:`Environment` it
looks in, and the paths and exit codes the rest of ascendkit names (the pods mount these paths)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_NO_DEVICES = 0, 1, 10
IMAGE_INFO = "/etc/ascendkit/image.json"
CONSTRAINTS = "/etc/ascendkit/constraints.txt"
DRIVER_VERSION = "/usr/local/Ascend/driver/version.info"
FIRMWARE_VERSION = "/usr/local/Ascend/firmware/version.info"  # mounted where the host has it (smoke)
HCCN_CONF = "/etc/hccn.conf"  # the NPU ports' addresses, as the host configured them (the preflight mounts it)
NODE_ENV = "ASCENDKIT_NODE_NAME"  # the Kubernetes node a preflight pod runs on (its downward API)
# The node's container runtimes as Kubernetes names them (containerd://1.6.20, docker://20.10.24),
# comma-separated: smoke passes its engine's; on a host doctor asks the local ones.
RUNTIME_ENV = "ASCENDKIT_NODE_RUNTIME"
# The first release of each that pulls zstd-compressed layers (the images' -zstd tags).
ZSTD_SINCE = {"containerd": (1, 5), "docker": (23, 0), "cri-o": (1, 24)}
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"  # from the host's driver, mounted read-only
LINK_TIMEOUT_S = 20


STATUSES = ("ok", "warn", "error", "skip")  # every check's status, in every report ascendkit writes


@dataclass(frozen=True)
class Check:
    """The result of one check, wherever ascendkit checks something: doctor here and on a node, an
    image's verification against its plan, a job's config, a training run, a signature, a node's
    preflight. ``status`` is one of :data:`STATUSES`: ``error`` fails what the check guards, ``warn``
    is reported and passes, ``skip`` did not apply. Where the check compares, ``expected`` and
    ``actual`` say with what (they are left out of reports when empty)."""

    name: str
    status: str  # "ok", "warn", "error" or "skip"
    detail: str
    expected: str = ""
    actual: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "error"

    def describe(self) -> dict[str, str]:
        """The check as reports write it: name, status and detail, and what it compared where it did."""
        data = {"name": self.name, "status": self.status, "detail": self.detail}
        return {**data, **({"expected": self.expected, "actual": self.actual} if self.expected or self.actual else {})}


@dataclass(frozen=True)
class Environment:
    """Where doctor looks; tests point it elsewhere."""

    root: Path = Path("/")
    env: dict[str, str] | None = None

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def getenv(self, name: str) -> str:
        return (os.environ if self.env is None else self.env).get(name, "")


def read_info(path: Path) -> dict[str, str]:
    """A ``key=value`` file as the driver and firmware write their version.info."""
    if not path.is_file():
        return {}
    fields = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def version_numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def devices(where: Environment) -> list[str]:
    return sorted(str(p) for p in where.path("/dev").glob("davinci[0-9]*"))
