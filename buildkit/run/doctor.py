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
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
ERROR_CODES = Path(__file__).with_name("error_codes.json")  # beside this file, in the package and in the image
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


def driver_version(where: Environment) -> str | None:
    """The host driver's release: ``package_version=`` (newer drivers) or ``Version=``."""
    fields = read_info(where.path(DRIVER_VERSION))
    return (fields.get("package_version") or fields.get("Version") or "").strip() or None


# An Ascend HDK release: 24.1.rc2 (version.info writes rc in lower case), 25.2.0, 26.0.RC1.1 (a patch);
# in the matrix also a whole line, 25.5.X.
_HDK = re.compile(r"^(\d+)\.(\d+)\.(RC\d+|\d+|X)((?:\.\d+)*)$", re.IGNORECASE)


def hdk_release(version: str) -> tuple[int, int, tuple[int, int] | None] | None:
    """(major, minor, third) of an HDK release, third being (0, n) for RCn, (1, n) for a final n,
    None for the X of a whole line; patches (a fourth part) belong to their release. None: unreadable."""
    match = _HDK.match(version.strip())
    if match is None:
        return None
    third = match[3].upper()
    rank = None if third == "X" else (0, int(third[2:])) if third.startswith("RC") else (1, int(third))
    return int(match[1]), int(match[2]), rank


def judge_driver(version: str, cann: str, supported: list[str], *, complete: bool = True) -> Check:
    """The mounted driver against the HDK releases the image's CANN supports (the matrix's
    ``compat.cann_drivers``): older than all of them fails (warns when the list is only the paired
    release, ``complete`` false), newer than all of them or between them warns."""
    listed = ", ".join(supported)
    found = hdk_release(version)
    entries = [e for e in (hdk_release(v) for v in supported) if e is not None]
    if found is None or not entries:
        return Check("driver", "warn", f"driver {version}: not a version this image can judge (CANN {cann} supports {listed})")
    if any(e[:2] == found[:2] and e[2] in (None, found[2]) for e in entries):
        return Check("driver", "ok", f"driver {version} is supported by CANN {cann} (Ascend HDK {listed})")
    low = min((major, minor, rank or (-1, 0)) for major, minor, rank in entries)
    high = max((major, minor, rank or (2, 0)) for major, minor, rank in entries)
    key = (found[0], found[1], found[2] or (0, 0))
    if key < low and not complete:
        return Check(
            "driver",
            "warn",
            f"driver {version} is older than Ascend HDK {listed}, the release paired with CANN {cann}; whether CANN {cann} "
            "supports older drivers is not recorded: if the first NPU call fails, upgrade the host's driver and firmware",
        )
    if key < low:
        return Check(
            "driver",
            "error",
            f"driver {version} is older than CANN {cann} supports (Ascend HDK {listed}): upgrade the host's driver and "
            "firmware, or use an image of an older CANN; this CANN fails inside the first NPU call otherwise",
        )
    where = "newer than every" if key > high else "not one of the"
    return Check(
        "driver", "warn", f"driver {version} is {where} Ascend HDK release(s) CANN {cann} is published for ({listed}): not known to work"
    )


def zstd_verdict(runtime: str) -> Check:
    """Whether a node's runtime (``containerd://1.6.20``) can pull the images' ``-zstd`` tags."""
    name, _, version = runtime.strip().partition("://")
    since, numbers = ZSTD_SINCE.get(name), _numbers(version)[:2]
    if since is None or len(numbers) < 2:
        return Check("zstd pulls", "skip", f"{runtime}: not a runtime and version doctor knows")
    need = f"{name} >= {'.'.join(map(str, since))}"
    if numbers >= since:
        return Check("zstd pulls", "ok", f"{name} {version} pulls zstd layers ({need}): the -zstd tags pull faster")
    return Check("zstd pulls", "warn", f"{name} {version} cannot pull zstd layers ({need}): pull the gzip tags, not -zstd")


def node_runtimes(where: Environment, on_host: bool) -> list[str]:
    """The runtimes ``$ASCENDKIT_NODE_RUNTIME`` names; on a host without it, the local engines' own versions."""
    given = [r.strip() for r in where.getenv(RUNTIME_ENV).split(",") if r.strip()]
    if given or not on_host:
        return given
    found = []
    for name, argv in (("docker", ["docker", "version", "--format", "{{.Server.Version}}"]), ("containerd", ["containerd", "--version"])):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = re.search(r"\d+\.\d+(\.\d+)?", out.stdout) if out.returncode == 0 else None
        if version:
            found.append(f"{name}://{version.group(0)}")
    return found


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def check_firmware(where: Environment) -> list[Check]:
    """The NPU firmware against the range the driver accepts (``compatible_version_fw=[low,high]``
    in the driver's version.info), where both are mounted."""
    firmware = read_info(where.path(FIRMWARE_VERSION)).get("Version")
    accepted = read_info(where.path(DRIVER_VERSION)).get("compatible_version_fw", "")
    bounds = [part.strip() for part in accepted.strip("[] ").split(",") if part.strip()]
    if not firmware:
        return [Check("firmware", "skip", f"{FIRMWARE_VERSION} is not mounted here")]
    if len(bounds) != 2:
        return [Check("firmware", "ok", f"firmware {firmware} (the driver names no compatible firmware range)")]
    if _numbers(bounds[0]) <= _numbers(firmware)[: len(_numbers(bounds[1]))] <= _numbers(bounds[1]):
        return [Check("firmware", "ok", f"firmware {firmware} within the driver's {bounds[0]}..{bounds[1]}")]
    return [
        Check(
            "firmware",
            "error",
            f"firmware {firmware} is outside {bounds[0]}..{bounds[1]}, what this driver accepts: "
            "install the firmware of the driver's Ascend HDK release",
        )
    ]


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


def _hccn_query(tool: Path, index: str, *query: str) -> tuple[int | None, str]:
    """``hccn_tool -i INDEX QUERY...``: its exit code (None when it could not run or timed out) and its output."""
    try:
        proc = subprocess.run([str(tool), "-i", index, *query], capture_output=True, text=True, timeout=LINK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    return proc.returncode, proc.stdout + proc.stderr


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1] if output.strip() else "no output"


def _runnable(tool: Path) -> bool:
    return tool.is_file() and os.access(tool, os.X_OK)


def check_links(where: Environment, found: list[str], *, required: bool) -> list[Check]:
    """Each NPU port's link state, as ``hccn_tool -i N -link -g`` reports it. With ``required``
    (the pods of a multi-node job) a link that is not UP fails doctor naming the port, so a broken
    fabric stops the init container, not the training 20 minutes into Ray."""
    tool = where.path(HCCN_TOOL)
    if not found:
        return []
    if not _runnable(tool):
        return [Check("NPU links", "skip", f"{HCCN_TOOL} is not in this container (mount it from the host's driver to check links)")]
    down, unknown = [], []
    for dev in found:
        index = Path(dev).name.removeprefix("davinci")
        code, output = _hccn_query(tool, index, "-link", "-g")
        match = re.search(r"link status:\s*(\w+)", output, re.I)
        if match is None or code != 0:
            unknown.append(f"NPU {index} ({_last_line(output)})")
        elif match.group(1).upper() != "UP":
            down.append(f"NPU {index} link {match.group(1).upper()}")
    if not down and not unknown:
        return [Check("NPU links", "ok", f"{len(found)} ports UP")]
    status = "error" if required else "warn"
    return [Check("NPU links", status, "; ".join([*down, *(f"cannot read {u}" for u in unknown)]))]


def check_hccn(where: Environment, found: list[str]) -> list[Check]:
    """Each NPU port's address in the host's hccn.conf (``address_N=``) against what the port holds
    (``hccn_tool -i N -ip -g``): a port configured by hand and never written back, or a file copied
    from another node, splits HCCL's view of the fabric from the hardware's."""
    conf = where.path(HCCN_CONF)
    tool = where.path(HCCN_TOOL)
    if not found:
        return []
    if not conf.is_file():
        return [Check("hccn.conf", "skip", f"{HCCN_CONF} is not mounted here (the cluster preflight mounts it)")]
    addresses = {k.removeprefix("address_"): v for k, v in read_info(conf).items() if k.startswith("address_")}
    if not addresses:
        return [
            Check("hccn.conf", "error", f"{HCCN_CONF} configures no NPU port (no address_N= line): run hccn_tool to set the ports' IPs")
        ]
    if not _runnable(tool):
        return [Check("hccn.conf", "warn", f"{len(addresses)} port addresses, not compared: {HCCN_TOOL} is not in this container")]
    problems = []
    for dev in found:
        index = Path(dev).name.removeprefix("davinci")
        want = addresses.get(index)
        if want is None:
            problems.append(f"NPU {index} has no address_{index} in {HCCN_CONF}")
            continue
        _, output = _hccn_query(tool, index, "-ip", "-g")
        match = re.search(r"ipaddr\s*:\s*(\S+)", output, re.IGNORECASE)
        if match is None:
            problems.append(f"NPU {index}: cannot read its address ({_last_line(output)})")
        elif match[1] != want:
            problems.append(f"NPU {index} holds {match[1]}, {HCCN_CONF} says {want}")
    if problems:
        return [Check("hccn.conf", "error", "; ".join(problems))]
    return [Check("hccn.conf", "ok", f"{len(found)} port addresses match {HCCN_CONF}")]


def error_codes() -> list[dict[str, str]]:
    """The table of HCCL, HCCP and ACL codes users hit most (error_codes.json: data, each with its source)."""
    try:
        return list(json.loads(ERROR_CODES.read_text(encoding="utf-8"))["codes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def code_pattern(table: list[dict[str, str]]) -> re.Pattern[str]:
    """One pattern for every code of the table: a named code (EI0006) on its own, not inside a longer
    word or number; a numeric one (507033) only as an error's value ("error code is 507033",
    "errorCode = 507033", "failed: 507033"), never a process id or a metric that happens to match."""

    def alternatives(codes: list[str]) -> str:
        return "|".join(sorted((re.escape(c) for c in codes), key=len, reverse=True))

    named = [e["code"] for e in table if not e["code"].isdigit()]
    numeric = [e["code"] for e in table if e["code"].isdigit()]
    parts = []
    if named:
        parts.append(rf"(?<![0-9A-Za-z])(?P<named>{alternatives(named)})(?![0-9])")
    if numeric:
        context = r"(?:error[ _]?code|errcode|ret(?:code)?|result|error|failed)"
        parts.append(rf"(?i:{context})\s*(?:is\s+|=\s*|:\s*)?(?P<numeric>{alternatives(numeric)})(?![0-9])")
    return re.compile("|".join(parts) or "(?!)")


def codes_in(pattern: re.Pattern[str], text: str) -> list[str]:
    """The codes ``pattern`` finds in ``text``, in order, each once."""
    return list(dict.fromkeys(m["named"] or m["numeric"] for m in pattern.finditer(text)))


def explain(text: str, table: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """The table's entries for every code ``text`` mentions, in the order they first appear."""
    table = error_codes() if table is None else table
    by_code = {e["code"]: e for e in table}
    return [by_code[code] for code in codes_in(code_pattern(table), text)]


def explained(text: str, context: str = "") -> str:
    """``text`` followed by what each code in it (or in ``context``, the whole message) means and the
    first thing to check."""
    notes = [f"{e['code']} ({e['name']}): {e['meaning']}; first check: {e['check']}" for e in explain(f"{text}\n{context}")]
    return text + "".join(f" [{note}]" for note in notes)


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
    drivers = info.get("drivers") or {}
    supported = [str(v) for v in drivers.get("hdk") or []]
    if driver is not None and supported:
        verdict = judge_driver(driver, str(info.get("cann")), supported, complete=drivers.get("complete", True) is not False)
    elif found:
        verdict = Check("driver", "ok" if driver else "error", driver or f"{DRIVER_VERSION} not mounted")
    else:
        verdict = Check("driver", "skip" if driver is None else "ok", driver or "no driver mounted")
    checks.append(verdict)
    if driver is not None:
        checks += check_firmware(where)
    if not found:
        checks.append(Check("NPUs", "skip", "no /dev/davinci* here: preflight only"))
    else:
        if any(c.name == "device access" and c.status == "error" for c in checks):
            checks.append(Check("NPUs", "skip", "not tried: the devices cannot be opened (see device access)"))
        else:
            checks += check_npus(info, torch_modules)
        checks += check_links(where, found, required=links)
        checks += check_hccn(where, found)
    checks += [zstd_verdict(runtime) for runtime in node_runtimes(where, on_host=not info and where.root == Path("/"))]
    failed = any(c.status == "error" for c in checks)
    code = EXIT_FAILED if failed else EXIT_NO_DEVICES if not found else EXIT_OK
    outcome = "failed" if failed else "no Ascend devices: preflight passed, NPU checks not run" if not found else "ready"
    return code, {
        "node": where.getenv(NODE_ENV) or socket.gethostname(),
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
