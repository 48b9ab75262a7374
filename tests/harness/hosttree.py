"""A stand-in Ascend host as a directory tree, built from a chip's host contract: the NPUs, every
device node and host path the contract lists for the chip (required ones, and optional and multi-node
ones unless left out), the driver files as small stand-ins. With ``mknod`` (root only) the device
nodes are real character devices (the null device's numbers, 1:3) that a container can be given;
otherwise empty files, enough for planning."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from buildkit.doctor.base import DRIVER_VERSION
from buildkit.doctor.contract import TOPO_DIR, Piece, contract_for

DEVICE_GID = 1000  # HwHiAiUser's group, the matrix's default device_gid
UB_NODES = {"/dev/uburma": ("ub0", "ub1"), "/dev/ummu": ("ummu0",)}  # STAND-IN names: one node or two per directory


def _node(path: Path, mknod: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if mknod:  # as the Ascend driver leaves its nodes: root's, group HwHiAiUser (1000), 0660
        os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
        os.chown(path, 0, DEVICE_GID)
        path.chmod(0o660)
    else:
        path.touch()


def _place(root: Path, piece: Piece, mknod: bool) -> None:
    where = root / piece.path.lstrip("/")
    if piece.kind == "device":
        _node(where, mknod)
    elif piece.kind == "device-directory":
        for name in UB_NODES.get(piece.path, ("0",)):
            _node(where / name, mknod)
    elif piece.kind == "directory":
        where.mkdir(parents=True, exist_ok=True)
    else:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text("Version=25.2.0\n" if piece.path == DRIVER_VERSION else f"STAND-IN for the host's {piece.path}\n")


def stand_in_host(
    root: Path,
    chip: str,
    npus: int,
    *,
    required: bool = True,
    optional: bool = True,
    devices: bool = True,
    mknod: bool = False,
    topo_file: str | None = None,
    without: tuple[str, ...] = (),
) -> Path:
    """The host tree for ``chip`` under ``root``: ``npus`` NPUs, and the contract's pieces (devices
    only with ``devices``; required and optional ones as asked; never those in ``without``). With
    ``topo_file``, that file of the driver's topo/950 directory."""
    contract = contract_for(chip)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for n in range(npus):
        _node(root / f"dev/davinci{n}", mknod)
    for piece in (*contract.devices, *contract.paths):
        wanted = required if piece.need == "required" else optional
        if not wanted or piece.path in without or (piece.is_device and not devices):
            continue
        _place(root, piece, mknod)
    if topo_file and TOPO_DIR not in without:
        topo = root / TOPO_DIR.lstrip("/") / "950" / topo_file
        topo.parent.mkdir(parents=True, exist_ok=True)
        topo.write_text('{"STAND-IN": "the product topology file HCCL reads"}\n')
    return root


def contract_paths(chip: str, *needs: str, devices: bool = False) -> tuple[str, ...]:
    """The contract's paths (or device entries) of ``chip`` with one of ``needs``."""
    contract = contract_for(chip)
    return tuple(p.path for p in (contract.devices if devices else contract.paths) if p.need in needs)
