"""What an Ascend training container needs from its host, per chip (host_contract.json beside this
file: data, each entry with its upstream source). Standard library only: doctor reads it in the image.

Each device node and host path has a need per chip: ``required`` (a host without it is refused),
``optional`` (passed where the host has it, the report names what was left out) or ``multi_node``
(for a job of several nodes). ``runtime`` says whether Ascend Docker Runtime already gives it to
every container, so a pod on a node with that runtime leaves it to the runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CONTRACT = Path(__file__).with_name("host_contract.json")  # beside this file, in the package and in the image
NEEDS = ("required", "optional", "multi_node")
KINDS = ("device", "device-directory", "directory", "file", "any")
TOPO_DIR = "/usr/local/Ascend/driver/topo"
HCCL_ROOTINFO = "/etc/hccl_rootinfo.json"
TOPO_ENV = "HCCL_TOPO_FILE_PATH"  # the product's topology file, which the device plugin sets on A5
EVERY_POD_ENV = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT")  # of the multi-node env, what every NPU pod gets (a first compile is slow)


@dataclass(frozen=True)
class Piece:
    """One device node, directory of device nodes, or host path, as one chip needs it."""

    path: str
    kind: str  # one of KINDS
    need: str  # one of NEEDS
    runtime: bool  # Ascend Docker Runtime gives it to every container
    source: str
    smoke_only: bool = False  # a pod cannot mount it (a hostPath of type File would keep the pod from starting)
    pods: bool = False  # optional for smoke, but on every node with the driver: pods mount it

    def in_pod(self, *, ascend_runtime: bool, nodes: int) -> bool:
        """Whether a pod mounts it as a hostPath: never what the node's Ascend Docker Runtime already
        mounts; else what is required, what every driver installation has, and a job of several
        nodes' multi-node pieces."""
        if self.is_device or self.smoke_only or (ascend_runtime and self.runtime):
            return False
        return self.need == "required" or self.pods or (self.need == "multi_node" and nodes > 1)

    @property
    def host_path_type(self) -> str:
        """The hostPath type Kubernetes checks before it starts the pod."""
        return {"directory": "Directory", "file": "File"}.get(self.kind, "")

    @property
    def is_device(self) -> bool:
        return self.kind in ("device", "device-directory")

    def found_on(self, root: Path) -> list[str]:
        """What of it the host under ``root`` has, as container paths: itself, or every node of its directory."""
        where = root / self.path.lstrip("/")
        if self.kind == "device-directory":
            return sorted(f"{self.path}/{n.name}" for n in where.iterdir()) if where.is_dir() else []
        return [self.path] if where.exists() else []


@dataclass(frozen=True)
class EnvEntry:
    name: str
    value: str  # may hold {hccl_topo_file} or {nic}
    source: str
    field: str = ""  # a Kubernetes downward-API field instead of a value (status.hostIP)


@dataclass(frozen=True)
class ChipContract:
    chip: str
    devices: tuple[Piece, ...]
    paths: tuple[Piece, ...]
    sku_env: tuple[EnvEntry, ...]  # values from the SKU (HCCL_TOPO_FILE_PATH from its topology file)
    multi_node_env: tuple[EnvEntry, ...]
    host_network_env: tuple[EnvEntry, ...]

    def env_for(self, hccl_topo_file: str | None) -> dict[str, str]:
        """The SKU-derived environment (an A5 SKU's HCCL_TOPO_FILE_PATH); nothing where the SKU names no file."""
        if not hccl_topo_file:
            return {}
        return {e.name: e.value.format(hccl_topo_file=hccl_topo_file) for e in self.sku_env}


def _pieces(entries: list[dict[str, Any]], chip: str) -> tuple[Piece, ...]:
    found = []
    for entry in entries:
        need = entry["chips"].get(chip)
        if need is None:
            continue
        if need not in NEEDS or entry["kind"] not in KINDS:
            raise ValueError(f"{CONTRACT.name}: {entry['path']}: need {need!r} or kind {entry['kind']!r} is not one of {NEEDS}, {KINDS}")
        found.append(
            Piece(
                entry["path"],
                entry["kind"],
                need,
                bool(entry["runtime"]),
                entry["source"],
                bool(entry.get("smoke_only", False)),
                bool(entry.get("pods", False)),
            )
        )
    return tuple(found)


def _env(table: dict[str, dict[str, Any]], chip: str) -> tuple[EnvEntry, ...]:
    return tuple(
        EnvEntry(name, str(e.get("value", "")), str(e["source"]), str(e.get("field", "")))
        for name, e in sorted(table.items())
        if chip in e.get("chips", [chip])
    )


@cache
def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CONTRACT.read_text(encoding="utf-8"))
    return data


def chips() -> tuple[str, ...]:
    """Every chip the contract knows, in the order of its first device's entry."""
    return tuple(raw()["devices"][0]["chips"])


@cache
def contract_for(chip: str) -> ChipContract:
    """The contract of ``chip`` (a2, a3, a5); KeyError for a chip it does not know."""
    data = raw()
    if chip not in chips():
        raise KeyError(f"{CONTRACT.name} has no chip {chip!r} (it has {', '.join(chips())})")
    env = data["env"]
    return ChipContract(
        chip,
        _pieces(data["devices"], chip),
        _pieces(data["paths"], chip),
        _env(env["sku"], chip),
        _env(env["multi_node"], chip),
        _env(env["host_network"], chip),
    )


def control_nodes(root: Path) -> list[str]:
    """Every device node beside /dev/davinciN that any chip's contract names and ``root`` has (each
    node of a directory such as /dev/uburma by itself), as paths under ``root``."""
    devices = {p.path: p for chip in chips() for p in contract_for(chip).devices}
    return [str(root / node.lstrip("/")) for piece in devices.values() for node in piece.found_on(root)]
