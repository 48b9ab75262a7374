"""Every doctor check in order, the report they make, and doctor's command line."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

from . import __doc__ as description
from .base import DRIVER_VERSION, EXIT_FAILED, EXIT_NO_DEVICES, EXIT_OK, IMAGE_INFO, NODE_ENV, Check, Environment, devices
from .engine import judge_engine, local_engine
from .host import check_firmware, check_hccn, check_links, check_user, driver_version, judge_driver, node_runtimes, zstd_verdict
from .pulls import check_pulls
from .software import check_cann_env, check_npus, check_pins
from .topology import check_node_runtime, check_rootinfo, check_topology, node_runtime


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
        verdict = judge_driver(
            driver,
            str(info.get("cann")),
            supported,
            complete=drivers.get("complete", True) is not False,
            refused=[str(v) for v in drivers.get("refused") or []],
        )
    elif found:
        verdict = Check("driver", "ok" if driver else "error", driver or f"{DRIVER_VERSION} not mounted")
    else:
        verdict = Check("driver", "skip" if driver is None else "ok", driver or "no driver mounted")
    checks.append(verdict)
    if driver is not None:
        checks += check_firmware(where)
    checks += check_rootinfo(where, info.get("chip"))
    in_pod = bool(where.getenv(NODE_ENV))
    checks += check_node_runtime(where, in_pod=in_pod)
    if not found:
        checks.append(Check("NPUs", "skip", "no /dev/davinci* here: preflight only"))
    else:
        if any(c.name == "device access" and c.status == "error" for c in checks):
            checks.append(Check("NPUs", "skip", "not tried: the devices cannot be opened (see device access)"))
        else:
            checks += check_npus(info, torch_modules)
        checks += check_links(where, found, required=links)
        checks += check_hccn(where, found)
        checks += check_topology(where, info.get("chip"), len(found))
    on_host = not info and where.root == Path("/")
    engine = local_engine() if on_host else None  # the engine this host's images are pulled, built and run with
    if engine is not None:
        checks.append(judge_engine(engine))
    docker_version = engine["version"] if engine is not None and engine["product"] == "Docker Engine" else None
    runtimes = node_runtimes(where, on_host=on_host, docker_version=docker_version)
    checks += [zstd_verdict(runtime) for runtime in runtimes]
    pulls, pull_config = check_pulls(where, runtimes)  # the node's containerd config: on the host, or mounted by the preflight pod
    checks += pulls
    failed = any(c.status == "error" for c in checks)
    code = EXIT_FAILED if failed else EXIT_NO_DEVICES if not found else EXIT_OK
    outcome = "failed" if failed else "no Ascend devices: preflight passed, NPU checks not run" if not found else "ready"
    return code, {
        "node": where.getenv(NODE_ENV) or socket.gethostname(),
        "outcome": outcome,
        "exit_code": code,
        "devices": len(found),
        "driver": driver,
        "node_runtime": node_runtime(where, in_pod),
        "engine": engine,
        "containerd_config": pull_config,  # what of /etc/containerd decides pulls (no credential): `k8s preflight` judges it
        "image": info,
        "checks": [c.describe() for c in checks],
    }


def format_report(report: dict[str, Any]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "error": "FAIL", "skip": "skip"}
    width = max(len(c["name"]) for c in report["checks"])
    lines = [f"{marks[c['status']]}  {c['name']:<{width}}  {c['detail']}" for c in report["checks"]]
    lines.append(f"ascendkit doctor: {report['outcome']} (exit {report['exit_code']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascendkit doctor", description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--links", action="store_true", help="fail when an NPU port's link is not UP (multi-node jobs)")
    args = parser.parse_args(argv)
    code, report = run(links=args.links)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return code
