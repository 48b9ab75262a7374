"""CPU time per CI job and per engine: where the machine's two cores go during `make test`.

Wall time alone cannot say which job to make cheaper when every job shares the same two cores:
a job that waits on the others looks as slow as one that keeps them busy. cgroup v1's cpuacct
controller counts the CPU every process in a group used, its children's included, whatever
process they were reparented to. Each job runs in a group of its own (``job-<name>``), each
dockerd in ``engine-<name>`` with its containers under it (``--cgroup-parent``: BuildKit's steps,
the classic builder's, every container a test runs), so the CPU of a build is charged to the
engine that ran it, not to the job that asked for it.

The same groups, made in the cpu controller's hierarchy too, say how the cores are shared. Without
them the kernel shares them by session: each job (a session of its own, so an autogroup) weighs as
much as one busy process, and all the engines' containers together (every build step, every qemu
process) one group of that same weight, so with eight jobs running the builds the docker jobs wait
on got about a ninth of the machine while the unit tests ran. Here every job and every engine
weighs the same, and those on the longest chains (PRIORITY) four times as much; the run's own group
weighs as much as sixteen busy processes outside it. That decides which work goes first, not how
much there is: a run whose jobs keep both cores busy (CI20 and CI21: 98 %) ends when their CPU,
summed, does.

Where there is no writable cpuacct hierarchy (cgroup v2 only, no root), nothing is measured and the
table says so; where there is no cpu hierarchy, nothing is weighted; nothing else changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller: a group's weight is its cpu.shares
ENV_VAR = "ASCENDKIT_CPUACCT"  # the run's group, for tests.harness.services to put its engines in

SHARES = 1024  # the kernel's default weight: every job and engine not in PRIORITY
RUN_SHARES = 16 * SHARES  # the run against the machine's other work
# The longest chains of `make test` (tests/harness/ci.py): the services, which every engine's job waits for;
# the docker and docker-b jobs, each its tests one after another on one engine; the arm64 stand-in's
# debootstrap (its packages' scripts under qemu), then the emulated job's install and imports under qemu. The other jobs run at once
# beside them and take what is left. docker-b ended every run last while it weighed as the rest (CI31 fresh:
# at 49.5 of 49.9 min; CI32 warm: 35.8 of 36.3): its share of the two cores, an eighth, is what it used
# (9 core-min in 34.6 min), so its tests waited for the CPU, not on their registries and Ray.
CRITICAL = (
    "job-services",
    "job-docker",
    "engine-docker",
    "job-docker-b",
    "engine-docker-b",
    "job-arm64-standin",
    "job-emulated",
    "engine-docker-emulated",
)
PRIORITY = {name: 4 * SHARES for name in CRITICAL}

# Joins the groups named by $0 (cpuacct) and $1 (cpu; "-": none), then becomes the command: every
# process it starts is in them too. Best effort: where the kernel refuses the move, the command runs
# all the same (only unmeasured, or unweighted).
_JOIN = 'echo $$ 2>/dev/null > "$0/cgroup.procs"; if [ "$1" != - ]; then echo $$ 2>/dev/null > "$1/cgroup.procs"; fi; shift; exec "$@"'


def _weigh(path: Path, shares: int) -> None:
    with contextlib.suppress(OSError):
        (path / "cpu.shares").write_text(f"{shares}\n")


class CpuAccount:
    """One run's groups under ``root`` (None: nothing measured) and, where the cpu controller is
    there, under ``weights`` (None: nothing weighted)."""

    def __init__(self, root: Path | None, weights: Path | None = None) -> None:
        self.root = root
        self.weights = weights

    @classmethod
    def create(cls, name: str, hierarchy: Path = CPUACCT, cpu_hierarchy: Path = CPU) -> CpuAccount:
        root = hierarchy / name
        try:
            root.mkdir(exist_ok=True)
        except OSError:
            return cls(None)
        weights = cpu_hierarchy / name
        try:
            weights.mkdir(exist_ok=True)
        except OSError:
            return cls(root)
        _weigh(weights, RUN_SHARES)
        return cls(root, weights)

    def group(self, name: str) -> Path | None:
        if self.root is None:
            return None
        path = self.root / name
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        return path

    def weight_group(self, name: str) -> Path | None:
        """Group ``name`` in the cpu hierarchy, weighted by PRIORITY (made before anything joins it)."""
        if self.weights is None:
            return None
        path = self.weights / name
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        _weigh(path, PRIORITY.get(name, SHARES))
        return path

    def wrap(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in group ``name``."""
        path = self.group(name)
        if path is None:
            return list(argv)
        weighed = self.weight_group(name)
        return ["sh", "-c", _JOIN, str(path), str(weighed) if weighed is not None else "-", *argv]

    def seconds(self) -> dict[str, float]:
        """CPU seconds each group used so far, its descendants' included."""
        if self.root is None:
            return {}
        used = {}
        for path in sorted(p for p in self.root.iterdir() if p.is_dir()):
            with contextlib.suppress(OSError, ValueError):
                used[path.name] = int((path / "cpuacct.usage").read_text()) / 1e9
        return used

    def remove(self) -> None:
        """Every group, deepest first, in this hierarchy and in the others where dockerd made its
        containers' (a group with processes left in it stays, harmlessly)."""
        if self.root is None:
            return
        hierarchies = [self.root.parent, *(p for p in self.root.parent.parent.iterdir() if p != self.root.parent)]
        for top in (h / self.root.name for h in hierarchies):
            if not top.is_dir():
                continue
            for path in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
                with contextlib.suppress(OSError):
                    path.rmdir()


def engine_group(engine: str) -> tuple[list[str], list[str]] | None:
    """For tests.harness.services: (the prefix that starts dockerd in the engine's group, the
    dockerd options that put its containers under it), when the CI run measures (``$ASCENDKIT_CPUACCT``)."""
    root = os.environ.get(ENV_VAR)
    if not root:
        return None
    weights = CPU / Path(root).relative_to(CPUACCT) if Path(root).is_relative_to(CPUACCT) else None
    account = CpuAccount(Path(root), weights if weights is not None and weights.is_dir() else None)
    path = account.group(f"engine-{engine}")
    assert path is not None
    relative = "/" + path.relative_to(CPUACCT).as_posix()  # the parent's path in every hierarchy, as dockerd takes it
    return account.wrap(f"engine-{engine}", []), ["--cgroup-parent", f"{relative}/containers"]
