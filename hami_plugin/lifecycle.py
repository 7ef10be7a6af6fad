"""Stopping a daemon from a signal handler without deadlocking it.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock: inside `threading.Event.wait`, which re-acquires its condition's lock
when it wakes. A handler that sets that same event then waits for a lock its own thread holds,
and the daemon ignores SIGTERM for ever (seen under load). `StopSignal.handle` only sets a
flag; the main thread, which alone waits through `StopSignal.wait`, turns it into the stop.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["StopSignal"]

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.5
"""How often the main thread's wait looks at the flag a handler set."""


class StopSignal:
    """A daemon's stop as its main thread waits for it: `stopped` set by `stop()` from any
    thread, or SIGTERM/SIGINT through `handle` (install it with `install`)."""

    def __init__(self, stop: Callable[[], None], stopped: threading.Event) -> None:
        self._stop = stop
        self._stopped = stopped
        self._signalled = False

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (call on the main thread)."""
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: a flag, no lock but logging's (re-entrant)."""
        logger.info("received %s: shutting down", signal.Signals(signum).name)
        self._signalled = True

    def wait(self, seconds: float) -> bool:
        """On the main thread: wait up to `seconds` for a stop; True once one came (a signal's
        is turned into `stop()` here)."""
        deadline = time.monotonic() + seconds
        while not self._signalled:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._stopped.is_set()
            if self._stopped.wait(min(left, _POLL_SECONDS)):
                return True
        self._stop()
        return True
