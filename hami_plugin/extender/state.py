"""The scheduler daemon's memory: everything filter, bind and recovery decide on, under ONE lock.

Fed by the pod and node informers (`pod_events` / `node_events` are their handlers) and by the
HTTP calls, `SchedulerState` holds, and delegates to:

* the `Ledger`: nodes registered from `hami.io/node-nvidia-register` while healthy (the
  `NodeHealthTracker`, HAMi's CheckHealth) and matching `--node-label-selector`; usage from
  every pod that carries a booking (`Ledger.update_pod`), except pods whose `hami.io/bind-phase`
  is `failed` while still Pending (our Allocate never serves them, so they hold nothing);
* the filter bookings (`hami_plugin.extender.bookings`). While a booking stands, the pod's own
  annotations are not counted (they are absent, or those of an older failed attempt); the first
  pod event that carries the booking replaces it, so a pod is never counted twice nor, between
  bind and its watch event, not at all;
* the in-flight pods of each node and the pods `allocating`
  (`hami_plugin.extender.inflight_tracker`);
* the nodes as the watch shows them, with their node locks and the handshakes to write
  (`hami_plugin.extender.nodes`), and the locks of deleted pods to release, for the recovery
  loop;
* a condition variable on the same lock, notified when an in-flight pod starts, finishes or
  vanishes and when a node lock changes, which waiting binds sleep on;
* the `FitCache` of the decisions;
* what it trusts of each pod's booking (`hami_plugin.extender.booking_trust`): with a booking
  key (`booking_keys`) a pod event enters the ledger and the in-flight view only as
  `BookingTrust.counted` hands it on, without its booking when that does not verify, so a
  forged booking neither fills a node nor blocks a bind; binds are signed there. Without a key
  every booking counts, as in HAMi;
* the namespace GPU quotas (`hami_plugin.scheduler.quota.QuotaBook`): limits from the
  ResourceQuota informer (`quota_events`), usage following the ledger's bookings of each pod
  (so only counted bookings count), checked by `decide` for pods of a namespace with a limit.

Filter answers are rendered by `hami_plugin.extender.filtering`. Nothing here does I/O: callers
never hold the lock across an API call. Observer calls are made after the lock is released.
Time is read from the injected `Clock` only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.extender.booking_trust import BookingTrust
from hami_plugin.extender.bookings import (
    BindPlan,
    BindRefusal,
    Booking,
    BookingPhase,
    Bookings,
)
from hami_plugin.extender.fanout import BindWaits
from hami_plugin.extender.filtering import FilterAnswer, filter_answer, simulate
from hami_plugin.extender.inflight_tracker import (
    InFlightTracker,
    StaleAllocation,
    same_pod,
)
from hami_plugin.extender.nodes import LockRelease, NodeRegistry
from hami_plugin.extender.observer import NullObserver, SchedulerObserver
from hami_plugin.protocol import inflight
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    BindPhase,
)
from hami_plugin.protocol.objects import POD_PENDING, NodeInfo, PodInfo
from hami_plugin.protocol.signature import BookingKeys
from hami_plugin.scheduler.filter import FitCache, assume, decide, pod_shape
from hami_plugin.scheduler.health import NodeHealthTracker
from hami_plugin.scheduler.ledger import Ledger, TrackedPod
from hami_plugin.scheduler.quota import QuotaBook, QuotaEntry, ResourceQuotaInfo
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["DEFAULT_BURST_LOOK_AHEAD", "SchedulerState"]

logger = logging.getLogger(__name__)

DEFAULT_BURST_LOOK_AHEAD = 16
"""`--burst-look-ahead`: at most this many fitting nodes past the policy's first are tried for a
node where the bind would not wait. Binpack then puts a burst on the first few nodes of its
order (a 300-pod burst of single-GPU pods onto 8-GPU nodes: a handful of nodes more than the
38 it fills anyway, against the 300 spread would use)."""


class _PodHandler:
    """The pod informer's handler (an `InformerHandler[PodInfo]`)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: PodInfo, old: PodInfo | None) -> None:
        self._state.pod_upserted(new)

    def on_delete(self, old: PodInfo) -> None:
        self._state.pod_deleted(old)

    def on_synced(self) -> None:
        self._state.pods_relisted()


class _NodeHandler:
    """The node informer's handler (an `InformerHandler[NodeInfo]`)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: NodeInfo, old: NodeInfo | None) -> None:
        self._state.node_upserted(new)

    def on_delete(self, old: NodeInfo) -> None:
        self._state.node_deleted(old.name)

    def on_synced(self) -> None:
        self._state.nodes_synced.set()


class _QuotaHandler:
    """The ResourceQuota informer's handler (an `InformerHandler[ResourceQuotaInfo]`; HAMi's
    `onAddQuota`/`onUpdateQuota`/`onDelQuota`, `pkg/scheduler/scheduler.go:304-334`)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: ResourceQuotaInfo, old: ResourceQuotaInfo | None) -> None:
        self._state.quota_upserted(new, old)

    def on_delete(self, old: ResourceQuotaInfo) -> None:
        self._state.quota_deleted(old)

    def on_synced(self) -> None:
        self._state.quotas_synced.set()


class SchedulerState:
    """Ledger, bookings, in-flight pods and locks of the scheduler daemon; thread-safe.

    `health` decides whether a node's GPUs may be scheduled (default: a fresh
    `NodeHealthTracker`); `node_selector` is the parsed `--node-label-selector`;
    `booking_keys` gives the current booking keys (`--booking-key-file`; None: trust every
    booking, as HAMi does).
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
        booking_keys: Callable[[], BookingKeys] | None = None,
        burst_look_ahead: int = DEFAULT_BURST_LOOK_AHEAD,
        node_lock_timeout: timedelta = timedelta(minutes=5),
    ) -> None:
        self.settings = settings
        self.burst_look_ahead = burst_look_ahead
        """How many fitting nodes past the policy's first a filter may look at for one where
        the bind need not wait (`scheduler.filter.decide`); 0: always the policy's first."""
        self.booking_ttl_seconds = booking_ttl_seconds
        self.observer: SchedulerObserver = observer or NullObserver()
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        """Notified (under the lock) when an in-flight pod or a node lock changes."""
        self.ledger = Ledger()
        self.fit_cache = FitCache()
        self.pod_events = _PodHandler(self)
        self.node_events = _NodeHandler(self)
        self.quotas = QuotaBook(resources=settings.resources)
        self.quota_events = _QuotaHandler(self)
        self.pods_synced = threading.Event()
        self.nodes_synced = threading.Event()
        self.quotas_synced = threading.Event()
        """Set once the ResourceQuota list is in; set from the start when no quota informer
        runs (the daemon clears it before starting one), so it holds nothing up then."""
        self.quotas_synced.set()
        self.work = threading.Event()
        """Set when the recovery loop has urgent work (a deleted pod's lock to release)."""
        self._bookings = Bookings()
        self._in_flight = InFlightTracker()
        self._nodes = NodeRegistry(self.ledger, health or NodeHealthTracker(), node_selector or {})
        self._pods: dict[str, PodInfo] = {}
        self._waits = BindWaits(
            self._bookings, self._nodes, self._in_flight, self._pods, node_lock_timeout
        )
        """Would a bind wait on a node (the filter's fan-out, `--node-lock-timeout` for locks)."""
        self._trust = BookingTrust(settings, booking_keys)
        self._lock_releases: dict[tuple[str, str], LockRelease] = {}  # by (node, pod key)

    # --- reading ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """The first lists are done (pods, nodes and, when watched, ResourceQuotas: HAMi waits
        for every informer's cache, `pkg/scheduler/scheduler.go:389`)."""
        return (
            self.pods_synced.is_set() and self.nodes_synced.is_set() and self.quotas_synced.is_set()
        )

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

    def bound_node(self, pod: PodInfo) -> str | None:
        """The node this process bound `pod` to, while the watch has not shown that yet (the
        booking is BOUND); None otherwise."""
        with self._lock:
            booking = self._bookings.get(pod.key)
            if booking is None or booking.phase is not BookingPhase.BOUND:
                return None
            return booking.node if same_pod(booking.uid, pod.uid) else None

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
            return self._in_flight.on_node(node)

    def locked_nodes(self) -> list[NodeInfo]:
        """Nodes whose last seen version carries `hami.io/mutex.lock`."""
        with self._lock:
            return self._nodes.locked()

    # --- informer events: nodes -------------------------------------------------------------

    def node_upserted(self, info: NodeInfo) -> None:
        """A node was added or changed: register its GPUs while healthy and selected."""
        if not self._nodes.selected(info):
            self.node_deleted(info.name)
            return
        now = self.clock.now()
        with self._lock:
            if self._nodes.upsert(info, now):
                self.changed.notify_all()

    def node_deleted(self, name: str) -> None:
        """A node was deleted (or left the label selector): forget its GPUs."""
        with self._lock:
            self._nodes.delete(name)
            self.changed.notify_all()

    def recheck_health(self) -> None:
        """Run the health check again on every node: HAMi's verdict depends on time (a
        `Requesting_` handshake goes stale after 60 s) as well as on node events."""
        now = self.clock.now()
        with self._lock:
            self._nodes.recheck(now)

    def take_handshakes(self) -> dict[str, str | None]:
        """Node -> handshake value to write (None: delete it), and forget them (the leader
        writes them)."""
        with self._lock:
            return self._nodes.take_handshakes()

    # --- informer events: pods ----------------------------------------------------------------

    def pod_upserted(self, info: PodInfo) -> None:
        """A pod was added or changed (the booking rules: `extender.bookings`)."""
        with self._lock:
            self._pods[info.key] = info
            self._pod_changed(info)

    def _pod_changed(self, info: PodInfo) -> None:
        key = info.key
        counted = self._trust.counted(info)
        booking = self._bookings.get(key)
        phase = counted.annotations.get(ANNOTATION_BIND_PHASE)
        if booking is not None and booking.uid and info.uid:
            if booking.uid != info.uid:
                if booking.seen:
                    # a new pod of the same name: the booking was for its predecessor
                    self._drop_booking(key)
                    booking = None
                else:
                    # the predecessor's event, delivered late: the booking stands
                    self._watch_in_flight(counted, drop_own=False)
                    self._in_flight.update_allocating(counted, phase, self.clock.monotonic())
                    return
            elif not booking.seen:
                booking = replace(booking, seen=True)
                self._bookings.put(booking)
        retired = booking is not None and (info.finished or booking.shown_by(info))
        if booking is not None and not retired:
            if booking.phase is BookingPhase.FILTERED and (info.node_name or info.deleting):
                self._drop_booking(key)  # bound by someone else, or going away
        else:
            if booking is not None:
                self._bookings.pop(key)  # the pod's own annotations take over
            self._track_from_annotations(counted)
        # this process's in-flight entry is superseded once the watch shows the patched pod
        drop_own = retired or info.finished or info.deleting or bool(info.node_name)
        self._watch_in_flight(counted, drop_own)
        self._in_flight.update_allocating(counted, phase, self.clock.monotonic())

    def _track_from_annotations(self, info: PodInfo) -> None:
        """Count what the pod's own annotations book, except for a pod whose bind failed while
        it is still Pending (our Allocate never serves it)."""
        phase = info.annotations.get(ANNOTATION_BIND_PHASE)
        if phase == BindPhase.FAILED and info.phase in (POD_PENDING, ""):
            self.ledger.untrack(info.key)
        else:
            self.ledger.update_pod(info)
        self._follow_quota(info.key)

    def _follow_quota(self, key: str) -> None:
        """The namespace quota usage follows the ledger's booking of the pod."""
        self.quotas.follow(key, self.ledger.tracked(key))

    def _shape_of(self, info: PodInfo) -> Hashable | None:
        return pod_shape(info, self.settings)

    def _watch_in_flight(self, info: PodInfo, drop_own: bool) -> None:
        changed = self._in_flight.watched(info, self._shape_of)
        if drop_own:
            changed = self._in_flight.drop_own(info.key) or changed
        if changed:
            self.changed.notify_all()

    def pod_deleted(self, info: PodInfo) -> None:
        """A pod was deleted: its GPUs, booking and in-flight entry go at once; a node lock it
        holds is queued for release (the recovery loop does the API call)."""
        key = info.key
        with self._lock:
            last = self._pods.get(key, info)
            if same_pod(last.uid, info.uid):
                self._pods.pop(key, None)
            self._trust.pod_deleted(key, info.uid)
            self._in_flight.forget_watched(key)
            self._in_flight.forget_allocating(key, info.uid)
            booking = self._bookings.get(key)
            if booking is not None and not same_pod(booking.uid, info.uid):
                # the booking is a successor's of the same name (decided before our watch
                # caught up): the ledger entry of the key is that booking, and any lock
                # naming the pod may be the successor's
                self.changed.notify_all()
                return
            self._drop_booking(key)
            self.ledger.delete_pod(key)
            self._follow_quota(key)
            self._in_flight.drop_own(key)
            for candidate in {
                last.annotations.get(ANNOTATION_VGPU_NODE, ""),
                last.node_name,
                info.annotations.get(ANNOTATION_VGPU_NODE, ""),
            }:
                value = self._nodes.lock_held_by(candidate, info.namespace, info.name)
                if value is not None:
                    self._lock_releases[(candidate, key)] = LockRelease(
                        candidate, info.namespace, info.name, value
                    )
                    self.work.set()
            self.changed.notify_all()

    def take_lock_releases(self) -> list[LockRelease]:
        """The locks of deleted pods to release, and forget them."""
        with self._lock:
            pending, self._lock_releases = self._lock_releases, {}
            return list(pending.values())

    def stale_allocations(self, now: datetime, timeout_seconds: float) -> list[StaleAllocation]:
        """Pods `allocating` and still Pending for longer than `timeout_seconds`, measured from
        `hami.io/bind-time` (or from when this process first saw them allocating, if that
        annotation is unreadable)."""
        monotonic = self.clock.monotonic()
        with self._lock:
            return self._in_flight.stale(now, monotonic, timeout_seconds)

    # --- bookings -----------------------------------------------------------------------------

    def expire_bookings(self) -> int:
        """Free FILTERED bookings past their time; returns how many (also counted)."""
        with self._lock:
            expired = self._expire()
        for _ in range(expired):
            self.observer.booking_expired()
        return expired

    def _expire(self) -> int:
        now = self.clock.monotonic()
        expired = self._bookings.expired(now)
        for booking in expired:
            logger.info(
                "filter booking of pod %s on node %s expired: no bind followed",
                booking.key,
                booking.node,
            )
            self._drop_booking(booking.key)
        for booking in self._bookings.vanished(now, self._shown):
            logger.info(
                "booking of pod %s on node %s freed: the pod is gone (not in the relist)",
                booking.key,
                booking.node,
            )
            self._drop_booking(booking.key)
            self._drop_own_in_flight(booking.key)
        return len(expired)

    def pods_relisted(self) -> None:
        """The pod informer holds a whole list (its first, or a relist after a lost watch).

        A bound booking whose pod the list does not show was made for a pod that is gone (its
        DELETED event was lost with the watch, and the informer, which never stored it, cannot
        report it) or for one created after the list was taken (its events are on their way).
        Such bookings are checked again once `booking_ttl_seconds` passed: if the pod has
        still not shown up, it is gone and its GPUs are freed."""
        with self._lock:
            deadline = self.clock.monotonic() + self.booking_ttl_seconds
            self._bookings.mark_unshown(deadline, self._shown)
        self.pods_synced.set()

    def _watched(self, key: str, uid: str) -> bool:
        """The watch shows the pod `key` of that UID (an unknown UID matches any)."""
        stored = self._pods.get(key)
        return stored is not None and same_pod(stored.uid, uid)

    def _shown(self, booking: Booking) -> bool:
        return self._watched(booking.key, booking.uid)

    def _drop_booking(self, key: str) -> None:
        if self._bookings.pop(key) is None:
            return
        self.ledger.untrack(key)
        self._follow_quota(key)
        pod = self._pods.get(key)
        if pod is not None:
            # they count again (if they book anything and, with a key, are trusted)
            self._track_from_annotations(self._trust.last_counted(pod))

    def _drop_own_in_flight(self, key: str) -> None:
        if self._in_flight.drop_own(key):
            self.changed.notify_all()

    # --- quotas -------------------------------------------------------------------------------

    def quota_upserted(self, new: ResourceQuotaInfo, old: ResourceQuotaInfo | None) -> None:
        """A ResourceQuota appeared or its `spec.hard` changed (HAMi's `AddQuota`, or
        `UpdateQuota` in one step under the lock)."""
        with self._lock:
            if old is None:
                self.quotas.add_quota(new.namespace, new.hard_map)
            else:
                self.quotas.update_quota(new.namespace, old.hard_map, new.hard_map)

    def quota_deleted(self, old: ResourceQuotaInfo) -> None:
        """A ResourceQuota went away (HAMi's `DelQuota`)."""
        with self._lock:
            self.quotas.del_quota(old.namespace, old.hard_map)

    def quota_entries(self) -> list[QuotaEntry]:
        """Every namespace's quota figures (the `hami_resource_quota_*` metrics)."""
        with self._lock:
            return self.quotas.entries()

    def fits_quota(self, namespace: str, memory_mib: int, cores: int) -> bool:
        """HAMi's `FitQuota` for a whole pod's request (the webhook's check)."""
        with self._lock:
            return self.quotas.fit_quota(namespace, memory_mib, self.settings.memory_factor, cores)

    # --- filter -------------------------------------------------------------------------------

    def filter(
        self,
        info: PodInfo,
        node_names: Sequence[str] | None,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> FilterAnswer:
        """Answer kube-scheduler's filter (docs/hami-reference.md 3.4) and book the chosen node's
        GPUs.

        `nodes` is the `Nodes` form (not node-cache-capable): HAMi's simulation on those node
        objects with no usage, nothing booked. Raises nothing for bad input: an invalid
        annotation is an answer with `error`.
        """
        requests = pod_requests(info, self.settings)
        # The decision stays HAMi's (a dropped request asks no GPU); what HAMi reads differently
        # from what the pod says is logged, once per filter call, before that early answer.
        for problem in requests.problems:
            logger.warning("pod %s: %s", info.key, problem)
        if not requests.wants_gpu:
            # HAMi answers NodeNames as given; the Nodes form gets its nodes back (HAMi answers
            # Nodes null there, which makes kube-scheduler drop every node).
            return FilterAnswer(
                node_names=list(node_names) if node_names is not None else None,
                nodes=list(nodes) if nodes is not None else None,
                outcome="no_gpu",
            )
        if nodes is not None:
            answer = simulate(info, requests, nodes, self.clock.now(), self.settings)
        else:
            names = list(node_names or ())
            now = self.clock.now()
            with self._lock:
                expired = self._expire()
                # re-scheduling: what the pod booked before is released first (HAMi Filter
                # step 3)
                self._drop_booking(info.key)
                self._drop_own_in_flight(info.key)
                self.ledger.untrack(info.key)
                self._follow_quota(info.key)
                result = decide(
                    self.ledger,
                    info,
                    names,
                    now,
                    self.settings,
                    cache=self.fit_cache,
                    requests=requests,
                    would_wait=lambda node, devices, shape: self._waits.would_wait(
                        info, node, devices, shape, now
                    ),
                    look_ahead=self.burst_look_ahead,
                    quota=self.quotas.quota_fit(info.namespace, self.settings.memory_factor),
                )
                if result.error is None and result.node is not None:
                    assume(self.ledger, info.key, result)
                    self._follow_quota(info.key)
                    self._bookings.book(
                        info.key,
                        info.uid,
                        result.node,
                        result,
                        seen=self._watched(info.key, info.uid),
                        expires=self.clock.monotonic() + self.booking_ttl_seconds,
                    )
            answer = filter_answer(info, names, result)
            for _ in range(expired):
                self.observer.booking_expired()
            if result.fanned_out:
                self.observer.filter_fanned_out()
        if answer.failure_counts:
            self.observer.filter_failures(answer.failure_counts)
        return answer

    # --- bind ---------------------------------------------------------------------------------

    def plan_bind(self, pod: PodInfo, node: str) -> BindPlan | BindRefusal:
        """Turn the pod's filter booking on `node` into a bind plan (BINDING: it no longer
        expires). Without a usable booking (none, expired, another node, another pod of the
        same name) the pod is decided again on `node` alone; a refusal when the pod does not
        fit there, the node is not registered or the pod's annotation cannot be read."""
        now = self.clock.now()
        with self._lock:
            self._expire()
            booking = self._bookings.get(pod.key)
            usable = (
                booking is not None
                and booking.node == node
                and booking.phase is BookingPhase.FILTERED
                and same_pod(booking.uid, pod.uid)
            )
            if booking is None or not usable:
                self._drop_booking(pod.key)
                self._drop_own_in_flight(pod.key)
                self.ledger.untrack(pod.key)
                self._follow_quota(pod.key)
                result = decide(
                    self.ledger,
                    pod,
                    [node],
                    now,
                    self.settings,
                    cache=self.fit_cache,
                    quota=self.quotas.quota_fit(pod.namespace, self.settings.memory_factor),
                )
                if result.error is not None:
                    return BindRefusal(pod, node, annotation_error=result.error)
                if result.node is None:
                    return BindRefusal(pod, node, failure=result.failed_nodes.get(node))
                assume(self.ledger, pod.key, result)
                self._follow_quota(pod.key)
                booking = self._bookings.book(
                    pod.key, pod.uid, node, result, seen=self._watched(pod.key, pod.uid)
                )
            bind_time = str(int(now.timestamp()))
            uid = pod.uid or booking.uid
            annotations = dict(booking.result.annotations)
            annotations[ANNOTATION_BIND_PHASE] = BindPhase.ALLOCATING.value
            annotations[ANNOTATION_BIND_TIME] = bind_time
            signature = self._trust.sign(pod.key, uid, node, annotations)
            self._bookings.put(
                replace(
                    booking,
                    phase=BookingPhase.BINDING,
                    bind_time=bind_time,
                    uid=uid,
                    signature=signature,
                )
            )
            protocol = self._nodes.allocate_protocol_level(node) > 0
            entry = None
            if protocol:
                devices = booking.result.devices
                entry = inflight.InFlightPod(
                    pod.namespace,
                    pod.name,
                    inflight.created_seconds_of(pod.creation_timestamp),
                    devices,
                    devices,
                    uid=uid,
                    shape=booking.result.shape,
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
            rebooked=not usable,
        )

    def claim_in_flight(
        self, plan: BindPlan, deadline: float, stop: threading.Event | None = None
    ) -> str | None:
        """Wait until no in-flight pod of the node could be confused with the plan's pod
        (`inflight.must_wait_for`), then count it in flight (not bound yet). Returns None when
        claimed, else why not, once `deadline` (on `clock.monotonic()`) passed or `stop` was
        set."""
        me = plan.in_flight
        if me is None:
            return None
        key = plan.pod.key
        with self._lock:
            while True:
                level = self._nodes.allocate_protocol_level(plan.node)
                blocker = self._in_flight.blocker(me, plan.node, key, max(level, 1))
                if blocker is None:
                    self._in_flight.claim(plan.node, key, me)
                    return None
                left = deadline - self.clock.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return blocker
                # the poll bound only guards against a missed notification (and lets a
                # manual clock's advance end the wait)
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
                self._bookings.put(replace(booking, phase=BookingPhase.BOUND))
            if self._in_flight.mark_bound(plan.node, key):
                self.changed.notify_all()

    def bind_failed(self, plan: BindPlan) -> None:
        """Roll back in memory: the booking is freed, the pod no longer counts in flight, the
        signed booking is no longer this process's own (should the revert not have reached
        the pod, its events are verified again)."""
        with self._lock:
            self._trust.bind_failed(plan.pod.key, plan.annotations)
            self._drop_booking(plan.pod.key)
            self._in_flight.drop_own(plan.pod.key)
            self.changed.notify_all()

    def drop_pod_booking(self, namespace: str, name: str) -> None:
        """Free a pod's booking (recovery, a bind that found the pod gone)."""
        with self._lock:
            self._drop_booking(f"{namespace}/{name}")
            self._in_flight.drop_own(f"{namespace}/{name}")
            self.changed.notify_all()
