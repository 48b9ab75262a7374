"""What a smoke container gets on an NPU host: exactly the SKU's devices and the host's driver files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.errors import InputError
from buildkit.matrix.model import Sku
from buildkit.run.doctor import DRIVER_VERSION, HCCN_TOOL

CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
# The driver lives on the host, never in the image (facts: "Running a container on an NPU host").
DRIVER_FILES_REQUIRED = ("/usr/local/Ascend/driver/lib64", DRIVER_VERSION)
# hccn_tool ships with the NPU driver; doctor reads each NPU port's link state with it.
DRIVER_FILES_OPTIONAL = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
    HCCN_TOOL,
)
SHM_SIZE = "16g"  # what verl's NPU CI gives its containers


@dataclass(frozen=True)
class DevicePlan:
    """What the container gets from the host. No NPUs at all means a preflight-only run."""

    npus: tuple[str, ...]
    control: tuple[str, ...]
    driver_files: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def has_npus(self) -> bool:
        return bool(self.npus)


MAX_NPU_ID = 256  # /dev/davinciN on one host; an A3 node has 16


def parse_visible(text: str) -> list[int]:
    """``0-3,8`` -> [0, 1, 2, 3, 8] (the ASCEND_VISIBLE_DEVICES form)."""
    if not text.strip():
        raise InputError("--devices is empty: give NPU ids like 0-7 or 0,1,2,3, or leave it out to use all of the SKU's")
    ids: list[int] = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last) if sep else int(first)
        except ValueError:
            raise InputError(f"--devices {text!r}: expected NPU ids like 0-7 or 0,1,2,3") from None
        if not 0 <= low <= high < MAX_NPU_ID:
            raise InputError(f"--devices {text!r}: ids run from 0 to {MAX_NPU_ID - 1}, low to high (e.g. 0-7)")
        ids += range(low, high + 1)
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise InputError(f"--devices {text!r}: expected distinct NPU ids like 0-7 or 0,1,2,3")
    return sorted(ids)


def plan_devices(sku_id: str, sku: Sku, visible: list[int] | None = None, host_root: Path = Path("/")) -> DevicePlan:
    """The SKU's devices and driver files as found on this host.

    A host with no ``/dev/davinciN`` gets an empty plan (preflight only). A host with some NPUs
    must have every one the SKU (or ``--devices``) names, the control devices and the driver.
    """

    def on_host(path: str) -> bool:
        return (host_root / path.lstrip("/")).exists()

    present = sorted(int(p.name.removeprefix("davinci")) for p in (host_root / "dev").glob("davinci*") if p.name[7:].isdigit())
    if not present:
        return DevicePlan((), (), (), notes=("no /dev/davinci* on this host: preflight only",))
    wanted = visible if visible is not None else list(range(sku.npus_per_node))
    if visible is None and len(present) < sku.npus_per_node:
        raise InputError(
            f"--hw {sku_id} ({sku.product}) has {sku.npus_per_node} NPUs per node, this host shows {len(present)} "
            f"(/dev/davinci{present[0]}..{present[-1]}); pick the ones to use with --devices, e.g. --devices 0-{len(present) - 1}"
        )
    missing = [f"/dev/davinci{i}" for i in wanted if i not in present]
    missing += [d for d in CONTROL_DEVICES if not on_host(d)]
    missing += [f for f in DRIVER_FILES_REQUIRED if not on_host(f)]
    if missing:
        raise InputError(f"this host lacks what --hw {sku_id} needs: {', '.join(missing)} (is the Ascend driver installed?)")
    optional = [f for f in DRIVER_FILES_OPTIONAL if on_host(f)]
    notes = tuple(f"{f} not on this host: not mounted" for f in DRIVER_FILES_OPTIONAL if f not in optional)
    return DevicePlan(
        npus=tuple(f"/dev/davinci{i}" for i in wanted),
        control=CONTROL_DEVICES,
        driver_files=(*DRIVER_FILES_REQUIRED, *optional),
        notes=notes,
    )


def host_config_args(plan: DevicePlan, mounts: dict[str, tuple[str, str]], *, privileged: bool) -> dict[str, Any]:
    """Arguments of docker-py's ``create_host_config`` for the smoke containers.

    ``mounts`` maps host paths to (container path, mode). Multi-card runs get the host network
    (HCCL and Ray talk over it) and a 16 GiB ``/dev/shm``.
    """
    binds = {host: {"bind": target, "mode": mode} for host, (target, mode) in mounts.items()}
    binds.update({f: {"bind": f, "mode": "ro"} for f in plan.driver_files})
    args: dict[str, Any] = {
        "binds": binds,
        "devices": [f"{d}:{d}:rwm" for d in (*plan.npus, *plan.control)],
        "shm_size": SHM_SIZE,
        "privileged": privileged,
    }
    if len(plan.npus) > 1:
        args["network_mode"] = "host"
    return args
