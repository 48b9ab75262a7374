"""A buildx that stalls the engine once the image is exported: the fault that makes BuildKit before
v0.14 (Docker 26's) fail a build it has finished, because recording it in its history took over
the 20 s it gives that (moby/buildkit#4327; an engine this busy or a disk this slow).

    ASCENDKIT_BUILDX=<a script running: python -m tests.harness.stall "$@">
    ASCENDKIT_STALL_BUILDX=<the real docker-buildx>
    ASCENDKIT_STALL_PID=<the engine's dockerd pid>   ASCENDKIT_STALL_COUNT=<a file: how many stalls are left>

Every command goes to the real buildx, its output passed on unchanged. In a ``build``, as soon as the
export vertex is reported complete (which is when BuildKit starts recording the build), the engine is
stopped (SIGSTOP) for ``STALL`` seconds and continued, while stalls are left in the count file. Frozen
past BuildKit's deadline, the engine fails the build on resuming (``failed to solve: DeadlineExceeded``),
as a slow one does by itself: the real engine's real answer, only brought about on purpose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from buildkit.image.progress import QuietReporter
from buildkit.image.solve import SolveProgress

STALL = 21.0  # seconds: past BuildKit's 20


def take_stall(count: Path) -> bool:
    """Whether a stall is left in ``count`` (then one fewer is)."""
    left = int(count.read_text() or "0")
    if left > 0:
        count.write_text(str(left - 1))
    return left > 0


def stall(pid: int, seconds: float = STALL) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def main(argv: list[str]) -> int:
    real = os.environ["ASCENDKIT_STALL_BUILDX"]
    if not argv or argv[0] != "build":
        os.execv(real, [real, *argv])
    pid, count = int(os.environ["ASCENDKIT_STALL_PID"]), Path(os.environ["ASCENDKIT_STALL_COUNT"])
    process = subprocess.Popen([real, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    progress, stalled = SolveProgress(QuietReporter()), False
    try:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            progress.feed_text(line)
            if progress.exported and not stalled:
                stalled = True
                if take_stall(count):
                    stall(pid)
        return process.wait()
    finally:
        if process.poll() is None:  # stopped from outside: buildx is stopped as ascendkit stops it
            process.send_signal(signal.SIGINT)
            process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
