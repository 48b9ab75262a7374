"""CPU time per CI job and per engine: where the machine's two cores go during `make test`.

Wall time alone cannot say which job to make cheaper when every job shares the same two cores:
a job that waits on the others looks as slow as one that keeps them busy. cgroup v1's cpuacct
controller counts the CPU every process in a group used, its children's included, whatever
process they were reparented to. Each job runs in a group of its own (``job-<name>``), each
dockerd in ``engine-<name>`` with its containers under it (``--cgroup-parent``: BuildKit's steps,
the classic builder's, every container a test runs), so the CPU of a build is charged to the
engine that ran it, not to the job that asked for it.

Where there is no writable cpuacct hierarchy (cgroup v2 only, no root), nothing is measured and the
table says so; nothing else changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
ENV_VAR = "ASCENDKIT_CPUACCT"  # the run's group, for tests.harness.services to put its engines in

# Joins the group named by $0, then becomes the command: every process it starts is in the group too.
# Best effort: where the kernel refuses the move, the command runs all the same (only unmeasured).
_JOIN = 'echo $$ 2>/dev/null > "$0/cgroup.procs"; exec "$@"'


class CpuAccount:
    """One run's groups under ``root`` (None: nothing measured)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @classmethod
    def create(cls, name: str, hierarchy: Path = CPUACCT) -> CpuAccount:
        root = hierarchy / name
        try:
            root.mkdir(exist_ok=True)
        except OSError:
            return cls(None)
        return cls(root)

    def group(self, name: str) -> Path | None:
        if self.root is None:
            return None
        path = self.root / name
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        return path

    def wrap(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in group ``name``."""
        path = self.group(name)
        return list(argv) if path is None else ["sh", "-c", _JOIN, str(path), *argv]

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
    account = CpuAccount(Path(root))
    path = account.group(f"engine-{engine}")
    assert path is not None
    relative = "/" + path.relative_to(CPUACCT).as_posix()  # the parent's path in every hierarchy, as dockerd takes it
    return account.wrap(f"engine-{engine}", []), ["--cgroup-parent", f"{relative}/containers"]
