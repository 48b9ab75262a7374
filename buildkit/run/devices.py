"""What a smoke container gets on an NPU host: exactly the SKU's devices and the host's driver files,
as its chip's host contract lists them (buildkit/doctor/host_contract.json), the environment the
contract derives from the SKU, the groups its user needs to open the devices, and a data directory
it can write."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.doctor.contract import TOPO_DIR, TOPO_ENV, contract_for
from buildkit.errors import InputError
from buildkit.matrix.model import Sku
from buildkit.plan import USER_LABEL

SHM_SIZE = "16g"  # what verl's NPU CI gives its containers


@dataclass(frozen=True)
class DevicePlan:
    """What the container gets from the host (the chip's contract: buildkit/doctor/host_contract.json,
    as this host has it). No NPUs at all means a preflight-only run."""

    npus: tuple[str, ...]
    control: tuple[str, ...]  # the chip's other device nodes, each node of a directory (/dev/uburma/ub0) by itself
    driver_files: tuple[str, ...]
    notes: tuple[str, ...] = ()
    host_root: Path = Path("/")  # where the host's / is (tests give a directory of stand-in nodes)
    env: tuple[tuple[str, str], ...] = ()  # what the chip's contract sets from the SKU (HCCL_TOPO_FILE_PATH)

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
    """The SKU's devices and driver files as found on this host, as its chip's contract lists them.

    A host with no ``/dev/davinciN`` gets an empty plan (preflight only). A host with some NPUs
    must have every one the SKU (or ``--devices``) names and every piece the contract requires;
    an optional piece it lacks is left out and named in the notes.
    """
    contract = contract_for(sku.chip)
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
    control: list[str] = []
    files: list[str] = []
    notes = []
    for piece in (*contract.devices, *contract.paths):
        found = piece.found_on(host_root)
        if not found and piece.need == "required":
            missing.append(piece.path + ("/*" if piece.kind == "device-directory" else ""))
        elif not found:
            notes.append(f"{piece.path} not on this host: not {'passed' if piece.is_device else 'mounted'} ({piece.need} on {sku.chip})")
        (control if piece.is_device else files).extend(found)
    env = contract.env_for(sku.hccl_topo_file)
    topo = env.get(TOPO_ENV)
    if topo and not (host_root / topo.lstrip("/")).is_file() and TOPO_DIR in files:
        lacking = f"{topo} ({TOPO_ENV} of {sku.product}: HCCL fails with EI0014 without it)"
        if len(wanted) > 1:
            missing.append(lacking)
        else:
            notes.append(f"{lacking} not on this host: one NPU needs no HCCL")
    if missing:
        raise InputError(f"this host lacks what --hw {sku_id} needs: {', '.join(missing)} (is the Ascend driver installed?)")
    return DevicePlan(
        npus=tuple(f"/dev/davinci{i}" for i in wanted),
        control=tuple(control),
        driver_files=tuple(files),
        notes=tuple(notes),
        host_root=host_root,
        env=tuple(sorted(env.items())),
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
