"""Preemption: which lower-priority pods a pod that fits nowhere would take GPUs back from.

kube-scheduler's own preemption cannot see GPUs (our resources are `ignoredByScheduler`, its dry
run fits the pod with nobody removed), so the scheduler decides the victims itself, by
kube-scheduler's rules as if its filters could see them (docs/design.md 11):

* who may preempt: not a pod whose `preemptionPolicy` is `Never`; not one whose nominated node
  still holds a terminating pod of lower priority (kube-scheduler v1.24+
  `pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go`
  `PodEligibleToPreemptOthers`): it waits for what it already took;
* the victims on one node (`victims_on_node`, kube-scheduler's `SelectVictimsOnNode`): every
  pod of lower priority that is not terminating or finished is removed; when the preemptor then
  fits, they are given back one by one, those whose PodDisruptionBudget would be violated first,
  each group in `MoreImportantPod` order (higher priority first, then earlier start); a pod whose
  return makes the preemptor not fit is a victim. The set is minimal: every victim frees capacity
  on the GPUs every remaining fit needs (a pod on another GPU is given back);
* one node among those with victims (`pick_one_node`, kube-scheduler's
  `pkg/scheduler/framework/preemption/preemption.go` `pickOneNodeForPreemption`): fewest PDB
  violations, lowest highest-victim priority, smallest sum of priorities (each offset by
  MaxInt32 + 1, so fewer victims weigh less), fewest victims, latest start of the
  highest-priority victims, then the first candidate.

Capacity is what the book counts: slots, memory and cores per GPU, MIG reservations at their
placements, the namespace quota. The fit itself is the caller's (`Fit`): the scheduler's own
fit of the preemptor on a node's usage with the removed pods taken out (`without`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.fit import FitFailure
from hami_plugin.scheduler.pod_fit import PodFit
from hami_plugin.scheduler.usage import NodeUsage, mig_booking

__all__ = [
    "PREEMPT_NEVER",
    "Fit",
    "NodeVictims",
    "PodDisruptionBudget",
    "Victim",
    "candidates_wanted",
    "eligible_to_preempt",
    "pick_one_node",
    "read_pod_disruption_budget",
    "victims_on_node",
    "without",
]

PREEMPT_NEVER = "Never"
"""`spec.preemptionPolicy` of a pod that never takes anything (Kubernetes `PreemptNever`)."""

_PRIORITY_OFFSET = 2**31
"""kube-scheduler adds MaxInt32 + 1 to every victim's priority before summing them."""


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod on the node that may be taken: its identity, priority, start time (None: not
    started, kube-scheduler reads it as now), labels for PodDisruptionBudgets, and what it
    books on the node's GPUs."""

    key: str
    uid: str
    namespace: str
    priority: int
    start_time: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    tallies: tuple[DeviceTally, ...] = ()
    mig: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    """What preemption reads of a policy/v1 PodDisruptionBudget: its namespace, its selector
    (`match_labels` and `match_expressions` as (key, operator, values)), how many disruptions it
    still allows and the pods it already counts as disrupted (by name)."""

    namespace: str
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    disruptions_allowed: int = 0
    disrupted_pods: frozenset[str] = frozenset()
    selects_nothing: bool = False
    """`spec.selector` absent: policy/v1 then selects no pod."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """kube-scheduler's test: same namespace, a selector that is not empty, and it matches."""
        if self.selects_nothing or namespace != self.namespace:
            return False
        if not self.match_labels and not self.match_expressions:
            return False  # kube-scheduler skips an empty selector (`selector.Empty()`)
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        return all(_expression(labels, *expression) for expression in self.match_expressions)


def read_pod_disruption_budget(obj: Mapping[str, Any]) -> PodDisruptionBudget:
    """What preemption reads of a policy/v1 PodDisruptionBudget object (camelCase keys, as the
    API sends it). Raises ValueError naming the field when it cannot be read."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        raise ValueError("metadata.name is missing")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise ValueError("spec and status must be objects")
    selector = spec.get("selector")
    labels: dict[str, str] = {}
    expressions: list[tuple[str, str, tuple[str, ...]]] = []
    if isinstance(selector, Mapping):
        for key, value in (selector.get("matchLabels") or {}).items():
            labels[str(key)] = str(value)
        for entry in selector.get("matchExpressions") or ():
            if not isinstance(entry, Mapping):
                raise ValueError("spec.selector.matchExpressions holds a non-object")
            values = tuple(str(value) for value in entry.get("values") or ())
            expressions.append((str(entry.get("key", "")), str(entry.get("operator", "")), values))
    allowed = status.get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise ValueError("status.disruptionsAllowed must be an integer")
    disrupted = status.get("disruptedPods") or {}
    return PodDisruptionBudget(
        namespace=str(metadata.get("namespace") or "default"),
        name=metadata["name"],
        match_labels=labels,
        match_expressions=tuple(expressions),
        disruptions_allowed=allowed,
        disrupted_pods=frozenset(str(name) for name in disrupted),
        selects_nothing=selector is None,
    )


def _expression(labels: Mapping[str, str], key: str, operator: str, values: Sequence[str]) -> bool:
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # an unknown operator makes the selector invalid: kube-scheduler skips it


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """The victims on one node (most important first), how many of them violate a
    PodDisruptionBudget, and the preemptor's fit once they are gone."""

    node: str
    victims: tuple[Victim, ...]
    pdb_violations: int
    fit: PodFit


Fit = Callable[[NodeUsage, Sequence[Victim]], PodFit | FitFailure]
"""`fit(usage, removed)`: the preemptor's fit on `usage` (the node without `removed`)."""


def eligible_to_preempt(
    preemption_policy: str, priority: int, terminating_on_nominated: Sequence[int]
) -> bool:
    """kube-scheduler's `PodEligibleToPreemptOthers`: not `Never`, and no terminating pod of
    lower priority (`terminating_on_nominated`: the priorities of the pods terminating on the
    pod's nominated node) is still going away."""
    if preemption_policy == PREEMPT_NEVER:
        return False
    return not any(other < priority for other in terminating_on_nominated)


MIN_CANDIDATE_NODES_PERCENTAGE = 10
MIN_CANDIDATE_NODES_ABSOLUTE = 100


def candidates_wanted(nodes: int) -> int:
    """How many nodes with victims the search collects before it stops (kube-scheduler's
    `calculateNumCandidates` with DefaultPreemptionArgs' defaults: 10 % of the nodes, at least
    100, at most all); it stops once it has that many and one of them violates no
    PodDisruptionBudget (`DryRunPreemption`). kube-scheduler starts at a random offset; here the
    nodes are searched in the order the filter fitted them (the node policy's), so the answer
    is deterministic."""
    wanted = nodes * MIN_CANDIDATE_NODES_PERCENTAGE // 100
    return min(max(wanted, MIN_CANDIDATE_NODES_ABSOLUTE), nodes)


def _importance(victim: Victim) -> tuple[int, int, float]:
    """kube-scheduler's `MoreImportantPod` as a sort key: higher priority, then earlier start
    (a pod not started counts as starting now, after every started one)."""
    started = victim.start_time is not None
    when = victim.start_time.timestamp() if victim.start_time is not None else 0.0
    return (-victim.priority, 0 if started else 1, when)


def _split_by_pdb(
    pods: Sequence[Victim], budgets: Sequence[PodDisruptionBudget]
) -> tuple[list[Victim], list[Victim]]:
    """kube-scheduler's `filterPodsWithPDBViolation`: the pods whose eviction would take a
    matching budget below zero (each eviction spends one allowed disruption, in `pods` order;
    a pod the budget already counts as disrupted spends nothing), and the others."""
    allowed = [budget.disruptions_allowed for budget in budgets]
    violating: list[Victim] = []
    other: list[Victim] = []
    for pod in pods:
        name = pod.key.partition("/")[2]
        violates = False
        for position, budget in enumerate(budgets):
            if not budget.selects(pod.namespace, pod.labels):
                continue
            if name in budget.disrupted_pods:
                continue
            allowed[position] -= 1
            if allowed[position] < 0:
                violates = True
        (violating if violates else other).append(pod)
    return violating, other


def without(usage: NodeUsage, removed: Sequence[Victim]) -> NodeUsage:
    """The node's usage with what `removed` book taken out (slots, memory, cores, and their
    MIG reservations at their placements). The score is left as it was: only one node is
    fitted."""
    if not removed:
        return usage
    positions = {device.uuid: position for position, device in enumerate(usage.devices)}
    used = list(usage.used)
    memory = list(usage.used_memory_mib)
    cores = list(usage.used_cores)
    mig_in_use = [list(allocations) for allocations in usage.mig_in_use]
    for pod in removed:
        for tally in pod.tallies:
            position = positions.get(tally.uuid)
            if position is None:
                continue
            used[position] -= tally.slots
            memory[position] -= tally.memory_mib
            cores[position] -= tally.cores
        if pod.mig and mig_in_use:
            booking = mig_booking(
                usage.devices, positions, [tally.uuid for tally in pod.tallies], pod.mig
            )
            for position, allocation in booking.in_use:
                if allocation in mig_in_use[position]:
                    mig_in_use[position].remove(allocation)
    return replace(
        usage,
        used=tuple(used),
        used_memory_mib=tuple(memory),
        used_cores=tuple(cores),
        mig_in_use=tuple(tuple(allocations) for allocations in mig_in_use),
    )


def victims_on_node(
    usage: NodeUsage,
    pods: Sequence[Victim],
    preemptor_priority: int,
    fit: Fit,
    budgets: Sequence[PodDisruptionBudget] = (),
    forced: Sequence[Victim] = (),
) -> NodeVictims | None:
    """kube-scheduler's `SelectVictimsOnNode` over GPUs (module docstring). `pods`: the pods
    that may be taken (running on the node, not terminating); only those of lower priority are.
    `forced`: pods that go whatever the GPUs need (kube-scheduler's own victims, for the
    preempt verb). None when the preemptor does not fit even with every candidate gone."""
    lower = sorted((pod for pod in pods if pod.priority < preemptor_priority), key=_importance)
    forced_keys = {pod.key for pod in forced}
    lower = [pod for pod in lower if pod.key not in forced_keys]
    removed = [*forced, *lower]
    outcome = fit(without(usage, removed), removed)
    if isinstance(outcome, FitFailure):
        return None
    violating, other = _split_by_pdb(lower, budgets)
    kept_out: list[Victim] = list(removed)
    victims: list[Victim] = []
    violations = 0
    for group, counts in ((violating, True), (other, False)):
        for pod in group:
            trial = [gone for gone in kept_out if gone.key != pod.key]
            attempt = fit(without(usage, trial), trial)
            if isinstance(attempt, FitFailure):
                victims.append(pod)
                violations += counts
            else:
                kept_out, outcome = trial, attempt
    if not victims and not forced:
        # the preemptor fits with nobody gone: preemption is not what it needs
        return None
    chosen = sorted([*forced, *victims], key=_importance)
    return NodeVictims(usage.name, tuple(chosen), violations, outcome)


def pick_one_node(candidates: Sequence[NodeVictims]) -> NodeVictims | None:
    """kube-scheduler's `pickOneNodeForPreemption` among nodes with victims (module docstring);
    a node without victims would win at once, but such a node is no candidate here."""
    if not candidates:
        return None

    def order(candidate: NodeVictims) -> tuple[int, int, int, int, float]:
        victims = candidate.victims
        highest = victims[0].priority
        total = sum(victim.priority + _PRIORITY_OFFSET for victim in victims)
        # the earliest start among the highest-priority victims; later is better
        starts = [
            victim.start_time.timestamp() if victim.start_time is not None else float("inf")
            for victim in victims
            if victim.priority == highest
        ]
        return (candidate.pdb_violations, highest, total, len(victims), -min(starts))

    return min(candidates, key=order)
