"""tests/harness/ci.py, the runner behind `make test`: order, failure, interruption, output, and the job graph."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness import cpuacct
from tests.harness.ci import FAILED, NOT_RUN, PASSED, STOPPED, Job, Runner, jobs_for
from tests.harness.services import ARM64_STATE_VAR

ROOT = Path(__file__).resolve().parent.parent


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run(jobs: list[Job], tmp_path: Path) -> Runner:
    runner = Runner(jobs, tmp_path, dict(os.environ))
    runner.run()
    return runner


def test_a_job_starts_only_after_what_it_needs_has_passed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "first-done"
    jobs = [
        Job("second", py(f"import pathlib; assert pathlib.Path({str(marker)!r}).exists(); print('saw it')"), needs=("first",)),
        Job("first", py(f"import pathlib, time; time.sleep(0.5); pathlib.Path({str(marker)!r}).touch(); print('made it')")),
        Job("alone", py("print('hello')\nprint('world')")),
    ]
    runner = run(jobs, tmp_path)
    assert runner.ok and [j.result for j in jobs] == [PASSED, PASSED, PASSED]
    assert jobs[0].started >= jobs[1].ended
    out = capsys.readouterr().out
    assert "[second] saw it" in out and "[first ] made it" in out and "[alone ] hello\n[alone ] world" in out
    assert (tmp_path / "alone.log").read_text() == "hello\nworld\n", "each job's whole output is kept"


def test_a_failed_job_keeps_its_dependents_from_running_and_the_rest_goes_on(tmp_path: Path) -> None:
    jobs = [
        Job("lint", py("import sys; print('E501'); sys.exit(3)")),
        Job("unit", py("print('never')"), needs=("lint",)),
        Job("bench", py("print('never')"), needs=("unit",)),
        Job("services", py("print('up')")),
    ]
    runner = run(jobs, tmp_path)
    assert not runner.ok
    assert [(j.result, j.detail) for j in jobs] == [
        (FAILED, "exit 3"),
        (NOT_RUN, "lint did not pass"),
        (NOT_RUN, "unit did not pass"),
        (PASSED, ""),
    ]
    assert not (tmp_path / "unit.log").exists()
    summary = runner.summary()
    assert "lint      FAILED" in summary and "unit      not run" in summary and "lint did not pass" in summary


def test_an_interrupt_stops_the_running_jobs_and_starts_no_more(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    # The job's own child sleeps too: the whole process group must go, not only the job's process.
    code = f"import pathlib, subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); pathlib.Path({str(child)!r}).write_text(str(p.pid)); time.sleep(60)"  # noqa: E501
    jobs = [Job("long", py(code)), Job("after", py("print('never')"), needs=("long",))]
    runner = Runner(jobs, tmp_path, dict(os.environ))

    def interrupt_when_started() -> None:
        _wait_for(child)
        runner.interrupt(signal.SIGTERM)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    t0 = time.monotonic()
    runner.run()
    assert time.monotonic() - t0 < 30
    assert [j.result for j in jobs] == [STOPPED, NOT_RUN] and jobs[1].detail == "interrupted"
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the job's child process was stopped with it"


def _wait_for(path: Path) -> None:
    """Until ``path`` holds something (a file a child is writing exists before its contents do)."""
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


ENGINE_JOBS = {"docker-20.10": "engine_20_10", "docker-overlay2": "engine_overlay2"}  # each reruns the tests marked for its engine


def test_every_test_runs_in_exactly_one_job_and_the_marked_ones_on_their_engine_too() -> None:
    """The jobs' marker expressions split the suite: none left out but the arm64 pair (`make repro-arm64`),
    none run twice on one engine; a docker test marked for another engine runs there as well, and only such a test
    (one marked engine_20_10_only runs there alone)."""
    for arm64 in (True, False):
        jobs = {job.name: job for job in jobs_for(arm64)}
        marks = {name: job.argv[job.argv.index("-m") + 1] for name, job in jobs.items() if job.argv[0].endswith("pytest")}
        main = {name: expr for name, expr in marks.items() if name not in ENGINE_JOBS}
        every = {"unit", "moves", "network", "docker", "docker-b"}
        assert set(main) == (every | {"emulated"} if arm64 else every)
        assert set(marks) - set(main) == set(ENGINE_JOBS)
        for docker, emulated, network, second, moves, pair, only, *engines in itertools.product((True, False), repeat=7 + len(ENGINE_JOBS)):
            if only and (not (docker and engines[0]) or second or emulated):
                continue  # a case for 20.10's job alone is a docker test marked for it, on the first engine's half
            if (emulated or second) and not docker:
                continue  # the emulated tests and the second engine's all need an engine
            if moves and (docker or network or emulated or second):
                continue  # the matrix-moves check is one unit test
            if pair and not emulated:
                continue  # the arm64 pair is an emulated test
            names = {"docker": docker, "emulated": emulated, "network": network, "second_engine": second, "matrix_moves": moves}
            names |= dict(zip(ENGINE_JOBS.values(), engines, strict=True)) | {"arm64_pair": pair, "engine_20_10_only": only}
            # pytest's -m grammar (and, or, not over marker names) is a subset of Python's
            chosen = [name for name, expr in main.items() if eval(expr, {}, names)]
            # the pair: `make repro-arm64` only; a case marked engine_20_10_only: the 20.10 job's alone
            assert len(chosen) == (0 if pair or only else 1), (arm64, names, chosen)
            for job, marker in ENGINE_JOBS.items():
                assert eval(marks[job], {}, names) == (docker and names[marker] and not emulated), (job, names)
        assert jobs["docker"].needs[-1] == "services" == jobs["docker-b"].needs[-1]
        if arm64:  # the amd64 tests need not wait for the arm64 stand-in's debootstrap under qemu; the emulated ones do
            assert jobs["arm64-standin"].needs == ("services",) and jobs["emulated"].needs == ("arm64-standin",)
            assert jobs["services"].argv[-2:] == ["--arm64", "--arm64-later"]
        else:
            assert "arm64-standin" not in jobs and "--arm64-later" not in jobs["services"].argv
        assert all(jobs[job].needs == ("lint", "services") for job in ENGINE_JOBS)


def test_the_closing_table_counts_each_pytest_jobs_tests(tmp_path: Path) -> None:
    """The table says how many tests each pytest job passed, failed and skipped, as pytest's closing line says."""
    jobs = [
        Job("unit", py("print('=' * 5 + ' 1680 passed, 3 skipped, 2 warnings in 287.36s (0:04:47) ' + '=' * 5)")),
        Job("docker", py("import sys; print('1 failed, 40 passed, 1 error in 9.01s'); sys.exit(1)")),
        Job("lint", py("print('All checks passed!')")),
    ]
    runner = run(jobs, tmp_path)
    assert jobs[0].counts == {"passed": 1680, "skipped": 3, "warning": 2}
    assert jobs[1].counts == {"failed": 1, "passed": 40, "error": 1} and jobs[2].counts == {}
    table = runner.summary().splitlines()
    assert table[0].split()[-3:] == ["passed", "failed", "skipped"]
    assert table[1].split()[4:7] == ["1680", "0", "3"], table[1]
    assert table[2].split()[4:7] == ["40", "2", "0"], "a test's error counts as a failure"
    assert table[3].split()[:3] == ["lint", "passed", table[3].split()[2]] and len(table[3].split()) == 4, table[3]


def test_the_failures_come_last_naming_each_failed_test_or_the_end_of_the_jobs_log(tmp_path: Path) -> None:
    """CI's output is read from its end: what failed is said there, not only in a log left on the machine."""
    summary_lines = [
        "FAILED tests/test_build.py::test_one - AssertionError: the tag is left",
        "ERROR tests/test_push.py::test_two - RuntimeError: no registry",
    ]
    docker = "\n".join(["collected 3 items", "E   assert 1 == 2", "=== short test summary info ===", *summary_lines, "1 failed, 1 error"])
    jobs = [
        Job("docker", py(f"import sys; print({docker!r}); sys.exit(1)")),
        Job("bench", py("import sys; print('\\n'.join(f'line {i}' for i in range(20))); sys.exit(2)")),
        Job("unit", py("print('FAILED tests/x.py::y - never shown: this job passed')")),
    ]
    runner = run(jobs, tmp_path)
    said = runner.failures(tail=3).splitlines()
    assert said == [
        "docker failed (exit 1); its failed tests:",
        *(f"  {line}" for line in summary_lines),
        "bench failed (exit 2); the end of its log:",
        "  line 17",
        "  line 18",
        "  line 19",
    ]
    assert run([Job("unit", py("print('ok')"))], tmp_path).failures() == ""


def test_a_job_that_cannot_start_fails_and_its_dependents_do_not_run(tmp_path: Path) -> None:
    def no_env_file() -> dict[str, str]:
        raise FileNotFoundError("/nowhere/env")

    jobs = [Job("docker", py("print('never')"), env=no_env_file), Job("bench", py("print('never')"), needs=("docker",))]
    assert not run(jobs, tmp_path).ok
    assert [j.result for j in jobs] == [FAILED, NOT_RUN] and "/nowhere/env" in jobs[0].detail


def test_a_missing_arm64_stand_in_fails_where_it_was_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import arm64_standin

    monkeypatch.delenv("ASCENDKIT_STANDIN_IMAGE_ARM64", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("ASCENDKIT_ARM64", "1")
    with pytest.raises(pytest.fail.Exception, match="no arm64 stand-in although ASCENDKIT_ARM64=1"):
        arm64_standin()
    monkeypatch.setenv("ASCENDKIT_ARM64", "0")
    with pytest.raises(pytest.skip.Exception):
        arm64_standin()
    monkeypatch.setenv("ASCENDKIT_STANDIN_IMAGE_ARM64", "ascendkit-standin/cann:arm64")
    assert arm64_standin() == "ascendkit-standin/cann:arm64"


def test_the_arm64_stand_in_made_later_is_waited_for_and_its_failure_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CI makes the arm64 stand-in in a job of its own (`services arm64-standin`) beside the amd64 tests:
    a test that needs it waits for the state file that job writes, and fails with what it says."""
    import tests.conftest
    from tests.conftest import arm64_standin

    state = tmp_path / "standin-arm64.state"
    monkeypatch.setenv("ASCENDKIT_STANDIN_IMAGE_ARM64", "ascendkit-standin/cann:arm64")
    monkeypatch.setenv(ARM64_STATE_VAR, str(state))
    threading.Timer(1.0, state.write_text, ("ready\n",)).start()
    started = time.monotonic()
    assert arm64_standin() == "ascendkit-standin/cann:arm64"
    assert time.monotonic() - started >= 1.0, "it waited for the job"
    state.write_text("failed: [services] debootstrap (arm64) failed\n")
    with pytest.raises(pytest.fail.Exception, match=r"cann:arm64: failed: \[services\] debootstrap \(arm64\) failed"):
        arm64_standin()
    state.unlink()
    monkeypatch.setattr(tests.conftest, "ARM64_STANDIN_WAIT_S", 0)
    with pytest.raises(pytest.fail.Exception, match="not there after 0 s"):
        arm64_standin()


def test_each_job_runs_in_its_own_cpu_group_and_the_table_shows_what_it_used(tmp_path: Path) -> None:
    """Each job joins its group before it runs anything (its children with it); the table reads each
    group's cpuacct.usage. A directory stands in for the cgroup hierarchy: the kernel's is root's."""
    hierarchy, weights = tmp_path / "cgroup" / "cpuacct", tmp_path / "cgroup" / "cpu"
    hierarchy.mkdir(parents=True)
    weights.mkdir()
    account = cpuacct.CpuAccount.create("run", hierarchy, weights)
    assert account.root is not None and account.weights == weights / "run"
    jobs = [Job("unit", py("import os; print(os.getpid())")), Job("docker", py("print('ok')")), Job("lint", py("print('ok')"))]
    runner = Runner(jobs, tmp_path, os.environ, account)
    runner.run()
    assert jobs[0].process is not None and jobs[1].process is not None
    assert (account.root / "job-unit" / "cgroup.procs").read_text().strip() == str(jobs[0].process.pid)
    # and in the cpu hierarchy's group of the same name, weighted: the docker job is on the longest chain
    assert (weights / "run" / "job-unit" / "cgroup.procs").read_text().strip() == str(jobs[0].process.pid)
    assert (weights / "run" / "job-docker" / "cgroup.procs").read_text().strip() == str(jobs[1].process.pid)
    shares = {path.parent.name: int(path.read_text()) for path in (weights / "run").glob("*/cpu.shares")}
    assert shares == {"job-unit": 1024, "job-docker": 4096, "job-lint": 1024}
    assert int((weights / "run" / "cpu.shares").read_text()) == cpuacct.RUN_SHARES == 16 * 1024, "as much as 16 busy processes outside"
    assert runner.base_env[cpuacct.ENV_VAR] == str(account.root)
    (account.root / "job-unit" / "cpuacct.usage").write_text(str(90 * 10**9))
    (account.root / "engine-docker").mkdir()
    (account.root / "engine-docker" / "cpuacct.usage").write_text(str(600 * 10**9))
    table = runner.summary().splitlines()
    assert table[0].split()[4] == "cpu" and table[1].split()[4] == "1.5m", table
    assert "core-minutes: docker 10.0" in table[4]
    for group in (account.root, weights / "run"):
        for path in group.rglob("*"):
            if path.is_file():
                path.unlink()  # the kernel's files go with their group
    for path in (weights / "run").glob("*"):
        path.rmdir()
    (weights / "run").rmdir()
    account.remove()
    assert not account.root.exists()


def test_without_a_cpu_hierarchy_nothing_is_measured_and_the_table_says_so(tmp_path: Path) -> None:
    account = cpuacct.CpuAccount.create("run", tmp_path / "nowhere" / "cpuacct", tmp_path / "nowhere" / "cpu")
    assert account.root is None and account.wrap("job-unit", ["true"]) == ["true"]
    hierarchy = tmp_path / "cpuacct"
    hierarchy.mkdir()
    measured = cpuacct.CpuAccount.create("run", hierarchy, tmp_path / "nowhere" / "cpu")  # measured, not weighted
    assert measured.weights is None and measured.wrap("job-unit", ["true"])[-3:] == [str(hierarchy / "run" / "job-unit"), "-", "true"]
    runner = run([Job("unit", py("print(1)"))], tmp_path)
    assert "CPU per job: not measured" in runner.summary()


def test_a_docker_job_names_its_tests_that_used_the_most_cpu(tmp_path: Path) -> None:
    """tests/harness/cpu_report.py: each test is charged what its engine's group used while it ran, and
    the session ends with them ranked. A file stands in for the engine group's counter; the tests below
    'build' by adding to it, as the kernel would while the engine works for them."""
    group = tmp_path / "cgroup" / "run" / "engine-docker-b"
    group.mkdir(parents=True)
    usage = group / "cpuacct.usage"
    usage.write_text("0")
    (tmp_path / "test_some.py").write_text(
        "from pathlib import Path\n"
        f"USAGE = Path({str(usage)!r})\n"
        "def spend(seconds):\n"
        "    USAGE.write_text(str(int(USAGE.read_text()) + seconds * 10**9))\n"
        "def test_cheap():\n    spend(2)\n"
        "def test_dear():\n    spend(300)\n"
        "def test_nothing():\n    pass\n"
    )
    env = {**os.environ, cpuacct.ENV_VAR: str(group.parent), "DOCKER_HOST": "unix:///tmp/state/docker-b.sock", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.harness.cpu_report", "-p", "no:cacheprovider", "-c", os.devnull, "test_some.py"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = proc.stdout.split("the 3 tests that used the most CPU", 1)[1].splitlines()[1:5]
    assert report[0].startswith("core-seconds: the engine (engine-docker-b) 302, the tests' own processes "), report
    ranked = [line.split()[-1] for line in report[1:]]
    assert ranked == ["test_some.py::test_dear", "test_some.py::test_cheap", "test_some.py::test_nothing"], report
    assert report[1].split()[:4] == ["300.0", "=", "300.0", "engine"], report

    elsewhere = {**env, "DOCKER_HOST": "unix:///tmp/state/docker.sock"}  # an engine with no group: nothing measured, nothing said
    unmeasured = subprocess.run(argv, cwd=tmp_path, env=elsewhere, capture_output=True, text=True, check=False)
    assert unmeasured.returncode == 0 and "used the most CPU" not in unmeasured.stdout
