"""The pods being allocated: bound (or being bound) but not yet served by the device plugin.

Per node, the in-flight pods as the allocate protocol (`protocol.inflight`) sees them: from the
watch (pods `allocating` and Pending), overridden by the binds of this process that the watch
has not shown yet. A bind to a node with the protocol waits while one of them could be confused
with its pod by kubelet's Allocate (`blocker`). The same watch events feed the pods `allocating`
the recovery loop times out (`stale`). Part of the book: not thread-safe, no I/O; a method that
reports a change makes the book wake waiting binds.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from hami_plugin.protocol import inflight
from hami_plugin.protocol.model import ANNOTATION_DEVICES_TO_ALLOCATE
from hami_plugin.protocol.objects import POD_PENDING, PodInfo
from hami_plugin.scheduler.book.trust import same_pod

__all__ = ["InFlightTracker", "StaleAllocation"]

logger = logging.getLogger(__name__)

_UNREADABLE = inflight.InFlightPod("", "", 0, (), ())
"""Stands for an in-flight pod whose booking cannot be read (it blocks its node)."""


@dataclass(frozen=True, slots=True)
class StaleAllocation:
    """A pod `allocating` for too long (recovery marks it failed)."""

    pod: PodInfo
    node: str
    since: datetime | None
    """When the allocation started (`hami.io/bind-time`), None when unreadable."""


@dataclass(slots=True)
class _Allocating:
    pod: PodInfo
    first_seen: float


class InFlightTracker:
    """In-flight pods per node (the watch's and this process's own) and the pods allocating."""

    def __init__(self) -> None:
        self._watch: dict[str, dict[str, inflight.InFlightPod]] = {}
        self._watch_node: dict[str, str] = {}  # pod key -> node of its watch entry
        self._own: dict[str, dict[str, inflight.InFlightPod]] = {}
        self._allocating: dict[str, _Allocating] = {}

    def on_node(self, node: str) -> dict[str, inflight.InFlightPod | None]:
        """Pod key -> in-flight view of a node's in-flight pods: the watch's, overridden by
        this process's binds; None for a pod whose to-allocate annotation is unreadable."""
        return {key: (None if pod is _UNREADABLE else pod) for key, pod in self._of(node).items()}

    def _of(self, node: str) -> dict[str, inflight.InFlightPod]:
        pods = dict(self._watch.get(node, {}))
        pods.update(self._own.get(node, {}))
        return pods

    def blocker(
        self,
        me: inflight.InFlightPod,
        node: str,
        key: str,
        level: int = 1,
        also: Iterable[inflight.InFlightPod] = (),
        *,
        assume_bound: bool = False,
    ) -> str | None:
        """Why pod `key` (in-flight view `me`) cannot be counted in flight on `node` now, or
        None when no other in-flight pod there could be confused with it (`level`: the node's
        `inflight.protocol_level`). `also` are more pods to count (bookings not claimed yet,
        read only as far as needed); `assume_bound`: as if every other pod's Binding had
        returned."""
        others = [pod for other, pod in self._of(node).items() if other != key]
        for pod in others:
            if pod is _UNREADABLE:
                return f"a pod in flight on node {node} has no readable booking"
        if assume_bound:
            others = [pod if pod.bound else replace(pod, bound=True) for pod in others]
        blocker = inflight.must_wait_for(me, itertools.chain(others, also), level=level)
        if blocker is None:
            return None
        return (
            f"node {node}: pod {blocker.namespace}/{blocker.name} is still being allocated "
            "and kubelet could not tell it from this one"
        )

    # --- this process's binds -------------------------------------------------------------------

    def claim(self, node: str, key: str, me: inflight.InFlightPod) -> None:
        """Count a bind's pod in flight on `node`, not bound yet."""
        self._own.setdefault(node, {})[key] = replace(me, bound=False)

    def mark_bound(self, node: str, key: str) -> bool:
        """The bind's Binding was created (kubelet orders the pod before later ones). Returns
        whether the pod was counted in flight there."""
        own = self._own.get(node, {})
        entry = own.get(key)
        if entry is None:
            return False
        own[key] = replace(entry, bound=True)
        return True

    def drop_own(self, key: str) -> bool:
        """Forget this process's in-flight entry of pod `key`; returns whether there was one."""
        dropped = False
        for node, own in list(self._own.items()):
            if own.pop(key, None) is not None:
                dropped = True
            if not own:
                del self._own[node]
        return dropped

    # --- the watch ------------------------------------------------------------------------------

    def has(self, node: str, key: str) -> bool:
        """Pod `key` counts in flight on `node` (the watch's or this process's)."""
        return key in self._own.get(node, {}) or key in self._watch.get(node, {})

    def watched(
        self, info: PodInfo, shape: Callable[[PodInfo], Hashable | None] | None = None
    ) -> bool:
        """Keep the node's in-flight view of a pod event: pods `allocating` and Pending (being
        deleted too, until they are gone); one whose to-allocate annotation is unreadable could
        be any Allocate, so it blocks every bind on its node. `shape` gives a pod's
        `InFlightPod.shape` (asked only of pods in flight). Returns whether the view changed."""
        key = info.key
        booking = info.booking
        node = booking.node if booking is not None else ""
        allocating = (
            booking is not None
            and bool(node)
            and booking.allocating
            and info.phase in (POD_PENDING, "")
        )
        entry = None
        if allocating:
            entry = inflight.in_flight_pod(info)
            if entry is not None and shape is not None:
                entry = replace(entry, shape=shape(info))
            if entry is None:
                logger.warning(
                    "pod %s allocating on node %s has no readable %s: no other pod is bound "
                    "there until it is gone",
                    key,
                    node,
                    ANNOTATION_DEVICES_TO_ALLOCATE,
                )
        changed = self.forget_watched(key, keep_node=node if allocating else None)
        if allocating:
            self._watch_node[key] = node
            pods = self._watch.setdefault(node, {})
            stored = entry if entry is not None else _UNREADABLE
            if pods.get(key) != stored:
                pods[key] = stored
                changed = True
        return changed

    def forget_watched(self, key: str, keep_node: str | None = None) -> bool:
        """Drop the watch's entry of pod `key` (unless it is on `keep_node`); returns whether
        there was one."""
        node = self._watch_node.get(key)
        if node is None or node == keep_node:
            return False
        pods = self._watch.get(node, {})
        pods.pop(key, None)
        if not pods:
            self._watch.pop(node, None)
        del self._watch_node[key]
        return True

    # --- allocations the recovery loop times out ------------------------------------------------

    def update_allocating(self, info: PodInfo, monotonic: float) -> None:
        """Track a pod `allocating`, Pending and not being deleted (first seen at monotonic
        time `monotonic`); forget it otherwise."""
        booking = info.booking
        if (
            booking is not None
            and booking.allocating
            and info.phase in (POD_PENDING, "")
            and not info.deleting
            and booking.node
        ):
            entry = self._allocating.get(info.key)
            if entry is None:
                self._allocating[info.key] = _Allocating(info, monotonic)
            else:
                entry.pod = info
        else:
            self._allocating.pop(info.key, None)

    def forget_allocating(self, key: str, uid: str) -> None:
        """A pod was deleted: forget its allocation (unless it is a successor's)."""
        allocating = self._allocating.get(key)
        if allocating is not None and same_pod(allocating.pod.uid, uid):
            del self._allocating[key]

    def stale(
        self, now: datetime, monotonic: float, timeout_seconds: float
    ) -> list[StaleAllocation]:
        """Pods allocating for longer than `timeout_seconds`, measured from `hami.io/bind-time`
        against `now` (or from when they were first seen allocating, against `monotonic`, if
        that annotation is unreadable)."""
        stale = []
        for entry in self._allocating.values():
            booking = entry.pod.booking
            seconds = booking.bind_seconds if booking is not None else None
            since = _unix_time(seconds, now)
            if since is not None:
                age = (now - since).total_seconds()
            else:
                age = monotonic - entry.first_seen
            if age > timeout_seconds:
                node = booking.node if booking is not None else ""
                stale.append(StaleAllocation(entry.pod, node, since))
        return stale


def _unix_time(seconds: int | None, reference: datetime) -> datetime | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, reference.tzinfo)
    except (OverflowError, OSError, ValueError):
        return None
