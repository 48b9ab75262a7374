"""Cancellation: SIGTERM is handled like Ctrl-C, and a short commit can hold both off.

CI systems and Kubernetes stop a run with SIGTERM. :func:`terminate_like_interrupt` makes it raise
:class:`Terminated`, a :class:`KeyboardInterrupt`, so every ``except KeyboardInterrupt`` and
``finally`` that cleans up after Ctrl-C (the build's containers, the smoke job's container) does the
same for SIGTERM; the CLI exits 143 for it (128 + 15) and 130 for SIGINT. A second SIGTERM while
cleaning up is ignored: cleanup is what the first one asked for.

:func:`deferred` holds both signals off for a few lines that must happen together or not at all
(a build's manifest and its tags), then delivers the one that arrived.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from buildkit.errors import Interrupted


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop like Ctrl-C, exit 143."""


def signal_exit_code(exc: BaseException) -> int:
    """143 for SIGTERM, 130 for Ctrl-C (the shell's 128 + signal number)."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup that follows is not cut short
    raise Terminated()


def terminate_like_interrupt() -> None:
    """Raise :class:`Terminated` in the main thread on SIGTERM (the CLI's entry point calls this)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the block to its end even if SIGINT or SIGTERM arrives; then raise what arrived.

    Only in the main thread (elsewhere signals are not delivered, and the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    for sig in previous:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    for sig in previous:  # once each, to the handlers just restored; SIGTERM first when both came
        if sig in pending:
            signal.raise_signal(sig)


def stopped_by(exc: BaseException) -> str:
    """``terminated (SIGTERM)`` or ``interrupted (Ctrl-C)``: how a message about a stopped run starts."""
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"


def interrupted(exc: BaseException, what: str) -> Interrupted:
    """The error a stopped run ends with: ``<how it was stopped>: <what>``, exit 143 for SIGTERM, 130 for Ctrl-C."""
    return Interrupted(f"{stopped_by(exc)}: {what}", terminated=isinstance(exc, Terminated))
