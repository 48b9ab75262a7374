"""Checks of what the node brings: the driver against the image's CANN, the firmware against the
driver, who runs and whether it can open the devices, each NPU port's link and address, and whether
the node's container runtime pulls zstd layers."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .base import (
    DRIVER_VERSION,
    FIRMWARE_VERSION,
    HCCN_CONF,
    HCCN_TOOL,
    LINK_TIMEOUT_S,
    RUNTIME_ENV,
    ZSTD_SINCE,
    Check,
    Environment,
    read_info,
    version_numbers,
)
from .contract import control_nodes


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


def _within(found: tuple[int, int, tuple[int, int] | None], entry: tuple[int, int, tuple[int, int] | None]) -> bool:
    """A release is the entry's release (its patches included), or of the entry's whole line (25.2.X)."""
    return entry[:2] == found[:2] and entry[2] in (None, found[2])


def judge_driver(version: str, cann: str, supported: list[str], *, complete: bool = True, refused: list[str] | None = None) -> Check:
    """The mounted driver against the HDK releases the image's CANN supports (the matrix's
    ``compat.cann_drivers``): one the CANN's notes say it no longer supports (``refused``) fails, older
    than all the supported ones fails (warns when the list is only the paired release, ``complete``
    false), newer than all of them or between them warns."""
    listed = ", ".join(supported)
    found = hdk_release(version)
    entries = [e for e in (hdk_release(v) for v in supported) if e is not None]
    if found is None or not entries:
        return Check("driver", "warn", f"driver {version}: not a version this image can judge (CANN {cann} supports {listed})")
    dropped = [line for line in refused or [] if (entry := hdk_release(line)) is not None and _within(found, entry)]
    if dropped:
        return Check(
            "driver",
            "error",
            f"driver {version}: CANN {cann} no longer supports Ascend HDK {dropped[0]} (it is published for {listed}): "
            "upgrade the host's driver and firmware, or use an image of an older CANN; this CANN fails inside the first "
            "NPU call otherwise",
        )
    if any(_within(found, e) for e in entries):
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
    since, numbers = ZSTD_SINCE.get(name), version_numbers(version)[:2]
    if since is None or len(numbers) < 2:
        return Check("zstd pulls", "skip", f"{runtime}: not a runtime and version doctor knows")
    need = f"{name} >= {'.'.join(map(str, since))}"
    if numbers >= since:
        return Check("zstd pulls", "ok", f"{name} {version} pulls zstd layers ({need}): the -zstd tags pull faster")
    return Check("zstd pulls", "warn", f"{name} {version} cannot pull zstd layers ({need}): pull the gzip tags, not -zstd")


def node_runtimes(where: Environment, on_host: bool, docker_version: str | None = None) -> list[str]:
    """The runtimes ``$ASCENDKIT_NODE_RUNTIME`` names; on a host without it, the local engines' own
    versions: Docker Engine's as doctor already read it (``docker_version``), containerd's asked here."""
    given = [r.strip() for r in where.getenv(RUNTIME_ENV).split(",") if r.strip()]
    if given or not on_host:
        return given
    found = []
    for name, said in (("docker", docker_version or ""), ("containerd", _said(["containerd", "--version"]))):
        version = re.search(r"\d+\.\d+(\.\d+)?", said)
        if version:
            found.append(f"{name}://{version.group(0)}")
    return found


def _said(argv: list[str]) -> str:
    """What a command printed, or "" when it failed or is not here."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


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
    if version_numbers(bounds[0]) <= version_numbers(firmware)[: len(version_numbers(bounds[1]))] <= version_numbers(bounds[1]):
        return [Check("firmware", "ok", f"firmware {firmware} within the driver's {bounds[0]}..{bounds[1]}")]
    return [
        Check(
            "firmware",
            "error",
            f"firmware {firmware} is outside {bounds[0]}..{bounds[1]}, what this driver accepts: "
            "install the firmware of the driver's Ascend HDK release",
        )
    ]


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
    nodes = [*found, *control_nodes(where.root)] if found else []
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
