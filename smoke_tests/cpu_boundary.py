"""Run a smoke job's own entry point on a machine with no NPU, as far as it goes, and record where it stopped.

    python3 cpu_boundary.py --out RESULT.json --log RUN.log [--bound 900] [--ray-cpus 16] [--no-ray] -- python3 -m MODULE ARG...

The command is the job's, unchanged (the trainer, its configuration, the job's data and a model
directory of its architecture). A Ray head with no accelerators is started first and the command
joins it (``RAY_ADDRESS``), as a multi-node job joins its cluster, so that while the trainer runs
this can ask Ray what it is waiting for. The run ends in one of three ways, all written to
RESULT.json for ``ascendkit smoke --cpu`` to judge:

- the command exits (the frameworks stop at their accelerator check with an exception, or at any
  earlier error: the log says which);
- Ray reports a demand for a resource no CPU node has (``NPU``, ``GPU``) for two polls in a row:
  the trainer is waiting for accelerators that will never come, and is stopped;
- the bound passes: stopped, with whatever Ray was waiting for.

Everything started (the command, the Ray head and its workers) is found by a marker in its
environment and stopped at the end, so nothing is left running. Standard library only; Ray's own
``ray`` command is the environment's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

MARKER = "ASCENDKIT_CPU_RUN"
POLL_S = 10.0
HEAD_ATTEMPTS = 3
# Resources a CPU node has; a pending demand for anything else is for an accelerator.
CPU_RESOURCES = {"CPU", "memory", "object_store_memory"}
_DEMAND = re.compile(r"\{([^}]*)\}\s*\*\s*(\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accelerator_demands(status: str) -> list[str]:
    """The lines of ``ray status``'s pending demands that ask for a resource no CPU node has."""
    found = []
    in_demands = False
    for line in status.splitlines():
        if line.startswith(("Pending Demands", "Demands")):  # Ray 2.5x+ / Ray 2.4x
            in_demands = True
            continue
        if in_demands and line and not line.startswith(" "):
            in_demands = False
        if in_demands:
            for body, _count in _DEMAND.findall(line):
                names = {part.split(":")[0].strip().strip("'\"") for part in body.split(",") if ":" in part}
                if names - CPU_RESOURCES:
                    found.append(line.strip())
                    break
    return found


def marked_pids(marker: str) -> list[int]:
    """Every process whose environment carries ``MARKER=marker``: the command, the Ray head and its workers."""
    wanted = f"{MARKER}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def rss_mib(pids: list[int]) -> float:
    """The resident memory of these processes together, in MiB."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return round(total / 2**20, 1)


def stop_all(marker: str) -> int:
    """SIGTERM then SIGKILL everything marked; returns how many were still running."""
    pids = marked_pids(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (pids := marked_pids(marker)):
            time.sleep(0.2)
        if not pids:
            break
    return len(pids)


def ray_status(env: dict[str, str], address: str) -> str:
    try:
        done = subprocess.run(["ray", "status", "--address", address], env=env, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(ray status failed: {exc})"
    return done.stdout + done.stderr


def start_head(env: dict[str, str], temp: Path, ray_cpus: int, out: Any, marker: str) -> str | None:
    """A Ray head with no accelerators; its address. A loaded machine can time a head's start out (its GCS answers
    late): what the attempt left is stopped and it is tried again, a few times."""
    for attempt in range(1, HEAD_ATTEMPTS + 1):
        port = free_port()
        head = ["ray", "start", "--head", f"--port={port}", f"--num-cpus={ray_cpus}", "--num-gpus=0", "--disable-usage-stats"]
        head += [f"--temp-dir={temp}", "--include-dashboard=false"]
        done = subprocess.run(head, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False)
        if done.returncode == 0:
            return f"127.0.0.1:{port}"
        out.write(f"\n--- ascendkit: the Ray head did not start (exit {done.returncode}, attempt {attempt}); stopping what it left ---\n")
        out.flush()
        stop_all(marker)
    return None


def run(command: list[str], log: Path, bound: float, ray_cpus: int, ray: bool = True) -> dict[str, Any]:
    marker = uuid.uuid4().hex
    temp = Path(tempfile.mkdtemp(prefix="ascendkit-ray-"))
    # Ray 2.5x and later want a token from clients unless told otherwise; this head is private to the run. Workers
    # start when an actor needs one, not ahead for every CPU (each would import Ray for nothing on a small machine).
    env = {
        **os.environ,
        MARKER: marker,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_prestart_worker_first_driver": "0",
        # A worker imports Ray and the trainer before it registers; on a loaded two-core machine that took more than
        # Ray's default 60 s, and the task runner was refused as unschedulable ("worker startup repeatedly failed").
        "RAY_worker_register_timeout_seconds": "600",
    }
    result: dict[str, Any] = {"command": command, "bound_s": bound, "ray_cpus": ray_cpus, "demands": [], "stopped": None}
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        try:
            address = start_head(env, temp, ray_cpus, out, marker) if ray else ""
            if address is None:
                result.update(exit_code=None, error=f"the Ray head did not start in {HEAD_ATTEMPTS} attempts; see the log")
                return result
            result["ray_head_s"] = round(time.monotonic() - started, 1) if ray else None
            said = f"Ray head at {address} with {ray_cpus} CPUs and no accelerators" if ray else "no Ray head (the job does not use Ray)"
            out.write(f"\n--- ascendkit: {said}; running the job ---\n")
            out.flush()
            job_env = {**env, "RAY_ADDRESS": address} if ray else env
            process = subprocess.Popen(command, env=job_env, stdout=out, stderr=subprocess.STDOUT)
            seen_waiting = 0
            next_poll = time.monotonic() + POLL_S
            next_sample = 0.0
            peak = 0.0
            while process.poll() is None:
                now = time.monotonic()
                if now >= next_sample:  # the job, the Ray head and every worker it started, together
                    next_sample = now + 2.0
                    peak = max(peak, rss_mib(marked_pids(marker)))
                    result["peak_rss_mib"] = peak
                if now - started > bound:
                    result["stopped"] = "bound"
                    result["demands"] = accelerator_demands(ray_status(env, address)) if ray else []
                    break
                if ray and now >= next_poll:
                    next_poll = now + POLL_S
                    demands = accelerator_demands(ray_status(env, address))
                    seen_waiting = seen_waiting + 1 if demands else 0
                    if seen_waiting >= 2:
                        result["stopped"] = "waiting-for-accelerators"
                        result["demands"] = demands
                        break
                time.sleep(0.5)
            result["exit_code"] = process.poll()
        finally:
            left = stop_all(marker)
            result["seconds"] = round(time.monotonic() - started, 1)
            if left:
                result["left_running"] = left
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a smoke job's entry point on CPU up to where it needs an accelerator.")
    parser.add_argument("--out", type=Path, required=True, help="where the result goes (JSON)")
    parser.add_argument("--log", type=Path, required=True, help="the run's output")
    parser.add_argument("--bound", type=float, default=900.0, help="seconds before the run is stopped (default 900)")
    parser.add_argument("--ray-cpus", type=int, default=12, help="logical CPUs the Ray head offers (default 12)")
    parser.add_argument("--no-ray", action="store_true", help="the job does not use Ray: start no head")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    result = run(command, args.log, args.bound, args.ray_cpus, ray=not args.no_ray)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"cpu_boundary: exit {result.get('exit_code')}, stopped {result['stopped']}, {result.get('seconds')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
