"""The scheduler's book: everything filter, bind and recovery decide on, as ONE value.

`Book` holds the ledger (nodes registered while healthy and selected, usage from the bookings
that count), the filter bookings (`bookings`), the in-flight pods (`inflight`), the nodes as
the watch shows them (`nodes`), what is trusted of each booking (`trust`), the namespace GPU
quotas, the pods as the watch shows them and the locks of deleted pods to release. Each
transition (a pod or node event, a filter, a bind's steps, expiry) updates it and returns a
`Change`: what the caller must do about it (docs/design.md 3).

It is pure: no lock (not thread-safe), no clock (every transition is given the time), no key
file (the booking keys are passed in; None trusts every booking, as HAMi does), no API call.
`extender.state.SchedulerState` is the shell that owns the lock, reads the clock and the keys,
and acts on each `Change`.

While a filter booking stands, the pod's own annotations are not counted (they are absent, or
those of an older failed attempt); the first pod event that carries the booking replaces it, so
a pod is never counted twice nor, between its bind and its watch event, not at all (3.2).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hami_plugin.protocol import inflight
from hami_plugin.protocol.booking import booking_annotations
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    BindPhase,
)
from hami_plugin.protocol.nodelock import LockRelease
from hami_plugin.protocol.objects import POD_PENDING, NodeInfo, PodInfo
from hami_plugin.protocol.signature import BookingKeys
from hami_plugin.scheduler.book.bookings import (
    BindPlan,
    BindRefusal,
    Booking,
    BookingPhase,
    Bookings,
)
from hami_plugin.scheduler.book.holds import Holds, is_hold_key
from hami_plugin.scheduler.book.inflight import InFlightTracker, StaleAllocation
from hami_plugin.scheduler.book.nodes import NodeRegistry
from hami_plugin.scheduler.book.preempting import Planner, Preemption
from hami_plugin.scheduler.book.trust import BookingTrust, same_pod
from hami_plugin.scheduler.book.waits import BindWaits
from hami_plugin.scheduler.filter import FilterResult, FitCache, assume, decide, pod_shape
from hami_plugin.scheduler.health import NodeHealthTracker
from hami_plugin.scheduler.ledger import Ledger, TrackedPod
from hami_plugin.scheduler.quota import QuotaBook, QuotaEntry
from hami_plugin.scheduler.requests import PodRequests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["DEFAULT_BURST_LOOK_AHEAD", "Book", "BookSettings", "Change"]

logger = logging.getLogger(__name__)

DEFAULT_BURST_LOOK_AHEAD = 16
"""`--burst-look-ahead`: at most this many fitting nodes past the policy's first are tried for
a node where the bind would not wait (docs/scheduler.md, "Bursts across nodes")."""


@dataclass(frozen=True, slots=True)
class BookSettings:
    """What the book is configured with: the scheduler's settings, how long a filter booking
    holds its GPUs, the burst fan-out, HAMi's node lock timeout and `--node-label-selector`."""

    scheduler: SchedulerSettings
    booking_ttl_seconds: float = 30.0
    burst_look_ahead: int = DEFAULT_BURST_LOOK_AHEAD
    node_lock_timeout: timedelta = timedelta(minutes=5)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    preemption: bool = True
    """A pod that fits nowhere takes GPUs back from pods of lower priority (docs/design.md 11)."""


@dataclass(frozen=True, slots=True)
class Change:
    """What a transition changed that the book's owner must act on.

    `wake_binds`: an in-flight pod, a node lock or a node's allocate protocol changed, so the
    binds waiting for one of them look again. `lock_releases`: a deleted pod's node lock is
    queued (`Book.take_lock_releases`). `expired`: filter bookings freed unbound. `preemption`:
    victims to evict (the hold is booked); `preemption_outcome`: `Planner.preempt`'s, or ""."""

    wake_binds: bool = False
    lock_releases: bool = False
    expired: int = 0
    preemption: Preemption | None = None
    preemption_outcome: str = ""


_NO_CHANGE = Change()


class Book:
    """The scheduler's bookkeeping; see the module docstring. Not thread-safe."""

    def __init__(self, settings: BookSettings, health: NodeHealthTracker | None = None) -> None:
        self._settings = settings
        self._scheduler = settings.scheduler
        self._ledger = Ledger()
        self._fit_cache = FitCache()
        self._quotas = QuotaBook(resources=settings.scheduler.resources)
        self._bookings = Bookings()
        self._in_flight = InFlightTracker()
        self._nodes = NodeRegistry(
            self._ledger, health or NodeHealthTracker(), settings.node_selector
        )
        self._pods: dict[str, PodInfo] = {}
        self._waits = BindWaits(
            self._bookings, self._nodes, self._in_flight, self._pods, settings.node_lock_timeout
        )
        self._trust = BookingTrust(settings.scheduler)
        self._lock_releases: dict[tuple[str, str], LockRelease] = {}  # by (node, pod key)
        self._holds = Holds(self._ledger)
        self._planner = Planner(
            self._ledger, self._pods, self._holds, self._quotas, settings.scheduler
        )
        # what the transition under way changed (`_change` hands it out and resets it)
        self._wake = False
        self._released = False

    def _change(
        self, expired: int = 0, preemption: tuple[Preemption | None, str] = (None, "")
    ) -> Change:
        if not (self._wake or self._released or expired or preemption[1]):
            return _NO_CHANGE  # most pod events: nothing to act on, nothing to allocate
        change = Change(self._wake, self._released, expired, *preemption)
        self._wake = self._released = False
        return change

    # --- reading ------------------------------------------------------------------------------

    def usages(self) -> list[NodeUsage]:
        """Every registered node's usage snapshot, by node name."""
        return self._ledger.usages()

    def tracked_pods(self) -> list[TrackedPod]:
        """Every tracked pod's booked usage, by pod key (holds are no pods)."""
        return [pod for pod in self._ledger.tracked_pods() if not is_hold_key(pod.key)]

    def node_usage(self, name: str) -> NodeUsage | None:
        """The node's usage snapshot; None when it is not registered."""
        return self._ledger.node(name)

    def tracked(self, key: str) -> TrackedPod | None:
        """The usage booked for pod `key` (`<namespace>/<name>`), if it counts."""
        return self._ledger.tracked(key)

    def registered_nodes(self) -> list[str]:
        """The names of the registered nodes, sorted."""
        return self._ledger.node_names()

    @property
    def pod_count(self) -> int:
        """How many pods count in the ledger."""
        return self._ledger.pod_count - len(self._holds)

    def pod(self, key: str) -> PodInfo | None:
        """The pod as the watch last showed it."""
        return self._pods.get(key)

    def node(self, name: str) -> NodeInfo | None:
        """The node as the watch last showed it (only nodes matching the selector)."""
        return self._nodes.get(name)

    def bound_node(self, pod: PodInfo) -> str | None:
        """The node this process bound `pod` to while the watch has not shown it (the booking
        is BOUND); None otherwise."""
        booking = self._bookings.get(pod.key)
        if booking is None or booking.phase is not BookingPhase.BOUND:
            return None
        return booking.node if same_pod(booking.uid, pod.uid) else None

    def booking_phase(self, key: str) -> BookingPhase | None:
        booking = self._bookings.get(key)
        return None if booking is None else booking.phase

    def bookings(self) -> dict[str, tuple[str, BookingPhase]]:
        """Pod key -> (node, phase) of every standing booking."""
        return {key: (b.node, b.phase) for key, b in self._bookings.items()}

    def in_flight(self, node: str) -> dict[str, inflight.InFlightPod | None]:
        """Pod key -> in-flight view of a node's in-flight pods (None: unreadable booking)."""
        return self._in_flight.on_node(node)

    def locked_nodes(self) -> list[NodeInfo]:
        """Nodes whose last seen version carries `hami.io/mutex.lock`."""
        return self._nodes.locked()

    def stale_allocations(
        self, now: datetime, monotonic: float, timeout_seconds: float
    ) -> list[StaleAllocation]:
        """Pods `allocating` and still Pending for longer than `timeout_seconds`, from
        `hami.io/bind-time` (or from when first seen allocating, if that is unreadable)."""
        return self._in_flight.stale(now, monotonic, timeout_seconds)

    def quota_entries(self) -> list[QuotaEntry]:
        """Every namespace's quota figures."""
        return self._quotas.entries()

    def has_quota(self, namespace: str) -> bool:
        """The namespace has a GPU memory or cores limit."""
        return self._quotas.has_limits(namespace)

    def fits_quota(self, namespace: str, memory_mib: int, cores: int) -> bool:
        """HAMi's `FitQuota` for a whole pod's request (the webhook's check)."""
        return self._quotas.fit_quota(namespace, memory_mib, self._scheduler.memory_factor, cores)

    # --- nodes --------------------------------------------------------------------------------

    def apply_node(self, info: NodeInfo, now: datetime) -> Change:
        """A node was added or changed: register its GPUs while healthy and selected."""
        if not self._nodes.selected(info):
            return self.delete_node(info.name)
        self._wake = self._nodes.upsert(info, now)
        return self._change()

    def delete_node(self, name: str) -> Change:
        """A node was deleted (or left the label selector): forget it and its GPUs."""
        self._nodes.delete(name)
        self._wake = True
        return self._change()

    def recheck_health(self, now: datetime) -> None:
        """Judge every node again: HAMi's verdict depends on time (a `Requesting_` handshake
        goes stale after 60 s) as well as on node events."""
        self._nodes.recheck(now)

    def take_handshakes(self) -> dict[str, str | None]:
        """Node -> handshake value to write (None: delete it), and forget them."""
        return self._nodes.take_handshakes()

    # --- quotas -------------------------------------------------------------------------------

    def apply_quota(
        self, namespace: str, hard: Mapping[str, object], old: Mapping[str, object] | None
    ) -> None:
        """A ResourceQuota appeared (`old` None) or its `spec.hard` changed (HAMi's `AddQuota`
        and `UpdateQuota`, pkg/scheduler/scheduler.go:304-334)."""
        if old is None:
            self._quotas.add_quota(namespace, hard)
        else:
            self._quotas.update_quota(namespace, old, hard)

    def delete_quota(self, namespace: str, hard: Mapping[str, object]) -> None:
        """A ResourceQuota went away (HAMi's `DelQuota`)."""
        self._quotas.del_quota(namespace, hard)

    # --- pods ---------------------------------------------------------------------------------

    def apply_pod(self, info: PodInfo, keys: BookingKeys | None, monotonic: float) -> Change:
        """A pod was added or changed (the booking rules of the module docstring)."""
        self._pods[info.key] = info
        key = info.key
        self._planner.follow(info)
        counted = self._trust.counted(info, keys)
        booking = self._bookings.get(key)
        if booking is not None and booking.uid and info.uid:
            if booking.uid != info.uid:
                if booking.seen:
                    # a new pod of the same name: the booking was for its predecessor
                    self._drop_booking(key)
                    booking = None
                else:
                    # the predecessor's event, delivered late: the booking stands
                    self._watch_in_flight(counted, drop_own=False)
                    self._in_flight.update_allocating(counted, monotonic)
                    return self._change()
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
        self._in_flight.update_allocating(counted, monotonic)
        return self._change()

    def delete_pod(self, info: PodInfo) -> Change:
        """A pod was deleted: its GPUs, booking and in-flight entry go at once; a node lock it
        holds is queued for release (`take_lock_releases`)."""
        key = info.key
        last = self._pods.get(key, info)
        if same_pod(last.uid, info.uid):
            self._pods.pop(key, None)
            self._planner.pod_deleted(key)
        self._trust.pod_deleted(key, info.uid)
        self._in_flight.forget_watched(key)
        self._in_flight.forget_allocating(key, info.uid)
        self._wake = True
        booking = self._bookings.get(key)
        if booking is not None and not same_pod(booking.uid, info.uid):
            # the booking is a successor's of the same name (decided before the watch caught
            # up): the ledger entry of the key is that booking, and any lock naming the pod
            # may be the successor's
            return self._change()
        self._drop_booking(key)
        self._ledger.delete_pod(key)
        self._follow_quota(key)
        self._in_flight.drop_own(key)
        for candidate in {_booked_node(last), last.node_name, _booked_node(info)}:
            value = self._nodes.lock_held_by(candidate, info.namespace, info.name)
            if value is not None:
                self._lock_releases[(candidate, key)] = LockRelease(
                    candidate, info.namespace, info.name, value
                )
                self._released = True
        return self._change()

    def relisted(self, monotonic: float) -> None:
        """The pod watch holds a whole list (its first, or a relist after a lost watch).

        A bound booking whose pod the list does not show was made for a pod that is gone (its
        DELETED event was lost with the watch) or for one created after the list was taken
        (its events are on their way): it is checked again one booking TTL later, and freed
        if the pod has still not shown up (`expire`)."""
        deadline = monotonic + self._settings.booking_ttl_seconds
        self._bookings.mark_unshown(deadline, self._shown)

    def take_lock_releases(self) -> list[LockRelease]:
        """The locks of deleted pods to release, and forget them."""
        pending, self._lock_releases = self._lock_releases, {}
        return list(pending.values())

    # --- bookings -----------------------------------------------------------------------------

    def expire(self, monotonic: float) -> Change:
        """Free FILTERED bookings past their time, and bound ones whose pod a relist did not
        show within a TTL; `Change.expired` counts the first."""
        return self._change(expired=self._expire(monotonic))

    def filter(
        self,
        info: PodInfo,
        requests: PodRequests,
        names: Sequence[str],
        now: datetime,
        monotonic: float,
    ) -> tuple[FilterResult, Change]:
        """Decide kube-scheduler's filter over `names` and book the chosen node's GPUs
        (FILTERED, for one booking TTL). What the pod booked before is released first (HAMi
        Filter step 3)."""
        expired = self._expire(monotonic)
        result = self._rebook(info, names, now, requests=requests, fan_out=True)
        preemption: tuple[Preemption | None, str] = (None, "")
        if result.error is None and result.node is not None:
            self._bookings.book(
                info.key,
                info.uid,
                result.node,
                result,
                seen=self._watched(info.key, info.uid),
                expires=monotonic + self._settings.booking_ttl_seconds,
            )
        elif result.error is None and result.requests.wants_gpu and self._settings.preemption:
            preemption = self._planner.preempt(info, result)
        return result, self._change(expired, preemption)

    # --- preemption ---------------------------------------------------------------------------

    @property
    def preemption(self) -> Planner:
        """Preemption's side of the book: the preempt verb (`refine_for`), evictions that failed
        (`failed`), PodDisruptionBudgets (`apply_budget`), the holds (`holds`, `held`)."""
        return self._planner

    def plan_bind(
        self,
        pod: PodInfo,
        node: str,
        keys: BookingKeys | None,
        now: datetime,
        monotonic: float,
    ) -> tuple[BindPlan | BindRefusal, Change]:
        """Turn the pod's filter booking on `node` into a bind plan (BINDING: it no longer
        expires), signed with `keys`. Without a usable booking (none, expired, another node,
        another pod of the same name) the pod is decided again on `node` alone; a refusal when
        it does not fit there, the node is not registered or an annotation cannot be read."""
        self._expire(monotonic)
        booking = self._bookings.get(pod.key)
        usable = (
            booking is not None
            and booking.node == node
            and booking.phase is BookingPhase.FILTERED
            and same_pod(booking.uid, pod.uid)
        )
        if booking is None or not usable:
            result = self._rebook(pod, [node], now)
            if result.error is not None:
                return BindRefusal(pod, node, annotation_error=result.error), self._change()
            if result.node is None:
                refusal = BindRefusal(pod, node, failure=result.failed_nodes.get(node))
                return refusal, self._change()
            booking = self._bookings.book(
                pod.key, pod.uid, node, result, seen=self._watched(pod.key, pod.uid)
            )
        return self._plan(pod, node, booking, keys, now, rebooked=not usable), self._change()

    def _plan(
        self,
        pod: PodInfo,
        node: str,
        booking: Booking,
        keys: BookingKeys | None,
        now: datetime,
        *,
        rebooked: bool,
    ) -> BindPlan:
        bind_time = str(int(now.timestamp()))
        uid = pod.uid or booking.uid
        result = booking.result
        assert result.node is not None and result.decided_at is not None  # a booked decision
        annotations = booking_annotations(node, result.devices, result.mig, result.decided_at)
        annotations[ANNOTATION_BIND_PHASE] = BindPhase.ALLOCATING.value
        annotations[ANNOTATION_BIND_TIME] = bind_time
        announced = self._nodes.booking_signatures(node)
        signature = self._trust.sign(pod.key, uid, annotations, keys, announced)
        self._bookings.put(
            replace(
                booking,
                phase=BookingPhase.BINDING,
                bind_time=bind_time,
                uid=uid,
                signature=signature,
                allocated_text=annotations[ANNOTATION_DEVICES_ALLOCATED],
            )
        )
        protocol = self._nodes.allocate_protocol_level(node) > 0
        return BindPlan.of(pod, uid, node, result, annotations, protocol, rebooked)

    def claim_in_flight(self, plan: BindPlan) -> str | None:
        """Count the plan's pod in flight on its node (not bound yet) unless an in-flight pod
        there could be confused with it (`inflight.must_wait_for`): then why, nothing claimed."""
        me = plan.in_flight
        if me is None:
            return None
        level = self._nodes.allocate_protocol_level(plan.node)
        blocker = self._in_flight.blocker(me, plan.node, plan.pod.key, max(level, 1))
        if blocker is None:
            self._in_flight.claim(plan.node, plan.pod.key, me)
        return blocker

    def bind_succeeded(self, plan: BindPlan) -> Change:
        """The Binding was created: the booking stays (BOUND) until the watch shows it, and
        the pod counts in flight as bound (kubelet orders it before later pods)."""
        key = plan.pod.key
        booking = self._bookings.get(key)
        if booking is not None and booking.phase is BookingPhase.BINDING:
            self._bookings.put(replace(booking, phase=BookingPhase.BOUND))
        self._wake = self._in_flight.mark_bound(plan.node, key)
        return self._change()

    def bind_failed(self, plan: BindPlan) -> Change:
        """Roll back: the booking is freed, the pod no longer counts in flight, the signed
        booking is no longer this process's own (should the revert not have reached the pod,
        its events are verified again)."""
        self._trust.bind_failed(plan.pod.key, plan.annotations)
        return self.release(plan.pod.key)

    def release(self, key: str) -> Change:
        """Free a pod's booking and in-flight entry (recovery, a bind that found the pod gone)."""
        self._drop_booking(key)
        self._in_flight.drop_own(key)
        self._wake = True
        return self._change()

    # --- the transitions' parts ---------------------------------------------------------------

    def _rebook(
        self,
        pod: PodInfo,
        names: Sequence[str],
        now: datetime,
        *,
        requests: PodRequests | None = None,
        fan_out: bool = False,
    ) -> FilterResult:
        """Decide the pod again over `names`, what it booked before released first, and count
        the decision in the ledger and its quota at once (HAMi tracks it before the watch
        shows the patch). `fan_out`: a burst may go past the policy's first node."""
        key = pod.key
        self._planner.settle()
        # neither its standing booking nor its own annotations count while it is decided
        self._bookings.pop(key)
        self._drop_own_in_flight(key)
        self._ledger.untrack(key)
        self._follow_quota(key)
        # nor what is held for it or for pods of lower priority
        lifted = self._holds.lift(key, pod.priority) if len(self._holds) else []
        result = decide(
            self._ledger,
            pod,
            names,
            now,
            self._scheduler,
            cache=self._fit_cache,
            requests=requests,
            would_wait=(
                (lambda n, devices, shape: self._waits.would_wait(pod, n, devices, shape, now))
                if fan_out
                else None
            ),
            look_ahead=self._settings.burst_look_ahead if fan_out else 0,
            quota=self._quotas.quota_fit(pod.namespace, self._scheduler.memory_factor),
        )
        if result.error is None and result.node is not None:
            self._holds.drop(key)  # its booking holds the GPUs now
            assume(self._ledger, key, result)
            self._follow_quota(key)
        if lifted:
            self._holds.restore(lifted)
        return result

    def _expire(self, monotonic: float) -> int:
        expired = self._bookings.expired(monotonic)
        for booking in expired:
            logger.info(
                "filter booking of pod %s on node %s expired: no bind followed",
                booking.key,
                booking.node,
            )
            self._drop_booking(booking.key)
        for booking in self._bookings.vanished(monotonic, self._shown):
            logger.info(
                "booking of pod %s on node %s freed: the pod is gone (not in the relist)",
                booking.key,
                booking.node,
            )
            self._drop_booking(booking.key)
            self._drop_own_in_flight(booking.key)
        return len(expired)

    def _track_from_annotations(self, info: PodInfo) -> None:
        """Count what the pod's own booking books, except for a pod whose bind failed while it
        is still Pending (our Allocate never serves it), unless its booking is signed and the
        pod bound (`BookingTrust.signed_and_bound`: bind-phase is the pod author's to write)."""
        booking = info.booking
        if (
            booking is not None
            and booking.failed
            and info.phase in (POD_PENDING, "")
            and not self._trust.signed_and_bound(info)
        ):
            self._ledger.untrack(info.key)
        else:
            self._ledger.update_pod(info)
        self._follow_quota(info.key)

    def _follow_quota(self, key: str) -> None:
        """The namespace quota usage follows the ledger's booking of the pod."""
        self._quotas.follow(key, self._ledger.tracked(key))

    def _shape_of(self, info: PodInfo) -> Hashable | None:
        return pod_shape(info, self._scheduler)

    def _watch_in_flight(self, info: PodInfo, drop_own: bool) -> None:
        changed = self._in_flight.watched(info, self._shape_of)
        if drop_own:
            changed = self._in_flight.drop_own(info.key) or changed
        self._wake = self._wake or changed

    def _watched(self, key: str, uid: str) -> bool:
        """The watch shows the pod `key` of that UID (an unknown UID matches any)."""
        stored = self._pods.get(key)
        return stored is not None and same_pod(stored.uid, uid)

    def _shown(self, booking: Booking) -> bool:
        return self._watched(booking.key, booking.uid)

    def _drop_booking(self, key: str) -> None:
        if self._bookings.pop(key) is None:
            return
        self._ledger.untrack(key)
        self._follow_quota(key)
        pod = self._pods.get(key)
        if pod is not None:
            # its own annotations count again (if they book anything and are trusted)
            self._track_from_annotations(self._trust.last_counted(pod))

    def _drop_own_in_flight(self, key: str) -> None:
        if self._in_flight.drop_own(key):
            self._wake = True


def _booked_node(pod: PodInfo) -> str:
    return pod.booking.node if pod.booking is not None else ""
