"""The pure part of the kube-scheduler stand-in's preemption: the in-tree NodeResourcesFit
filter, PodDisruptionBudget matching and the choices `DefaultPreemption` makes, over pods and
nodes as JSON objects. No I/O; `now` is passed in.

Modelled on kube-scheduler v1.24 (files under `pkg/scheduler/` of kubernetes/kubernetes):

* `fits_node`: `framework/plugins/noderesources/fit.go` `fitsRequest` (the `pods` count, then
  `cpu` and `memory`; extended resources are left out because the shipped configuration marks
  ours `ignoredByScheduler`), run as `framework/runtime/framework.go`
  `RunFilterPluginsWithNominatedPods` does: the pods nominated to the node with a priority at
  least the pod's count as if they ran there. Unlike kube-scheduler, a node that reports no
  allocatable for a resource is not limited on it (test nodes often leave cpu out).
* `select_victims_on_node`: `framework/plugins/defaultpreemption/default_preemption.go`
  `SelectVictimsOnNode` with `filterPodsWithPDBViolation` and `util/utils.go`
  `MoreImportantPod`.
* `pick_one_node_for_preemption`: `framework/preemption/preemption.go`
  `pickOneNodeForPreemption` with `util/utils.go` `GetEarliestPodStartTime`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

__all__ = [
    "Code",
    "NodeState",
    "NodeStatus",
    "Victims",
    "fit_error_message",
    "fits_node",
    "more_important_first",
    "parse_quantity",
    "pdb_disruptions",
    "pick_one_node_for_preemption",
    "pod_key",
    "pod_priority",
    "select_victims_on_node",
]

JsonObject = dict[str, Any]

_MAX_INT32 = 2**31 - 1
_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_FIT_RESOURCES = ("cpu", "memory")


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes quantity (`500m`, `1Gi`, `1k`, `1e3`) as a number. Raises ValueError."""
    match = _QUANTITY.match(str(text).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"invalid quantity {text!r}")
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name')}"


def pod_priority(pod: Mapping[str, Any]) -> int:
    """`spec.priority`, 0 when unset (component-helpers `PodPriority`)."""
    return int((pod.get("spec") or {}).get("priority") or 0)


def _start_time(pod: Mapping[str, Any], now: datetime) -> datetime:
    """`util.GetPodStartTime`: `status.startTime`, now when unset."""
    stamp = (pod.get("status") or {}).get("startTime")
    if not stamp:
        return now
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def more_important_first(pods: Sequence[JsonObject], now: datetime) -> list[JsonObject]:
    """`pods` in `MoreImportantPod` order: higher priority first, then the one that started
    earlier (stable for ties)."""
    return sorted(pods, key=lambda pod: (-pod_priority(pod), _start_time(pod, now)))


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    # The API server defaults a missing request to the limit.
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: parse_quantity(merged[name]) for name in _FIT_RESOURCES if name in merged}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """cpu (cores) and memory (bytes) the pod asks: the containers' sum, at least each init
    container's, plus the overhead (`noderesources.computePodResourceRequest`)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = dict.fromkeys(_FIT_RESOURCES, Decimal(0))
    for container in spec.get("containers") or ():
        for name, value in _container_requests(container).items():
            total[name] += value
    for container in spec.get("initContainers") or ():
        for name, value in _container_requests(container).items():
            total[name] = max(total[name], value)
    for name, value in (spec.get("overhead") or {}).items():
        if name in total:
            total[name] += parse_quantity(value)
    return total


class Code(StrEnum):
    """framework.Code, the ones that matter here."""

    SUCCESS = "Success"
    ERROR = "Error"
    UNSCHEDULABLE = "Unschedulable"
    UNRESOLVABLE = "UnschedulableAndUnresolvable"


@dataclass(frozen=True, slots=True)
class NodeStatus:
    code: Code
    reasons: tuple[str, ...]


def fit_error_message(statuses: Mapping[str, NodeStatus], all_nodes: int) -> str:
    """`FitError.Error()`: "0/N nodes are available: <count> <reason>, ...."."""
    counts: dict[str, int] = {}
    for status in statuses.values():
        for reason in status.reasons:
            counts[reason] = counts.get(reason, 0) + 1
    detail = ", ".join(sorted(f"{count} {reason}" for reason, count in counts.items()))
    return f"0/{all_nodes} nodes are available: {detail}."


@dataclass(slots=True)
class NodeState:
    """A node as the dry run sees it: the node object, the pods on it (bound, not finished;
    terminating ones included) and the pods nominated to it."""

    node: JsonObject
    pods: list[JsonObject] = field(default_factory=list)
    nominated: list[JsonObject] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])


def fits_node(pod: Mapping[str, Any], state: NodeState) -> list[str]:
    """NodeResourcesFit with nominated pods: the reasons the pod does not fit ("Too many
    pods", "Insufficient cpu", "Insufficient memory"), [] when it fits."""
    priority = pod_priority(pod)
    uid = (pod.get("metadata") or {}).get("uid")
    present = list(state.pods) + [
        other
        for other in state.nominated
        if pod_priority(other) >= priority and (other.get("metadata") or {}).get("uid") != uid
    ]
    allocatable = (state.node.get("status") or {}).get("allocatable") or {}
    reasons: list[str] = []
    if "pods" in allocatable and len(present) + 1 > int(parse_quantity(allocatable["pods"])):
        reasons.append("Too many pods")
    wanted = pod_requests(pod)
    for name in _FIT_RESOURCES:
        if wanted[name] == 0 or name not in allocatable:
            continue
        used = sum((pod_requests(other)[name] for other in present), Decimal(0))
        if wanted[name] > parse_quantity(allocatable[name]) - used:
            reasons.append(f"Insufficient {name}")
    return reasons


def _selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """`metav1.LabelSelectorAsSelector(...).Matches`, except that a nil or empty selector
    matches nothing, as `filterPodsWithPDBViolation` treats a PDB's."""
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key"), expression.get("operator")
        values = set(expression.get("values") or ())
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pdb_disruptions(
    pods: Sequence[JsonObject], pdbs: Sequence[Mapping[str, Any]]
) -> tuple[list[JsonObject], list[JsonObject]]:
    """`filterPodsWithPDBViolation`: (violating, non-violating), each in the order given. A
    pod violates when a PDB of its namespace selects it with `disruptionsAllowed` used up;
    a pod already in a PDB's `disruptedPods` neither counts nor violates it."""
    allowed = [int((pdb.get("status") or {}).get("disruptionsAllowed") or 0) for pdb in pdbs]
    violating: list[JsonObject] = []
    non_violating: list[JsonObject] = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        violated = False
        if labels:  # a pod without labels matches no PDB
            for index, pdb in enumerate(pdbs):
                pdb_namespace = (pdb.get("metadata") or {}).get("namespace") or "default"
                if pdb_namespace != (metadata.get("namespace") or "default"):
                    continue
                if not _selector_matches((pdb.get("spec") or {}).get("selector"), labels):
                    continue
                disrupted = (pdb.get("status") or {}).get("disruptedPods") or {}
                if metadata.get("name") in disrupted:
                    continue
                allowed[index] -= 1
                if allowed[index] < 0:
                    violated = True
        (violating if violated else non_violating).append(pod)
    return violating, non_violating


@dataclass(frozen=True, slots=True)
class Victims:
    """`extenderv1.Victims`: the pods to evict on a node, most important first."""

    pods: tuple[JsonObject, ...]
    num_pdb_violations: int = 0


def select_victims_on_node(
    preemptor: Mapping[str, Any],
    state: NodeState,
    pdbs: Sequence[Mapping[str, Any]],
    now: datetime,
) -> tuple[Victims | None, list[str]]:
    """`SelectVictimsOnNode` (v1.24): remove every pod of lower priority, check the preemptor
    fits (with nominated pods), then reprieve the PDB-violating pods and then the others,
    each most important first; the pods that could not be reprieved are the victims.

    Returns (victims, []) or (None, reasons the preemptor does not fit even so). Victims may
    be empty: the node fits without evicting anyone (the caller turns that into an error).
    """
    priority = pod_priority(preemptor)
    potential = [pod for pod in state.pods if pod_priority(pod) < priority]
    remaining = [pod for pod in state.pods if pod_priority(pod) >= priority]
    trial = NodeState(state.node, remaining, state.nominated)
    reasons = fits_node(preemptor, trial)
    if reasons:
        return None, reasons
    violating, non_violating = pdb_disruptions(more_important_first(potential, now), pdbs)
    victims: list[JsonObject] = []
    num_violations = 0
    for group, counts in ((violating, True), (non_violating, False)):
        for pod in group:
            trial.pods.append(pod)
            if fits_node(preemptor, trial):
                trial.pods.pop()
                victims.append(pod)
                num_violations += counts
    if violating and non_violating:
        victims = more_important_first(victims, now)
    return Victims(tuple(victims), num_violations), []


def _earliest_start_of_most_important(victims: Victims, now: datetime) -> datetime:
    """`GetEarliestPodStartTime`: the earliest start among the victims of the highest
    priority."""
    highest = max(pod_priority(pod) for pod in victims.pods)
    return min(_start_time(pod, now) for pod in victims.pods if pod_priority(pod) == highest)


def pick_one_node_for_preemption(candidates: Mapping[str, Victims], now: datetime) -> str:
    """`pickOneNodeForPreemption`: fewest PDB violations, then the lowest highest-victim
    priority, the smallest sum of priorities (each + MaxInt32 + 1), the fewest victims, the
    latest earliest start among the highest-priority victims, then the first in order.
    Victims are most important first. "" when there is none."""

    def highest(node: str) -> int:
        return pod_priority(candidates[node].pods[0])

    def priority_sum(node: str) -> int:
        return sum(pod_priority(pod) + _MAX_INT32 + 1 for pod in candidates[node].pods)

    scores = (
        lambda node: -candidates[node].num_pdb_violations,
        lambda node: -highest(node),
        lambda node: -priority_sum(node),
        lambda node: -len(candidates[node].pods),
        lambda node: _earliest_start_of_most_important(candidates[node], now).timestamp(),
    )
    remaining = list(candidates)
    for score in scores:
        if len(remaining) <= 1:
            break
        best = max(score(node) for node in remaining)
        remaining = [node for node in remaining if score(node) == best]
    return remaining[0] if remaining else ""
