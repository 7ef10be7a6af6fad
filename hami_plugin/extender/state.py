"""The scheduler daemon's memory: everything filter, bind and recovery decide on, under ONE lock.

Fed by the pod and node informers (`pod_events` / `node_events` are their handlers) and by the
HTTP calls, it holds:

* the `Ledger`: nodes registered from `hami.io/node-nvidia-register` while healthy (task A's
  `NodeHealthTracker`, HAMi's CheckHealth) and matching `--node-label-selector`; usage from
  every pod that carries a booking (`Ledger.update_pod`), except pods whose `hami.io/bind-phase`
  is `failed` while still Pending (our Allocate never serves them, so they hold nothing);
* the filter bookings: filter answers one node and books the pod's GPUs there in memory only
  (the annotations go out in bind's one patch). A booking is FILTERED until bind starts
  (expires after `booking_ttl_seconds`, freed and counted), BINDING while a bind runs (never
  expires), BOUND once the Binding succeeded, until the watch delivers the pod as patched. While
  a booking stands, the pod's own annotations are not counted (they are absent, or those of an
  older failed attempt); the first pod event that carries the booking replaces it, so a pod is
  never counted twice nor, between bind and its watch event, not at all;
* the in-flight pods of each node with the allocate protocol (`hami_plugin.protocol.inflight`): from
  the watch, plus the binds of this process that the watch has not shown yet;
* the node locks seen on nodes, the pods `allocating`, the handshakes to write and the locks of
  deleted pods to release, for the recovery loop;
* a condition variable on the same lock, notified when an in-flight pod starts, finishes or
  vanishes and when a node lock changes, which waiting binds sleep on;
* the `FitCache` of the decisions.

Nothing here does I/O: callers never hold the lock across an API call. Observer calls are made
after the lock is released.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.extender.observer import NullObserver, SchedulerObserver
from hami_plugin.protocol import inflight
from hami_plugin.protocol.govalues import go_quote
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICE_SCORING_WEIGHTS,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    BindPhase,
)
from hami_plugin.protocol.objects import NodeInfo, ObjectError, PodInfo, read_pod
from hami_plugin.scheduler.filter import FilterResult, FitCache, assume, decide
from hami_plugin.scheduler.fit import FitFailure, FitReason, render_failure
from hami_plugin.scheduler.health import NodeHealthTracker
from hami_plugin.scheduler.ledger import Ledger, TrackedPod
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "BindPlan",
    "BookingPhase",
    "FilterAnswer",
    "PodEvent",
    "SchedulerState",
    "StaleAllocation",
]

logger = logging.getLogger(__name__)

PENDING = "Pending"
_UNREADABLE = inflight.InFlightPod("", "", 0, (), ())
"""Stands for an in-flight pod whose booking cannot be read (it blocks its node)."""


class BookingPhase(enum.Enum):
    FILTERED = "filtered"
    BINDING = "binding"
    BOUND = "bound"


@dataclass(frozen=True, slots=True)
class _Booking:
    key: str
    uid: str
    node: str
    result: FilterResult
    phase: BookingPhase
    expires: float
    """Monotonic time a FILTERED booking is freed."""
    bind_time: str = ""
    """`hami.io/bind-time` of the bind patch (BINDING/BOUND), to recognise its watch event."""
    seen: bool = False
    """The watch has shown this pod (this UID). Until then, events of another UID under the
    same name are a predecessor's, still being delivered, not a sign the booking is stale."""
    token: int = 0
    """Stays the same through `replace`: the expiry queue and the relist check recognise a
    booking by it."""


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event to record about a pod (sent asynchronously by the caller)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    event_type: str = "Normal"


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """What /filter answers (HAMi's ExtenderFilterResult fields) and what to tell others.

    `nodes` is the `Nodes` form's answer (the chosen node object), `node_names` the
    node-cache-capable form's. None fields are JSON null.
    """

    node_names: list[str] | None = None
    nodes: list[Mapping[str, Any]] | None = None
    failed_nodes: dict[str, str] | None = None
    error: str = ""
    outcome: str = "fit"
    failure_counts: dict[str, int] = field(default_factory=dict)
    events: tuple[PodEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What a bind writes, decided under the lock from the pod's booking.

    `annotations`/`labels` are the ONE pod patch; `in_flight` is the pod as the in-flight rules
    see it once patched (protocol nodes only); `needs_lock`: take HAMi's node lock first.
    """

    pod: PodInfo
    node: str
    annotations: dict[str, str]
    labels: dict[str, str]
    protocol: bool
    needs_lock: bool
    in_flight: inflight.InFlightPod | None
    rebooked: bool


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


class _PodHandler:
    """The pod informer's handler (task B's `InformerHandler[PodInfo]`)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: PodInfo, old: PodInfo | None) -> None:
        self._state.pod_upserted(new)

    def on_delete(self, old: PodInfo) -> None:
        self._state.pod_deleted(old)

    def on_synced(self) -> None:
        self._state.pods_relisted()


class _NodeHandler:
    """The node informer's handler (task B's `InformerHandler[NodeInfo]`)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: NodeInfo, old: NodeInfo | None) -> None:
        self._state.node_upserted(new)

    def on_delete(self, old: NodeInfo) -> None:
        self._state.node_deleted(old.name)

    def on_synced(self) -> None:
        self._state.nodes_synced.set()


def _reason_name(reason: FitReason) -> str:
    if reason is FitReason.NODE_UNREGISTERED:
        return "NodeUnregistered"
    return reason.value


def _failure_counts(failed: Mapping[str, FitFailure]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for failure in failed.values():
        if failure.node_reason is not None:
            name = _reason_name(failure.node_reason)
            counts[name] = counts.get(name, 0) + 1
            continue
        for reason, _ in failure.counts:
            counts[reason.value] = counts.get(reason.value, 0) + 1
    return counts


def _filter_error(error: str, info: PodInfo) -> str:
    """HAMi's text for a pod whose annotation cannot be read: Filter wraps the scoring-weights
    error as `calcScore failed <err> for pod <name>` (scheduler.go:1105, the error text of
    device_scoring_weights.go)."""
    key, _, detail = error.partition(": ")
    if key == ANNOTATION_DEVICE_SCORING_WEIGHTS:
        value = info.annotations.get(key, "")
        error = f"invalid {key} annotation {go_quote(value)}: {detail}"
    return f"calcScore failed {error} for pod {info.name}"


class SchedulerState:
    """Ledger, bookings, in-flight pods and locks of the scheduler daemon; thread-safe.

    `health` decides whether a node's GPUs may be scheduled (default: a fresh
    `NodeHealthTracker`); `node_selector` is the parsed `--node-label-selector`.
    """

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        booking_ttl_seconds: float = 30.0,
        node_selector: Mapping[str, str] | None = None,
        observer: SchedulerObserver | None = None,
        clock: Clock | None = None,
        health: NodeHealthTracker | None = None,
    ) -> None:
        self.settings = settings
        self.booking_ttl_seconds = booking_ttl_seconds
        self.node_selector = dict(node_selector or {})
        self.observer: SchedulerObserver = observer or NullObserver()
        self.clock: Clock = clock or SystemClock()
        self._health = health or NodeHealthTracker()
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        """Notified (under the lock) when an in-flight pod or a node lock changes."""
        self.ledger = Ledger()
        self.fit_cache = FitCache()
        self.pod_events = _PodHandler(self)
        self.node_events = _NodeHandler(self)
        self.pods_synced = threading.Event()
        self.nodes_synced = threading.Event()
        self.work = threading.Event()
        """Set when the recovery loop has urgent work (a deleted pod's lock to release)."""
        self._bookings: dict[str, _Booking] = {}
        self._expiries: deque[_Booking] = deque()  # FILTERED bookings, oldest first
        self._vanishing: dict[str, tuple[int, float]] = {}  # key -> (token, deadline)
        self._tokens = itertools.count(1)
        self._pods: dict[str, PodInfo] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._watch_in_flight: dict[str, dict[str, inflight.InFlightPod]] = {}
        self._in_flight_node: dict[str, str] = {}  # pod key -> node of its watch entry
        self._own_in_flight: dict[str, dict[str, inflight.InFlightPod]] = {}
        self._allocating: dict[str, _Allocating] = {}
        self._handshakes: dict[str, str | None] = {}
        self._lock_releases: dict[tuple[str, str], str] = {}  # (node, pod key) -> lock value

    # --- reading ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Both first lists are done."""
        return self.pods_synced.is_set() and self.nodes_synced.is_set()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state lock (tests and the ledger-invariant checks read a consistent view)."""
        with self._lock:
            yield

    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        """Every registered node's usage and every tracked pod's booking (SchedulerView)."""
        with self._lock:
            return self.ledger.usages(), self.ledger.tracked_pods()

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as the watch last showed it."""
        with self._lock:
            return self._pods.get(f"{namespace}/{name}")

    def pod_exists(self, namespace: str, name: str) -> bool:
        with self._lock:
            return f"{namespace}/{name}" in self._pods

    def node(self, name: str) -> NodeInfo | None:
        """The node as the watch last showed it (only nodes matching the selector)."""
        with self._lock:
            return self._nodes.get(name)

    def booking_phase(self, namespace: str, name: str) -> BookingPhase | None:
        with self._lock:
            booking = self._bookings.get(f"{namespace}/{name}")
            return None if booking is None else booking.phase

    def bookings(self) -> dict[str, tuple[str, BookingPhase]]:
        """Pod key -> (node, phase) of every standing booking."""
        with self._lock:
            return {key: (b.node, b.phase) for key, b in self._bookings.items()}

    def in_flight(self, node: str) -> dict[str, inflight.InFlightPod | None]:
        """Pod key -> in-flight view of a node's in-flight pods: the watch's, overridden by
        this process's binds; None for a pod whose to-allocate annotation is unreadable."""
        with self._lock:
            return {
                key: (None if pod is _UNREADABLE else pod)
                for key, pod in self._in_flight_on(node).items()
            }

    def locked_nodes(self) -> list[NodeInfo]:
        """Nodes whose last seen version carries `hami.io/mutex.lock`."""
        with self._lock:
            return [n for n in self._nodes.values() if ANNOTATION_NODE_LOCK in n.annotations]

    # --- informer events: nodes -------------------------------------------------------------

    def _selected(self, info: NodeInfo) -> bool:
        return all(info.labels.get(k) == v for k, v in self.node_selector.items())

    def node_upserted(self, info: NodeInfo) -> None:
        """A node was added or changed: register its GPUs while healthy and selected."""
        if not self._selected(info):
            self.node_deleted(info.name)
            return
        now = self.clock.now()
        with self._lock:
            previous = self._nodes.get(info.name)
            self._nodes[info.name] = info
            self._judge(info, now)
            before = previous.annotations if previous is not None else {}
            if any(
                before.get(key) != info.annotations.get(key)
                for key in (ANNOTATION_NODE_LOCK, inflight.ANNOTATION_ALLOCATE_PROTOCOL)
            ):
                self.changed.notify_all()

    def _judge(self, info: NodeInfo, now: datetime) -> None:
        """HAMi's registration step for one node (reference 3.2): CheckHealth, then forget the
        GPUs of an unhealthy node (and delete its handshake, NodeCleanUp), or read them again
        when the verdict asks for it. A node HAMi would not read again keeps what it has;
        reading an unchanged register annotation again is free, and picks up a change of
        `hami.io/device-cordon`."""
        verdict = self._health.check(info, now)
        name = info.name
        if verdict.write_handshake is not None:
            self._handshakes[name] = verdict.write_handshake
        if not verdict.healthy:
            if name in self.ledger:
                logger.warning("node %s is unhealthy: its GPUs are not scheduled", name)
                self.ledger.remove_node(name)
                self._health.forget(name)
                self._handshakes[name] = None
            return
        if verdict.need_update or name in self.ledger:
            try:
                self.ledger.update_node(info)
            except ObjectError as error:
                logger.warning("node %s not registered: %s", name, error)
                self.ledger.remove_node(name)

    def node_deleted(self, name: str) -> None:
        """A node was deleted (or left the label selector): forget its GPUs."""
        with self._lock:
            self._nodes.pop(name, None)
            self._handshakes.pop(name, None)
            self._health.forget(name)
            self.ledger.remove_node(name)
            self.changed.notify_all()

    def recheck_health(self) -> None:
        """Run the health check again on every node: HAMi's verdict depends on time (a
        `Requesting_` handshake goes stale after 60 s) as well as on node events."""
        now = self.clock.now()
        with self._lock:
            for info in list(self._nodes.values()):
                self._judge(info, now)

    def take_handshakes(self) -> dict[str, str | None]:
        """Node -> handshake value to write (None: delete it), and forget them (the leader
        writes them)."""
        with self._lock:
            pending, self._handshakes = self._handshakes, {}
            return pending

    # --- informer events: pods ----------------------------------------------------------------

    def pod_upserted(self, info: PodInfo) -> None:
        """A pod was added or changed (see the module docstring for the booking rules)."""
        with self._lock:
            self._pods[info.key] = info
            self._pod_changed(info)

    def _pod_changed(self, info: PodInfo) -> None:
        key = info.key
        booking = self._bookings.get(key)
        phase = info.annotations.get(ANNOTATION_BIND_PHASE)
        if booking is not None and booking.uid and info.uid:
            if booking.uid != info.uid:
                if booking.seen:
                    # a new pod of the same name: the booking was for its predecessor
                    self._drop_booking(key)
                    booking = None
                else:
                    # the predecessor's event, delivered late: the booking stands
                    self._update_in_flight(info, drop_own=False)
                    self._update_allocating(info, phase)
                    return
            elif not booking.seen:
                booking = replace(booking, seen=True)
                self._bookings[key] = booking
        failed_pending = phase == BindPhase.FAILED and info.phase in (PENDING, "")
        retired = booking is not None and (info.finished or self._retires(booking, info))
        if booking is not None and not retired:
            if booking.phase is BookingPhase.FILTERED and (info.node_name or info.deleting):
                self._drop_booking(key)  # bound by someone else, or going away
        else:
            if booking is not None:
                del self._bookings[key]  # the pod's own annotations take over
            self._track_from_annotations(info, failed_pending)
        # this process's in-flight entry is superseded once the watch shows the patched pod
        drop_own = retired or info.finished or info.deleting or bool(info.node_name)
        self._update_in_flight(info, drop_own)
        self._update_allocating(info, phase)

    def _retires(self, booking: _Booking, info: PodInfo) -> bool:
        """Does this pod event show the booking itself (the bind patch reached the watch)?"""
        annotations = info.annotations
        if booking.phase is BookingPhase.FILTERED:
            return False
        if booking.phase is BookingPhase.BOUND and info.node_name:
            return True  # the Binding came after our patch
        return (
            annotations.get(ANNOTATION_BIND_TIME) == booking.bind_time
            and annotations.get(ANNOTATION_VGPU_NODE) == booking.node
            and annotations.get(ANNOTATION_BIND_PHASE) != BindPhase.FAILED
        )

    def _track_from_annotations(self, info: PodInfo, failed_pending: bool) -> None:
        if failed_pending:
            self.ledger.untrack(info.key)
            return
        try:
            self.ledger.update_pod(info)
        except ObjectError as error:  # cannot happen for a PodInfo; kept for safety
            logger.warning("pod %s not tracked: %s", info.key, error)
            self.ledger.untrack(info.key)

    def _update_in_flight(self, info: PodInfo, drop_own: bool) -> None:
        """Keep the node's in-flight view: pods `allocating` and Pending (being deleted too,
        until they are gone); one whose to-allocate annotation is unreadable could be any
        Allocate, so it blocks every bind on its node."""
        key = info.key
        node = info.annotations.get(ANNOTATION_VGPU_NODE, "")
        allocating = (
            bool(node)
            and info.annotations.get(ANNOTATION_BIND_PHASE) == BindPhase.ALLOCATING
            and info.phase in (PENDING, "")
        )
        entry = None
        if allocating:
            entry = inflight.in_flight_pod(
                info.namespace, info.name, info.created, info.annotations
            )
            if entry is None:
                logger.warning(
                    "pod %s allocating on node %s has no readable %s: no other pod is bound "
                    "there until it is gone",
                    key,
                    node,
                    ANNOTATION_DEVICES_TO_ALLOCATE,
                )
        changed = self._forget_watch_in_flight(key, keep_node=node if allocating else None)
        if allocating:
            self._in_flight_node[key] = node
            pods = self._watch_in_flight.setdefault(node, {})
            stored = entry if entry is not None else _UNREADABLE
            if pods.get(key) != stored:
                pods[key] = stored
                changed = True
        if drop_own:
            changed = self._drop_own_in_flight(key) or changed
        if changed:
            self.changed.notify_all()

    def _forget_watch_in_flight(self, key: str, keep_node: str | None = None) -> bool:
        node = self._in_flight_node.get(key)
        if node is None or node == keep_node:
            return False
        pods = self._watch_in_flight.get(node, {})
        pods.pop(key, None)
        if not pods:
            self._watch_in_flight.pop(node, None)
        del self._in_flight_node[key]
        return True

    def _update_allocating(self, info: PodInfo, phase: str | None) -> None:
        if (
            phase == BindPhase.ALLOCATING
            and info.phase in (PENDING, "")
            and not info.deleting
            and info.annotations.get(ANNOTATION_VGPU_NODE)
        ):
            entry = self._allocating.get(info.key)
            if entry is None:
                self._allocating[info.key] = _Allocating(info, self.clock.monotonic())
            else:
                entry.pod = info
        else:
            self._allocating.pop(info.key, None)

    def pod_deleted(self, info: PodInfo) -> None:
        """A pod was deleted: its GPUs, booking and in-flight entry go at once; a node lock it
        holds is queued for release (the recovery loop does the API call)."""
        key = info.key
        with self._lock:
            last = self._pods.get(key, info)
            if _same_pod(last.uid, info.uid):
                self._pods.pop(key, None)
            self._forget_watch_in_flight(key)
            allocating = self._allocating.get(key)
            if allocating is not None and _same_pod(allocating.pod.uid, info.uid):
                del self._allocating[key]
            booking = self._bookings.get(key)
            if booking is not None and not _same_pod(booking.uid, info.uid):
                # the booking is a successor's of the same name (decided before our watch
                # caught up): the ledger entry of the key is that booking, and any lock
                # naming the pod may be the successor's
                self.changed.notify_all()
                return
            self._drop_booking(key)
            self.ledger.delete_pod(key)
            self._drop_own_in_flight(key)
            for candidate in {
                last.annotations.get(ANNOTATION_VGPU_NODE, ""),
                last.node_name,
                info.annotations.get(ANNOTATION_VGPU_NODE, ""),
            }:
                value = self._lock_held_by(candidate, info.namespace, info.name)
                if value is not None:
                    self._lock_releases[(candidate, key)] = value
                    self.work.set()
            self.changed.notify_all()

    def _lock_held_by(self, node: str, namespace: str, name: str) -> str | None:
        if not node:
            return None
        info = self._nodes.get(node)
        if info is None:
            return None
        value = info.annotations.get(ANNOTATION_NODE_LOCK)
        if value and value.endswith(f",{namespace},{name}"):
            return value
        return None

    def take_lock_releases(self) -> dict[tuple[str, str], str]:
        """(node, pod key) -> lock value of deleted pods' locks, and forget them."""
        with self._lock:
            pending, self._lock_releases = self._lock_releases, {}
            return pending

    def stale_allocations(self, now: datetime, timeout_seconds: float) -> list[StaleAllocation]:
        """Pods `allocating` and still Pending for longer than `timeout_seconds`, measured from
        `hami.io/bind-time` (or from when this process first saw them allocating, if that
        annotation is unreadable)."""
        stale = []
        monotonic = self.clock.monotonic()
        with self._lock:
            for entry in self._allocating.values():
                since = _unix_time(entry.pod.annotations.get(ANNOTATION_BIND_TIME), now)
                if since is not None:
                    age = (now - since).total_seconds()
                else:
                    age = monotonic - entry.first_seen
                if age > timeout_seconds:
                    node = entry.pod.annotations.get(ANNOTATION_VGPU_NODE, "")
                    stale.append(StaleAllocation(entry.pod, node, since))
        return stale

    # --- filter -------------------------------------------------------------------------------

    def expire_bookings(self) -> int:
        """Free FILTERED bookings past their time; returns how many (also counted)."""
        with self._lock:
            expired = self._expire()
        for _ in range(expired):
            self.observer.booking_expired()
        return expired

    def _expire(self) -> int:
        # FILTERED bookings are made in time order with one TTL, so they expire in the order
        # of `_expiries`; entries of bookings since replaced, bound or dropped are skipped.
        now = self.clock.monotonic()
        expired = 0
        while self._expiries and self._expiries[0].expires <= now:
            queued = self._expiries.popleft()
            booking = self._bookings.get(queued.key)
            if (
                booking is None
                or booking.token != queued.token
                or booking.phase is not BookingPhase.FILTERED
            ):
                continue
            logger.info(
                "filter booking of pod %s on node %s expired: no bind followed",
                booking.key,
                booking.node,
            )
            self._drop_booking(booking.key)
            expired += 1
        self._drop_vanished(now)
        return expired

    def pods_relisted(self) -> None:
        """The pod informer holds a whole list (its first, or a relist after a lost watch).

        A bound booking whose pod the list does not show was made for a pod that is gone (its
        DELETED event was lost with the watch, and the informer, which never stored it, cannot
        report it) or for one created after the list was taken (its events are on their way).
        Such bookings are checked again once `booking_ttl_seconds` passed: if the pod has
        still not shown up, it is gone and its GPUs are freed."""
        with self._lock:
            deadline = self.clock.monotonic() + self.booking_ttl_seconds
            for key, booking in self._bookings.items():
                if booking.phase is not BookingPhase.FILTERED and not self._shown(booking):
                    self._vanishing[key] = (booking.token, deadline)
        self.pods_synced.set()

    def _shown(self, booking: _Booking) -> bool:
        stored = self._pods.get(booking.key)
        return stored is not None and _same_pod(stored.uid, booking.uid)

    def _drop_vanished(self, now: float) -> None:
        for key, (token, deadline) in list(self._vanishing.items()):
            booking = self._bookings.get(key)
            if booking is None or booking.token != token or self._shown(booking):
                del self._vanishing[key]
            elif deadline <= now:
                del self._vanishing[key]
                logger.info(
                    "booking of pod %s on node %s freed: the pod is gone (not in the relist)",
                    key,
                    booking.node,
                )
                self._drop_booking(key)
                self._drop_own_in_flight(key)

    def _seen(self, pod: PodInfo) -> bool:
        stored = self._pods.get(pod.key)
        return stored is not None and _same_pod(stored.uid, pod.uid)

    def _drop_booking(self, key: str) -> None:
        booking = self._bookings.pop(key, None)
        if booking is None:
            return
        self.ledger.untrack(key)
        pod = self._pods.get(key)
        if pod is not None:
            # the pod's own annotations count again (if they book anything)
            phase = pod.annotations.get(ANNOTATION_BIND_PHASE)
            failed_pending = phase == BindPhase.FAILED and pod.phase in (PENDING, "")
            self._track_from_annotations(pod, failed_pending)

    def filter(
        self,
        pod: Mapping[str, Any] | PodInfo,
        node_names: Sequence[str] | None,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> FilterAnswer:
        """Answer kube-scheduler's filter (reference 3.4) and book the chosen node's GPUs.

        `nodes` is the `Nodes` form (not node-cache-capable): HAMi's simulation on those node
        objects with no usage, nothing booked. Raises nothing for bad input: an unreadable pod
        is an answer with `error`.
        """
        try:
            info = read_pod(pod)
            requests = pod_requests(info, self.settings)
        except ObjectError as error:
            return FilterAnswer(error=f"invalid pod: {error}", outcome="error")
        if not requests.wants_gpu:
            # HAMi answers NodeNames as given; the Nodes form gets its nodes back (HAMi answers
            # Nodes null there, which makes kube-scheduler drop every node).
            return FilterAnswer(
                node_names=list(node_names) if node_names is not None else None,
                nodes=list(nodes) if nodes is not None else None,
                outcome="no_gpu",
            )
        for problem in requests.problems:
            logger.info("pod %s: %s", info.key, problem)
        if nodes is not None:
            answer = self._simulate(info, nodes)
        else:
            answer, expired = self._filter_cached(info, list(node_names or ()))
            for _ in range(expired):
                self.observer.booking_expired()
        if answer.failure_counts:
            self.observer.filter_failures(answer.failure_counts)
        return answer

    def _filter_cached(self, info: PodInfo, names: list[str]) -> tuple[FilterAnswer, int]:
        now = self.clock.now()
        with self._lock:
            expired = self._expire()
            # re-scheduling: what the pod booked before is released first (HAMi Filter step 3)
            self._drop_booking(info.key)
            self._drop_own_in_flight(info.key)
            self.ledger.untrack(info.key)
            result = decide(self.ledger, info, names, now, self.settings, cache=self.fit_cache)
            if result.error is None and result.node is not None:
                assume(self.ledger, info.key, result)
                booking = _Booking(
                    key=info.key,
                    uid=info.uid,
                    node=result.node,
                    result=result,
                    phase=BookingPhase.FILTERED,
                    expires=self.clock.monotonic() + self.booking_ttl_seconds,
                    seen=self._seen(info),
                    token=next(self._tokens),
                )
                self._bookings[info.key] = booking
                self._expiries.append(booking)
        return self._answer(info, names, result), expired

    def _answer(self, info: PodInfo, names: list[str], result: FilterResult) -> FilterAnswer:
        if result.error is not None:
            message = _filter_error(result.error, info)
            event = PodEvent(
                info.namespace, info.name, info.uid, "FilteringFailed", message, "Warning"
            )
            return FilterAnswer(error=message, outcome="error", events=(event,))
        if result.node is None:
            failed = {
                name: render_failure(failure) for name, failure in result.failed_nodes.items()
            }
            return FilterAnswer(
                failed_nodes=failed,
                outcome="no_fit",
                failure_counts=_failure_counts(result.failed_nodes),
                events=self._no_fit_events(info, names, failed),
            )
        # HAMi fits every node and lists them all; the fast path stops at the first fit, so
        # the counts are of the nodes tried.
        fits = ",".join(f"{name}:{score:.2f}" for name, score in result.scores.items())
        message = (
            f"find fit node({result.node}), {len(result.failed_nodes)} nodes not fit, "
            f"{len(result.scores)} nodes fit({fits})"
        )
        event = PodEvent(info.namespace, info.name, info.uid, "FilteringSucceed", message)
        return FilterAnswer(node_names=[result.node], outcome="fit", events=(event,))

    @staticmethod
    def _no_fit_events(
        info: PodInfo, names: Sequence[str], failed: Mapping[str, str]
    ) -> tuple[PodEvent, ...]:
        """HAMi's FilteringFailed events: one per `n/N Reason` type with its sorted nodes
        (score.go:348-353, reasons parsed as common.ParseReason does), then the summary."""
        by_reason: dict[str, list[str]] = {}
        for node, text in failed.items():
            for part in text.split(", "):
                count, _, reason = part.partition(" ")
                if "/" in count and reason:
                    by_reason.setdefault(reason, []).append(node)
        events = [
            PodEvent(
                info.namespace,
                info.name,
                info.uid,
                "FilteringFailed",
                f"{len(nodes)} nodes {reason}({','.join(sorted(nodes))})",
                "Warning",
            )
            for reason, nodes in sorted(by_reason.items())
        ]
        events.append(
            PodEvent(
                info.namespace,
                info.name,
                info.uid,
                "FilteringFailed",
                f"no available node, {len(names)} nodes do not meet",
                "Warning",
            )
        )
        return tuple(events)

    def _simulate(self, info: PodInfo, nodes: Sequence[Mapping[str, Any]]) -> FilterAnswer:
        """HAMi's filterSimulation (scheduler.go:1156-1199): the given nodes' GPUs from their
        register annotation, no usage, no health check; every node fitted; the answer is the
        best node's object in `Nodes`, plus FailedNodes."""
        ledger = Ledger()
        names: list[str] = []
        by_name: dict[str, Mapping[str, Any]] = {}
        failed_objects = 0
        for node in nodes:
            try:
                ledger.update_node(node)
                name = ledger_name(node)
            except ObjectError as error:
                logger.warning("filter: node object skipped: %s", error)
                failed_objects += 1
                continue
            names.append(name)
            by_name.setdefault(name, node)
        result = decide(ledger, info, names, self.clock.now(), self.settings, exhaustive=True)
        if result.error is not None:
            return FilterAnswer(error=_filter_error(result.error, info), outcome="error")
        failed = {name: render_failure(failure) for name, failure in result.failed_nodes.items()}
        if result.node is None:
            return FilterAnswer(
                failed_nodes=failed,
                outcome="no_fit",
                failure_counts=_failure_counts(result.failed_nodes),
            )
        return FilterAnswer(nodes=[by_name[result.node]], failed_nodes=failed, outcome="fit")

    # --- bind ---------------------------------------------------------------------------------

    def plan_bind(self, pod: PodInfo, node: str) -> BindPlan | str:
        """Turn the pod's filter booking on `node` into a bind plan (BINDING: it no longer
        expires). Without a usable booking (none, expired, another node, another pod of the
        same name) the pod is decided again on `node` alone. Returns an error text when the
        pod does not fit there or the node is not registered."""
        now = self.clock.now()
        with self._lock:
            self._expire()
            booking = self._bookings.get(pod.key)
            usable = (
                booking is not None
                and booking.node == node
                and booking.phase is BookingPhase.FILTERED
                and (not booking.uid or not pod.uid or booking.uid == pod.uid)
            )
            rebooked = not usable
            if not usable:
                self._drop_booking(pod.key)
                self._drop_own_in_flight(pod.key)
                self.ledger.untrack(pod.key)
                result = decide(self.ledger, pod, [node], now, self.settings, cache=self.fit_cache)
                if result.error is not None:
                    return _filter_error(result.error, pod)
                if result.node is None:
                    failure = result.failed_nodes.get(node)
                    why = render_failure(failure) if failure is not None else "does not fit"
                    return f"pod {pod.key} does not fit on node {node}: {why}"
                assume(self.ledger, pod.key, result)
                booking = _Booking(
                    pod.key,
                    pod.uid,
                    node,
                    result,
                    BookingPhase.FILTERED,
                    0.0,
                    seen=self._seen(pod),
                    token=next(self._tokens),
                )
            assert booking is not None
            bind_time = str(int(now.timestamp()))
            self._bookings[pod.key] = replace(
                booking, phase=BookingPhase.BINDING, bind_time=bind_time, uid=pod.uid or booking.uid
            )
            annotations = dict(booking.result.annotations)
            annotations[ANNOTATION_BIND_PHASE] = BindPhase.ALLOCATING.value
            annotations[ANNOTATION_BIND_TIME] = bind_time
            node_info = self._nodes.get(node)
            protocol = node_info is not None and (
                node_info.annotations.get(inflight.ANNOTATION_ALLOCATE_PROTOCOL)
                == inflight.ALLOCATE_PROTOCOL
            )
            entry = None
            if protocol:
                entry = inflight.in_flight_pod(
                    pod.namespace, pod.name, pod.created, {**pod.annotations, **annotations}
                )
            app_gpu = any(r is not None for r in booking.result.requests.app_requests)
        return BindPlan(
            pod=pod,
            node=node,
            annotations=annotations,
            labels={LABEL_VGPU_NODE: node},
            protocol=protocol,
            needs_lock=not protocol and app_gpu,
            in_flight=entry,
            rebooked=rebooked,
        )

    def _in_flight_on(self, node: str) -> dict[str, inflight.InFlightPod]:
        pods = dict(self._watch_in_flight.get(node, {}))
        pods.update(self._own_in_flight.get(node, {}))
        return pods

    def _blocker(self, me: inflight.InFlightPod, node: str, key: str) -> str | None:
        others = [pod for other, pod in self._in_flight_on(node).items() if other != key]
        for pod in others:
            if pod is _UNREADABLE:
                return f"a pod in flight on node {node} has no readable booking"
        blocker = inflight.must_wait_for(me, others)
        if blocker is None:
            return None
        return (
            f"node {node}: pod {blocker.namespace}/{blocker.name} is still being allocated "
            "and kubelet could not tell it from this one"
        )

    def claim_in_flight(
        self, plan: BindPlan, deadline: float, stop: threading.Event | None = None
    ) -> str | None:
        """Wait until no in-flight pod of the node could be confused with the plan's pod
        (`inflight.must_wait_for`), then count it in flight (not bound yet). Returns None when
        claimed, else why not, once `deadline` (time.monotonic) passed or `stop` was set."""
        me = plan.in_flight
        if me is None:
            return None
        key = plan.pod.key
        with self._lock:
            while True:
                blocker = self._blocker(me, plan.node, key)
                if blocker is None:
                    self._own_in_flight.setdefault(plan.node, {})[key] = replace(me, bound=False)
                    return None
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return blocker
                # the poll bound only guards against a missed notification
                self.changed.wait(min(left, 1.0))

    def wait_for_change(self, timeout: float) -> None:
        """Sleep until a node lock or in-flight pod changes, at most `timeout` seconds."""
        if timeout <= 0:
            return
        with self._lock:
            self.changed.wait(timeout)

    def bind_succeeded(self, plan: BindPlan) -> None:
        """The Binding was created: the booking stays (BOUND) until the watch shows it, and
        the pod counts in flight as bound (kubelet orders it before later pods)."""
        key = plan.pod.key
        with self._lock:
            booking = self._bookings.get(key)
            if booking is not None and booking.phase is BookingPhase.BINDING:
                self._bookings[key] = replace(booking, phase=BookingPhase.BOUND)
            own = self._own_in_flight.get(plan.node, {})
            entry = own.get(key)
            if entry is not None:
                own[key] = replace(entry, bound=True)
                self.changed.notify_all()

    def bind_failed(self, plan: BindPlan) -> None:
        """Roll back in memory: the booking is freed, the pod no longer counts in flight."""
        with self._lock:
            self._drop_booking(plan.pod.key)
            self._drop_own_in_flight(plan.pod.key)
            self.changed.notify_all()

    def drop_pod_booking(self, namespace: str, name: str) -> None:
        """Free a pod's booking (recovery, a bind that found the pod gone)."""
        with self._lock:
            self._drop_booking(f"{namespace}/{name}")
            self._drop_own_in_flight(f"{namespace}/{name}")
            self.changed.notify_all()

    def _drop_own_in_flight(self, key: str) -> bool:
        dropped = False
        for node, own in list(self._own_in_flight.items()):
            if own.pop(key, None) is not None:
                dropped = True
                self.changed.notify_all()
            if not own:
                del self._own_in_flight[node]
        return dropped


def _same_pod(uid: str, other: str) -> bool:
    """Two UIDs of a pod name designate the same pod (an unknown UID matches any)."""
    return not uid or not other or uid == other


def ledger_name(node: Mapping[str, Any]) -> str:
    """The name of a node object (raises ObjectError when it has none)."""
    metadata = node.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ObjectError("node object without metadata.name")
    return name


def _unix_time(text: str | None, reference: datetime) -> datetime | None:
    if not text:
        return None
    try:
        seconds = int(text)
    except ValueError:
        return None
    try:
        return datetime.fromtimestamp(seconds, reference.tzinfo)
    except (OverflowError, OSError, ValueError):
        return None
