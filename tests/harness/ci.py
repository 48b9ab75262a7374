"""What `make test` (and so CI) runs: the lint, every test and the quick benchmarks, at once where
they can be.

    python -m tests.harness.ci [--arm64]

The jobs, and what each waits for::

    job              waits for         runs
    services         -                 python -m tests.harness.services start [--arm64 --arm64-later]: engines,
                                       registries, the amd64 stand-in
    arm64-standin    services          python -m tests.harness.services arm64-standin: the arm64 stand-in (debootstrap,
                                       its packages' scripts under qemu), only with --arm64; the docker job's arm64 build waits for it
    lint             -                 make lint
    unit             lint              pytest -n auto -m "not docker and not network and not matrix_moves": no engine,
                                       every proxy dead, an empty cache
    moves            lint              pytest -m matrix_moves: the unit suite again in a copy with the default stack moved
    network          lint              pytest -m "network and not docker": what truly needs PyPI (resolving, downloading)
    cpu-run          lint              make cpu-run: the default stack's and the newest verl stack's GRPO job run on CPU in
                                       their own packages to the accelerator boundary, and one GRPO step (tests/harness/cpu_run.py)
    docker           lint, services    pytest -m "docker and not second_engine and not engine_20_10_only and not emulated",
                                       on Docker 26.1.5, containerd store
    docker-b         lint, services    pytest -m "docker and second_engine and not emulated", on a second engine of that kind
    docker-20.10     lint, services    pytest -m "docker and engine_20_10 and not emulated", on Docker 20.10
    docker-overlay2  lint, services    pytest -m "docker and engine_overlay2 and not emulated", on Docker 26.1.5 on overlay2
    emulated         arm64-standin     pytest -m "emulated and not arm64_pair", on the emulated engine (only with --arm64)
    reproduced       docker-b, docker-20.10, docker-overlay2   python -m tests.harness.reproduced: one image across engines
    bench            lint, services    make bench-quick, on an engine of its own (docker-bench), beside the tests

Every docker test runs on the engine a fresh Docker install gives (the containerd image store), in
two halves at once on two such engines (tests/conftest.py's SECOND_ENGINE says which run on the second);
what differs between engines (build, load, export, publish, mirror, smoke, verify, the host-contract
containers) runs on Docker 20.10 too, and export and publish on Docker 26 over overlay2 (the OCI
layout of uncompressed blobs): each of those jobs has its engine, its registries and its env file
(tests/harness/services.py), so nothing one pushes or removes shows in another.

The emulated tests (the default stack's real arm64 layers, installed and importing verl under
qemu) take about as long as all the other jobs together: run beside them, the whole takes the
longer of the two instead of their sum. They share no image with the other tests, and their engine
is their own, so nothing they build, remove or run shows in the docker job's checks of what is
left behind. The arm64 build of the test stack stays in the docker job: it completes the
multi-arch index of that job's own x86_64 build. Left out of every job: the two clean arm64 builds
compared (marked ``arm64_pair``, ``make repro-arm64``): about 4.5 core-minutes of qemu that CI's
time does not have, which issue 65 allows; CI holds reproducibility on x86_64, on every engine.

The unit tests run on every core (pytest-xdist: each test is independent of the others' order and
process). The matrix-moves check (tests/test_matrix_moves.py) runs the whole unit suite once more in a
copy of the repository with ``default: true`` moved: it is a job of its own beside the others, never
nested inside the unit job, where it was half of that job's time.

Each job's output is printed as it comes, every line headed by the job's name, and kept whole in
``$ASCENDKIT_SERVICES_DIR/ci/<job>.log``. A job whose prerequisite failed does not run, and says so.
The same groups weigh the jobs in the cpu controller: the jobs and engines on the longest chains
(the services; the docker and docker-b jobs; the arm64 stand-in, then the emulated job) four times as much as the rest, which
run beside them (cpuacct.PRIORITY). The services are stopped at the end whatever happened, also
on Ctrl-C or SIGTERM; then a table
says how each job ended, how long it took, the CPU its processes used (tests/harness/cpuacct.py, with each
engine's builds and containers on a line of their own) and, for a pytest job, how many tests passed, failed
and were skipped (read from pytest's closing line). Last come the failures, so that the end of the output
names them: each failed pytest job's short-summary lines, or the last lines of another failed job's log.
The exit status is 0 when every job passed, else 1
(130 or 143 when interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import cpuacct
from tests.harness.services import EMULATED_HOST_VAR, ENV_FILE, STATE

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

PASSED, FAILED, NOT_RUN, STOPPED = "passed", "FAILED", "not run", "stopped"


@dataclass
class Job:
    name: str
    argv: Sequence[str]
    needs: tuple[str, ...] = ()
    env: Callable[[], Mapping[str, str]] = dict  # read when the job starts (after its prerequisites)
    result: str = ""
    detail: str = ""
    started: float = 0.0
    ended: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)  # pytest's closing line: passed, failed, skipped, ...
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


# pytest's closing line, with or without -q: "=== 1680 passed, 2 skipped, 1 warning in 287.36s (0:04:47) ==="
_PYTEST_CLOSING = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s\b")
# pytest's short test summary: "FAILED tests/test_x.py::test_y - AssertionError: ..." (or ERROR, at setup)
_PYTEST_SUMMARY = re.compile(r"^(FAILED|ERROR) \S+::")


def pytest_counts(line: str) -> dict[str, int] | None:
    """What pytest's closing line counts (passed, failed, skipped, error(s), ...), or None for any other line."""
    found = _PYTEST_CLOSING.match(line.strip())
    if found is None:
        return None
    pairs = (part.split(" ", 1) for part in found.group(1).split(", ") if part)
    return {word.rstrip("s") if word in ("errors", "warnings") else word: int(count) for count, word in pairs}


def cpu_times() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat ((0, 0) where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def services_env() -> dict[str, str]:
    """The env file `tests.harness.services start` wrote."""
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def engine_env(name: str) -> Callable[[], dict[str, str]]:
    """The env file `tests.harness.services start` wrote for engine ``name`` (``env.<name>``)."""

    def read() -> dict[str, str]:
        path = ENV_FILE.with_name(f"env.{name}")
        return {key: value for key, value in (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)}

    return read


def emulated_env() -> dict[str, str]:
    env = services_env()
    return {**env, "DOCKER_HOST": env[EMULATED_HOST_VAR]}


DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, so any request that leaves fails at once


def offline_env(name: str) -> Callable[[], dict[str, str]]:
    """A job's offline environment: every proxy a dead port and an empty cache of its own, so a test that
    reaches for the network (or for what an earlier run fetched) fails here, not only on a user's
    offline machine. The tests' own servers are on the loopback, which the proxies never take
    (tests/conftest.py)."""

    def read() -> dict[str, str]:
        cache = Path(tempfile.gettempdir()) / f"ak-ci-{name}-cache"  # emptied at every run, not left behind in new names
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        proxies = {key: DEAD_PROXY for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}
        return {
            **proxies,
            "NO_PROXY": "127.0.0.1,127.0.0.0/8,localhost,::1",
            "no_proxy": "127.0.0.1,127.0.0.0/8,localhost,::1",
            "ASCENDKIT_CACHE": str(cache),
        }

    return read


def pytest_argv(name: str, marks: str, workers: str | None = None) -> list[str]:
    # Each run its own temporary root (concurrent sessions may prune each other's default one), as
    # short as the default: some tests put socket paths in it, which have a length limit.
    basetemp = Path(tempfile.gettempdir()) / f"ak-ci-{name}"
    parallel = ["-n", workers] if workers else []
    return [str(BIN / "pytest"), *parallel, "-m", marks, "--durations=25", "-p", "no:cacheprovider", f"--basetemp={basetemp}"]


UNIT_MARKS = "not docker and not network and not matrix_moves"


def jobs_for(arm64: bool) -> list[Job]:
    make = ["make", "--no-print-directory"]
    services = [str(BIN / "python"), "-m", "tests.harness.services", "start", *(["--arm64", "--arm64-later"] if arm64 else [])]
    jobs = [
        Job("services", services),
        Job("lint", [*make, "lint"]),
        Job("unit", pytest_argv("unit", UNIT_MARKS, workers="auto"), needs=("lint",), env=offline_env("unit")),
        Job("moves", pytest_argv("moves", "matrix_moves"), needs=("lint",), env=offline_env("moves")),
        Job("network", pytest_argv("network", "network and not docker"), needs=("lint",)),
        Job("cpu-run", [*make, "cpu-run", f"CPU_RUN_OUT={STATE}/cpu-run"], needs=("lint",)),
        Job(
            "docker",
            pytest_argv(
                "docker",
                "docker and not second_engine and not engine_20_10_only" + (" and not emulated" if arm64 else " and not arm64_pair"),
            ),
            ("lint", "services"),
            services_env,
        ),
        Job(
            "docker-b",
            pytest_argv("docker-b", "docker and second_engine" + (" and not emulated" if arm64 else " and not arm64_pair")),
            ("lint", "services"),
            engine_env("docker-b"),
        ),
        Job(
            "docker-20.10",
            pytest_argv("d2010", "docker and engine_20_10 and not emulated"),
            ("lint", "services"),
            engine_env("docker-20.10"),
        ),
        Job(
            "docker-overlay2",
            pytest_argv("overlay2", "docker and engine_overlay2 and not emulated"),
            ("lint", "services"),
            engine_env("docker-overlay2"),
        ),
        Job(
            "reproduced",
            [str(BIN / "python"), "-m", "tests.harness.reproduced"],
            ("docker-b", "docker-20.10", "docker-overlay2"),
            services_env,
        ),
        Job("bench", [*make, "bench-quick", "BENCH_ENGINE=docker-bench"], ("lint", "services"), engine_env("docker-bench")),
    ]
    if arm64:
        standin = Job("arm64-standin", [str(BIN / "python"), "-m", "tests.harness.services", "arm64-standin"], ("services",))
        emulated = Job("emulated", pytest_argv("emulated", "emulated and not arm64_pair"), ("arm64-standin",), emulated_env)
        jobs[2:2] = [standin, emulated]
    return jobs


class Runner:
    """Runs jobs as their prerequisites pass, each in its own process group, printing their lines."""

    def __init__(self, jobs: list[Job], logs: Path, base_env: Mapping[str, str], account: cpuacct.CpuAccount | None = None) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.logs = logs
        self.account = account or cpuacct.CpuAccount(None)
        self.base_env = dict(base_env)
        if self.account.root is not None:
            self.base_env[cpuacct.ENV_VAR] = str(self.account.root)
        self.width = max(len(name) for name in self.jobs)
        self.lock = threading.RLock()  # re-entrant: the signal handler runs on the main thread, maybe inside it
        self.changed = threading.Condition(self.lock)
        self.interrupted = 0
        self.t0 = time.monotonic()
        self.cpu0 = cpu_times()

    def say(self, name: str, line: str) -> None:
        with self.lock:
            sys.stdout.write(f"[{name:<{self.width}}] {line}\n")
            sys.stdout.flush()

    def _start(self, job: Job) -> None:
        env = {**self.base_env, **job.env(), "PYTHONUNBUFFERED": "1"}
        job.started = time.monotonic()
        job.process = subprocess.Popen(
            self.account.wrap(f"job-{job.name}", job.argv),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.say(job.name, f"started: {' '.join(job.argv)}")
        threading.Thread(target=self._follow, args=(job,), daemon=True).start()

    def _follow(self, job: Job) -> None:
        assert job.process is not None and job.process.stdout is not None
        with (self.logs / f"{job.name}.log").open("wb") as log:
            for raw in job.process.stdout:
                log.write(raw)
                line = raw.decode("utf-8", "replace").rstrip("\n")
                counts = pytest_counts(line)
                if counts is not None:
                    job.counts = counts
                self.say(job.name, line.removeprefix(f"[{job.name}] "))  # tests.harness.services heads its own lines
        code = job.process.wait()
        with self.changed:
            job.ended = time.monotonic()
            job.result = STOPPED if self.interrupted else PASSED if code == 0 else FAILED
            job.detail = f"exit {code}" if code else ""
            self.changed.notify_all()
        self.say(job.name, f"{job.result} in {job.ended - job.started:.0f} s" + (f" ({job.detail})" if job.detail else ""))

    def run(self) -> None:
        """Until every job has ended or will never run."""
        with self.changed:
            while True:
                progressed = False
                for job in self.jobs.values():
                    if job.result or job.process is not None:
                        continue
                    needs = [self.jobs[n] for n in job.needs]
                    blocked = [n.name for n in needs if n.result and n.result != PASSED]
                    if blocked or self.interrupted:
                        job.result = NOT_RUN
                        job.detail = "interrupted" if self.interrupted else f"{', '.join(blocked)} did not pass"
                        progressed = True
                    elif all(n.result == PASSED for n in needs):
                        self.changed.release()
                        try:
                            self._start(job)
                        except (OSError, KeyError) as exc:  # no such program, no env file or variable
                            job.result, job.detail = FAILED, f"could not start: {exc!r}"
                            self.say(job.name, job.detail)
                        finally:
                            self.changed.acquire()
                        progressed = True
                if all(job.result for job in self.jobs.values()):
                    return
                if not progressed:
                    self.changed.wait(timeout=1.0)

    def interrupt(self, signum: int) -> None:
        """Stop every running job's process group; the jobs not yet started will not start."""
        with self.changed:
            self.interrupted = signum
            running = [job for job in self.jobs.values() if job.process is not None and not job.result]
            self.changed.notify_all()
        for job in running:
            assert job.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.process.pid, signal.SIGTERM)

    def summary(self) -> str:
        used = self.account.seconds()
        rows = [f"{'job':<{self.width}}  {'result':<8} {'start':>6} {'took':>6} {'cpu':>6} {'passed':>6} {'failed':>6} {'skipped':>7}"]
        for job in self.jobs.values():
            start = f"{(job.started - self.t0) / 60:5.1f}m" if job.started else ""
            took = f"{(job.ended - job.started) / 60:5.1f}m" if job.ended else ""
            tests = ["", "", ""]
            if job.counts:
                failed = job.counts.get("failed", 0) + job.counts.get("error", 0)
                tests = [str(job.counts.get("passed", 0)), str(failed), str(job.counts.get("skipped", 0))]
            cpu = f"{used[f'job-{job.name}'] / 60:5.1f}m" if f"job-{job.name}" in used else ""
            row = f"{job.name:<{self.width}}  {job.result:<8} {start:>6} {took:>6} {cpu:>6} {tests[0]:>6} {tests[1]:>6} {tests[2]:>7}"
            rows.append(f"{row}  {job.detail}".rstrip())
        engines = {name.removeprefix("engine-"): s for name, s in used.items() if name.startswith("engine-")}
        if engines:
            each = ", ".join(f"{name} {s / 60:.1f}" for name, s in engines.items())
            rows.append(f"engines' CPU (their builds and containers), core-minutes: {each}")
        elif self.account.root is None:
            rows.append("CPU per job: not measured (no writable cgroup v1 cpuacct hierarchy)")
        busy = cpu_busy(self.cpu0, cpu_times())
        rows.append(f"total {(time.monotonic() - self.t0) / 60:.1f} min; the CPUs were busy {busy:.0%} of it ({os.cpu_count()} cores)")
        return "\n".join(rows)

    def failures(self, tail: int = 8, most: int = 12) -> str:
        """What failed, printed last so that the end of CI's output names it: each failed pytest job's
        short-summary lines (``FAILED path::test - message``, at most ``most``), or the last ``tail``
        lines of any other failed job's log."""
        out: list[str] = []
        for job in self.jobs.values():
            if job.result != FAILED:
                continue
            log = self.logs / f"{job.name}.log"
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            named = [line for line in lines if _PYTEST_SUMMARY.match(line)]
            shown = named[:most] if named else lines[-tail:]
            out.append(f"{job.name} failed ({job.detail or 'no detail'}); {'its failed tests' if named else 'the end of its log'}:")
            out.extend(f"  {line[:240]}" for line in shown)
            if len(named) > most:
                out.append(f"  ... and {len(named) - most} more in {log}")
        return "\n".join(out)

    @property
    def ok(self) -> bool:
        return all(job.result == PASSED for job in self.jobs.values())


def stop_services(runner: Runner) -> None:
    if runner.jobs["services"].started:
        code = subprocess.run([str(BIN / "python"), "-m", "tests.harness.services", "stop"], cwd=ROOT, check=False).returncode
        if code != 0:
            print(f"[ci] stopping the services failed (exit {code})", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm64", action="store_true", help="also the arm64 stand-in, and the emulated tests on their own engine")
    args = parser.parse_args(argv)
    logs = STATE / "ci"
    shutil.rmtree(logs, ignore_errors=True)
    shutil.rmtree(STATE / "reproducible", ignore_errors=True)  # what this run's engines publish, never an earlier run's
    logs.mkdir(parents=True)
    base_env = {**os.environ, "ASCENDKIT_REQUIRE_DOCKER": "1"}
    for name in ("DOCKER_HOST", "ASCENDKIT_REGISTRY", "ASCENDKIT_STANDIN_IMAGE", "ASCENDKIT_STANDIN_IMAGE_ARM64", EMULATED_HOST_VAR):
        base_env.pop(name, None)  # the unit job gets no engine; the others get the services' own
    account = cpuacct.CpuAccount.create(f"ascendkit-ci-{os.getpid()}")
    runner = Runner(jobs_for(args.arm64), logs, base_env, account)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, _frame: runner.interrupt(s))
    try:
        runner.run()
    finally:
        stop_services(runner)
        print(runner.summary(), flush=True)
        print(f"(each job's whole output: {logs}/<job>.log; cpu: the core-minutes its own processes used)", flush=True)
        failures = runner.failures()
        if failures:
            print(failures, flush=True)
        account.remove()
    if runner.interrupted:
        return 128 + runner.interrupted
    return 0 if runner.ok else 1


if __name__ == "__main__":
    sys.exit(main())
