"""The one retry policy: how often something is tried and how long between tries.

Every retry of both daemons is a `RetryPolicy`; what is retried is the failure the loop using it
catches:

* API calls (`call_with_retries`, under `hami_plugin.kube.transport`): 429, 5xx, connection
  errors and timeouts (`Retryable`), with exponential backoff and jitter. urllib3's own retries
  are switched off by the client, so a hanging server costs `timeout_seconds` per attempt, not
  four times that; a caller's time budget (the client's `deadline()`) cuts both the attempts'
  timeouts and the retries;
* read, decide, write under a resourceVersion precondition (`CONFLICT_RETRIES`: the node lock
  in `hami_plugin.kube.nodelock`, the pod patches of bind and recovery): a `Conflict` reads again
  at once;
* the loops that run until stopped (kubelet registration, the write-behind queue, the
  informers) and kubelet's PodResources API (RESOURCE_EXHAUSTED): their own schedules.

A pause waits on the loop's stop event where it has one, else through an injected `sleep`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from hami_plugin.clock import Clock
from hami_plugin.kube.errors import Retryable, translate_errors

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

Sleep = Callable[[float], None]

TimeLeft = Callable[[], tuple[float, float] | None]
"""(seconds left, whole budget) of the calling thread's time budget, or None without one."""

_MAX_DOUBLINGS = 64
"""Retries past this many double the pause no further (it is at its cap long before)."""

_RANDOM = random.Random()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often something is tried, and the pauses between tries.

    `attempts` counts the first try (a loop that runs until stopped takes only the pauses).
    The pause before retry k (1-based) is `steps[k-1]` when `steps` are given (the last one
    repeating), else b = min(initial * 2**(k-1), max); with `jitter` it is drawn uniformly from
    [b/2, b]. `timeout_seconds` bounds each attempt of an API call (`call_with_retries`).
    """

    attempts: int = 5
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 2.0
    timeout_seconds: float = 10.0
    jitter: bool = True
    steps: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if min(self.initial_backoff_seconds, self.max_backoff_seconds, *self.steps) < 0:
            raise ValueError("RetryPolicy backoff seconds must be >= 0")
        if self.timeout_seconds <= 0:
            raise ValueError(f"RetryPolicy.timeout_seconds must be > 0, got {self.timeout_seconds}")

    def backoff_seconds(self, retry: int, rng: random.Random | None = None) -> float:
        """The pause before retry number `retry` (1-based), its jitter drawn from `rng`."""
        if self.steps:
            ceiling = self.steps[min(retry, len(self.steps)) - 1]
        else:
            doublings = min(retry, _MAX_DOUBLINGS) - 1
            ceiling = min(self.initial_backoff_seconds * 2**doublings, self.max_backoff_seconds)
        if not self.jitter:
            return ceiling
        return (rng or _RANDOM).uniform(ceiling / 2, ceiling)

    def pause_after(self, previous: float | None) -> float:
        """The pause after one of `previous` seconds (None: the first pause): twice as long, at
        most `max_backoff_seconds`, no jitter. For a loop whose kinds of failure (each with its
        own policy) share one growing pause, as kubelet registration's do."""
        if previous is None:
            return self.initial_backoff_seconds
        return min(previous * 2, self.max_backoff_seconds)

    def tries(
        self,
        *,
        stop: threading.Event | None = None,
        sleep: Sleep = time.sleep,
        ends_at: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Iterator[int]:
        """The attempt numbers 1, 2, ... for a loop that `continue`s after a failure it
        retries and leaves by `return`, `break` or `raise` otherwise.

        Before each retry it pauses (`backoff_seconds`): on `stop` when given (set: no more
        tries), else through `sleep`. It yields `attempts` numbers at most, and none whose
        pause would reach `ends_at` (a `monotonic()` time).
        """
        attempt = 1
        while True:
            yield attempt
            if attempt >= self.attempts:
                return
            pause = self.backoff_seconds(attempt)
            if ends_at is not None and monotonic() + pause >= ends_at:
                return
            if (pause > 0 or stop is not None) and stopped_during(pause, stop, sleep):
                return
            attempt += 1


CONFLICT_RETRIES = RetryPolicy(attempts=3, initial_backoff_seconds=0.0, jitter=False)
"""Read, decide and write again after a `Conflict`, three times, at once: the write that won
the race is over by the time the object is read again."""


def stopped_during(seconds: float, stop: threading.Event | None, sleep: Sleep) -> bool:
    """Pause `seconds` on `stop` when given, else through `sleep`; True when `stop` was set."""
    if stop is None:
        sleep(seconds)
        return False
    return stop.wait(seconds)


def call_with_retries(
    what: str,
    attempt: Callable[[float], _T],
    policy: RetryPolicy,
    *,
    rng: random.Random,
    sleep: Sleep,
    time_left: TimeLeft,
    clock: Clock,
    stop: threading.Event | None = None,
) -> _T:
    """Run `attempt(timeout_seconds)` with retries, its failures translated (`what` names the
    call in every message; `clock` reads a `Retry-After` date, see `translate_errors`).

    The server's `Retry-After` replaces the pause (capped at `max_backoff_seconds`). Raises
    NotFound, Conflict, Gone, KubeError at once and Retryable after the last attempt, as soon
    as `time_left` does not allow another one, or when `stop` is set during a backoff.
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
            if stopped_during(delay, stop, sleep):
                raise Retryable(f"{exc} (stopped after {retry} attempts)", exc.status) from (
                    exc.__cause__
                )
