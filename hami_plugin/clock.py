"""The daemon's two clocks, injected wherever time is read so tests can move time.

`now()` is wall-clock time (written into `hami.io/bind-time`, compared with lock and bind
times); `monotonic()` measures intervals: booking expiry, allocation ages, rate limits, the
durations the metrics report and the deadlines that end a wait. Only the waiting itself
(condition variables, events, sleeps, socket timeouts) takes real seconds; a wait that ends at
a deadline wakes at least once a second to read the clock again, so advancing a `ManualClock`
ends it. The one exception is the HTTP server's shutdown drain, bounded in real time so that a
manual clock cannot hold up a shutdown.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Wall-clock and monotonic time."""

    def now(self) -> datetime:
        """The current time, time-zone aware."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""


class SystemClock:
    """The real clocks; `now()` is in the local time zone (HAMi writes local times)."""

    def now(self) -> datetime:
        return datetime.now(UTC).astimezone()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told (tests, benchmarks). Thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._monotonic = 1000.0

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._monotonic += seconds
