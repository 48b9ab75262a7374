"""The harness's wait for a daemon it starts (tests/harness/containerd_node.py: containerd and soci's snapshotter):
it waits for the socket to accept, however long the machine's load makes that, and fails with the daemon's log
when the daemon ends first or never listens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import containerd_node
from tests.harness.containerd_node import wait_listening

LISTEN_LATE = """\
import socket, sys, time
time.sleep(float(sys.argv[2]))
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen()
time.sleep(60)
"""


def _start(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=out)
    return proc, log


@pytest.mark.slow
def test_a_daemon_that_listens_late_is_waited_for(tmp_path: Path) -> None:
    """Later than the 10 s the harness used to wait before going on without the socket (which left soci's pull
    to fail on a loaded machine): a sleep, no CPU."""
    sock = tmp_path / "d.sock"
    proc, log = _start(tmp_path, "-c", LISTEN_LATE, str(sock), "11")
    try:
        wait_listening(sock, proc, log, "late-daemon")
        assert proc.poll() is None and sock.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_daemon_that_ends_first_fails_with_its_log(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, "-c", "import sys; print('no config here', file=sys.stderr); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"(?s)early-daemon ended \(exit 3\) before it listened: .*no config here"):
        wait_listening(tmp_path / "d.sock", proc, log, "early-daemon")


def test_a_daemon_that_never_listens_fails_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerd_node, "READY_S", 0.5)
    proc, log = _start(tmp_path, "-c", "import time; time.sleep(60)")
    try:
        with pytest.raises(RuntimeError, match=r"mute-daemon did not listen on .* in 0 s"):
            wait_listening(tmp_path / "d.sock", proc, log, "mute-daemon")
    finally:
        proc.kill()
        proc.wait()


def test_a_daemon_that_listens_but_does_not_answer_is_not_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerd_node, "READY_S", 0.5)
    sock = tmp_path / "d.sock"
    proc, log = _start(tmp_path, "-c", LISTEN_LATE, str(sock), "0")
    try:
        with pytest.raises(RuntimeError, match=r"deaf-daemon did not listen on .* and answer false in 0 s"):
            wait_listening(sock, proc, log, "deaf-daemon", answers=["false"])
    finally:
        proc.kill()
        proc.wait()
