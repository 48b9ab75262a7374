"""`ascendkit doctor`: is this image (or host) ready to train on its Ascend NPUs?

Standard library only, so it runs inside every image without adding packages to the training
environment (the image carries this file and a small `ascendkit` wrapper); torch and torch_npu
are imported only when NPUs are present. Exit codes:

    0   every check passed (NPUs present and working)
    1   a check failed
    10  no Ascend devices here: the preflight checks passed, the NPU checks were not run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_NO_DEVICES = 0, 1, 10
IMAGE_INFO = "/etc/ascendkit/image.json"
CONSTRAINTS = "/etc/ascendkit/constraints.txt"
DRIVER_VERSION = "/usr/local/Ascend/driver/version.info"
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"  # from the host's driver, mounted read-only
LINK_TIMEOUT_S = 20
CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")  # beside every /dev/davinciN


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn", "error" or "skip"
    detail: str


@dataclass(frozen=True)
class Environment:
    """Where doctor looks; tests point it elsewhere."""

    root: Path = Path("/")
    env: dict[str, str] | None = None

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def getenv(self, name: str) -> str:
        return (os.environ if self.env is None else self.env).get(name, "")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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


def driver_version(where: Environment) -> str | None:
    """The host driver's release: ``package_version=`` (newer drivers) or ``Version=``."""
    path = where.path(DRIVER_VERSION)
    if not path.is_file():
        return None
    fields = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return (fields.get("package_version") or fields.get("Version") or "").strip() or None


def devices(where: Environment) -> list[str]:
    return sorted(str(p) for p in where.path("/dev").glob("davinci[0-9]*"))


def check_user(where: Environment, found: list[str]) -> list[Check]:
    """Who runs here, and whether that user can open the NPU devices: a device it cannot open makes
    torch_npu see no NPUs, with no word of permissions (Ascend's devices are mode 0660)."""
    import pwd

    uid, gid = os.getuid(), os.getgid()
    try:
        name: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = None
    who = f"{name or 'uid ' + str(uid)} ({uid}:{gid}; groups {','.join(str(g) for g in sorted(set(os.getgroups())))})"
    if name is None:
        detail = f"uid {uid} has no passwd entry: HCCL with more than one card fails without one; run as the image's user"
        checks = [Check("user", "warn", detail)]
    else:
        checks = [Check("user", "ok", who)]
    nodes = [*found, *(str(where.path(d)) for d in CONTROL_DEVICES if where.path(d).exists())] if found else []
    blocked = []
    for node in nodes:
        if not os.access(node, os.R_OK | os.W_OK):
            st = Path(node).stat()
            blocked.append((node.removeprefix(str(where.root).rstrip("/")), st.st_uid, st.st_gid, st.st_mode & 0o777))
    if blocked:
        groups = sorted({g for _, _, g, _ in blocked})
        owners = "; ".join(f"{n} ({u}:{g} {m:04o})" for n, u, g, m in blocked)
        detail = (
            f"{who} cannot open {owners}: add the devices' group (docker run --group-add {','.join(map(str, groups))}; "
            "Kubernetes: securityContext.supplementalGroups), or run as root"
        )
        checks.append(Check("device access", "error", detail))
    elif nodes:
        checks.append(Check("device access", "ok", f"{len(nodes)} device nodes open for reading and writing"))
    return checks


def check_npus(info: dict[str, Any], torch_modules: tuple[Any, Any] | None = None) -> list[Check]:
    """torch_npu sees the NPUs, they are of the image's chip family, and a matmul agrees with the CPU."""
    try:
        torch, torch_npu = torch_modules or (__import__("torch"), __import__("torch_npu"))
    except ImportError as exc:
        return [Check("torch_npu", "error", f"cannot import: {exc}")]
    count = torch.npu.device_count()
    if count == 0:
        return [Check("NPUs", "error", "devices are mounted but torch_npu sees none (driver, permissions, or held by another container)")]
    checks = [Check("NPUs", "ok", f"{count} visible to torch_npu {getattr(torch_npu, '__version__', '')}".strip())]
    soc = str(torch.npu.get_device_name(0))
    family = [str(s) for s in info.get("soc_names", [])]
    if family and soc not in family:
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


def check_links(where: Environment, found: list[str], *, required: bool) -> list[Check]:
    """Each NPU port's link state, as ``hccn_tool -i N -link -g`` reports it. With ``required``
    (the pods of a multi-node job) a link that is not UP fails doctor naming the port, so a broken
    fabric stops the init container, not the training 20 minutes into Ray."""
    tool = where.path(HCCN_TOOL)
    if not found:
        return []
    if not (tool.is_file() and os.access(tool, os.X_OK)):
        return [Check("NPU links", "skip", f"{HCCN_TOOL} is not in this container (mount it from the host's driver to check links)")]
    down, unknown = [], []
    for dev in found:
        index = Path(dev).name.removeprefix("davinci")
        try:
            proc = subprocess.run(
                [str(tool), "-i", index, "-link", "-g"], capture_output=True, text=True, timeout=LINK_TIMEOUT_S, check=False
            )
            output = proc.stdout + proc.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            output, proc = str(exc), None
        match = re.search(r"link status:\s*(\w+)", output, re.I)
        if match is None or proc is None or proc.returncode != 0:
            unknown.append(f"NPU {index} ({output.strip().splitlines()[-1] if output.strip() else 'no output'})")
        elif match.group(1).upper() != "UP":
            down.append(f"NPU {index} link {match.group(1).upper()}")
    if not down and not unknown:
        return [Check("NPU links", "ok", f"{len(found)} ports UP")]
    status = "error" if required else "warn"
    return [Check("NPU links", status, "; ".join([*down, *(f"cannot read {u}" for u in unknown)]))]


def run(
    where: Environment | None = None, torch_modules: tuple[Any, Any] | None = None, *, links: bool = False
) -> tuple[int, dict[str, Any]]:
    where = where or Environment()
    info_path = where.path(IMAGE_INFO)
    info: dict[str, Any] = json.loads(info_path.read_text()) if info_path.is_file() else {}
    checks = [
        Check(
            "image",
            "ok" if info else "skip",
            f"{info.get('stack')} for chip {info.get('chip')}" if info else "not an ascendkit image (host)",
        )
    ]
    checks += check_pins(where)
    checks += check_cann_env(where, info)
    found = devices(where)
    checks += check_user(where, found)
    driver = driver_version(where)
    if not found:
        checks.append(Check("driver", "skip" if driver is None else "ok", driver or "no driver mounted"))
        checks.append(Check("NPUs", "skip", "no /dev/davinci* here: preflight only"))
    else:
        checks.append(Check("driver", "ok" if driver else "error", driver or f"{DRIVER_VERSION} not mounted"))
        if any(c.name == "device access" and c.status == "error" for c in checks):
            checks.append(Check("NPUs", "skip", "not tried: the devices cannot be opened (see device access)"))
        else:
            checks += check_npus(info, torch_modules)
        checks += check_links(where, found, required=links)
    failed = any(c.status == "error" for c in checks)
    code = EXIT_FAILED if failed else EXIT_NO_DEVICES if not found else EXIT_OK
    outcome = "failed" if failed else "no Ascend devices: preflight passed, NPU checks not run" if not found else "ready"
    return code, {
        "outcome": outcome,
        "exit_code": code,
        "devices": len(found),
        "driver": driver,
        "image": info,
        "checks": [asdict(c) for c in checks],
    }


def format_report(report: dict[str, Any]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "error": "FAIL", "skip": "skip"}
    width = max(len(c["name"]) for c in report["checks"])
    lines = [f"{marks[c['status']]}  {c['name']:<{width}}  {c['detail']}" for c in report["checks"]]
    lines.append(f"ascendkit doctor: {report['outcome']} (exit {report['exit_code']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascendkit doctor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--links", action="store_true", help="fail when an NPU port's link is not UP (multi-node jobs)")
    args = parser.parse_args(argv)
    code, report = run(links=args.links)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return code


if __name__ == "__main__":
    sys.exit(main())
