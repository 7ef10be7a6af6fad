"""The scheduler daemon's memory: the book (`scheduler.book`) behind ONE lock.

`SchedulerState` is the thin shell around the pure `Book`: it owns the lock, reads the clock
and the booking keys (before taking the lock: the key file may be re-read), runs each
transition and acts on the `Change` it returns: it wakes the binds waiting for an in-flight pod
or a node lock, flags recovery work, and tells the observer what expired once the lock is
released. It is fed by the pod, node and ResourceQuota informers (`pod_events`, `node_events`,
`quota_events`) and by the HTTP calls; nobody holds the lock across an API call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.extender.filtering import FilterAnswer, filter_answer, simulate
from hami_plugin.extender.observer import NullObserver, SchedulerObserver
from hami_plugin.protocol import inflight
from hami_plugin.protocol.nodelock import LockRelease
from hami_plugin.protocol.objects import NodeInfo, PodInfo
from hami_plugin.protocol.signature import BookingKeys
from hami_plugin.scheduler.book.book import Book, BookSettings, Change
from hami_plugin.scheduler.book.bookings import BindPlan, BindRefusal, BookingPhase
from hami_plugin.scheduler.book.inflight import StaleAllocation
from hami_plugin.scheduler.book.preempting import Preemption, Refined
from hami_plugin.scheduler.health import NodeHealthTracker
from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.preemption import PodDisruptionBudget
from hami_plugin.scheduler.quota import QuotaEntry, ResourceQuotaInfo
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["SchedulerState"]

logger = logging.getLogger(__name__)

_WAIT_POLL_SECONDS = 1.0
"""A wait on the state's condition re-reads its deadline at least this often (a missed
notification, a manual clock moved on)."""


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
        self._state.nodes_listed()


class _BudgetHandler:
    """The PodDisruptionBudget informer's handler (preemption reads them)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: PodDisruptionBudget, old: PodDisruptionBudget | None) -> None:
        self._state.budget_upserted(new.key, new)

    def on_delete(self, old: PodDisruptionBudget) -> None:
        self._state.budget_upserted(old.key, None)

    def on_synced(self) -> None:
        return None


class _QuotaHandler:
    """The ResourceQuota informer's handler (HAMi's `onAddQuota`/`onUpdateQuota`/
    `onDelQuota`, pkg/scheduler/scheduler.go:304-334)."""

    def __init__(self, state: SchedulerState) -> None:
        self._state = state

    def on_upsert(self, new: ResourceQuotaInfo, old: ResourceQuotaInfo | None) -> None:
        self._state.quota_upserted(new, old)

    def on_delete(self, old: ResourceQuotaInfo) -> None:
        self._state.quota_deleted(old)

    def on_synced(self) -> None:
        self._state.quotas_listed()


class SchedulerState:
    """The book behind one lock; thread-safe. See the module docstring.

    `settings` configure the book (`BookSettings`); `booking_keys` gives the current booking
    keys (`--booking-key-file`; None: trust every booking, as HAMi does); `health` decides
    whether a node's GPUs may be scheduled (default: a fresh `NodeHealthTracker`).
    """

    def __init__(
        self,
        settings: BookSettings,
        *,
        observer: SchedulerObserver | None = None,
        clock: Clock | None = None,
        health: NodeHealthTracker | None = None,
        booking_keys: Callable[[], BookingKeys] | None = None,
    ) -> None:
        self._settings = settings.scheduler
        self._book = Book(settings, health)
        self._keys = booking_keys
        self._observer: SchedulerObserver = observer or NullObserver()
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._work = threading.Event()
        self._pods_listed = threading.Event()
        self._nodes_listed = threading.Event()
        # no quota informer: nothing to wait for (`expect_quota_list` clears it)
        self._quotas_listed = threading.Event()
        self._quotas_listed.set()
        self.pod_events = _PodHandler(self)
        self.node_events = _NodeHandler(self)
        self.quota_events = _QuotaHandler(self)
        self.budget_events = _BudgetHandler(self)
        self._preemptions: list[Preemption] = []  # decided, to evict (`take_preemptions`)
        self._preempted = threading.Condition(self._lock)  # `_preemptions` got one
        self._preemptors: dict[str, datetime | None] = {}  # key -> creation, until Running

    # --- what the shell holds -----------------------------------------------------------------

    @property
    def settings(self) -> SchedulerSettings:
        return self._settings

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def observer(self) -> SchedulerObserver:
        return self._observer

    def attach_observer(self, observer: SchedulerObserver) -> None:
        """Report filter, bind, expiry and recovery events to `observer` from now on."""
        self._observer = observer

    def _apply(self, change: Change) -> None:
        """Act on a transition's change; called with the lock held."""
        if change.wake_binds:
            self._changed.notify_all()
        if change.lock_releases:
            self._work.set()

    def _observe(self, change: Change) -> None:
        """Tell the observer what the change says; called without the lock."""
        for _ in range(change.expired):
            self._observer.booking_expired()
        if change.preemption_outcome:
            self._observer.preemption_attempted(change.preemption_outcome)

    def _current_keys(self) -> BookingKeys | None:
        return None if self._keys is None else self._keys()

    # --- first lists --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """The first lists are in (pods, nodes and, when watched, ResourceQuotas: HAMi waits
        for every informer's cache, pkg/scheduler/scheduler.go:389)."""
        return (
            self._pods_listed.is_set()
            and self._nodes_listed.is_set()
            and self._quotas_listed.is_set()
        )

    def expect_quota_list(self) -> None:
        """A ResourceQuota informer runs: `synced` waits for its first list too."""
        self._quotas_listed.clear()

    def nodes_listed(self) -> None:
        self._nodes_listed.set()

    def quotas_listed(self) -> None:
        self._quotas_listed.set()

    def wait_synced(self, timeout: float) -> bool:
        """Block up to `timeout` seconds (real time) for `synced`; returns it."""
        for listed in (self._pods_listed, self._nodes_listed, self._quotas_listed):
            if not listed.wait(timeout):
                return False
        return True

    def wait_for_lists(self, seconds: float) -> bool:
        """Wait up to `seconds` on the state's clock for the first pod and node lists (HAMi's
        WaitForCacheSync before its first filter); returns `synced`."""
        deadline = self._clock.monotonic() + seconds
        for listed in (self._pods_listed, self._nodes_listed):
            while not listed.is_set() and (left := deadline - self._clock.monotonic()) > 0:
                listed.wait(min(left, _WAIT_POLL_SECONDS))
        return self.synced

    # --- recovery work and waiting binds ------------------------------------------------------

    def request_recovery(self) -> None:
        """Ask the recovery loop for a pass at once (a new leader, a deleted pod's lock)."""
        self._work.set()

    @property
    def recovery_due(self) -> bool:
        return self._work.is_set()

    def wait_for_work(self, timeout: float) -> None:
        """Sleep until recovery work is requested, at most `timeout` seconds."""
        self._work.wait(timeout)

    def take_work(self) -> bool:
        """Whether recovery work was requested since the last call (and forget it)."""
        if not self._work.is_set():
            return False
        self._work.clear()
        return True

    def wake_waiters(self) -> None:
        """Wake every bind waiting for a node lock or an in-flight pod (a stopping daemon)."""
        with self._lock:
            self._changed.notify_all()

    def wait_for_change(self, timeout: float) -> None:
        """Sleep until a node lock or in-flight pod changes, at most `timeout` seconds."""
        if timeout <= 0:
            return
        with self._lock:
            self._changed.wait(timeout)

    # --- reading ------------------------------------------------------------------------------

    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        """Every registered node's usage and every tracked pod's booking (SchedulerView)."""
        with self._lock:
            return self._book.usages(), self._book.tracked_pods()

    def node_usage(self, name: str) -> NodeUsage | None:
        """The node's usage snapshot; None when it is not registered."""
        with self._lock:
            return self._book.node_usage(name)

    def tracked(self, key: str) -> TrackedPod | None:
        """The usage booked for pod `<namespace>/<name>`, if it counts."""
        with self._lock:
            return self._book.tracked(key)

    def registered_nodes(self) -> list[str]:
        with self._lock:
            return self._book.registered_nodes()

    def counts(self) -> tuple[int, int]:
        """(registered nodes, pods counted in the ledger)."""
        with self._lock:
            return len(self._book.registered_nodes()), self._book.pod_count

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as the watch last showed it."""
        with self._lock:
            return self._book.pod(f"{namespace}/{name}")

    def pod_exists(self, namespace: str, name: str) -> bool:
        return self.pod(namespace, name) is not None

    def bound_node(self, pod: PodInfo) -> str | None:
        """The node this process bound `pod` to, while the watch has not shown that yet."""
        with self._lock:
            return self._book.bound_node(pod)

    def node(self, name: str) -> NodeInfo | None:
        """The node as the watch last showed it (only nodes matching the selector)."""
        with self._lock:
            return self._book.node(name)

    def booking_phase(self, namespace: str, name: str) -> BookingPhase | None:
        with self._lock:
            return self._book.booking_phase(f"{namespace}/{name}")

    def bookings(self) -> dict[str, tuple[str, BookingPhase]]:
        """Pod key -> (node, phase) of every standing booking."""
        with self._lock:
            return self._book.bookings()

    def in_flight(self, node: str) -> dict[str, inflight.InFlightPod | None]:
        """Pod key -> in-flight view of a node's in-flight pods (None: unreadable booking)."""
        with self._lock:
            return self._book.in_flight(node)

    def locked_nodes(self) -> list[NodeInfo]:
        """Nodes whose last seen version carries `hami.io/mutex.lock`."""
        with self._lock:
            return self._book.locked_nodes()

    def stale_allocations(self, now: datetime, timeout_seconds: float) -> list[StaleAllocation]:
        """Pods `allocating` and still Pending for longer than `timeout_seconds` at `now`."""
        monotonic = self._clock.monotonic()
        with self._lock:
            return self._book.stale_allocations(now, monotonic, timeout_seconds)

    # --- nodes --------------------------------------------------------------------------------

    def node_upserted(self, info: NodeInfo) -> None:
        """A node was added or changed: register its GPUs while healthy and selected."""
        now = self._clock.now()
        with self._lock:
            self._apply(self._book.apply_node(info, now))

    def node_deleted(self, name: str) -> None:
        """A node was deleted (or left the label selector): forget its GPUs."""
        with self._lock:
            self._apply(self._book.delete_node(name))

    def recheck_health(self) -> None:
        """Run HAMi's node health check again on every node (it depends on time too)."""
        now = self._clock.now()
        with self._lock:
            self._book.recheck_health(now)

    def take_handshakes(self) -> dict[str, str | None]:
        """Node -> handshake value to write (None: delete it), and forget them."""
        with self._lock:
            return self._book.take_handshakes()

    # --- pods ---------------------------------------------------------------------------------

    def pod_upserted(self, info: PodInfo) -> None:
        """A pod was added or changed."""
        keys = self._current_keys()
        monotonic = self._clock.monotonic()
        with self._lock:
            self._apply(self._book.apply_pod(info, keys, monotonic))
            created = self._preemptors.pop(info.key, None) if info.phase == "Running" else None
        if created is not None:
            started = (info.start_time or self._clock.now()) - created
            self._observer.preemptor_running(max(started.total_seconds(), 0.0))

    def pod_deleted(self, info: PodInfo) -> None:
        """A pod was deleted: its GPUs, booking and in-flight entry go at once; a node lock it
        holds is queued for release (the recovery loop does the API call)."""
        with self._lock:
            self._apply(self._book.delete_pod(info))
            self._preemptors.pop(info.key, None)

    def pods_relisted(self) -> None:
        """The pod informer holds a whole list (`Book.relisted`)."""
        monotonic = self._clock.monotonic()
        with self._lock:
            self._book.relisted(monotonic)
        self._pods_listed.set()

    def take_lock_releases(self) -> list[LockRelease]:
        """The locks of deleted pods to release, and forget them."""
        with self._lock:
            return self._book.take_lock_releases()

    def expire_bookings(self) -> int:
        """Free FILTERED bookings past their time; returns how many (also observed)."""
        monotonic = self._clock.monotonic()
        with self._lock:
            change = self._book.expire(monotonic)
            self._apply(change)
        self._observe(change)
        return change.expired

    # --- preemption ---------------------------------------------------------------------------

    def take_preemptions(self, timeout: float) -> list[Preemption]:
        """The preemptions decided since the last call, waiting up to `timeout` for one."""
        with self._lock:
            if not self._preemptions:
                self._preempted.wait(min(timeout, _WAIT_POLL_SECONDS))
            taken, self._preemptions = self._preemptions, []
            return taken

    def preemption_failed(self, preemptor: PodInfo) -> None:
        """Its victims could not be evicted: the hold ends (`Planner.failed`)."""
        with self._lock:
            self._book.preemption.failed(preemptor.key, preemptor.uid)
        self._observer.preemption_attempted("failed")

    def refine_preemption(
        self, pod: PodInfo, proposed: Mapping[str, tuple[tuple[str, ...], int]]
    ) -> dict[str, Refined] | None:
        """kube-scheduler's preempt verb (`Planner.refine_for`)."""
        with self._lock:
            return self._book.preemption.refine_for(pod, proposed)

    def budget_upserted(self, key: str, budget: PodDisruptionBudget | None) -> None:
        """A PodDisruptionBudget `<namespace>/<name>` appeared or changed (None: deleted)."""
        with self._lock:
            self._book.preemption.apply_budget(key, budget)

    # --- quotas -------------------------------------------------------------------------------

    def quota_upserted(self, new: ResourceQuotaInfo, old: ResourceQuotaInfo | None) -> None:
        with self._lock:
            self._book.apply_quota(new.namespace, new.hard_map, old.hard_map if old else None)

    def quota_deleted(self, old: ResourceQuotaInfo) -> None:
        with self._lock:
            self._book.delete_quota(old.namespace, old.hard_map)

    def quota_entries(self) -> list[QuotaEntry]:
        """Every namespace's quota figures (the `hami_resource_quota_*` metrics)."""
        with self._lock:
            return self._book.quota_entries()

    def has_quota(self, namespace: str) -> bool:
        with self._lock:
            return self._book.has_quota(namespace)

    def fits_quota(self, namespace: str, memory_mib: int, cores: int) -> bool:
        """HAMi's `FitQuota` for a whole pod's request (the webhook's check)."""
        with self._lock:
            return self._book.fits_quota(namespace, memory_mib, cores)

    # --- filter and bind ----------------------------------------------------------------------

    def filter(
        self,
        info: PodInfo,
        node_names: Sequence[str] | None,
        nodes: Sequence[Mapping[str, Any]] | None = None,
    ) -> FilterAnswer:
        """Answer kube-scheduler's filter (docs/hami-reference.md 3.4) and book the chosen
        node's GPUs. `nodes` is the `Nodes` form (not node-cache-capable): HAMi's simulation on
        those node objects, nothing booked. Raises nothing for bad input: an unreadable
        annotation is an answer with `error`."""
        requests = pod_requests(info, self._settings)
        # The decision stays HAMi's (a dropped request asks no GPU); what HAMi reads
        # differently from what the pod says is logged, once per filter call.
        for problem in requests.problems:
            logger.warning("pod %s: %s", info.key, problem)
        if not requests.wants_gpu:
            # HAMi answers NodeNames as given; the Nodes form gets its nodes back (HAMi
            # answers Nodes null there, which makes kube-scheduler drop every node).
            return FilterAnswer(
                node_names=list(node_names) if node_names is not None else None,
                nodes=list(nodes) if nodes is not None else None,
                outcome="no_gpu",
            )
        if nodes is not None:
            answer = simulate(info, requests, nodes, self._clock.now(), self._settings)
        else:
            names = list(node_names or ())
            now, monotonic = self._clock.now(), self._clock.monotonic()
            with self._lock:
                result, change = self._book.filter(info, requests, names, now, monotonic)
                self._apply(change)
                if change.preemption is not None:
                    self._preemptions.append(change.preemption)
                    self._preemptors[info.key] = info.creation_timestamp
                    self._preempted.notify()
            self._observe(change)
            answer = filter_answer(info, names, result)
            if result.fanned_out:
                self._observer.filter_fanned_out()
        if answer.failure_counts:
            self._observer.filter_failures(answer.failure_counts)
        return answer

    def plan_bind(self, pod: PodInfo, node: str) -> BindPlan | BindRefusal:
        """Turn the pod's filter booking on `node` into a bind plan (`Book.plan_bind`)."""
        keys = self._current_keys()
        now, monotonic = self._clock.now(), self._clock.monotonic()
        with self._lock:
            plan, change = self._book.plan_bind(pod, node, keys, now, monotonic)
            self._apply(change)
        return plan

    def claim_in_flight(
        self, plan: BindPlan, deadline: float, stop: threading.Event | None = None
    ) -> str | None:
        """Wait until no in-flight pod of the node could be confused with the plan's pod, then
        count it in flight. Returns None when claimed, else why not once `deadline` (on the
        clock's monotonic time) passed or `stop` was set."""
        with self._lock:
            while True:
                blocker = self._book.claim_in_flight(plan)
                if blocker is None:
                    return None
                left = deadline - self._clock.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return blocker
                self._changed.wait(min(left, _WAIT_POLL_SECONDS))

    def bind_succeeded(self, plan: BindPlan) -> None:
        """The Binding was created (`Book.bind_succeeded`)."""
        with self._lock:
            self._apply(self._book.bind_succeeded(plan))

    def bind_failed(self, plan: BindPlan) -> None:
        """The bind was rolled back (`Book.bind_failed`)."""
        with self._lock:
            self._apply(self._book.bind_failed(plan))

    def drop_pod_booking(self, namespace: str, name: str) -> None:
        """Free a pod's booking (recovery, a bind that found the pod gone)."""
        with self._lock:
            self._apply(self._book.release(f"{namespace}/{name}"))
