"""Graceful stop on SIGTERM and SIGINT while the loop trains.

Inside ``with StopSignals(loop) as stop:`` the first SIGTERM or SIGINT only records the request
(:attr:`StopSignals.requested`, the signal's name) and wakes the event loop; the training loop
checks it between steps, finishes the step in progress, writes a checkpoint and returns
normally, so the run's ``finally`` shuts engines and actors down and ``plasmid train`` exits 0.
A second SIGINT raises ``KeyboardInterrupt`` at once (the CLI exits 130, without a checkpoint);
further SIGTERMs are ignored (a scheduler's SIGKILL follows if it will not wait).

The handlers are Python-level (``signal.signal``), not ``loop.add_signal_handler``: those run only
when the event loop gets control, which a trainer computing a step in the loop's thread withholds
for the whole step, so a second Ctrl-C could not act at once. Waking the loop with
``call_soon_threadsafe`` is what asyncio's own SIGINT handling (``asyncio.Runner``) does. The
previous handlers are restored on exit. Outside the main thread (where signals cannot be caught)
the context does nothing.

A second SIGINT must end the process even when what the interrupt unwinds hangs (an engine's
shutdown waiting on a server, interpreter exit joining a worker thread stuck in a long call): with
:func:`force_exit_after_second_interrupt` set, which the ``plasmid`` command's entry point does, the
second SIGINT also arms a timer that ends the process with status 130 after that many seconds.
Library use of the loop (tests, notebooks) keeps the plain ``KeyboardInterrupt``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from types import FrameType
from typing import Any

#: The signals that ask a run to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: seconds from a second SIGINT to a forced exit (``None``: never forced); see the module doc
_force_exit_seconds: float | None = None


def force_exit_after_second_interrupt(seconds: float | None) -> None:
    """From now on, a second SIGINT ends this process (``os._exit(130)``) if it has not exited
    ``seconds`` later; ``None`` turns that off. Called by the ``plasmid`` command's entry point."""
    global _force_exit_seconds
    _force_exit_seconds = seconds


def _exit_now() -> None:
    os.write(2, b"plasmid: still running after a second interrupt; exiting now\n")
    os._exit(130)



class StopSignals:
    """Catch SIGTERM and SIGINT for ``loop`` while inside the ``with`` block (see the module)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            if signum == signal.SIGINT:
                if _force_exit_seconds is not None:
                    timer = threading.Timer(_force_exit_seconds, _exit_now)
                    timer.daemon = True
                    timer.start()
                raise KeyboardInterrupt
            return
        self.requested = name
        # os.write, not print: a handler may run in the middle of another write to stderr.
        os.write(2, f"plasmid: {name} received: finishing this step, then writing a checkpoint "
                 f"and stopping (interrupt again to stop at once, without a checkpoint)\n".encode())
        self.loop.call_soon_threadsafe(lambda: None)
