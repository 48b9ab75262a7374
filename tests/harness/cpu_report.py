"""The CPU each docker test cost, its engine's builds and containers included: a pytest plugin.

CI's closing table says how many core-minutes each engine used (tests/harness/cpuacct.py); this says
which tests used them. Under `make test`, where every job has an engine of its own and cgroup v1's
cpuacct counts each engine's dockerd, BuildKit and containers apart, a test's cost is what its
engine's group used while it ran (setup, call and teardown: a session fixture's build is charged to
the first test that needs it, as ``--durations`` does) plus what this process and its children
used. At the end the session prints its most expensive tests beside their wall time.

It does nothing where nothing is measured: no ``$ASCENDKIT_CPUACCT``, no engine socket named by
``DOCKER_HOST`` (the unit jobs), or no group for that engine.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.cpuacct import ENV_VAR

SHOWN = 15


def engine_usage_file(env: Mapping[str, str] = os.environ) -> Path | None:
    """The cpuacct counter of the engine ``DOCKER_HOST`` names (``unix://.../<engine>.sock``), if measured."""
    root, host = env.get(ENV_VAR), env.get("DOCKER_HOST", "")
    if not root or not host.startswith("unix://") or not host.endswith(".sock"):
        return None
    usage = Path(root) / f"engine-{Path(host.removeprefix('unix://')).stem}" / "cpuacct.usage"
    return usage if usage.is_file() else None


def _own_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class CpuReport:
    usage: Path
    costs: list[tuple[float, float, float, str]] = field(default_factory=list)  # (engine s, own s, wall s, test)

    def engine_seconds(self) -> float:
        try:
            return int(self.usage.read_text()) / 1e9
        except (OSError, ValueError):  # the group went away (the services stopped): counted as nothing
            return 0.0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        engine, own, wall = self.engine_seconds(), _own_seconds(), time.monotonic()
        yield
        used = max(self.engine_seconds() - engine, 0.0)
        self.costs.append((used, _own_seconds() - own, time.monotonic() - wall, item.nodeid))

    def lines(self, shown: int = SHOWN) -> list[str]:
        ranked = sorted(self.costs, key=lambda c: c[0] + c[1], reverse=True)[:shown]
        engine_total = sum(c[0] for c in self.costs)
        own_total = sum(c[1] for c in self.costs)
        rows = [f"core-seconds: the engine ({self.usage.parent.name}) {engine_total:.0f}, the tests' own processes {own_total:.0f}"]
        rows += [f"{e + o:8.1f} = {e:7.1f} engine + {o:6.1f} own   {w:7.1f}s wall  {n}" for e, o, w, n in ranked]
        return rows

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.costs:
            terminalreporter.write_sep("=", f"the {min(SHOWN, len(self.costs))} tests that used the most CPU")
            for line in self.lines():
                terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    usage = engine_usage_file()
    if usage is not None and not hasattr(config, "workerinput"):  # one report per session, not per xdist worker
        config.pluginmanager.register(CpuReport(usage), "ascendkit-cpu-report")
