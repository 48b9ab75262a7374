"""What a smoke container gets on an NPU host: exactly the SKU's devices and the host's driver files,
the groups its user needs to open them, and a data directory it can write."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.errors import InputError
from buildkit.matrix.model import Sku
from buildkit.plan import USER_LABEL
from buildkit.run.doctor.base import CONTROL_DEVICES, DRIVER_VERSION, FIRMWARE_VERSION, HCCN_TOOL

# The driver lives on the host, never in the image (facts: "Running a container on an NPU host").
DRIVER_FILES_REQUIRED = ("/usr/local/Ascend/driver/lib64", DRIVER_VERSION)
# hccn_tool ships with the NPU driver; doctor reads each NPU port's link state with it, and the
# firmware's version file to judge the firmware against the range the driver accepts.
DRIVER_FILES_OPTIONAL = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
    HCCN_TOOL,
    FIRMWARE_VERSION,
)
SHM_SIZE = "16g"  # what verl's NPU CI gives its containers


@dataclass(frozen=True)
class DevicePlan:
    """What the container gets from the host. No NPUs at all means a preflight-only run."""

    npus: tuple[str, ...]
    control: tuple[str, ...]
    driver_files: tuple[str, ...]
    notes: tuple[str, ...] = ()
    host_root: Path = Path("/")  # where the host's / is (tests give a directory of stand-in nodes)

    @property
    def has_npus(self) -> bool:
        return bool(self.npus)

    def on_host(self, path: str) -> str:
        """The host's file for ``path`` (the container's path)."""
        return str(self.host_root / path.lstrip("/"))

    def driver_binds(self) -> dict[str, dict[str, str]]:
        """The host's driver files, each read-only at its own path in the container."""
        return {self.on_host(f): {"bind": f, "mode": "ro"} for f in self.driver_files}


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
    optional = [f for f in DRIVER_FILES_OPTIONAL if on_host(f)] + [f for f in sku.host_files if on_host(f)]
    notes = tuple(f"{f} not on this host: not mounted" for f in (*DRIVER_FILES_OPTIONAL, *sku.host_files) if f not in optional)
    return DevicePlan(
        npus=tuple(f"/dev/davinci{i}" for i in wanted),
        control=CONTROL_DEVICES,
        driver_files=(*DRIVER_FILES_REQUIRED, *optional),
        notes=notes,
        host_root=host_root,
    )


def device_groups(plan: DevicePlan, uid: int, gid: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The supplementary groups a container running as ``uid:gid`` needs to open the plan's device
    nodes, read from the nodes themselves (Ascend's are HwHiAiUser's, mode 0660, but a host may
    give them another group); and notes on nodes no group opens."""
    if uid == 0:
        return (), ()
    groups: set[int] = set()
    notes: list[str] = []
    for device in (*plan.npus, *plan.control):
        st = Path(plan.on_host(device)).stat()
        mode = st.st_mode & 0o777
        if (st.st_uid == uid and mode & 0o600 == 0o600) or mode & 0o006 == 0o006:
            continue
        if mode & 0o060 != 0o060:
            notes.append(
                f"{device} is {st.st_uid}:{st.st_gid} mode {mode:04o}: uid {uid} cannot open it through a group (--as-root runs as root)"
            )
        elif st.st_gid != gid:
            groups.add(st.st_gid)
    if 0 in groups:
        notes.append("some device nodes belong to group root: the container's user is given group 0 to open them")
    return tuple(sorted(groups)), tuple(notes)


def host_config_args(
    plan: DevicePlan, mounts: dict[str, tuple[str, str]], *, privileged: bool, groups: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Arguments of docker-py's ``create_host_config`` for the smoke containers.

    ``mounts`` maps host paths to (container path, mode); ``groups`` are added to the container's
    user (the devices' groups). Multi-card runs get the host network (HCCL and Ray talk over it)
    and a 16 GiB ``/dev/shm``.
    """
    binds = {host: {"bind": target, "mode": mode} for host, (target, mode) in mounts.items()}
    binds.update(plan.driver_binds())
    args: dict[str, Any] = {
        "binds": binds,
        "devices": [f"{plan.on_host(d)}:{d}:rwm" for d in (*plan.npus, *plan.control)],
        "shm_size": SHM_SIZE,
        "privileged": privileged,
    }
    if groups:
        args["group_add"] = [str(g) for g in groups]
    if len(plan.npus) > 1:
        args["network_mode"] = "host"
    return args


def image_user(labels: dict[str, str], config_user: str) -> tuple[str, int, int]:
    """(name, uid, gid) the image runs as: its ascendkit label, else its config's numeric User,
    else root (images built before the user, and others)."""
    match = re.fullmatch(r"(\S+) (\d+):(\d+)", labels.get(USER_LABEL, ""))
    if match:
        return match[1], int(match[2]), int(match[3])
    match = re.fullmatch(r"(\d+)(?::(\d+))?", config_user)
    if match and match[1] != "0":
        return f"uid {match[1]}", int(match[1]), int(match[2] or 0)
    return "root", 0, 0


def prepare_data_dir(out: Path, uid: int, gid: int) -> str | None:
    """``out/data``, where the job writes the data it generates, writable by the container's user
    (the image's, uid 1000 by default, rarely the caller's): given to it when this process is root,
    else opened to everyone for this run's generated data (said in the report)."""
    data = out / "data"
    data.mkdir(exist_ok=True)
    if uid == 0 or os.geteuid() == uid:
        return None
    if os.geteuid() == 0:
        os.chown(data, uid, gid)
        return None
    data.chmod(0o777)
    return f"{data} made writable by all: the image's user (uid {uid}) writes the generated data there; only root can give it the directory"
