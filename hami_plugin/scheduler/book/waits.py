"""Would a bind wait on this node now? The question the filter asks to fan a burst out.

`scheduler.filter.decide` answers, among the nodes that fit, the first in the policy's order on
which a bind would not wait, within `--burst-look-ahead` fitting nodes past the policy's first
(docs/scheduler.md, "Bursts across nodes"). `BindWaits.would_wait` is its predicate, read from
the book's own views:

* a node with HAMi's node lock: another pod's booking there (it takes the lock first), or a lock
  another live pod holds that has not expired (`protocol.nodelock`);
* a node with our allocate protocol: an in-flight pod, or another booking there, that kubelet's
  Allocate could confuse with this one (`inflight.must_wait_for` at the node's level), counting
  every other pod as bound: a wait for a Binding to return takes milliseconds and is not worth
  another node (bind's `claim_in_flight` still waits for it); a wait for an Allocate is a
  kubelet round trip.

Part of the book: not thread-safe, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from datetime import datetime, timedelta

from hami_plugin.protocol import inflight
from hami_plugin.protocol.model import PodDevices
from hami_plugin.protocol.nodelock import LockAction, decide_lock
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.book.bookings import Booking, Bookings
from hami_plugin.scheduler.book.inflight import InFlightTracker
from hami_plugin.scheduler.book.nodes import NodeRegistry

__all__ = ["BindWaits"]


class BindWaits:
    """The filter's would-a-bind-wait predicate over the state's bookings, nodes, in-flight
    pods and watched pods (the objects themselves, read when asked)."""

    def __init__(
        self,
        bookings: Bookings,
        nodes: NodeRegistry,
        in_flight: InFlightTracker,
        pods: Mapping[str, PodInfo],
        node_lock_timeout: timedelta,
    ) -> None:
        self._bookings = bookings
        self._nodes = nodes
        self._in_flight = in_flight
        self._pods = pods
        self.node_lock_timeout = node_lock_timeout

    def would_wait(
        self, pod: PodInfo, node: str, devices: PodDevices, shape: Hashable, now: datetime
    ) -> bool:
        """Would a bind of `pod` to `node` with `devices` (its fit there) wait for another pod
        now? (The module docstring.)"""
        others = [booking for booking in self._bookings.on_node(node) if booking.key != pod.key]
        level = self._nodes.allocate_protocol_level(node)
        if level == 0:
            return bool(others) or self._lock_held_by_another(pod, node, now)
        created = inflight.created_seconds_of(pod.creation_timestamp)
        me = inflight.InFlightPod.booked(
            pod.namespace, pod.name, created, devices, bound=False, uid=pod.uid, shape=shape
        )
        unclaimed = (  # built only as far as the check reads
            _unclaimed_in_flight(booking, self._created_seconds(booking.key, me.created_seconds))
            for booking in others
            if not self._in_flight.has(node, booking.key)
        )
        blocker = self._in_flight.blocker(me, node, pod.key, level, unclaimed, assume_bound=True)
        return blocker is not None

    def _lock_held_by_another(self, pod: PodInfo, node: str, now: datetime) -> bool:
        value = self._nodes.lock_value(node)
        if value is None:
            return False
        decision = decide_lock(node, value, now, self.node_lock_timeout, pod.namespace, pod.name)
        if decision.action is LockAction.CHECK_OWNER and decision.lock is not None:
            return f"{decision.lock.namespace}/{decision.lock.pod_name}" in self._pods
        return decision.action is LockAction.CONTENTION

    def _created_seconds(self, key: str, unknown: int) -> int:
        """The creation second of the watched pod `key`, else `unknown` (the cautious reading:
        the same second as the pod asking)."""
        pod = self._pods.get(key)
        if pod is None or pod.creation_timestamp is None:
            return unknown
        return inflight.created_seconds_of(pod.creation_timestamp)


def _unclaimed_in_flight(booking: Booking, created: int) -> inflight.InFlightPod:
    """A booking not counted in flight yet (filtered, or its bind still waiting), as the
    in-flight rules will see it once bound: nothing consumed."""
    namespace, _, name = booking.key.partition("/")
    result = booking.result
    return inflight.InFlightPod.booked(
        namespace, name, created, result.devices, uid=booking.uid, shape=result.shape
    )
