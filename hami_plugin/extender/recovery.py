"""Nothing stays stuck: the leader's clean-up loop.

HAMi's most reported problem is a pod left `allocating` for ever, or a node lock that outlives
its pod, which blocks the node for 5 minutes (HAMi #1130, #1367). The loop, on the leader only
(followers just keep their state warm), every `interval_seconds`:

* a pod `allocating` longer than `--allocation-timeout` (default 2 min, from `hami.io/bind-time`)
  while still Pending: `hami.io/bind-phase: failed` (patched only if the pod is still in that
  very allocation, resourceVersion precondition), a Warning event `AllocationTimeout` saying
  why, its node lock released, its booking dropped (`pod_recovered("allocation_timeout")`);
* a node lock older than `--node-lock-timeout` (`lock_expired`) or whose owner pod no longer
  exists (`owner_gone`): released, only if the lock is still that value;
* the lock of a pod deleted at any stage: released as soon as the delete event arrives (the
  state queues it and wakes the loop);
* the node handshakes that HAMi's CheckHealth writes (`Requesting_<now>`, or the key deleted
  when a node turns unhealthy), at most once per node per `handshake_interval_seconds`.

On every replica, every second: filter bookings past their TTL are freed; every
`health_interval_seconds` (HAMi's 15 s registration tick) the health verdicts are taken again,
since a `Requesting_` handshake goes stale with time alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.api import BindApi
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.events import EventSink, PodEvent
from hami_plugin.kube.listing import fetch_pod
from hami_plugin.kube.nodelock import release_node_lock
from hami_plugin.kube.retry import CONFLICT_RETRIES
from hami_plugin.protocol.govalues import format_go_duration
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_LOCK,
    BindPhase,
)
from hami_plugin.protocol.nodelock import LockAction, TakeoverReason, stale_lock
from hami_plugin.protocol.objects import POD_PENDING
from hami_plugin.scheduler.book.inflight import StaleAllocation

__all__ = ["Recovery"]

logger = logging.getLogger(__name__)

_TICK_SECONDS = 1.0
_API_BUDGET_SECONDS = 10.0


class Recovery:
    """The clean-up loop; `run(stop)` blocks (give it a thread), `sweep()` is one full pass."""

    def __init__(
        self,
        state: SchedulerState,
        api: BindApi,
        events: EventSink,
        is_leader: Callable[[], bool],
        *,
        allocation_timeout_seconds: float = 120.0,
        node_lock_timeout: timedelta = timedelta(minutes=5),
        interval_seconds: float = 5.0,
        health_interval_seconds: float = 15.0,
        handshake_interval_seconds: float = 10.0,
        watch_failed_at: Callable[[], float | None] = lambda: None,
        outage_grace_seconds: float = 30.0,
    ) -> None:
        self._state = state
        self._clock = state.clock
        self._api = api
        self._events = events
        self._is_leader = is_leader
        self._allocation_timeout = allocation_timeout_seconds
        self._lock_timeout = node_lock_timeout
        self._interval = interval_seconds
        self._health_interval = health_interval_seconds
        self._handshake_interval = handshake_interval_seconds
        self._handshakes_written: dict[str, float] = {}
        self._watch_failed_at = watch_failed_at
        self._outage_grace = outage_grace_seconds

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop`; one failed pass is logged and the next one runs as planned.

        It wakes every second (real time) and runs what is due on the state's clock."""
        next_sweep = next_health = self._clock.monotonic()
        while not stop.is_set():
            self._state.wait_for_work(_TICK_SECONDS)
            if stop.is_set():
                return
            now = self._clock.monotonic()
            try:
                self._state.expire_bookings()
                if self._state.take_work():
                    self.release_deleted_pods_locks()
                if now >= next_health:
                    next_health = now + self._health_interval
                    self._state.recheck_health()
                if now >= next_sweep:
                    next_sweep = now + self._interval
                    self.sweep()
            except Exception:  # the loop must outlive any bug in one pass
                logger.exception("recovery pass failed")

    def sweep(self) -> None:
        """One full pass (leader only; a follower only drops what it queued)."""
        if not self._is_leader():
            self._state.take_lock_releases()
            self._state.take_handshakes()
            return
        self.release_deleted_pods_locks()
        if self._state.synced:
            self.fail_stale_allocations()
            self.release_stale_locks()
        self.write_handshakes()

    # --- deleted pods -----------------------------------------------------------------------

    def release_deleted_pods_locks(self) -> None:
        """Release the node locks of pods deleted since the last call."""
        pending = self._state.take_lock_releases()
        if not self._is_leader():
            return
        for release in pending:
            node, key = release.node, f"{release.namespace}/{release.name}"
            try:
                with self._api.deadline(_API_BUDGET_SECONDS):
                    if release_node_lock(self._api, node, release.namespace, release.name):
                        logger.info("node %s: lock of deleted pod %s released", node, key)
            except KubeError as error:
                logger.warning("node %s: lock of deleted pod %s not released: %s", node, key, error)

    # --- allocation timeout -----------------------------------------------------------------

    def fail_stale_allocations(self) -> None:
        """Mark pods stuck in `allocating` failed, free their lock and booking.

        Not within `outage_grace_seconds` of a failure of the pod watch: after an API server
        outage the device plugins write the bind-phase of the pods they served meanwhile from
        their queues (docs/device-plugin.md), which takes a few seconds once the API answers;
        failing those pods first would free GPUs their containers use."""
        failed_at = self._watch_failed_at()
        if failed_at is not None and self._clock.monotonic() - failed_at < self._outage_grace:
            return
        now = self._clock.now()
        for stale in self._state.stale_allocations(now, self._allocation_timeout):
            try:
                with self._api.deadline(_API_BUDGET_SECONDS):
                    if not self._fail(stale):
                        continue
            except KubeError as error:
                logger.warning("pod %s: allocation timeout not handled: %s", stale.pod.key, error)
                continue
            self._state.drop_pod_booking(stale.pod.namespace, stale.pod.name)
            self._state.observer.pod_recovered("allocation_timeout")

    def _fail(self, stale: StaleAllocation) -> bool:
        pod = stale.pod
        bind_time = pod.annotations.get(ANNOTATION_BIND_TIME)
        version = pod.resource_version or None
        for _ in CONFLICT_RETRIES.tries():
            try:
                self._api.patch_pod_metadata(
                    pod.namespace,
                    pod.name,
                    {ANNOTATION_BIND_PHASE: BindPhase.FAILED.value},
                    resource_version=version,
                )
                break
            except NotFound:
                return False
            except Conflict:
                current = fetch_pod(self._api, pod.namespace, pod.name)
                if (
                    current is None
                    or current.annotations.get(ANNOTATION_BIND_PHASE) != BindPhase.ALLOCATING
                    or current.annotations.get(ANNOTATION_BIND_TIME) != bind_time
                    or current.phase not in (POD_PENDING, "")
                ):
                    return False  # it moved on meanwhile
                version = current.resource_version or None
        else:
            return False
        since = f" since {stale.since.isoformat()}" if stale.since is not None else ""
        message = (
            f"GPU allocation on node {stale.node} did not happen within "
            f"{format_go_duration(timedelta(seconds=self._allocation_timeout))}{since} "
            "(kubelet never called the device plugin's Allocate for this pod): bind-phase set "
            "to failed; delete the pod to schedule it again"
        )
        logger.warning("pod %s: %s", pod.key, message)
        self._events.record(
            PodEvent(pod.namespace, pod.name, pod.uid, "AllocationTimeout", message, "Warning")
        )
        if stale.node:
            release_node_lock(self._api, stale.node, pod.namespace, pod.name)
        return True

    # --- node locks -------------------------------------------------------------------------

    def release_stale_locks(self) -> None:
        """Release node locks that expired or whose owner pod is gone."""
        now = self._clock.now()
        for node in self._state.locked_nodes():
            value = node.annotations.get(ANNOTATION_NODE_LOCK, "")
            decision = stale_lock(node.name, value, now, self._lock_timeout)
            try:
                with self._api.deadline(_API_BUDGET_SECONDS):
                    if decision.action is LockAction.CHECK_OWNER and decision.lock is not None:
                        namespace = decision.lock.namespace or ""
                        name = decision.lock.pod_name or ""
                        exists = self._state.pod_exists(namespace, name) or (
                            fetch_pod(self._api, namespace, name) is not None
                        )
                        decision = stale_lock(node.name, value, now, self._lock_timeout, exists)
                    if decision.action is not LockAction.TAKE_OVER or decision.reason is None:
                        continue
                    if decision.reason is TakeoverReason.MALFORMED:
                        continue  # an unreadable lock: the next bind there takes it over
                    if release_node_lock(self._api, node.name, "", "", expected=value):
                        logger.warning("%s", decision.message)
                        self._state.observer.pod_recovered(decision.reason.value)
            except KubeError as error:
                logger.warning("node %s: stale lock not released: %s", node.name, error)

    # --- handshakes -------------------------------------------------------------------------

    def write_handshakes(self) -> None:
        """Write the handshakes HAMi's CheckHealth asked for, rate-limited per node."""
        now = self._clock.monotonic()
        for node, value in self._state.take_handshakes().items():
            last = self._handshakes_written.get(node)
            if last is not None and now - last < self._handshake_interval:
                continue
            self._handshakes_written[node] = now
            try:
                with self._api.deadline(_API_BUDGET_SECONDS):
                    self._api.patch_node_annotations(node, {ANNOTATION_NODE_HANDSHAKE: value})
            except NotFound:
                self._handshakes_written.pop(node, None)
            except KubeError as error:
                logger.warning("node %s: handshake not written: %s", node, error)
        # forget nodes not written for a while, so the map does not grow with node churn
        horizon = now - 10 * self._handshake_interval
        for node in [n for n, t in self._handshakes_written.items() if t < horizon]:
            del self._handshakes_written[node]
