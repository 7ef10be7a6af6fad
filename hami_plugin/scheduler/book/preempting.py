"""The book's side of preemption: the pods a node could give up, read from the book, and the
decisions of `scheduler.preemption` made over them (docs/design.md 11).

`Planner.choose` picks the node and victims for a pod that fit nowhere (the extender evicts
them, `extender.preemption`); `Planner.refine` answers kube-scheduler's preempt verb, adding to
kube-scheduler's own victims those the GPUs need; `Planner.nominated_fit` rebuilds a hold from a
nomination. Only pods the watch shows bound to the node, not terminating nor finished, of lower
priority, and not already taken by another hold are candidates; what they free is what the
ledger counts for them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import PodDevices
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.usage import DeviceTally, collapse_pod_devices
from hami_plugin.scheduler.book.holds import Hold, Holds, hold_key, is_hold_key
from hami_plugin.scheduler.book.trust import same_pod
from hami_plugin.scheduler.filter import FilterResult, NodeFitter, node_fitter
from hami_plugin.scheduler.fit import NODE_UNREGISTERED, FitFailure, QuotaFit
from hami_plugin.scheduler.ledger import Ledger, TrackedPod
from hami_plugin.scheduler.pod_fit import PodFit
from hami_plugin.scheduler.preemption import (
    PREEMPT_NEVER,
    Fit,
    NodeVictims,
    PodDisruptionBudget,
    Victim,
    candidates_wanted,
    eligible_to_preempt,
    pick_one_node,
    victims_on_node,
    without,
)
from hami_plugin.scheduler.quota import QuotaBook
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["Planner", "Preemption", "Refined"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Preemption:
    """A decision to act on: take `victims` (with what each books on the node's GPUs) off
    `node` for `preemptor`, which will get `devices` there; `cleared`: pods of lower priority
    whose nomination to that node ends (kube-scheduler's `getLowerPriorityNominatedPods`)."""

    preemptor: PodInfo
    node: str
    victims: tuple[PodInfo, ...]
    victim_gpus: tuple[tuple[DeviceTally, ...], ...]
    devices: PodDevices
    pdb_violations: int = 0
    cleared: tuple[PodInfo, ...] = ()
    mig: tuple[MigAllocation, ...] = ()
    """The preemptor's MIG reservations there (held with its GPUs)."""


@dataclass(frozen=True, slots=True)
class Refined:
    """The preempt verb's answer for one node: victim UIDs and PDB violations."""

    uids: tuple[str, ...]
    pdb_violations: int


class Planner:
    """Preemption over the book's parts (read only; the book acts on the result)."""

    def __init__(
        self,
        ledger: Ledger,
        pods: Mapping[str, PodInfo],
        holds: Holds,
        quotas: QuotaBook,
        settings: SchedulerSettings,
    ) -> None:
        self._ledger = ledger
        self._pods = pods
        self._holds = holds
        self._budgets: dict[str, PodDisruptionBudget] = {}
        self._nominations: set[str] = set()  # nominated pod keys whose hold is to be settled
        self._quotas = quotas
        self._settings = settings

    def holds(self) -> list[Hold]:
        """The capacity held for preemptors, by pod key."""
        return self._holds.all()

    def held(self, key: str) -> TrackedPod | None:
        """What is held for preemptor `key`, if anything."""
        return self._ledger.tracked(hold_key(key)) if self._holds.get(key) else None

    # --- the book's transitions ----------------------------------------------------------------

    def preempt(self, pod: PodInfo, result: FilterResult) -> tuple[Preemption | None, str]:
        """Victims for a pod that fit nowhere, among the nodes it failed on (docs/design.md
        11); their GPUs are held for it at once, lower-priority holds on that node end. The
        outcome: `preempted`, `never` (its policy), `waiting` (victims it took are still
        going), `no_victims` (no node frees enough) or `no_gpu`."""
        fitter = node_fitter(pod, result.requests, self._settings)
        if fitter is None:
            return None, "no_gpu"
        if pod.preemption_policy == PREEMPT_NEVER:
            return None, "never"
        if not self.eligible(pod):
            return None, "waiting"
        nodes = [name for name, why in result.failed_nodes.items() if why is not NODE_UNREGISTERED]
        lifted = self._holds.lift(pod.key, pod.priority)
        try:
            preemption = self.choose(pod, fitter, nodes)
        finally:
            self._holds.restore(lifted)
        if preemption is None:
            return None, "no_victims"
        for cleared in preemption.cleared:
            self._holds.drop(cleared.key)
        hold = Hold(
            pod.key,
            pod.uid,
            preemption.node,
            pod.priority,
            victims=tuple(victim.key for victim in preemption.victims),
            victim_uids=frozenset(victim.uid for victim in preemption.victims),
        )
        tallies = collapse_pod_devices(preemption.devices, result.requests.init_count)
        self._holds.place(hold, tallies, preemption.mig)
        self._nominations.discard(pod.key)
        return preemption, "preempted"

    def refine_for(
        self, pod: PodInfo, proposed: Mapping[str, tuple[tuple[str, ...], int]]
    ) -> dict[str, Refined] | None:
        """`refine` for the preempt verb; None when the pod asks no GPU."""
        requests = pod_requests(pod, self._settings)
        fitter = node_fitter(pod, requests, self._settings)
        if fitter is None:
            return None
        if pod.preemption_policy == PREEMPT_NEVER:
            return {}
        lifted = self._holds.lift(pod.key, pod.priority)
        try:
            return self.refine(pod, fitter, proposed)
        finally:
            self._holds.restore(lifted)

    def failed(self, key: str, uid: str) -> None:
        """The victims could not be evicted: the hold ends, the pod may choose again."""
        hold = self._holds.get(key)
        if hold is not None and same_pod(hold.uid, uid):
            self._holds.drop(key)

    def apply_budget(self, key: str, budget: PodDisruptionBudget | None) -> None:
        if budget is None:
            self._budgets.pop(key, None)
        else:
            self._budgets[key] = budget

    def pod_deleted(self, key: str) -> None:
        self._holds.drop(key)
        self._nominations.discard(key)

    def follow(self, info: PodInfo) -> None:
        """Keep the pod's hold in step with what the watch shows (holds.py docstring)."""
        key = info.key
        hold = self._holds.get(key)
        if info.node_name or info.deleting or info.finished:
            if hold is not None:
                self._holds.drop(key)
            self._nominations.discard(key)
            return
        if hold is not None and not same_pod(hold.uid, info.uid):
            self._holds.drop(key)
            hold = None
        nominated = info.nominated_node_name
        if hold is not None:
            if nominated == hold.node:
                self._holds.confirm(key)
            elif nominated:
                self._holds.drop(key)
                self._nominations.add(key)
            elif hold.confirmed:
                self._holds.drop(key)  # the nomination was cleared
        elif nominated:
            self._nominations.add(key)
        else:
            self._nominations.discard(key)

    def settle(self) -> None:
        """Hold for each nominated pod without a hold what its node frees once the pods of
        lower priority terminating there are gone (a restart, a standby, kube-scheduler's own
        preemption)."""
        for key in sorted(self._nominations):
            pod = self._pods.get(key)
            if pod is None or not pod.nominated_node_name or self._holds.get(key) is not None:
                self._nominations.discard(key)
                continue
            if self._ledger.node(pod.nominated_node_name) is None:
                continue  # not registered yet: settled once it is
            self._nominations.discard(key)
            self._settle_one(pod)

    def _settle_one(self, pod: PodInfo) -> None:
        requests = pod_requests(pod, self._settings)
        fitter = node_fitter(pod, requests, self._settings)
        if fitter is None:
            return
        lifted = self._holds.lift(pod.key, pod.priority)
        try:
            fit, going = self.nominated_fit(pod, fitter)
        except LookupError as why:
            logger.info("no capacity held for nominated pod %s: %s", pod.key, why)
            return
        finally:
            self._holds.restore(lifted)
        uids = frozenset(self._pods[victim].uid for victim in going)
        hold = Hold(pod.key, pod.uid, pod.nominated_node_name, pod.priority, going, uids, True)
        self._holds.place(hold, collapse_pod_devices(fit.devices, requests.init_count), fit.mig)

    # --- who and what ------------------------------------------------------------------------

    def _on_node(self, node: str) -> list[PodInfo]:
        """The pods the watch shows bound to `node` that the ledger counts there."""
        pods = []
        for key in self._ledger.keys_on(node):
            if is_hold_key(key):
                continue
            pod = self._pods.get(key)
            if pod is not None and pod.node_name == node:
                pods.append(pod)
        return pods

    def _victim(self, pod: PodInfo) -> Victim:
        tracked = self._ledger.tracked(pod.key)
        return Victim(
            key=pod.key,
            uid=pod.uid,
            namespace=pod.namespace,
            priority=pod.priority,
            start_time=pod.start_time,
            labels=pod.labels,
            tallies=tracked.tallies if tracked is not None else (),
            mig=tracked.mig if tracked is not None else (),
        )

    def _searched(self, usage: NodeUsage, taken: set[str]) -> tuple[NodeUsage, list[Victim]]:
        """The node as a victim search sees it, and the pods it may take there (any priority:
        the decision keeps the lower). `taken`: the victims of every preemption in flight
        (`Holds.preempting`). The node is seen once those are gone: their GPUs are held for
        their preemptors already (the holds count), so a search that also counted them would
        take twice what they free; they are no candidates either."""
        pods = self._on_node(usage.name)
        going = [self._victim(pod) for pod in pods if pod.key in taken]
        candidates = [
            self._victim(pod)
            for pod in pods
            if not pod.deleting and not pod.finished and pod.key not in taken
        ]
        return without(usage, going), candidates

    def terminating(self, node: str) -> list[PodInfo]:
        """The pods on `node` that are going away (deleted, containers not gone yet)."""
        return [pod for pod in self._on_node(node) if pod.deleting and not pod.finished]

    def eligible(self, pod: PodInfo) -> bool:
        """May `pod` take anything now (`preemption.eligible_to_preempt`)? Not while victims
        chosen for it before still exist (evicted or terminating)."""
        hold = self._holds.get(pod.key)
        if hold is not None and any(
            key in self._pods and self._pods[key].uid in hold.victim_uids for key in hold.victims
        ):
            return False
        nominated = pod.nominated_node_name or (hold.node if hold is not None else "")
        if not nominated:
            return eligible_to_preempt(pod.preemption_policy, pod.priority, [])
        # terminating there: as the watch shows it, or being evicted for any preemptor (its
        # DELETE sent, not seen yet)
        taken = self._holds.preempting()
        going = [
            other.priority
            for other in self._on_node(nominated)
            if (other.deleting and not other.finished) or other.key in taken
        ]
        return eligible_to_preempt(pod.preemption_policy, pod.priority, going)

    def _fit(self, pod: PodInfo, fitter: NodeFitter) -> Fit:
        """The preemptor's fit on a node without some pods: their namespace quota usage is
        freed with them."""
        quota = self._quotas.quota_fit(pod.namespace, self._settings.memory_factor)

        def fit(usage: NodeUsage, removed: Sequence[Victim]) -> PodFit | FitFailure:
            return fitter(usage, _freed(quota, pod.namespace, removed))

        return fit

    def _budget_list(self) -> list[PodDisruptionBudget]:
        return [self._budgets[key] for key in sorted(self._budgets)]

    # --- decisions ---------------------------------------------------------------------------

    def choose(self, pod: PodInfo, fitter: NodeFitter, nodes: Sequence[str]) -> Preemption | None:
        """The node and victims kube-scheduler would pick among `nodes` (those the pod failed
        on) if it saw GPUs; None when no node has any."""
        fit = self._fit(pod, fitter)
        budgets = self._budget_list()
        taken = self._holds.preempting()
        found: list[NodeVictims] = []
        wanted = candidates_wanted(len(nodes))
        non_violating = 0
        for name in nodes:
            usage = self._ledger.node(name)
            if usage is None:
                continue
            usage, candidates = self._searched(usage, taken)
            outcome = victims_on_node(usage, candidates, pod.priority, fit, budgets)
            if outcome is None:
                continue
            found.append(outcome)
            non_violating += outcome.pdb_violations == 0
            if non_violating and len(found) >= wanted:
                break  # kube-scheduler's DryRunPreemption stops here too
        best = pick_one_node(found)
        if best is None:
            return None
        victims = tuple(self._pods[victim.key] for victim in best.victims)
        cleared = tuple(
            self._pods[hold.key]
            for hold in self._holds.all()
            if hold.node == best.node
            and hold.key != pod.key
            and hold.priority < pod.priority
            and hold.key in self._pods
        )
        return Preemption(
            preemptor=pod,
            node=best.node,
            victims=victims,
            victim_gpus=tuple(victim.tallies for victim in best.victims),
            devices=best.fit.devices,
            mig=best.fit.mig,
            pdb_violations=best.pdb_violations,
            cleared=cleared,
        )

    def refine(
        self,
        pod: PodInfo,
        fitter: NodeFitter,
        proposed: Mapping[str, tuple[tuple[str, ...], int]],
    ) -> dict[str, Refined]:
        """kube-scheduler's candidates (node -> its victims' UIDs and PDB violations) with the
        victims the GPUs need added; a node where the pod cannot get its GPUs even then is left
        out. While victims this scheduler chose for the pod are still going, only their node
        is kept, with them."""
        hold = self._holds.get(pod.key)
        fit = self._fit(pod, fitter)
        budgets = self._budget_list()
        taken = self._holds.preempting()
        refined: dict[str, Refined] = {}
        for node, (uids, violations) in proposed.items():
            if hold is not None and hold.victims:
                if node != hold.node:
                    continue
                extra = tuple(
                    self._pods[key].uid
                    for key in hold.victims
                    if key in self._pods and self._pods[key].uid not in uids
                )
                refined[node] = Refined((*uids, *extra), violations)
                continue
            usage = self._ledger.node(node)
            if usage is None:
                continue
            usage, candidates = self._searched(usage, taken)
            wanted = set(uids)
            forced = [victim for victim in candidates if victim.uid in wanted]
            outcome = victims_on_node(
                usage, candidates, pod.priority, fit, budgets, forced=tuple(forced)
            )
            if outcome is None:
                continue
            extra = tuple(victim.uid for victim in outcome.victims if victim.uid not in wanted)
            refined[node] = Refined((*uids, *extra), violations + outcome.pdb_violations)
        return refined

    def nominated_fit(self, pod: PodInfo, fitter: NodeFitter) -> tuple[PodFit, tuple[str, ...]]:
        """The pod's fit on its nominated node once the pods of lower priority terminating
        there are gone, and their keys; raises LookupError when it does not fit."""
        node = pod.nominated_node_name
        usage = self._ledger.node(node)
        if usage is None:
            raise LookupError(f"node {node} is not registered")
        going = [
            self._victim(other) for other in self.terminating(node) if other.priority < pod.priority
        ]
        outcome = self._fit(pod, fitter)(without(usage, going), going)
        if isinstance(outcome, FitFailure):
            raise LookupError(f"pod {pod.key} does not fit on its nominated node {node}")
        return outcome, tuple(victim.key for victim in going)


def _freed(quota: QuotaFit | None, namespace: str, removed: Sequence[Victim]) -> QuotaFit | None:
    """The namespace quota check with what `removed` pods of that namespace book given back."""
    if quota is None:
        return None
    memory = sum(t.memory_mib for pod in removed if pod.namespace == namespace for t in pod.tallies)
    cores = sum(t.cores for pod in removed if pod.namespace == namespace for t in pod.tallies)
    if not memory and not cores:
        return quota
    base = quota

    def fits(memory_mib: int, asked_cores: int) -> bool:
        return base(memory_mib - memory, asked_cores - cores)

    return fits
