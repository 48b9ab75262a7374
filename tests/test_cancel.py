"""SIGTERM is handled like Ctrl-C, and a commit held off by `deferred` finishes before either lands.
(The engine-side proofs, a SIGTERM mid-build and mid-smoke leaving nothing behind, are in
tests/test_build.py and tests/test_smoke_docker.py.)"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from buildkit.cancel import Terminated, deferred, signal_exit_code, stopped_by, terminate_like_interrupt
from buildkit.errors import ExitCode, Interrupted


@pytest.fixture
def handlers() -> Iterator[None]:
    """Python's own Ctrl-C handler, as ascendkit has it in a terminal: a test run started in the
    background (`cmd &`, nohup) inherits SIGINT ignored, and a held SIGINT would then land nowhere."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_sigterm_raises_terminated_once_then_is_ignored_while_cleaning_up(handlers: None) -> None:
    terminate_like_interrupt()
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, "a second SIGTERM must not cut the cleanup short"
    os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing raised, the test goes on


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_deferred_block_runs_to_its_end_then_the_signal_lands(handlers: None, signum: int, raised: type[BaseException]) -> None:
    terminate_like_interrupt()
    steps = []
    with pytest.raises(raised):
        with deferred():
            steps.append("manifest")
            os.kill(os.getpid(), signum)
            steps.append("tags")
        steps.append("after")  # never: the held signal is raised as the block ends
    assert steps == ["manifest", "tags"]


def test_deferred_without_a_signal_changes_nothing(handlers: None) -> None:
    terminate_like_interrupt()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with deferred():
        pass
    assert {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} == before


def test_exit_codes_and_words_say_which_signal() -> None:
    assert signal_exit_code(Terminated()) == ExitCode.TERMINATED and int(ExitCode.TERMINATED) == 143
    assert signal_exit_code(KeyboardInterrupt()) == ExitCode.INTERRUPTED and int(ExitCode.INTERRUPTED) == 130
    assert stopped_by(Terminated()) == "terminated (SIGTERM)" and stopped_by(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert Interrupted("x", terminated=True).exit_code == 143 and Interrupted("x").exit_code == 130
