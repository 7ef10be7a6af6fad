"""What the scheduler daemon tells its metrics: the observer it calls and the view it offers.

The daemon calls a `SchedulerObserver` as things happen (a filter answered, a bind done, a
booking expired...); `hami_plugin.extender.metrics` implements it over the Prometheus types of
`hami_plugin.metrics.families`, so the rest of the daemon knows nothing of Prometheus.
`NullObserver` is the default when no metrics server runs. Usage gauges are not pushed: a
collector reads `SchedulerView.usage_snapshot()` at scrape time.

Observer methods are called on request and worker threads, never under the state lock; an
implementation must be thread-safe and must not block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "FILTER_OUTCOMES",
    "PREEMPTION_OUTCOMES",
    "RECOVERY_REASONS",
    "NullObserver",
    "SchedulerObserver",
    "SchedulerView",
]

FILTER_OUTCOMES = ("fit", "no_fit", "error", "no_gpu")
"""The `outcome` values of `SchedulerObserver.filter_done`."""
RECOVERY_REASONS = ("allocation_timeout", "owner_gone", "lock_expired")
PREEMPTION_OUTCOMES = ("preempted", "no_victims", "waiting", "never", "failed")
"""`Planner.preempt`'s outcomes (`no_gpu` is never observed: such a pod fits everywhere), and
`failed`: the victims could not be evicted."""
"""The `reason` values of `SchedulerObserver.pod_recovered`."""


class SchedulerObserver(Protocol):
    """Events of the scheduler daemon, for metrics."""

    def filter_done(self, seconds: float, outcome: str) -> None:
        """A /filter call answered; `outcome` is one of FILTER_OUTCOMES."""

    def filter_failures(self, reasons: Mapping[str, int]) -> None:
        """A /filter call that found no node: per reason (a FitReason value such as
        `CardInsufficientMemory`, or `NodeUnregistered` / `NodeInsufficientDevice`), how many
        nodes failed with it."""

    def bind_done(self, seconds: float, ok: bool) -> None:
        """A /bind call answered."""

    def bind_waited(self, seconds: float) -> None:
        """Time a bind waited for a node lock or for an in-flight pod of its node."""

    def booking_expired(self) -> None:
        """A filter booking that no bind followed was freed."""

    def filter_fanned_out(self) -> None:
        """A filter answered a later node than the policy's first, on which the bind would
        have waited (a burst fanning out)."""

    def pod_recovered(self, reason: str) -> None:
        """The recovery loop undid something stuck; `reason` is one of RECOVERY_REASONS."""

    def leader_changed(self, is_leader: bool) -> None:
        """This replica started or stopped leading."""

    def preemption_attempted(self, outcome: str) -> None:
        """A GPU pod that fit nowhere was considered for preemption; `outcome` is one of
        PREEMPTION_OUTCOMES."""

    def preemption_victims(self, count: int) -> None:
        """A preemption evicted `count` victims."""

    def preemptor_running(self, seconds: float) -> None:
        """A pod that preempted others runs, `seconds` after its creation."""


class SchedulerView(Protocol):
    """The daemon's state as metrics read it at scrape time (thread-safe snapshots)."""

    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        """Every registered node's usage and every tracked pod's booking, taken together."""

    def is_leader(self) -> bool:
        """Whether this replica serves filter and bind now."""


class NullObserver:
    """An observer that records nothing (no metrics server)."""

    def filter_done(self, seconds: float, outcome: str) -> None:
        return None

    def filter_failures(self, reasons: Mapping[str, int]) -> None:
        return None

    def bind_done(self, seconds: float, ok: bool) -> None:
        return None

    def bind_waited(self, seconds: float) -> None:
        return None

    def booking_expired(self) -> None:
        return None

    def filter_fanned_out(self) -> None:
        return None

    def pod_recovered(self, reason: str) -> None:
        return None

    def leader_changed(self, is_leader: bool) -> None:
        return None

    def preemption_attempted(self, outcome: str) -> None:
        return None

    def preemption_victims(self, count: int) -> None:
        return None

    def preemptor_running(self, seconds: float) -> None:
        return None
