"""What the host contract adds to doctor: what HCCL reads from the host on an Ascend 950 (A5) beside
the devices (the product's topology file under the driver's ``topo`` directory, named by
``HCCL_TOPO_FILE_PATH``, which the device plugin and smoke set; ``/etc/hccl_rootinfo.json``, whose
format 1.0 A5's HCCL refuses with EI0014), and, in a pod, which of the two cluster modes its node
runs (with Ascend Docker Runtime the device plugin only sets ASCEND_VISIBLE_DEVICES and
ASCEND_RUNTIME_OPTIONS, and the runtime mounts the driver)."""

from __future__ import annotations

import json
import os
import re

from .base import Check, Environment
from .contract import HCCL_ROOTINFO, TOPO_DIR, TOPO_ENV

RUNTIME_ENVS = ("ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS")  # the device plugin's SetAscendRuntimeEnv
NODE_RUNTIME_CHECK = "node runtime"
EI0014_FIX = "EI0014 on A5: regenerate it with the driver of this host (its format must be 2.0) or remove it"


def _format_of(data: object) -> str | None:
    """The format version a rootinfo file says, from its top-level ``*version*`` field."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        if "version" in str(key).lower() and isinstance(value, (str, int, float)):
            return str(value)
    return None


def check_rootinfo(where: Environment, chip: str | None) -> list[Check]:
    """``/etc/hccl_rootinfo.json`` where it is mounted: format 2.0 on A5 (a 1.0 file gives EI0014)."""
    path = where.path(HCCL_ROOTINFO)
    if not path.is_file():
        return []
    try:
        found = _format_of(json.loads(path.read_text(encoding="utf-8", errors="replace")))
    except ValueError:
        return [Check("hccl rootinfo", "error" if chip == "a5" else "warn", f"{HCCL_ROOTINFO} is not JSON: {EI0014_FIX}")]
    if found is None:
        return [Check("hccl rootinfo", "warn", f"{HCCL_ROOTINFO} names no format version: A5's HCCL reads format 2.0 only")]
    if re.match(r"^2(\.|$)", found):
        return [Check("hccl rootinfo", "ok", f"{HCCL_ROOTINFO} format {found}")]
    status = "error" if chip == "a5" else "warn"
    return [Check("hccl rootinfo", status, f"{HCCL_ROOTINFO} is format {found}, not 2.0: {EI0014_FIX}")]


def check_topology(where: Environment, chip: str | None, npus: int) -> list[Check]:
    """On A5: the driver's topo directory mounted, and the file ``HCCL_TOPO_FILE_PATH`` names in it
    (an error where HCCL has cards to connect, more than one NPU)."""
    if chip != "a5":
        return []
    wanted = where.getenv(TOPO_ENV)
    if not where.path(TOPO_DIR).is_dir():
        status = "error" if npus > 1 else "warn"
        return [Check("hccl topology", status, f"{TOPO_DIR} not mounted: HCCL fails with EI0014 (mount the host's driver topo directory)")]
    if not wanted:
        return [
            Check(
                "hccl topology", "warn", f"{TOPO_ENV} is not set: HCCL cannot find the product's topology file (the device plugin sets it)"
            )
        ]
    if not where.path(wanted).is_file():
        status = "error" if npus > 1 else "warn"
        return [
            Check("hccl topology", status, f"{TOPO_ENV}={wanted}: no such file on this host's driver (EI0014, topo_file path is invalid)")
        ]
    return [Check("hccl topology", "ok", f"{TOPO_ENV}={wanted}")]


def node_runtime(where: Environment, in_pod: bool) -> str | None:
    """In a pod: ``ascend`` where the node runs Ascend Docker Runtime (the device plugin then set its
    variables instead of adding device nodes), else ``plain``; None outside a pod. The report carries
    it as ``node_runtime`` so `k8s preflight` can say which ``--node-runtime`` to render."""
    if not in_pod:
        return None
    env = os.environ if where.env is None else where.env
    return "ascend" if any(name in env for name in RUNTIME_ENVS) else "plain"


def check_node_runtime(where: Environment, in_pod: bool) -> list[Check]:
    """:func:`node_runtime` as a line of the report, with what it was told by."""
    runtime = node_runtime(where, in_pod)
    if runtime is None:
        return []
    if runtime == "ascend":
        env = os.environ if where.env is None else where.env
        said = ", ".join(name for name in RUNTIME_ENVS if name in env)
        return [Check(NODE_RUNTIME_CHECK, "ok", f"ascend: the device plugin set {said} (Ascend Docker Runtime mounts the driver)")]
    return [Check(NODE_RUNTIME_CHECK, "ok", "plain: the device plugin added the devices itself (the pods mount the driver files)")]
