"""How hard each API call tries: the retry policy and the loop that applies it.

Retries with exponential backoff and jitter on 429, 5xx, connection errors and timeouts
(`Retryable`); urllib3's own retries are switched off by the client so a hanging server costs
`timeout_seconds` per attempt, not four times that. A caller's time budget (the client's
`deadline()`) cuts both the attempts' timeouts and the retries.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hami_plugin.clock import Clock
from hami_plugin.kube.errors import Retryable, translate_errors

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

TimeLeft = Callable[[], tuple[float, float] | None]
"""(seconds left, whole budget) of the calling thread's time budget, or None without one."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard each API call tries.

    `attempts` counts the first try; the wait before retry k (1-based) is drawn uniformly from
    [b/2, b] with b = min(initial * 2**(k-1), max), or the server's Retry-After when it is given
    (capped at max). `timeout_seconds` bounds each attempt (connect + response).
    """

    attempts: int = 5
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 2.0
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.initial_backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("RetryPolicy backoff seconds must be >= 0")
        if self.timeout_seconds <= 0:
            raise ValueError(f"RetryPolicy.timeout_seconds must be > 0, got {self.timeout_seconds}")

    def backoff_seconds(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number `retry` (1-based), with jitter."""
        ceiling = min(self.initial_backoff_seconds * 2 ** (retry - 1), self.max_backoff_seconds)
        return rng.uniform(ceiling / 2, ceiling)


def call_with_retries(
    what: str,
    attempt: Callable[[float], _T],
    policy: RetryPolicy,
    *,
    rng: random.Random,
    sleep: Callable[[float], None],
    time_left: TimeLeft,
    clock: Clock,
    stop: threading.Event | None = None,
) -> _T:
    """Run `attempt(timeout_seconds)` with retries, its failures translated (`what` names the
    call in every message; `clock` reads a `Retry-After` date, see `translate_errors`).

    Raises NotFound, Conflict, Gone, KubeError at once and Retryable after the last attempt, as
    soon as `time_left` does not allow another one, or when `stop` is set during a backoff.
    """
    retry = 0
    while True:
        timeout = policy.timeout_seconds
        left = time_left()
        if left is not None:
            if left[0] <= 0:
                raise Retryable(f"{what}: not sent, its {left[1]:g} s time budget is spent")
            timeout = min(timeout, left[0])
        try:
            with translate_errors(what, clock=clock):
                return attempt(timeout)
        except Retryable as exc:
            retry += 1
            if retry >= policy.attempts:
                raise Retryable(
                    f"{exc} (gave up after {retry} attempts)", exc.status
                ) from exc.__cause__
            delay = policy.backoff_seconds(retry, rng)
            if exc.retry_after_seconds is not None:
                delay = min(exc.retry_after_seconds, policy.max_backoff_seconds)
            left = time_left()
            if left is not None and left[0] <= delay:
                raise Retryable(
                    f"{exc} (gave up after {retry} attempts: its {left[1]:g} s time budget "
                    "is spent)",
                    exc.status,
                ) from exc.__cause__
            logger.debug("%s; retry %d in %.3f s", exc, retry, delay)
            if stop is None:
                sleep(delay)
            elif stop.wait(delay):
                raise Retryable(f"{exc} (stopped after {retry} attempts)", exc.status) from (
                    exc.__cause__
                )
