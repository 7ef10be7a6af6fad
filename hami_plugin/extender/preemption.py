"""Carrying out a preemption: the leader evicts the victims the book chose, as kube-scheduler's
preemption does (docs/design.md 11).

kube-scheduler cannot preempt for GPUs (its dry run does not see them, `docs/design.md` 11.1),
so when `/filter` finds no node for a GPU pod and the book chose victims, this loop does what
kube-scheduler's `prepareCandidate` and the scheduling failure handler would
(pkg/scheduler/framework/preemption/preemption.go, pkg/scheduler/schedule_one.go):

1. the preemptor's `status.nominatedNodeName` is set to the node (kube-scheduler's `updatePod`
   with the PostFilter result): the hold survives a restart and a leader change through it;
2. for each victim: the `DisruptionTarget` condition (reason `PreemptionByScheduler`, message
   "<schedulerName>: preempting to accommodate a higher priority pod"), then a DELETE with the
   pod's own grace period and a UID precondition (a successor of the same name is never hit),
   then an Event on the victim, reason `Preempted`, kube-scheduler's message
   "Preempted by pod <preemptor UID> on node <node>" (v1.27+ wording);
3. lower-priority pods nominated to that node lose their nomination
   (`getLowerPriorityNominatedPods`), so kube-scheduler places them elsewhere;
4. an Event on the preemptor, reason `Preempting`, naming each victim and the GPUs it frees.

A victim already gone (404, or another UID) counts as evicted. Any other failure ends the
preemption: a Warning `PreemptionFailed` on the preemptor, the hold released
(`SchedulerState.preemption_failed`), so its next attempt may choose again. kube-scheduler
binds the preemptor through `/filter` and `/bind` once its victims are gone: this loop never
binds.
"""

from __future__ import annotations

import logging
import threading

from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.api import PreemptionApi
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.events import EventSink, PodEvent
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.book.preempting import Preemption

__all__ = ["DISRUPTION_TARGET", "Evictor", "preempting_message"]

logger = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
_API_BUDGET_SECONDS = 10.0


def preempting_message(preemption: Preemption) -> str:
    """The preemptor's Event: the node, and each victim with its priority and GPUs."""
    parts = []
    for victim, tallies in zip(preemption.victims, preemption.victim_gpus, strict=True):
        gpus = ", ".join(_gpu(tally) for tally in tallies) or "no GPU"
        parts.append(f"{victim.key} (priority {victim.priority}; {gpus})")
    return (
        f"preempting {len(parts)} pod(s) of lower priority on node {preemption.node} for its "
        f"GPUs: " + "; ".join(parts)
    )


def _gpu(tally: DeviceTally) -> str:
    return f"{tally.uuid} {tally.memory_mib} MiB {tally.cores}% cores"


class Evictor:
    """The eviction loop; `run(stop)` blocks (give it a thread), `execute` is one preemption."""

    def __init__(
        self,
        state: SchedulerState,
        api: PreemptionApi,
        events: EventSink,
        scheduler_name: str,
    ) -> None:
        self._state = state
        self._api = api
        self._events = events
        self._scheduler_name = scheduler_name

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for preemption in self._state.take_preemptions(timeout=1.0):
                if stop.is_set():
                    break
                self.execute(preemption)

    def execute(self, preemption: Preemption) -> bool:
        """Evict, nominate, tell; True when every victim is evicted (or already gone)."""
        preemptor = preemption.preemptor
        with self._api.deadline(_API_BUDGET_SECONDS):
            try:
                self._api.patch_pod_status(
                    preemptor.namespace,
                    preemptor.name,
                    {"nominatedNodeName": preemption.node},
                )
            except NotFound:
                logger.info("preemptor %s is gone: no victim evicted", preemptor.key)
                self._state.preemption_failed(preemptor)
                return False
            except KubeError as error:
                # the hold stands in this process; only a restart would lose it
                logger.warning("could not nominate %s: %s", preemptor.key, error)
            for victim in preemption.victims:
                failure = self._evict(victim, preemptor, preemption.node)
                if failure is not None:
                    self._failed(preemption, victim, failure)
                    return False
            for cleared in preemption.cleared:
                self._clear_nomination(cleared)
        self._events.record(
            PodEvent.of_pod(preemptor, "Preempting", preempting_message(preemption), "Normal")
        )
        logger.info(
            "preempted %s on node %s for pod %s",
            ", ".join(victim.key for victim in preemption.victims),
            preemption.node,
            preemptor.key,
        )
        self._state.observer.preemption_victims(len(preemption.victims))
        return True

    def _evict(self, victim: PodInfo, preemptor: PodInfo, node: str) -> KubeError | None:
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION_BY_SCHEDULER,
            "message": f"{preemptor.scheduler_name or self._scheduler_name}: preempting to "
            "accommodate a higher priority pod",
        }
        try:
            self._api.add_pod_condition(victim.namespace, victim.name, condition)
        except NotFound:
            return None  # gone already
        except KubeError as error:
            logger.warning("pod %s: DisruptionTarget not written: %s", victim.key, error)
        try:
            self._api.delete_pod(victim.namespace, victim.name, victim.uid)
        except (NotFound, Conflict):
            return None  # gone, or a successor of the same name: nothing of it runs
        except KubeError as error:
            return error
        self._events.record(
            PodEvent(
                victim.namespace,
                victim.name,
                victim.uid,
                "Preempted",
                f"Preempted by pod {preemptor.uid} on node {node}",
            )
        )
        return None

    def _failed(self, preemption: Preemption, victim: PodInfo, error: KubeError) -> None:
        preemptor = preemption.preemptor
        logger.warning(
            "preemption for pod %s on node %s failed: pod %s not evicted: %s",
            preemptor.key,
            preemption.node,
            victim.key,
            error,
        )
        message = f"could not evict pod {victim.key} on node {preemption.node}: {error}"
        self._events.record(PodEvent.of_pod(preemptor, "PreemptionFailed", message, "Warning"))
        self._state.preemption_failed(preemptor)

    def _clear_nomination(self, pod: PodInfo) -> None:
        try:
            self._api.patch_pod_status(pod.namespace, pod.name, {"nominatedNodeName": None})
        except KubeError as error:
            logger.info("nomination of pod %s not cleared: %s", pod.key, error)
