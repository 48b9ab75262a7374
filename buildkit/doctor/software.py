"""Checks of what the image installed: its exact pins, the CANN environment of the process, and
torch_npu on the NPUs (imported only when devices are present)."""

from __future__ import annotations

import re
from typing import Any

from .base import CONSTRAINTS, Check, Environment
from .codes import explained


def _installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_pins(where: Environment) -> list[Check]:
    """Every exact pin the image recorded as it installed it, against what is installed now."""
    path = where.path(CONSTRAINTS)
    if not path.is_file():
        return [Check("pinned packages", "skip", f"{CONSTRAINTS} not found (not an ascendkit image)")]
    mismatched, checked = [], 0
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        if not match:
            continue  # a range constraint such as numpy<2.0.0 pins nothing exactly
        checked += 1
        name, pinned = match[1], match[2]
        found = _installed_version(name)
        if found is None or found.split("+")[0] != pinned.split("+")[0]:
            mismatched.append(f"{name} {found or 'missing'} (pinned {pinned})")
    if mismatched:
        return [Check("pinned packages", "error", "; ".join(mismatched))]
    return [Check("pinned packages", "ok", f"{checked} exact pins installed as recorded")]


def check_cann_env(where: Environment, info: dict[str, Any]) -> list[Check]:
    checks = []
    home = where.getenv("ASCEND_HOME_PATH")
    if not home:
        checks.append(Check("ASCEND_HOME_PATH", "error", "not set: the CANN environment is missing from this process"))
    elif not where.path(home).is_dir():
        checks.append(Check("ASCEND_HOME_PATH", "error", f"{home} does not exist"))
    else:
        checks.append(Check("ASCEND_HOME_PATH", "ok", home))
    library_path = where.getenv("LD_LIBRARY_PATH")
    toolkit_lib = f"{home.rstrip('/')}/lib64" if home else ""
    if not library_path:
        checks.append(Check("LD_LIBRARY_PATH", "error", "not set"))
    elif toolkit_lib and toolkit_lib not in library_path.split(":"):
        checks.append(Check("LD_LIBRARY_PATH", "error", f"does not contain {toolkit_lib}"))
    else:
        checks.append(
            Check(
                "LD_LIBRARY_PATH",
                "ok" if toolkit_lib else "skip",
                "toolkit libraries on the path" if toolkit_lib else "no toolkit to look for",
            )
        )
    atb = where.getenv("ATB_HOME_PATH")
    abi = info.get("atb_cxx_abi")
    if not atb:
        checks.append(Check("ATB_HOME_PATH", "error", "not set"))
    elif abi is not None and not atb.rstrip("/").endswith(f"cxx_abi_{abi}"):
        checks.append(Check("ATB_HOME_PATH", "error", f"{atb} is not the cxx_abi_{abi} build this image's torch needs"))
    elif not where.path(atb).is_dir():
        checks.append(Check("ATB_HOME_PATH", "warn", f"{atb} does not exist in this image"))
    else:
        checks.append(Check("ATB_HOME_PATH", "ok", atb))
    return checks


def check_npus(info: dict[str, Any], torch_modules: tuple[Any, Any] | None = None) -> list[Check]:
    """torch_npu sees the NPUs, they are of the image's chip family, and a matmul agrees with the CPU."""
    try:
        torch, torch_npu = torch_modules or (__import__("torch"), __import__("torch_npu"))
    except ImportError as exc:
        return [Check("torch_npu", "error", f"cannot import: {exc}")]
    try:
        return _npu_checks(info, torch, torch_npu)
    except Exception as exc:  # torch_npu raises RuntimeError with the ACL code somewhere in its (long) text
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return [Check("NPUs", "error", explained(f"torch_npu failed: {first}", text))]


def _npu_checks(info: dict[str, Any], torch: Any, torch_npu: Any) -> list[Check]:
    count = torch.npu.device_count()
    if count == 0:
        return [Check("NPUs", "error", "devices are mounted but torch_npu sees none (driver, permissions, or held by another container)")]
    checks = [Check("NPUs", "ok", f"{count} visible to torch_npu {getattr(torch_npu, '__version__', '')}".strip())]
    soc = str(torch.npu.get_device_name(0))
    family = [str(s) for s in info.get("soc_names", [])]
    prefix = str(info.get("soc_family") or "")  # a newer family (Ascend950) whose SoCs the list may not name yet
    if family and soc not in family and not (prefix and soc.lower().startswith(prefix.lower())):
        built_for = f"{info.get('chip_name', info.get('chip'))} ({', '.join(family)})"
        checks.append(Check("SoC", "error", f"{soc}: this image is built for {built_for}; use the image of this host's chip"))
    else:
        checks.append(Check("SoC", "ok", soc))
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    on_npu = (a.to("npu:0") @ b.to("npu:0")).cpu()
    close = bool(torch.allclose(on_npu, a @ b, rtol=1e-3, atol=1e-3))
    checks.append(Check("matmul", "ok" if close else "error", "NPU result matches the CPU" if close else "NPU and CPU results differ"))
    return checks
