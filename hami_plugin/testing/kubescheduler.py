"""A kube-scheduler stand-in for tests: the queue of kube-scheduler 1.24 in front of our
extender, over the wire.

It watches pods and nodes through the API server (the double, with a `KubeClient`), takes the
Pending, unbound, not-deleting pods of its `scheduler_name`, and schedules them one at a time
as kube-scheduler does with an extender that is `nodeCacheCapable` and owns the GPU resources
(`daemonset/kube-scheduler-config.yaml`): POST `/filter` with `ExtenderArgs` (the pod, the
node names), then POST `/bind` with `ExtenderBindingArgs` to the first node returned. The one
in-tree filter modelled is NodeResourcesFit for cpu, memory and the pod count, with nominated
pods (`kubescheduler_fit`); only the nodes it passes go to `/filter`
(`kubescheduler_filter`). The active queue pops by PrioritySort (higher `spec.priority`,
then the pod queued earlier). A pod with `status.nominatedNodeName` is tried on that node
alone first (PreferNominatedNode). When no node is left, PostFilter runs DefaultPreemption
with the extender's `preempt_verb` (`kubescheduler_preemption`, None: the extender has none);
`preemptions` and `preempt_calls` record it. `pdbs` lists the PodDisruptionBudgets (default:
a GET of `/apis/policy/v1/poddisruptionbudgets`, 404 read as none). An extender or bind
error clears the pod's `nominatedNodeName`; a PostFilter with no candidate clears it, one
that failed with an error leaves it (1.24's `updatePod` with `clearNominatedNode` or the
PostFilter result).

The queueing rules it follows, and why (`docs/kube-scheduler.md`):

* A failed attempt writes `PodScheduled` False to the pod's status (`pods/<name>/status`),
  reason "Unschedulable" and the error or the fit failure as message, as 1.24 does for an
  extender error (`docs/kube-scheduler.md` 2); the write is skipped when the condition would
  not change. A failed bind writes reason "SchedulerError", message "binding rejected: ...".
* A failed filter (connection refused, a non-200 answer, `Error` in the result) or one that
  left no node parks the pod in the unschedulable pool with no plugin to blame, unless a move
  request came during its attempt, which sends it to the backoff queue (1.24's
  `AddUnschedulableIfNotPresent`, `docs/kube-scheduler.md` 2). A failed bind sends the pod to
  the backoff queue (its move request). `errors_to_backoff=True` plays 1.28 and later instead:
  a pod rejected by no plugin always goes to the backoff queue (`docs/kube-scheduler.md` 2).
* A parked pod leaves the pool (`docs/kube-scheduler.md` 3):
  - on an update of the pod that `isPodUpdated` does not ignore (anything but
    `resourceVersion`, `generation`, `managedFields`, `finalizers` and `status`): to the
    backoff queue while its backoff runs, else to the active queue ("PodUpdate");
  - on a move request, which moves every pod with no plugin to blame: an assigned pod deleted
    ("AssignedPodDelete"), a node added ("NodeAdd"), a node update that changes its labels,
    taints, `spec.unschedulable`, allocatable or conditions ("NodeUpdate"); annotation-only
    node updates move nothing;
  - at the flush: every `flush_interval_seconds` (30 s) the pods parked longer than
    `flush_after_seconds` (`--pod-max-in-unschedulable-pods-duration`, 5 minutes) move
    ("UnschedulableTimeout").
* Backoff: `initial_backoff_seconds` (1 s) doubling per attempt up to `max_backoff_seconds`
  (10 s), from the last failure.
* An update of a pod being scheduled puts it in the active queue at once (1.24's `Update` of
  a pod in no queue), so its failing attempt does not park it.

Simplified: the bind runs in the scheduling thread (kube-scheduler binds in a goroutine while
the next pod is scheduled), no prioritize call, one profile.

`moves` and `attempts` record what happened, for tests to assert on; `parked()` is the
unschedulable pool now; `hold()`/`release()` pause it between two attempts. `start()`/`stop()`
run and join its three threads (two informers, the scheduling loop). `extender_url` may be
changed while it runs (a restarted extender on another port); a pod already being scheduled
finishes with the old one.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError
from hami_plugin.kube.informer import Informer, ListWatchOptions
from hami_plugin.testing.kubescheduler_filter import FilterOutcome, find_nodes_that_fit
from hami_plugin.testing.kubescheduler_fit import (
    Code,
    NodeState,
    fit_error_message,
    pod_priority,
)
from hami_plugin.testing.kubescheduler_http import ExtenderError, post_json
from hami_plugin.testing.kubescheduler_preemption import (
    PreemptCall,
    Preemption,
    PreemptionEvaluator,
    read_pdbs,
)
from hami_plugin.testing.kubescheduler_queue import (
    Attempt,
    Move,
    Queued,
    Queues,
    is_pod_updated,
    node_scheduling_change,
    pod_key,
)

__all__ = [
    "Attempt",
    "KubeSchedulerStandIn",
    "Move",
    "PreemptCall",
    "Preemption",
    "is_pod_updated",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

_LIST_WATCH = ListWatchOptions(
    watch_timeout_seconds=30, initial_backoff_seconds=0.1, max_backoff_seconds=1.0
)
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULER_ERROR = "SchedulerError"


class _PodEvents:
    def __init__(self, owner: KubeSchedulerStandIn) -> None:
        self._owner = owner

    def on_upsert(self, new: JsonObject, old: JsonObject | None) -> None:
        self._owner._pod_upserted(new, old)

    def on_delete(self, old: JsonObject) -> None:
        self._owner._pod_deleted(old)

    def on_synced(self) -> None:
        return None


class _NodeEvents:
    def __init__(self, owner: KubeSchedulerStandIn) -> None:
        self._owner = owner

    def on_upsert(self, new: JsonObject, old: JsonObject | None) -> None:
        if old is None:
            self._owner._move_all("NodeAdd")
        elif node_scheduling_change(old, new):
            self._owner._move_all("NodeUpdate")

    def on_delete(self, old: JsonObject) -> None:
        return None

    def on_synced(self) -> None:
        return None


class KubeSchedulerStandIn:
    """See the module docstring. `kube` is owned by the caller."""

    def __init__(
        self,
        kube: KubeClient,
        extender_url: str,
        *,
        scheduler_name: str = "hami-scheduler",
        flush_after_seconds: float = 300.0,
        flush_interval_seconds: float = 30.0,
        initial_backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 10.0,
        errors_to_backoff: bool = False,
        http_timeout_seconds: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock | None = None,
        preempt_verb: str | None = "preempt",
        pdbs: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        self.extender_url = extender_url
        self._kube = kube
        self._scheduler_name = scheduler_name
        self._flush_after = flush_after_seconds
        self._flush_interval = flush_interval_seconds
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._errors_to_backoff = errors_to_backoff
        self._http_timeout = http_timeout_seconds
        self._ssl_context = ssl_context
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queues = Queues()
        self._cycle = 0
        self._move_request_cycle = -1
        self._stop = threading.Event()
        self._held = False
        self._threads: list[threading.Thread] = []
        self.moves: list[Move] = []
        self.attempts: list[Attempt] = []
        self._nominated: dict[str, str] = {}
        """The nominator: pending pod key -> nominated node (kube-scheduler keeps it in the
        queue, set at once on preemption and from pod updates)."""
        self._preemption = PreemptionEvaluator(
            kube, self._post, preempt_verb, pdbs or (lambda: read_pdbs(kube))
        )
        self._pods: Informer[JsonObject] = Informer(
            kube, "/api/v1/pods", dict, pod_key, _PodEvents(self), name="standin-pods",
            options=_LIST_WATCH,
        )  # fmt: skip
        self._nodes: Informer[JsonObject] = Informer(
            kube, "/api/v1/nodes", dict, lambda node: str(node["metadata"]["name"]),
            _NodeEvents(self), name="standin-nodes", options=_LIST_WATCH,
        )  # fmt: skip

    # --- what tests read ------------------------------------------------------------------------

    def parked(self) -> set[str]:
        """The pods in the unschedulable pool now."""
        with self._lock:
            return set(self._queues.unschedulable)

    def moved(self) -> list[Move]:
        with self._lock:
            return list(self.moves)

    def tried(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    @property
    def preemptions(self) -> list[Preemption]:
        """The preemptions carried out, in order."""
        with self._lock:
            return list(self._preemption.preemptions)

    @property
    def preempt_calls(self) -> list[PreemptCall]:
        """The POSTs to the extender's preempt verb, in order."""
        with self._lock:
            return list(self._preemption.preempt_calls)

    @property
    def synced(self) -> bool:
        return self._pods.synced.is_set() and self._nodes.synced.is_set()

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        for name, target in (
            ("standin-pods", self._pods.run),
            ("standin-nodes", self._nodes.run),
            ("standin-schedule", self._loop),
        ):
            thread = threading.Thread(target=target, args=(self._stop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(self._http_timeout + 10)

    def hold(self, timeout: float = 60.0) -> None:
        """Start no new attempt, and return once the attempt in progress (if any) is over: a
        test kills the extender between two attempts this way. Raises TimeoutError."""
        with self._wake:
            self._held = True
            if not self._wake.wait_for(lambda: not self._queues.in_flight, timeout):
                raise TimeoutError("an attempt is still in progress")

    def release(self) -> None:
        """Undo `hold`."""
        with self._wake:
            self._held = False
            self._wake.notify_all()

    # --- events -----------------------------------------------------------------------------------

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        metadata = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        return (
            spec.get("schedulerName") == self._scheduler_name
            and not spec.get("nodeName")
            and metadata.get("deletionTimestamp") is None
            and phase == "Pending"
        )

    def _pod_upserted(self, new: JsonObject, old: JsonObject | None) -> None:
        key = pod_key(new)
        now = self._clock.monotonic()
        with self._wake:
            queues = self._queues
            self._track_nomination(key, new, old)
            if not self._ours(new):
                queues.remove(key)
                if (new.get("spec") or {}).get("nodeName"):
                    queues.assumed.discard(key)
                return
            if key in queues.assumed:
                return  # 1.24 ignores updates of an assumed pod
            queued = queues.find(key)
            if queued is None:
                queues.active[key] = Queued(new, queued_at=now)
            elif key in queues.unschedulable:
                queued.pod = new
                if old is not None and is_pod_updated(old, new):
                    del queues.unschedulable[key]
                    self._requeue(key, queued, now)
                    self.moves.append(Move(key, "PodUpdate", now))
            elif key in queues.in_flight:
                queued.pod = new
                if old is not None and is_pod_updated(old, new):
                    queues.active[key] = Queued(
                        new, queued.attempts, queued.failed_at, queued_at=now
                    )
            else:
                queued.pod = new
            self._wake.notify_all()

    def _track_nomination(self, key: str, new: JsonObject, old: JsonObject | None) -> None:
        """The nominator's view of a pod update (called with the lock held): a bound, deleting
        or finished pod is nominated nowhere; an empty `nominatedNodeName` clears the
        nomination only when it was set before (an update that races the in-memory
        nomination keeps it, as 1.24's `updateNominatedPod`)."""
        if (new.get("spec") or {}).get("nodeName") or not self._pending(new):
            self._nominated.pop(key, None)
            return
        node = str((new.get("status") or {}).get("nominatedNodeName") or "")
        before = str(((old or {}).get("status") or {}).get("nominatedNodeName") or "")
        if node:
            self._nominated[key] = node
        elif before:
            self._nominated.pop(key, None)

    @staticmethod
    def _pending(pod: Mapping[str, Any]) -> bool:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
        return phase == "Pending" and not deleting

    def _pod_deleted(self, old: JsonObject) -> None:
        key = pod_key(old)
        with self._wake:
            self._nominated.pop(key, None)
            self._queues.remove(key)
            self._queues.assumed.discard(key)
        if (old.get("spec") or {}).get("nodeName"):
            self._move_all("AssignedPodDelete")

    def _move_all(self, event: str) -> None:
        """A move request: every parked pod (none has a plugin to blame) leaves the pool."""
        now = self._clock.monotonic()
        with self._wake:
            for key, queued in list(self._queues.unschedulable.items()):
                del self._queues.unschedulable[key]
                self._requeue(key, queued, now)
                self.moves.append(Move(key, event, now))
            self._move_request_cycle = self._cycle
            self._wake.notify_all()

    def _requeue(self, key: str, queued: Queued, now: float) -> None:
        # called with the lock held
        if self._backoff_until(queued) > now:
            self._queues.backoff[key] = queued
        else:
            self._queues.active[key] = queued

    def _backoff_until(self, queued: Queued) -> float:
        exponent = max(queued.attempts - 1, 0)
        duration = min(self._initial_backoff * 2.0**exponent, self._max_backoff)
        return queued.failed_at + duration

    # --- the scheduling loop ------------------------------------------------------------------

    def _loop(self, stop: threading.Event) -> None:
        next_flush = self._clock.monotonic() + self._flush_interval
        while not stop.is_set():
            now = self._clock.monotonic()
            if now >= next_flush:
                self._flush_unschedulable(now)
                next_flush = now + self._flush_interval
            picked = self._pop(now)
            if picked is None:
                with self._wake:
                    self._wake.wait(0.05)
                continue
            key, queued = picked
            try:
                self._schedule_one(key, queued)
            except Exception:  # a test double must keep going: log it, back off
                logger.exception("stand-in: scheduling %s failed", key)
                with self._wake:
                    self._queues.in_flight.pop(key, None)
                    self._queues.backoff[key] = queued
                    self._wake.notify_all()

    def _flush_unschedulable(self, now: float) -> None:
        with self._wake:
            for key, queued in list(self._queues.unschedulable.items()):
                if now - queued.parked_at > self._flush_after:
                    del self._queues.unschedulable[key]
                    self._requeue(key, queued, now)
                    self.moves.append(Move(key, "UnschedulableTimeout", now))

    def _pop(self, now: float) -> tuple[str, Queued] | None:
        with self._wake:
            queues = self._queues
            for key, queued in list(queues.backoff.items()):
                if self._backoff_until(queued) <= now:
                    del queues.backoff[key]
                    queues.active[key] = queued
            if not queues.active or self._held or not self.synced:
                return None
            # PrioritySort (`queuesort/priority_sort.go` `Less`): higher priority first, then
            # the pod queued earlier
            key = max(
                queues.active,
                key=lambda k: (pod_priority(queues.active[k].pod), -queues.active[k].queued_at),
            )
            queued = queues.active.pop(key)
            queued.attempts += 1
            self._cycle += 1
            queues.in_flight[key] = queued
            return key, queued

    def _snapshot(self) -> dict[str, NodeState]:
        """The scheduler cache now: each node with its pods (bound, not finished; terminating
        ones until they are gone) and the pods nominated to it."""
        nodes = {str(node["metadata"]["name"]): NodeState(node) for node in self._nodes.items()}
        pods = {pod_key(pod): pod for pod in self._pods.items()}
        for pod in pods.values():
            state = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
            phase = (pod.get("status") or {}).get("phase")
            if state is not None and phase not in ("Succeeded", "Failed"):
                state.pods.append(pod)
        with self._lock:
            nominated = dict(self._nominated)
        for key, node in nominated.items():
            if key in pods and node in nodes:
                nodes[node].nominated.append(pods[key])
        return nodes

    def _schedule_one(self, key: str, queued: Queued) -> None:
        """One scheduling cycle (`schedule_one.go` v1.24 `scheduleOne`)."""
        cycle = self._cycle
        url = self.extender_url
        pod = queued.pod
        nodes = self._snapshot()
        if not nodes:
            message = "no nodes available to schedule pods"
            self._failed(key, queued, cycle, "unschedulable", message, nominate="")
            return

        def call(names: Sequence[str]) -> JsonObject:
            return self._post(url, "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})

        # PreferNominatedNode (`evaluateNominatedNode`): the nominated node alone first
        nominated = str((pod.get("status") or {}).get("nominatedNodeName") or "")
        outcome = FilterOutcome()
        if nominated in nodes:
            outcome = find_nodes_that_fit(pod, [nominated], nodes, call)
        if not outcome.feasible:
            outcome = find_nodes_that_fit(pod, sorted(nodes), nodes, call)
        if outcome.error:
            self._failed(key, queued, cycle, "error", outcome.error, nominate="")
            return
        if not outcome.feasible:
            self._post_filter(key, queued, cycle, outcome, nodes)
            return
        self._bind(key, queued, cycle, outcome.feasible[0], url)

    def _post_filter(
        self,
        key: str,
        queued: Queued,
        cycle: int,
        outcome: FilterOutcome,
        nodes: dict[str, NodeState],
    ) -> None:
        """No node fits: PostFilter (DefaultPreemption), then the failure as 1.24 handles
        it: the PostFilter message joins the FitError unless its status is an Error."""
        message = fit_error_message(outcome.statuses, len(nodes))
        pod = self._pods.get(key) or queued.pod  # Preempt reads the pod anew
        now = self._clock.now()
        result = self._preemption.preempt(pod, outcome.statuses, nodes, now, self.extender_url)
        if result.code == Code.ERROR:
            logger.info("stand-in: PostFilter for %s: %s", key, result.message)
        elif result.message:
            message = f"{message} {result.message}"
        if result.nominate is not None:
            with self._lock:
                if result.nominate:
                    self._nominated[key] = result.nominate
                else:
                    self._nominated.pop(key, None)
        self._failed(key, queued, cycle, "unschedulable", message, nominate=result.nominate)

    def _bind(self, key: str, queued: Queued, cycle: int, node: str, url: str) -> None:
        metadata = queued.pod.get("metadata") or {}
        binding = {
            "PodName": metadata.get("name"),
            "PodNamespace": metadata.get("namespace") or "default",
            "PodUID": metadata.get("uid") or "",
            "Node": node,
        }
        with self._wake:
            self._queues.assumed.add(key)
        try:
            answer = self._post(url, "/bind", binding)
            bind_error = str(answer.get("Error") or "")
        except ExtenderError as failure:
            bind_error = str(failure)
        if bind_error:
            with self._wake:
                self._queues.assumed.discard(key)
            message = f"binding rejected: {bind_error}"
            self._failed(key, queued, cycle, "bind-error", message, nominate="")
            return
        with self._wake:
            self._queues.in_flight.pop(key, None)
            self._nominated.pop(key, None)
            self._wake.notify_all()
            self._queues.remove(key)  # a copy queued by an update during the attempt
            self.attempts.append(Attempt(key, "bound", node, "", self._clock.monotonic()))

    def _failed(
        self,
        key: str,
        queued: Queued,
        cycle: int,
        outcome: str,
        message: str,
        *,
        nominate: str | None = None,
    ) -> None:
        """`handleSchedulingFailure`: write the condition (and `nominatedNodeName` when
        `nominate` is not None), requeue the pod."""
        reason = REASON_SCHEDULER_ERROR if outcome == "bind-error" else REASON_UNSCHEDULABLE
        self._write_condition(key, reason, message, nominate)
        now = self._clock.monotonic()
        current = self._pods.get(key)
        with self._wake:
            queues = self._queues
            queues.in_flight.pop(key, None)
            self._wake.notify_all()
            self.attempts.append(Attempt(key, outcome, "", message, now))
            if current is None or not self._ours(current):
                return
            queued.pod = current
            queued.failed_at = now
            queued.queued_at = now
            if key in queues.active:
                return  # updated during the attempt: already queued again
            to_backoff = (
                outcome == "bind-error"
                or self._move_request_cycle >= cycle
                or (self._errors_to_backoff and outcome == "error")
            )
            if to_backoff:
                queues.backoff[key] = queued
            else:
                queued.parked_at = now
                queues.unschedulable[key] = queued
            self._wake.notify_all()

    def _write_condition(
        self, key: str, reason: str, message: str, nominate: str | None = None
    ) -> None:
        """`updatePod`: one status patch with the PodScheduled condition and, when `nominate`
        is not None and differs, `nominatedNodeName`; nothing when neither changes."""
        current = self._pods.get(key)
        if current is None:
            return
        status = current.get("status") or {}
        patch: JsonObject = {}
        if nominate is not None and nominate != (status.get("nominatedNodeName") or ""):
            patch["nominatedNodeName"] = nominate or None
        conditions = [dict(c) for c in status.get("conditions") or ()]
        wanted = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        if not any(all(c.get(k) == v for k, v in wanted.items()) for c in conditions):
            stamp = self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            conditions = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append(
                {**wanted, "lastProbeTime": None, "lastTransitionTime": stamp}
            )  # fmt: skip
            patch["conditions"] = conditions
        if not patch:
            return  # UpdatePodCondition: nothing changed, nothing written
        namespace, name = key.split("/", 1)
        try:
            self._kube.patch_pod_status(namespace, name, patch)
        except KubeError as error:
            logger.warning("stand-in: status of %s not written: %s", key, error)

    def _post(self, url: str, path: str, document: Mapping[str, Any]) -> JsonObject:
        return post_json(
            url, path, document, timeout_seconds=self._http_timeout, ssl_context=self._ssl_context
        )
