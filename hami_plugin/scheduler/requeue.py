"""Which GPU pods kube-scheduler has parked, and when to nudge each one again: pure rules.

kube-scheduler 1.24 to 1.27 parks a pod whose extender call failed (connection refused while
`hami scheduler` restarts, "not the leader", "not synced") among its unschedulable pods, with
no plugin to blame; only a cluster event, an update of the pod itself, or the flush after 5
minutes moves it back (`docs/kube-scheduler.md` 2, 3). An annotation change is such an update
in every version (`docs/kube-scheduler.md` 4): `hami scheduler` writes
`hami-plugin.io/requeue` on each parked pod once it can answer again, and kube-scheduler
retries the pod after its backoff (at most 10 s).

`parked` says whether a pod is one of them; `RequeueTracker` remembers when each was last
nudged and how often, and nudges one pod again only while it stays parked, after 2 s, then
4, 8, up to 20 s apart (the retry after the first nudge can still fail: a Service that does
not route to this replica yet), and only while a window is open (opened when the extender
starts answering again). It holds an entry only for pods still parked at the last pass: its
size is bounded by the parked pods.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hami_plugin.protocol.objects import POD_PENDING, PodInfo
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "ANNOTATION_REQUEUE",
    "PARKED_REASONS",
    "RequeueTracker",
    "parked",
]

ANNOTATION_REQUEUE = "hami-plugin.io/requeue"
"""The time `hami scheduler` last asked kube-scheduler to retry the pod (ours, not HAMi's)."""

PARKED_REASONS = frozenset({"Unschedulable", "SchedulerError"})
"""`PodScheduled` reasons of a failed attempt: kube-scheduler 1.24 writes "Unschedulable" for
an extender error too, 1.26 and later "SchedulerError" (`docs/kube-scheduler.md` 2)."""


def parked(pod: PodInfo, scheduler_name: str, settings: SchedulerSettings) -> bool:
    """Whether kube-scheduler tried `pod` and gave up for now: Pending, not bound, not being
    deleted, of `scheduler_name`, asking for GPUs, `PodScheduled` False with a reason of
    `PARKED_REASONS`."""
    condition = pod.scheduled
    if condition is None or condition.status != "False" or condition.reason not in PARKED_REASONS:
        return False
    if pod.node_name or pod.deleting or pod.phase not in (POD_PENDING, ""):
        return False
    if pod.scheduler_name != scheduler_name:
        return False
    return pod_requests(pod, settings).wants_gpu


@dataclass(slots=True)
class RequeueTracker:
    """When each parked pod was last nudged, and the window in which nudging is on.

    Times are monotonic seconds passed in by the caller. `open_window(now, seconds)` turns
    nudging on until `now + seconds` (a later close wins); `due(pods, now)` returns the pods
    to nudge now, in the order given, and forgets pods no longer given (bound, deleted, or
    scheduled); `nudged(pod, now)` records a nudge that was written. The n-th nudge of a pod
    follows the one before by `first_interval_seconds * 2**(n-2)`, at most
    `max_interval_seconds`. `window_open(now)` lets
    the caller skip reading the pods at all while the window is shut.
    """

    first_interval_seconds: float = 2.0
    max_interval_seconds: float = 20.0
    window_until: float = float("-inf")
    _last: dict[str, tuple[str, float, int]] = field(default_factory=dict)
    """pod key -> (uid, monotonic time of the last nudge, nudges so far)."""

    def open_window(self, now: float, seconds: float) -> None:
        self.window_until = max(self.window_until, now + seconds)

    def window_open(self, now: float) -> bool:
        return now < self.window_until

    def due(self, pods: Iterable[PodInfo], now: float) -> list[PodInfo]:
        """The parked `pods` to nudge at `now`; none while the window is shut, and then
        nothing is remembered either."""
        if not self.window_open(now):
            self._last.clear()
            return []
        given = {pod.key: pod for pod in pods}
        for key in [key for key in self._last if key not in given]:
            del self._last[key]
        due = []
        for key, pod in given.items():
            last = self._last.get(key)
            if last is None or last[0] != pod.uid or now - last[1] >= self.interval(last[2]):
                due.append(pod)
        return due

    def interval(self, nudges: int) -> float:
        """How long after its `nudges`-th nudge a pod still parked is due again."""
        return min(
            self.first_interval_seconds * 2.0 ** max(nudges - 1, 0), self.max_interval_seconds
        )

    def nudged(self, pod: PodInfo, now: float) -> None:
        last = self._last.get(pod.key)
        count = last[2] + 1 if last is not None and last[0] == pod.uid else 1
        self._last[pod.key] = (pod.uid, now, count)

    def __len__(self) -> int:
        return len(self._last)
