"""The client-side rate limit on API calls (`--kube-qps`, `--kube-burst`): a token bucket.

client-go throttles every request of a `rest.Config` with a token bucket of `QPS` tokens a
second and `Burst` tokens deep (`flowcontrol.NewTokenBucketRateLimiter`, over
golang.org/x/time/rate); HAMi's scheduler sets both from `--kube-qps` and `--kube-burst`
(v2.10.0 cmd/scheduler/main.go:75-77, pkg/util/client/options.go). This bucket behaves the
same way: it starts full, so `burst` calls go at once, and then one call every `1/qps`
seconds; a retry takes a token as a first attempt does (client-go throttles each try), and so
does opening a watch or a list page. Waiting is the caller's (`Transport.send`); a call whose
wait would outlast its time budget takes no token (x/time/rate's `Wait` with a deadline).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from hami_plugin.clock import Clock

__all__ = ["ClientRateLimit", "TokenBucket"]


@dataclass(frozen=True, slots=True)
class ClientRateLimit:
    """At most `qps` calls a second on average, `burst` of them at once."""

    qps: float
    burst: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.qps) or self.qps <= 0:
            raise ValueError(f"ClientRateLimit.qps must be a number > 0, got {self.qps}")
        if self.burst < 1:
            raise ValueError(f"ClientRateLimit.burst must be >= 1, got {self.burst}")


class TokenBucket:
    """`limit` over `clock.monotonic()`. Thread-safe; every caller shares one bucket."""

    def __init__(self, limit: ClientRateLimit, clock: Clock) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(limit.burst)
        self._stamp = clock.monotonic()

    def reserve(self, max_wait_seconds: float | None = None) -> float | None:
        """Take a token; the seconds to wait before sending (0: at once).

        The tokens taken by calls still waiting count, so callers queue in the order they
        came. With `max_wait_seconds`, a wait longer than that takes no token and returns None.
        """
        with self._lock:
            now = self._clock.monotonic()
            tokens = min(
                float(self.limit.burst), self._tokens + (now - self._stamp) * self.limit.qps
            )
            self._stamp = now
            tokens -= 1.0
            wait = 0.0 if tokens >= 0 else -tokens / self.limit.qps
            if max_wait_seconds is not None and wait > max_wait_seconds:
                self._tokens = tokens + 1.0
                return None
            self._tokens = tokens
            return wait
