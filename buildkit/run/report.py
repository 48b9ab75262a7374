"""Judging a smoke run and writing its report (report.json and report.md)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from buildkit.accuracy.compare import PCT_UNIT
from buildkit.accuracy.metrics import StepMetrics, is_finite, series
from buildkit.doctor.base import Check
from buildkit.framework import UNLABELLED, Gate, title_of
from buildkit.fsio import write_atomic
from buildkit.text import md_cell as _cell


def judge(steps: list[StepMetrics], requested: int, gate: Gate) -> list[Check]:
    """The checks that need no baseline: steps done, finite numbers, and for the job's metrics
    (``gate``): rewards in [0, 1], a loss logged, throughput > 0 where the job logs it."""
    checks: list[Check] = []
    done = max((s.step for s in steps), default=0)
    checks.append(
        Check("steps completed", "ok" if done >= requested else "error", f"the log shows step {done} of {requested}")
        if steps
        else Check("steps completed", "error", f"no step metrics in the log (0 of {requested})")
    )
    bad = [f"step {s.step} {name}={value}" for s in steps for name, value in s.metrics.items() if not is_finite(value)]
    checks.append(Check("finite metrics", "error" if bad else "ok", "; ".join(bad[:5]) or "no NaN or inf in any metric"))
    if gate.reward is not None:
        rewards = series(steps, gate.reward)
        if not rewards:
            checks.append(Check("rewards in [0, 1]", "error", f"no {gate.reward} in the log"))
        else:
            outside = [f"step {k}: {v}" for k, v in sorted(rewards.items()) if not (is_finite(v) and 0.0 <= v <= 1.0)]
            detail = "; ".join(outside[:5]) or f"{len(rewards)} steps, {min(rewards.values()):.4g}..{max(rewards.values()):.4g}"
            checks.append(Check("rewards in [0, 1]", "error" if outside else "ok", detail))
    losses = next((series(steps, name) for name in gate.losses if series(steps, name)), {})
    checks.append(
        Check("loss logged", "ok", f"{len(losses)} steps, last {losses[max(losses)]:.4g}")
        if losses
        else Check("loss logged", "error", f"no {' or '.join(gate.losses)} in the log")
    )
    if gate.throughput is not None:
        throughput = series(steps, gate.throughput)
        if not throughput:
            checks.append(Check("throughput > 0", "error", f"no {gate.throughput} in the log"))
        else:
            slow = [f"step {k}: {v}" for k, v in sorted(throughput.items()) if not (is_finite(v) and v > 0)]
            mean = sum(throughput.values()) / len(throughput)
            detail = "; ".join(slow[:5]) or f"mean {mean:.4g} tokens/s/device over {len(throughput)} steps"
            checks.append(Check("throughput > 0", "error" if slow else "ok", detail))
    return checks


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _devices_cell(devices: list[str]) -> str:
    if not devices:
        return "none (preflight only)"
    if len(devices) <= 4:
        return ", ".join(devices)
    return f"{len(devices)} NPUs: {devices[0]} .. {devices[-1]}"


def report_markdown(data: dict[str, Any]) -> str:
    image = data["image"]
    settings = data["settings"]
    job = data.get("job") or {}
    framework_title = title_of(str(job.get("framework", UNLABELLED)))
    lines = [
        f"# {framework_title} {str(job.get('name', 'grpo')).upper()} smoke test: {data['outcome'].upper()}",
        "",
        f"{data['message']} (exit {data['exit_code']}).",
        "",
        "| | |",
        "|---|---|",
        f"| SKU | `{data['sku']}` ({_cell(data['product'])}) |",
        f"| image | `{_cell(image['ref'])}` (`{image['id'][:19]}`), stack `{image['stack']}`, chip `{image['chip']}` |",
        f"| steps | {settings['steps']} (timeout {settings['timeout_s']:g} s) |",
        f"| devices | {_devices_cell(settings['devices'])} |",
        f"| network | {settings['network']}{', privileged' if settings['privileged'] else ''} |",
        f"| model | {_cell(settings['model_path'] or '-')} |",
        f"| data | {_cell(settings['data'])} |",
        f"| baseline | {_cell(settings['baseline'] or '-')} |",
    ]
    for note in data["host_notes"]:
        lines.append(f"\n> {note}")
    lines += _check_lines(data, framework_title)
    stall = job.get("stall")
    if stall:
        lines += ["", f"## Why the job stopped: {_cell(stall['summary'])}", ""]  # a stall, a timeout or a failed exit
        lines += [f"- {_cell(cause)}" for cause in stall["likely_causes"]]
        lines += ["", "Last lines of the log:", "", "```", *stall["last_lines"], "```"]
    if data.get("comparison"):
        lines += _comparison_lines(data["comparison"])
    files = data["files"]
    lines += ["", "## Files", ""]
    lines += [f"- {kind.replace('_', ' ')}: `{name}`" for kind, name in files.items()]
    if "plot" in files:
        lines += ["", f"![reward, loss and throughput per step]({files['plot']})"]
    return "\n".join(lines) + "\n"


def _check_table(checks: list[dict[str, Any]]) -> list[str]:
    return ["| check | status | detail |", "|---|---|---|"] + [
        f"| {_cell(c['name'])} | {c['status']} | {_cell(c['detail'])} |" for c in checks
    ]


def _check_lines(data: dict[str, Any], framework_title: str) -> list[str]:
    """The config check's, doctor's and the training's checks, each a section where it ran."""
    lines: list[str] = []
    check = data.get("config_check")
    if check:
        state = "passed" if check["passed"] else "FAILED"
        how = "parses the job's flags" if check.get("style") == "parser" else "composes the job"
        lines += ["", f"## Config check ({framework_title} {how} in the image): {state}", ""]
        lines += [f"`{_cell(shlex.join(check['command']))}`"]
        if check.get("error"):
            lines += ["", f"> {_cell(check['error'])}"]
        if check["checks"]:
            lines += ["", *_check_table(check["checks"])]
    doctor = data.get("doctor")
    if doctor:
        lines += ["", f"## Doctor: {doctor.get('outcome', '?')}", "", *_check_table(doctor.get("checks", []))]
    if data["checks"]:
        lines += ["", "## Training checks", "", *_check_table(data["checks"])]
    if data.get("replay"):
        lines += ["", f"Replay of a GPU run's rollouts (precision alignment): {_cell(data['replay'])}."]
    return lines


def _comparison_lines(comparison: dict[str, Any]) -> list[str]:
    if comparison.get("method", "seeds") != "seeds":
        return _verdict_lines(comparison)
    lines = [
        "",
        "## Against the baseline",
        "",
        "| metric | steps | mean abs error | x100 (seeds' %) | tolerance (same unit) | result |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in comparison["metrics"].items():
        error = "n/a" if m["mean_abs_error"] is None else f"{m['mean_abs_error']:.6g}"
        pct = "n/a" if m["mean_abs_error_pct"] is None else f"{m['mean_abs_error_pct']:.3f}"
        result = "FAIL" if m["status"] == "error" else "pass"
        lines.append(f"| `{name}` | {m['steps']} | {error} | {pct} | {m['tolerance_pct']:g} | {result} |")
    ratio = comparison.get("throughput_ratio")
    lines += ["", f"%: {comparison.get('pct_unit', PCT_UNIT)}."]
    lines += ["", f"Throughput ratio (NPU / baseline): {'n/a' if ratio is None else f'{ratio:.3f}'}"]
    return lines


def _verdict_lines(verdict: dict[str, Any]) -> list[str]:
    """A comparison by replay, regression or identical (buildkit.accuracy.methods): per metric what was measured, the
    bound, the verdict; then what was not counted and why."""
    lines = [
        "",
        f"## Against the baseline: method {verdict['method']}",
        "",
        "| metric | measured | value | steps | bound | result |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in verdict["metrics"].items():
        value = "not finite" if m["worst"] is None else f"{m['worst']:.6g}"
        result = {"ok": "pass", "error": "FAIL", "reported": "not counted"}[m["status"]]
        lines.append(f"| `{name}` | {_cell(m['measure'])} | {value} | {len(m['steps'])} | {_cell(m['bound'])} | {result} |")
    lines += [""] + [f"- {_cell(note)}" for note in verdict.get("notes", [])]
    return lines


def write_reports(out: Path, data: dict[str, Any]) -> None:
    clean = _json_safe(data)
    write_atomic(out / "report.json", json.dumps(clean, indent=2) + "\n")
    write_atomic(out / "report.md", report_markdown(clean))


def stderr_echo(line: str) -> None:
    sys.stderr.write(f"  | {line}\n")
