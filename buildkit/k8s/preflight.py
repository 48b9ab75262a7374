"""``ascendkit k8s preflight``: read what the preflight pods printed (``ascendkit doctor --json`` on
each NPU node) and judge the cluster: one row per node, its verdict, the check that failed and what
to do. The reports come from ``kubectl logs ... --prefix`` on stdin, from files, or from a directory
of files (one node's log each)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.doctor.base import Check
from buildkit.doctor.engine import engine_of_runtime
from buildkit.doctor.host import zstd_verdict
from buildkit.doctor.pulls import containerd_version, judge_settings, settings
from buildkit.errors import InputError
from buildkit.fsio import read_input_text
from buildkit.k8s import NODE_RUNTIMES

# kubectl logs --prefix: "[pod/NAME/CONTAINER] " in front of every line
_PREFIX = re.compile(r"^\[pod/(?P<pod>[^/\]]+)/[^\]]*\] ?")

# The first thing to do when a check fails on a node, by doctor's check name; the check's own
# detail (versions, ports, paths) is shown beside it.
REMEDIES = {
    "driver": "upgrade the node's NPU driver and firmware (Ascend HDK) to a release the image's CANN supports, or drain the node",
    "firmware": "install the firmware of the driver's Ascend HDK release (npu-smi upgrade), then reboot the node",
    "NPUs": "npu-smi info on the node: another container holds the NPUs (DCMI -8020/-8005), or a card is faulty",
    "NPU links": "hccn_tool -i N -link -g on the node: reseat the port's cable or fix the switch port, then check again",
    "hccn.conf": "compare /etc/hccn.conf with hccn_tool -i N -ip -g and set the ports' addresses again (hccn_tool -i N -ip -s ...)",
    "device access": "give the pods the group of /dev/davinci* (`k8s render --device-gid`), as `ls -ln /dev/davinci0` shows",
    "user": "run as the image's user (it has a passwd entry)",
    "SoC": "this node's chip is not the image's: use the image of its chip, or fix the node's accelerator-type label",
    "matmul": "the NPU computes wrong results: take the node out and have the card checked",
    "pinned packages": "the image was changed after it was built: use the published image by digest",
    "hccl rootinfo": "regenerate the node's /etc/hccl_rootinfo.json with its driver (format 2.0), or remove it (EI0014)",
    "hccl topology": "the node's driver has no topology file for its product (driver/topo/950): install the 950 driver",
    "containerd pulls": "set the node's containerd as the detail says and restart it (docs/kubernetes.md, `Node settings`)",
    "zstd pulls": "give this node the gzip tags, not -zstd, or upgrade its runtime (containerd >= 1.5, Docker Engine >= 23.0)",
}
NO_DEVICES = "the device plugin gave the pod no NPUs: check the node's device plugin and its NPU resource name (--npu-resource)"


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    verdict: str  # the worst status of its checks: "ok", "warn" or "error" (a Check's)
    check: str  # the first failing (or warning) check; "" when all passed
    detail: str
    remedy: str
    runtime: str = ""  # the node's container runtime (containerd://1.6.20), from --node-info
    zstd: bool | None = None  # whether that runtime pulls the -zstd tags; None: not known
    node_runtime: str = ""  # "ascend" or "plain": what doctor saw of Ascend Docker Runtime in the pod
    engine: dict[str, str] | None = None  # the node's engine as its runtime (from --node-info) says it: product, version, API, image store
    pulls: dict[str, Any] | None = None  # its containerd's pull settings (doctor read the config; the version from --node-info)

    def describe(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "verdict": self.verdict,
            "check": self.check,
            "detail": self.detail,
            "remedy": self.remedy,
            "runtime": self.runtime or None,
            "zstd": self.zstd,
            "node_runtime": self.node_runtime or None,
            "engine": self.engine,
            "pulls": self.pulls,
        }


def _reports(text: str, source: str) -> list[tuple[str, dict[str, Any]]]:
    """Every doctor report in ``text`` with the pod (or source) it came from."""
    groups: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = _PREFIX.match(line)
        key = match["pod"] if match else source
        groups.setdefault(key, []).append(line[match.end() :] if match else line)
    found: list[tuple[str, dict[str, Any]]] = []
    decoder = json.JSONDecoder()
    for key, lines in groups.items():
        body = "\n".join(lines)
        at = 0
        while (start := body.find("{", at)) != -1:
            try:
                value, end = decoder.raw_decode(body, start)
            except ValueError:
                at = start + 1
                continue
            if isinstance(value, dict) and isinstance(value.get("checks"), list):
                found.append((key, value))
            at = end
    return found


def read_reports(sources: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The reports of ``sources``: ``-`` (stdin), files, or directories of files."""
    found: list[tuple[str, dict[str, Any]]] = []
    for source in sources:
        path = Path(source)
        if source == "-":
            found += _reports(sys.stdin.buffer.read().decode("utf-8", "replace"), "stdin")
        elif path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not files:
                raise InputError(f"{source}: an empty directory (one node's log per file, from kubectl logs)")
            for file in files:
                found += _reports(read_input_text(file, "preflight log", errors="replace"), file.stem)
        else:
            found += _reports(read_input_text(path, "preflight log", errors="replace"), path.stem)
    if not found:
        raise InputError(
            f"{', '.join(sources)}: no `ascendkit doctor --json` report found (give kubectl logs of the preflight pods, with --tail=-1)"
        )
    return found


def read_node_runtimes(path: str) -> dict[str, str]:
    """node name -> its container runtime, from ``kubectl get nodes -o json`` (a List, or one Node)."""
    text = sys.stdin.buffer.read().decode("utf-8", "replace") if path == "-" else read_input_text(Path(path), "node list")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--node-info {path}: not JSON ({exc}); give `kubectl get nodes -o json`") from None
    items = data.get("items") if isinstance(data, dict) and data.get("kind") == "List" else [data]
    runtimes = {}
    for item in items if isinstance(items, list) else []:
        name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
        runtime = (((item.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion")) if isinstance(item, dict) else None
        if name and runtime:
            runtimes[str(name)] = str(runtime)
    if not runtimes:
        raise InputError(f"--node-info {path}: no node with status.nodeInfo.containerRuntimeVersion; give `kubectl get nodes -o json`")
    return runtimes


def judge(source: str, report: dict[str, Any], runtime: str = "") -> NodeVerdict:
    """The node's verdict from its report; with its ``runtime`` (from --node-info), whether it pulls zstd too."""
    config = report.get("containerd_config") if isinstance(report.get("containerd_config"), dict) else None
    version = containerd_version([runtime]) if runtime else ""
    pulls = None
    if config is not None:  # judged again with the version Kubernetes reports (doctor in the pod may not know it)
        found = settings(config, version)
        judged = judge_settings(found)
        report = {**report, "checks": [c for c in report["checks"] if not (isinstance(c, dict) and c.get("name") == judged.name)]}
        report["checks"].append(judged.describe())
        pulls = found.describe()
    if not runtime:
        return dataclasses.replace(_judge(source, report, None), pulls=pulls)
    zstd = zstd_verdict(runtime)
    verdict = _judge(source, report, zstd)
    zstd_pulls = None if zstd.status == "skip" else zstd.status == "ok"
    return dataclasses.replace(verdict, runtime=runtime, zstd=zstd_pulls, engine=engine_of_runtime(runtime), pulls=pulls)


def _node_runtime(report: dict[str, Any]) -> str:
    """The node's runtime mode as its doctor said it (``node_runtime``); "" from a report without it."""
    said = report.get("node_runtime")
    return said if said in NODE_RUNTIMES else ""


def _judge(source: str, report: dict[str, Any], zstd: Check | None) -> NodeVerdict:
    node = str(report.get("node") or source)
    checks = [c for c in report["checks"] if isinstance(c, dict)]
    if zstd is not None and not any(c.get("name") == zstd.name for c in checks):
        checks.append(zstd.describe())
    failed = [c for c in checks if c.get("status") == "error"]
    warned = [c for c in checks if c.get("status") == "warn"]
    if failed:
        first = failed[0]
        name = str(first.get("name"))
        more = f" (and {', '.join(str(c.get('name')) for c in failed[1:])})" if len(failed) > 1 else ""
        return NodeVerdict(node, "error", name + more, str(first.get("detail", "")), REMEDIES.get(name, "see the check's detail"))
    if report.get("devices") == 0 or report.get("exit_code") == 10:
        return NodeVerdict(node, "error", "NPUs", "no /dev/davinci* in the pod", NO_DEVICES)
    if warned:
        first = warned[0]
        return NodeVerdict(node, "warn", str(first.get("name")), str(first.get("detail", "")), REMEDIES.get(str(first.get("name")), ""))
    return NodeVerdict(node, "ok", "", f"{report.get('devices')} NPUs, every check passed", "")


def summarize(
    reports: list[tuple[str, dict[str, Any]]], expect: int | None = None, runtimes: dict[str, str] | None = None
) -> tuple[list[NodeVerdict], list[str]]:
    """One verdict per node (its last report wins: a restarted pod prints again), and the problems
    of the whole: fewer nodes than ``expect`` reported. ``runtimes`` (node -> container runtime, from
    ``--node-info``) adds whether each node can pull the -zstd tags."""
    latest: dict[str, NodeVerdict] = {}
    for source, report in reports:
        node = str(report.get("node") or source)
        verdict = dataclasses.replace(judge(source, report, (runtimes or {}).get(node, "")), node_runtime=_node_runtime(report))
        latest[verdict.node] = verdict
    verdicts = sorted(latest.values(), key=lambda v: ({"error": 0, "warn": 1, "ok": 2}[v.verdict], v.node))
    problems = []
    if expect is not None and len(verdicts) < expect:
        problems.append(
            f"{len(verdicts)} of {expect} nodes reported: the others' preflight pods are Pending (NPUs held by a job, or "
            "not matching the SKU's node labels) or could not start (no /etc/hccn.conf): kubectl get pods -o wide"
        )
    return verdicts, problems


def format_table(verdicts: list[NodeVerdict], problems: list[str]) -> str:
    """The verdicts as a table for people: node, verdict, check, detail; what to do under each failing row."""
    header = ("node", "verdict", "check", "detail")
    rows = [(v.node, v.verdict.upper(), v.check or "-", v.detail) for v in verdicts]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
    lines = []
    for row, verdict in zip([header, *rows], [None, *verdicts], strict=True):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
        if verdict is not None and verdict.remedy:
            lines.append(" " * (sum(widths) + 6) + "what to do: " + verdict.remedy)
    failed = sum(v.verdict == "error" for v in verdicts)
    warned = sum(v.verdict == "warn" for v in verdicts)
    lines += [f"! {problem}" for problem in problems]
    known = [v for v in verdicts if v.zstd is not None]
    if known:
        cannot = [f"{v.node} ({v.runtime})" for v in known if not v.zstd]
        lines.append(
            f"zstd: {len(known) - len(cannot)} of {len(known)} node(s) pull the -zstd tags"
            + (f"; these need the gzip tags: {', '.join(cannot)}" if cannot else "")
        )
    engines: dict[str, list[str]] = {}
    for v in verdicts:
        if v.engine is not None:
            said = f"{v.engine['product']} {v.engine['version']}" + (f" (API {v.engine['api_version']})" if v.engine["api_version"] else "")
            engines.setdefault(f"{said}, image store: {v.engine['image_store'] or 'unknown'}", []).append(v.node)
    for said, nodes in sorted(engines.items()):
        lines.append(f"engine: {said}: {len(nodes)} node(s)")
    pulls: dict[str, list[str]] = {}
    for v in verdicts:
        if v.pulls is not None:
            p = v.pulls
            said = (
                f"containerd {p['containerd'] or '(version unknown)'}: max_concurrent_downloads {p['max_concurrent_downloads']}, "
                f"snapshotter {p['snapshotter']}, discard_unpacked_layers {str(p['discard_unpacked_layers']).lower()}"
                + (", transfer service" if p["transfer_service"] else f", old pull ({p['fallback']})" if p["fallback"] else "")
            )
            pulls.setdefault(said, []).append(v.node)
    for said, nodes in sorted(pulls.items()):
        lines.append(f"pulls: {said}: {len(nodes)} node(s)")
    modes = {mode: [v.node for v in verdicts if v.node_runtime == mode] for mode in NODE_RUNTIMES}
    if any(modes.values()):
        said = "; ".join(f"{len(nodes)} node(s) {mode}" for mode, nodes in modes.items() if nodes)
        advice = (
            f"render the jobs with --node-runtime {next(m for m, n in modes.items() if n)}"
            if sum(bool(n) for n in modes.values()) == 1
            else "the nodes differ: render a job per mode, each pinned to its nodes, or give every node the same runtime"
        )
        lines.append(f"Ascend Docker Runtime: {said}: {advice}")
    lines.append(f"ascendkit k8s preflight: {len(verdicts)} node(s) reported, {failed} failed, {warned} warned")
    return "\n".join(lines)
