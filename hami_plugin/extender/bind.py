"""`/bind`: the pod's booking written in one patch, then the Binding; any failure rolled back.

Steps for `ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}`:

0. The arguments: the namespace a DNS-1123 label, the pod and node names DNS-1123 subdomains
   (`protocol.names`, as the API server requires; they go into API paths), the UID given.
   Anything else is answered with the reason and no API call.
1. The pod: from the watch's store, else one GET (a LIST by name, so the full pod comes back).
   A pod already bound to that node answers success (a retried bind); bound elsewhere, being
   deleted, or another pod of that name (UID differs): Error.
2. The booking: the one filter made on that node (`SchedulerState.plan_bind`), else the pod is
   decided again on that node alone (expired booking, another node, a restarted scheduler).
3. Serialise with other allocations of the node:
   * node with `hami-plugin.io/allocate-protocol: in-flight/v1` (our device plugin): wait until
     `inflight.must_wait_for` finds no in-flight pod that kubelet's Allocate could confuse with
     this one, then count it in flight. No node lock, so a burst binds concurrently;
   * any other node (HAMi's device plugin): HAMi's node lock `hami.io/mutex.lock` through the
     API (`kube.nodelock.compare_and_patch`: GET node, decide with `protocol.nodelock`, merge
     patch with the node's resourceVersion; a stale lock is replaced in that same patch). A lock
     held by a live pod is waited for (woken by the node watch), HAMi only waits for pod-group
     members. The binds for one node queue in arrival order (`lockqueue.NodeLockQueue`): only
     the head tries the lock, so a burst makes one GET and one patch per lock change, not one
     per waiter.
   Both waits end after `--node-lock-retry-timeout` (28 s, below kube-scheduler's 30 s).
4. ONE pod merge patch with the pod's resourceVersion as precondition: the booking
   (`protocol.booking.BOOKING_ANNOTATIONS`: node, time, devices, `bind-phase: allocating`,
   bind-time, MIG reservations, with a booking key the signature) and its label (a Conflict
   re-reads the pod and tries again, `CONFLICT_RETRIES` attempts in all). The device plugin
   finds all of it before kubelet can call Allocate, which only happens after step 5.
5. The Binding (`pods/<name>/binding`, with the pod's UID as precondition).

On failure after step 2 everything is undone: the patch is reverted (the booking annotations
and label removed, `bind-phase: failed` left as the record of the attempt; with the patched
resourceVersion as precondition, so if the Binding did happen after all the revert conflicts,
the pod is found bound and the bind counts as done), the lock released if we took it, the
booking freed, a Warning event `BindingFailed`, and the answer is the error. Removing the
annotations (rather than only marking the attempt failed) is the safer rollback: no reader of
them, our ledger, HAMi's scheduler, HAMi's monitor listing pods by the label, can count GPUs
that nothing holds any more.

Binds run concurrently (kube-scheduler sends up to 16 at once); the state lock is never held
across an API call.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta

from hami_plugin.extender.filtering import annotation_error_message
from hami_plugin.extender.lockqueue import LockTicket, NodeLockQueue
from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.api import BindApi
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.events import EventSink, PodEvent
from hami_plugin.kube.listing import fetch_pod
from hami_plugin.kube.nodelock import (
    Keep,
    KeptChanging,
    Write,
    compare_and_patch,
    release_node_lock,
)
from hami_plugin.kube.retry import CONFLICT_RETRIES
from hami_plugin.logsafe import from_caller, safe_text
from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS, BOOKING_LABELS
from hami_plugin.protocol.govalues import go_quote
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    BindPhase,
)
from hami_plugin.protocol.names import dns1123_label_problem, dns1123_subdomain_problem
from hami_plugin.protocol.nodelock import (
    LockAction,
    contention_message,
    decide_lock,
    held_by,
    lock_value,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.book.bookings import BindPlan, BindRefusal
from hami_plugin.scheduler.fit import render_failure

__all__ = ["Binder", "binding_args_problem", "refusal_message"]

logger = logging.getLogger(__name__)

_ROLLBACK_BUDGET_SECONDS = 5.0
_API_BUDGET_SECONDS = 10.0
"""Time the API calls after the wait (patch, Binding) may take together."""
_WAKE_SECONDS = 1.0
"""A waiting bind reads the clock (deadline, stop) at least this often."""
_LOCK_RECHECK_SECONDS = 5.0
"""The head of a node's queue reads a held lock again after this long even when the node
watch showed no change of it: only a missed watch event makes this necessary."""


class BindError(Exception):
    """A bind step failed; the message is the answer's `Error`."""


@dataclass(frozen=True, slots=True)
class _LockRefused:
    """A lock attempt that did not take the lock: the answer should the wait end now, and
    the lock value its last GET of the node read."""

    message: str
    seen: str | None
    held: bool = True
    """Another live pod holds the lock (False: the node kept changing under the patch)."""


def refusal_message(refusal: BindRefusal) -> str:
    """The answer's `Error` for a pod `plan_bind` refused."""
    if refusal.annotation_error is not None:
        return annotation_error_message(refusal.annotation_error, refusal.pod)
    why = render_failure(refusal.failure) if refusal.failure is not None else "does not fit"
    return f"pod {refusal.pod.key} does not fit on node {refusal.node}: {why}"


def binding_args_problem(namespace: str, name: str, uid: str, node: str) -> str | None:
    """None when the /bind arguments can be acted on, else the answer's `Error`: the names
    must be what the API server accepts (they go into API paths as they are), the UID given
    (the Binding's precondition: without it a recreated pod of that name would be bound)."""
    for field, value, problem in (
        ("PodNamespace", namespace, dns1123_label_problem),
        ("PodName", name, dns1123_subdomain_problem),
        ("Node", node, dns1123_subdomain_problem),
    ):
        why = problem(value)
        if why is not None:
            return f"invalid {field} {go_quote(value)}: {why}"
    if not uid:
        return "invalid PodUID: required"
    return None


class Binder:
    """Runs /bind calls; thread-safe (one call per request thread)."""

    def __init__(
        self,
        state: SchedulerState,
        api: BindApi,
        events: EventSink,
        *,
        node_lock_timeout: timedelta = timedelta(minutes=5),
        retry_timeout_seconds: float = 28.0,
        stop: threading.Event | None = None,
        lock_queue: NodeLockQueue | None = None,
    ) -> None:
        self._state = state
        self._clock = state.clock
        self._api = api
        self._events = events
        self._lock_timeout = node_lock_timeout
        self._retry_timeout = retry_timeout_seconds
        self._stop = stop or threading.Event()
        self._lock_queue = lock_queue or NodeLockQueue(state.clock)

    @property
    def lock_queue(self) -> NodeLockQueue:
        """The binds waiting for each node's HAMi lock (their depths feed filter and metrics)."""
        return self._lock_queue

    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod; returns "" on success, else the error text (HAMi answers it as
        `ExtenderBindingResult.Error`). Never raises for bad input or API failures."""
        started = self._clock.monotonic()
        error = ""
        try:
            error = binding_args_problem(namespace, name, uid, node) or ""
            if error:
                logger.warning("bind refused: %s", safe_text(error), extra=from_caller("bind"))
                return error
            error = self._bind(namespace, name, uid, node, started)
        finally:
            self._state.observer.bind_done(self._clock.monotonic() - started, not error)
        return error

    def _event(self, pod: PodInfo, reason: str, message: str, event_type: str) -> None:
        self._events.record(PodEvent(pod.namespace, pod.name, pod.uid, reason, message, event_type))

    def _bind(self, namespace: str, name: str, uid: str, node: str, started: float) -> str:
        logger.info("bind pod %s/%s to node %s", namespace, name, node)
        try:
            pod = self._pod(namespace, name, uid)
        except BindError as error:
            self._state.drop_pod_booking(namespace, name)
            return str(error)
        if pod.node_name:
            if pod.node_name == node:
                return ""  # a retried bind of a pod bound by the first try
            message = f"pod {pod.key} is already bound to node {pod.node_name}"
            return message
        if self._state.bound_node(pod) == node:
            return ""  # the first try's Binding, which the watch has not shown yet
        plan = self._state.plan_bind(pod, node)
        if isinstance(plan, BindRefusal):
            message = refusal_message(plan)
            logger.warning("bind pod %s to node %s: %s", pod.key, node, message)
            self._event(pod, "BindingFailed", message, "Warning")
            return message
        lock_taken = False
        patched: PodInfo | None = None
        try:
            deadline = started + self._retry_timeout
            if plan.protocol:
                self._wait_in_flight(plan, deadline)
            elif plan.needs_lock:
                self._lock_node(plan, deadline)
                lock_taken = True
            with self._api.deadline(_API_BUDGET_SECONDS):
                patched = self._patch_pod(plan)
                self._api.bind_pod(namespace, name, pod.uid or uid, node)
        except (BindError, KubeError) as error:
            message = str(error)
            if self._rollback(plan, patched, lock_taken):
                logger.info("bind pod %s: the Binding did happen after all (%s)", pod.key, message)
                return self._succeeded(plan)
            logger.warning("bind pod %s to node %s failed: %s", pod.key, node, message)
            self._event(pod, "BindingFailed", message, "Warning")
            return message
        except BaseException:
            # A bug or a stopping process: the booking must not stay claimed for ever.
            self._rollback(plan, patched, lock_taken)
            raise
        return self._succeeded(plan)

    def _succeeded(self, plan: BindPlan) -> str:
        self._state.bind_succeeded(plan)
        pod = plan.pod
        # HAMi's text: `Successfully binding node %v to %v/%v` with the node in a []string
        message = f"Successfully binding node [{plan.node}] to {pod.namespace}/{pod.name}"
        self._event(pod, "BindingSucceed", message, "Normal")
        logger.info("pod %s bound to node %s", pod.key, plan.node)
        return ""

    # --- step 1 ---------------------------------------------------------------------------------

    def _pod(self, namespace: str, name: str, uid: str) -> PodInfo:
        pod = self._state.pod(namespace, name)
        if pod is None or (uid and pod.uid and pod.uid != uid):
            # not seen yet, or the watch still shows a predecessor of the same name
            try:
                with self._api.deadline(_API_BUDGET_SECONDS):
                    pod = fetch_pod(self._api, namespace, name)
            except KubeError as error:
                raise BindError(f"cannot read pod {namespace}/{name}: {error}") from error
        if pod is None:
            raise BindError(f'pods "{name}" not found')
        if uid and pod.uid and pod.uid != uid:
            raise BindError(f"pod {namespace}/{name} has UID {pod.uid}, not {uid}: recreated")
        if pod.deleting or pod.finished:
            raise BindError(f"pod {namespace}/{name} is being deleted or has finished")
        return pod

    # --- step 3 ---------------------------------------------------------------------------------

    def _wait_in_flight(self, plan: BindPlan, deadline: float) -> None:
        began = self._clock.monotonic()
        blocker = self._state.claim_in_flight(plan, deadline, self._stop)
        waited = self._clock.monotonic() - began
        if waited > 0.001:
            self._state.observer.bind_waited(waited)
        if blocker is not None:
            raise BindError(f"{blocker}; waited {waited:.1f} s")

    def _lock_node(self, plan: BindPlan, deadline: float) -> None:
        """Take HAMi's node lock for the pod (docs/hami-reference.md 1.7), waiting while another
        live pod holds it. Raises BindError when the wait ends: HAMi's contention message, or
        the queue's when the bind never got its turn and the watch shows no lock.

        The binds for one node queue in arrival order and only the head tries the lock; it
        leaves the queue once it holds the lock (or gives up), so the next one finds the lock
        held by that pod and waits for the node watch to show it released. A pod that holds
        the lock already (a retried bind; HAMi's lock is re-entrant) does not queue behind the
        binds that wait for it to let go."""
        began = self._clock.monotonic()
        queue = self._lock_queue
        ticket = None if self._holds_lock(plan) else queue.enter(plan.node, plan.pod.key)
        waited = False
        try:
            if ticket is not None and (ahead := queue.ahead(ticket)) > 0:
                logger.info(
                    "bind pod %s waits for node %s's lock: %d binds ahead",
                    plan.pod.key,
                    plan.node,
                    ahead,
                )
                waited = True
                if not queue.wait_turn(ticket, deadline, self._stop):
                    raise BindError(self._queue_refusal(plan, ticket, began))
            waited = self._take_lock(plan, deadline) or waited
        finally:
            if ticket is not None:
                queue.leave(ticket)
            if waited:
                self._state.observer.bind_waited(self._clock.monotonic() - began)

    def _holds_lock(self, plan: BindPlan) -> bool:
        """The node watch shows the lock held by the plan's pod."""
        watched = self._state.node(plan.node)
        value = watched.annotations.get(ANNOTATION_NODE_LOCK) if watched is not None else None
        return held_by(value, plan.pod.namespace, plan.pod.name)

    def _queue_refusal(self, plan: BindPlan, ticket: LockTicket, began: float) -> str:
        """The answer of a bind whose turn never came: HAMi's contention message when the watch
        shows another pod's lock on the node (what HAMi answers in that case), else how many
        binds were still ahead (the lock is free, or being written, but others came first)."""
        watched = self._state.node(plan.node)
        value = watched.annotations.get(ANNOTATION_NODE_LOCK) if watched is not None else None
        if value is not None and not held_by(value, plan.pod.namespace, plan.pod.name):
            return contention_message(plan.node, self._lock_timeout)
        waited = self._clock.monotonic() - began
        ahead = self._lock_queue.ahead(ticket)
        return f"node {plan.node}: {ahead} binds ahead in the lock queue; waited {waited:.1f} s"

    def _take_lock(self, plan: BindPlan, deadline: float) -> bool:
        """As the head of the node's queue: try the lock until it is the pod's. Returns whether
        it had to wait; raises BindError with the last refusal when the deadline passed."""
        waited = False
        while True:
            before = self._state.node(plan.node)
            with self._api.deadline(_API_BUDGET_SECONDS):
                refused = self._try_lock(plan)
            if refused is None:
                return waited
            waited = True
            if refused.held:
                version = before.resource_version if before is not None else None
                ready = self._wait_for_release(plan.node, refused.seen, version, deadline)
            else:
                ready = self._wait_a_while(deadline)
            if not ready:
                raise BindError(refused.message)

    def _wait_for_release(
        self, node: str, seen: str | None, version: str | None, deadline: float
    ) -> bool:
        """Sleep until another attempt at `node`'s lock is worth an API call: the node watch
        shows a lock value other than `seen` (the one the last GET read) in a version of the
        node other than `version` (the one it showed before that GET), or
        `_LOCK_RECHECK_SECONDS` passed. False once `deadline` passed or the stop was set.

        The state's `changed` is notified for any node's lock and any in-flight pod, so most
        wake-ups concern other nodes and cost nothing here. A watch behind our GET shows an
        older value in the version it showed before: no GET for that either; once it shows
        `seen`, any other value is newer."""
        tried = self._clock.monotonic()
        while True:
            now = self._clock.monotonic()
            left = deadline - now
            if left <= 0 or self._stop.is_set():
                return False
            # woken by the node watch when a lock changes; the bound lets the clock be read
            self._state.wait_for_change(min(left, _WAKE_SECONDS))
            watched = self._state.node(node)
            if watched is None or self._clock.monotonic() - tried >= _LOCK_RECHECK_SECONDS:
                return True
            if watched.annotations.get(ANNOTATION_NODE_LOCK) == seen:
                version = watched.resource_version  # caught up with our GET
            elif watched.resource_version != version:
                return True

    def _wait_a_while(self, deadline: float) -> bool:
        """Sleep until the next node change, at most `_WAKE_SECONDS`. False once `deadline`
        passed or the stop was set."""
        left = deadline - self._clock.monotonic()
        if left <= 0 or self._stop.is_set():
            return False
        self._state.wait_for_change(min(left, _WAKE_SECONDS))
        return True

    def _try_lock(self, plan: BindPlan) -> _LockRefused | None:
        """One attempt: None when the pod holds the lock now, else why not. A stale lock is
        replaced in the same patch, atomic thanks to the node's resourceVersion."""
        try:
            patched = compare_and_patch(
                self._api,
                plan.node,
                ANNOTATION_NODE_LOCK,
                lambda value: self._lock_decision(plan, value),
                what="lock not taken",
            )
        except KeptChanging as error:
            return _LockRefused(str(error), error.seen, held=False)
        except NotFound as error:
            raise BindError(f"failed to get node {plan.node}: {error}") from error
        if patched.written:
            logger.info("node %s locked for pod %s", plan.node, plan.pod.key)
        return patched.answer

    def _lock_decision(
        self, plan: BindPlan, value: str | None
    ) -> Keep[_LockRefused | None] | Write[_LockRefused | None]:
        """HAMi's `LockNode` on the lock `value` read: keep a lock the pod holds already or
        another live pod holds, else write the pod's."""
        pod = plan.pod
        now = self._clock.now()
        decision = decide_lock(plan.node, value, now, self._lock_timeout, pod.namespace, pod.name)
        if decision.action is LockAction.CHECK_OWNER and decision.lock is not None:
            decision = decide_lock(
                plan.node,
                value,
                now,
                self._lock_timeout,
                pod.namespace,
                pod.name,
                owner_exists=self._pod_exists(
                    decision.lock.namespace or "", decision.lock.pod_name or ""
                ),
            )
        if decision.action is LockAction.REENTRANT:
            return Keep(None)
        if decision.action is LockAction.CONTENTION:
            return Keep(_LockRefused(decision.message, value))
        if decision.action is LockAction.TAKE_OVER:
            logger.warning("%s", decision.message)
        return Write(lock_value(now, pod.namespace, pod.name), None)

    def _pod_exists(self, namespace: str, name: str) -> bool:
        if self._state.pod_exists(namespace, name):
            return True
        try:
            return fetch_pod(self._api, namespace, name) is not None
        except KubeError as error:
            # as HAMi: when the owner cannot be checked, the lock stands
            logger.warning("owner %s/%s of a node lock not checked: %s", namespace, name, error)
            return True

    # --- step 4 ---------------------------------------------------------------------------------

    def _patch_pod(self, plan: BindPlan) -> PodInfo:
        pod = plan.pod
        version = pod.resource_version or None
        annotations: dict[str, str | None] = dict(plan.annotations)
        if pod.booking is not None and pod.booking.mig_text is not None:
            # a stale MIG reservation of an earlier booking would not match this signature
            annotations.setdefault(ANNOTATION_VGPU_MIG_ALLOCATIONS, None)
        for _ in CONFLICT_RETRIES.tries():
            try:
                return self._api.patch_pod_metadata(
                    pod.namespace,
                    pod.name,
                    annotations,
                    labels=plan.labels,
                    resource_version=version,
                )
            except Conflict:
                current = fetch_pod(self._api, pod.namespace, pod.name)
                if current is None:
                    raise BindError(f'pods "{pod.name}" not found') from None
                if pod.uid and current.uid != pod.uid:
                    raise BindError(f"pod {pod.key} was recreated during the bind") from None
                if current.node_name or current.deleting:
                    raise BindError(f"pod {pod.key} was bound or deleted meanwhile") from None
                version = current.resource_version or None
        raise BindError(f"pod {pod.key}: patch kept conflicting")

    # --- rollback -------------------------------------------------------------------------------

    def _rollback(self, plan: BindPlan, patched: PodInfo | None, lock_taken: bool) -> bool:
        """Undo what the failed bind wrote. Returns True when the pod turns out to be bound to
        the node after all (the Binding applied, its answer was lost): nothing is undone."""
        pod = plan.pod
        try:
            with self._api.deadline(_ROLLBACK_BUDGET_SECONDS):
                if patched is not None and self._revert_patch(plan, patched):
                    return True
                if lock_taken:
                    release_node_lock(self._api, plan.node, pod.namespace, pod.name)
        except KubeError as error:
            logger.error(
                "bind pod %s: rollback incomplete (%s); the recovery loop will clean up",
                pod.key,
                error,
            )
        self._state.bind_failed(plan)
        return False

    def _revert_patch(self, plan: BindPlan, patched: PodInfo) -> bool:
        pod = plan.pod
        # what the patch wrote goes, bind-phase `failed` stays as the record of the attempt
        revert: dict[str, str | None] = {
            key: None for key in BOOKING_ANNOTATIONS if key in plan.annotations
        }
        revert[ANNOTATION_BIND_PHASE] = BindPhase.FAILED.value
        version = patched.resource_version or None
        for _ in CONFLICT_RETRIES.tries():
            try:
                self._api.patch_pod_metadata(
                    pod.namespace,
                    pod.name,
                    revert,
                    labels=dict.fromkeys(BOOKING_LABELS),
                    resource_version=version,
                )
                return False
            except NotFound:
                return False
            except Conflict:
                current = fetch_pod(self._api, pod.namespace, pod.name)
                if current is None:
                    return False
                if current.node_name == plan.node:
                    return True
                ours = plan.annotations[ANNOTATION_BIND_TIME]
                if current.booking is None or current.booking.bind_time != ours:
                    return False  # someone else wrote the pod since: not ours to revert
                version = current.resource_version or None
        raise KubeError(f"pod {pod.key}: revert kept conflicting")
