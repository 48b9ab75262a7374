"""`python -m buildkit`, each run its own process, without each paying for Python's imports again.

A command that refuses bad input spends most of its CPU importing: Typer, pydantic, docker-py,
requests, jinja2 and ascendkit's own modules, about half a second of a process that then refuses in a
tenth of one. tests/test_bad_inputs.py runs some two hundred of them, twice per `make test` (the unit
and the moves jobs). Here one server process imports ascendkit's libraries once (every module under
``buildkit`` but the command-line layer, ``buildkit.cli``, which a run imports as a fresh process
does: only its own command's module) and forks a child per run. The child is the run: it takes the
run's directory, environment, memory limit and standard streams, then runs ``buildkit`` as
``python -m buildkit`` does (runpy, as ``__main__``), and leaves as the interpreter leaves, with its
exit status, its traceback if one escaped and its exit handlers run. The server answers with the
status and the CPU the child used (``wait4``), and kills a child that outlives its deadline.

What differs from a process started from nothing is only what was imported before ``main()``; a
module that read the environment or the directory while imported would read the server's, which is
why none of ascendkit's does (tests/test_bad_inputs.py still starts some commands from nothing,
tests/test_cli.py many). Protocol: one JSON line per run on the server's stdin, one back on its stdout.

    server = ForkServer.start()
    result = server.run(["render", "--hw", "a3"], cwd=..., env=..., memory=2 << 30, timeout=600)
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import resource
import runpy
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_IN, _OUT = 3, 4  # the protocol's pipes, away from the standard streams each child replaces


@dataclass(frozen=True)
class Run:
    returncode: int  # as subprocess says it: -N when killed by signal N
    stdout: str
    stderr: str
    cpu_s: float  # user + system seconds of the run's process and what it waited for
    timed_out: bool = False


class ForkServer:
    """The client side: one server process, one run at a time."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None) -> ForkServer:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.forkrun"],
            cwd=ROOT,
            env=dict(env if env is not None else os.environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        server = cls(process)
        ready = server._read()
        if ready.get("ready") is not True:
            raise RuntimeError(f"the fork server did not start: {ready}")
        return server

    def _read(self) -> dict[str, object]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.process.poll()})")
        reply: dict[str, object] = json.loads(line)
        return reply

    def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], out_dir: Path, memory: int, timeout: float) -> Run:
        """``python -m buildkit ARGV`` in ``cwd`` with exactly ``env``; its streams kept in ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout, stderr = out_dir / "stdout", out_dir / "stderr"
        request: dict[str, object] = {"argv": list(argv), "cwd": str(cwd), "env": dict(env), "memory": memory, "timeout": timeout}
        request |= {"stdout": str(stdout), "stderr": str(stderr)}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        reply = self._read()
        code, cpu = reply["code"], reply["cpu"]
        assert isinstance(code, int) and isinstance(cpu, float)
        return Run(code, _text(stdout), _text(stderr), cpu, bool(reply.get("timed_out")))

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


# ---- the server ----------------------------------------------------------------------------------


def _preload() -> None:
    """Every module of ascendkit's libraries (and so the third-party ones they import), not its command
    line and not a package's ``__main__``."""
    import buildkit

    for info in pkgutil.walk_packages(buildkit.__path__, "buildkit."):
        if info.name.startswith("buildkit.cli") or info.name.rpartition(".")[2] == "__main__":  # a script runs when imported
            continue
        importlib.import_module(info.name)


def _reap(pid: int, timeout: float) -> tuple[int, float, bool]:
    """Wait for the child: (status as subprocess reports it, CPU seconds, whether it was killed for time)."""
    pidfd = os.pidfd_open(pid)  # readable when the child ends: a wait with a deadline, no polling
    try:
        ended, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, not ended


def _become_the_run(request: dict[str, object]) -> None:
    """In the child: the run's directory, environment, limit and streams, then ``python -m buildkit``."""
    os.close(_IN)
    os.close(_OUT)
    memory = request["memory"]
    assert isinstance(memory, int)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.chdir(str(request["cwd"]))
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        target = os.open(str(request[key]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.close(stdin)
    argv = request["argv"]
    assert isinstance(argv, list)
    sys.argv = [sys.argv[0], *map(str, argv)]  # runpy puts buildkit/__main__.py in sys.argv[0], as `python -m` does


def serve() -> dict[str, object] | None:
    """Answer runs until stdin closes (then None); in each child, return its request."""
    for fd, new in ((0, _IN), (1, _OUT)):
        os.dup2(fd, new)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    _preload()
    reader = os.fdopen(_IN, "rb", closefd=False)
    os.write(_OUT, json.dumps({"ready": True}).encode() + b"\n")
    for line in reader:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            reader.close()
            _become_the_run(request)
            return dict(request)
        code, cpu, timed_out = _reap(pid, float(request["timeout"]))
        os.write(_OUT, json.dumps({"code": code, "cpu": cpu, "timed_out": timed_out}).encode() + b"\n")
    return None


if __name__ == "__main__":
    if serve() is not None:  # the child: the run itself, ended as the interpreter ends it
        runpy.run_module("buildkit", run_name="__main__", alter_sys=True)
