"""Stopping on SIGINT / SIGTERM without a traceback, for the entry points and the wrappers that start them.

Ctrl-C in a terminal sends SIGINT to every process of the foreground group (the train scripts'
wrapper, the trainer, the SFT step, the retriever); ``kill`` or a job scheduler sends SIGTERM to one
process. Either way each of our processes stops once, cleaning up as it goes:

* :func:`stop_on_signals`: the first SIGINT or SIGTERM raises :class:`RunStopped` in the main
  thread, so ``finally`` blocks run (workers and Ray shut down, a checkpoint being written is
  discarded); later ones are ignored, so the clean-up is not cut short by a second Ctrl-C or by the
  copy a wrapper passes on.
* :func:`run_child`: a wrapper waits for its child instead of being interrupted, and passes on the
  signals it gets, so the child stops itself (entry points then exit with 128 + the signal's number).

Ray's own processes block SIGINT (Ray starts them so); the trainer stops them.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(KeyboardInterrupt):
    """A SIGINT or SIGTERM asked the process to stop (a ``KeyboardInterrupt``, as Ctrl-C is)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        """``"SIGINT"`` or ``"SIGTERM"``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's status for a process ended by this signal: 130 (SIGINT), 143 (SIGTERM)."""
        return 128 + self.signum


class Received:
    """The stop signal a :func:`stop_on_signals` block got (``signum`` None until one arrives).

    Some libraries turn the exception a signal handler raises into one of their own (Ray's waits
    raise a plain ``KeyboardInterrupt``), so the signal is recorded here as well.
    """

    signum: int | None = None


@contextmanager
def stop_on_signals() -> Iterator[Received]:
    """Within the block, the first SIGINT/SIGTERM raises :class:`RunStopped`; any later one is ignored.

    Yields the :class:`Received` record of that signal. After a stop the handlers stay ignoring (the
    process is about to exit; a signal during its last lines must not print a traceback); after a
    normal exit the previous handlers come back. Outside the main thread (where Python cannot take
    signals) the block runs unchanged.
    """
    received = Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def stop(signum, frame):
        if received.signum is not None:  # a second signal, or one that came before SIG_IGN took effect
            return
        received.signum = signum
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise RunStopped(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    try:
        yield received
    finally:
        if received.signum is None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_child(cmd: Sequence[str], **popen_kwargs) -> int:
    """Run ``cmd`` to its end, passing on every SIGINT/SIGTERM this process gets while it runs.

    The child is not killed: it receives the signal (as it would from the terminal) and stops itself,
    and this process waits for it, so whatever the child started is ended by the child.

    Returns:
        the child's exit status (``-N`` when signal N killed it; our entry points exit with 128 + N).
    """
    child = subprocess.Popen(list(cmd), **popen_kwargs)
    if threading.current_thread() is not threading.main_thread():
        return child.wait()

    def pass_on(signum, frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stopped_by_signal(returncode: int) -> bool:
    """Whether an exit status says a SIGINT/SIGTERM ended the process (``-N`` or ``128 + N``)."""
    return any(returncode in (-signum, 128 + signum) for signum in STOP_SIGNALS)
