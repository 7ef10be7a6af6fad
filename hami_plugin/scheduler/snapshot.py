"""Cluster snapshots for the dry run: what `kubectl get nodes,pods,resourcequotas,
poddisruptionbudgets,priorityclasses -A -o yaml` prints (a `v1 List` or a `NodeList`/`PodList`
with `items`, a stream of YAML documents, or any mix; objects of other kinds skipped).

A snapshot must hold at least one Node, and every object must name its `kind`: anything else is
an error that says what was expected, never a cluster in which no node fits. The ledger built
from it registers the nodes a HAMi v2.10 scheduler would (`scheduler.health`: a node whose
device plugin is gone is left out, judged at the time the caller passes), books what the pods
hold (MIG reservations and the GPUs HAMi's getNodesUsage marks unhealthy included; no booking
key, so every booking counts, as in HAMi), and `build_quota_book` gives the namespace GPU
quotas from the ResourceQuota objects. PodDisruptionBudgets are read as preemption reads them
(`read_pod_disruption_budget`); PriorityClasses give a pod that names one but carries no
`spec.priority` (a pod file not yet admitted) the priority and preemption policy the Priority
admission plugin would give it (`admit_priority`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import yaml

from hami_plugin.protocol.model import ANNOTATION_NODE_HANDSHAKE
from hami_plugin.protocol.objects import NodeInfo, ObjectError, PodInfo, read_node, read_pod
from hami_plugin.scheduler.book.book import Book, BookSettings
from hami_plugin.scheduler.health import check_node_health
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.preemption import PodDisruptionBudget, read_pod_disruption_budget
from hami_plugin.scheduler.quota import QuotaBook, ResourceQuotaInfo, read_resource_quota
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings

__all__ = [
    "SNAPSHOT_COMMAND",
    "SYSTEM_PRIORITY_CLASSES",
    "ClusterSnapshot",
    "PriorityClassInfo",
    "SnapshotError",
    "admit_priority",
    "build_book",
    "build_ledger",
    "build_quota_book",
    "parse_pod",
    "parse_snapshot",
    "pod_from_object",
    "read_pod_object",
    "read_priority_class",
    "unhealthy_nodes",
]

logger = logging.getLogger(__name__)

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SnapshotError(ValueError):
    """A snapshot or pod file that is not what kubectl would print."""


SNAPSHOT_COMMAND = (
    "kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,priorityclasses -A -o yaml"
)

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
"""A PriorityClass's `preemptionPolicy` when it names none (the API server's default)."""


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    """What the Priority admission plugin reads of a scheduling.k8s.io/v1 PriorityClass."""

    name: str
    value: int
    global_default: bool = False
    preemption_policy: str = PREEMPT_LOWER_PRIORITY


SYSTEM_PRIORITY_CLASSES = (
    PriorityClassInfo("system-node-critical", 2_000_001_000),
    PriorityClassInfo("system-cluster-critical", 2_000_000_000),
)
"""The classes every API server creates at start (kube-apiserver v1.24
`pkg/apis/scheduling/v1/helpers.go` `systemPriorityClasses`): known without the snapshot."""


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeInfo, ...]
    pods: tuple[PodInfo, ...]
    quotas: tuple[ResourceQuotaInfo, ...] = ()
    budgets: tuple[PodDisruptionBudget, ...] = ()
    priority_classes: tuple[PriorityClassInfo, ...] = ()


def read_priority_class(obj: Mapping[str, Any]) -> PriorityClassInfo:
    """A PriorityClass object as the API sends it. Raises ValueError naming the field."""
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        raise ValueError("metadata.name is missing")
    value = obj.get("value")
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise ValueError(f"value must be a 32-bit integer, not {value!r}")
    default = obj.get("globalDefault", False)
    if not isinstance(default, bool):
        raise ValueError(f"globalDefault must be true or false, not {default!r}")
    policy = obj.get("preemptionPolicy") or PREEMPT_LOWER_PRIORITY
    if not isinstance(policy, str):
        raise ValueError(f"preemptionPolicy must be a string, not {policy!r}")
    return PriorityClassInfo(metadata["name"], value, default, policy)


def _unadmitted(obj: Mapping[str, Any]) -> bool:
    """The pod carries no `spec.priority`: the Priority admission plugin has not seen it."""
    spec = obj.get("spec")
    return not isinstance(spec, Mapping) or spec.get("priority") is None


def admit_priority(
    pod: PodInfo, classes: Iterable[PriorityClassInfo], what: str = "pod"
) -> PodInfo:
    """The pod as the Priority admission plugin admits it (kube-apiserver v1.24
    `plugin/pkg/admission/priority/admission.go` `admitPod`, on Create): the named class's
    value, else the `globalDefault` class's (the lowest of several, `getDefaultPriorityClass`)
    whose name it then carries, else 0; the class's `preemptionPolicy` unless the pod names one
    (the plugin refuses a pod whose own differs; here the pod's stands). Only for a pod without
    `spec.priority`: a pod from the cluster keeps its own. The system classes are known
    without the snapshot (`SYSTEM_PRIORITY_CLASSES`). Raises SnapshotError for a class name
    the snapshot does not hold (the plugin refuses the pod)."""
    by_name = {c.name: c for c in (*SYSTEM_PRIORITY_CLASSES, *classes)}
    name = pod.priority_class_name
    if name:
        chosen = by_name.get(name)
        if chosen is None:
            raise SnapshotError(
                f"{what}: pod {pod.key}: no PriorityClass with name {name} was found in the "
                f"snapshot (the Priority admission plugin would refuse the pod); take the "
                f"snapshot with `{SNAPSHOT_COMMAND}`"
            )
    else:
        defaults = [c for c in by_name.values() if c.global_default]
        chosen = min(defaults, key=lambda c: c.value) if defaults else None
        if chosen is None:
            return pod  # no class, no default: priority 0, as read
    return replace(
        pod,
        priority=chosen.value,
        priority_class_name=chosen.name,
        preemption_policy=pod.preemption_policy or chosen.preemption_policy,
    )


def _documents(text: str, what: str) -> list[Any]:
    try:
        return [document for document in yaml.load_all(text, Loader=_Loader) if document]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise SnapshotError(f"{what}: {problem}{where}") from None


def _objects(documents: Iterable[Any], what: str) -> Iterable[Mapping[str, Any]]:
    for document in documents:
        if not isinstance(document, Mapping):
            found = type(document).__name__
            raise SnapshotError(f"{what}: expected Kubernetes objects, got {found}")
        if "items" in document and str(document.get("kind", "List")).endswith("List"):
            yield from _objects(document.get("items") or (), what)
        else:
            yield document


_KINDS = ("Node", "Pod", "ResourceQuota", "PodDisruptionBudget", "PriorityClass")


def parse_snapshot(text: str, what: str = "snapshot") -> ClusterSnapshot:
    """Read the nodes, pods, quotas, PodDisruptionBudgets and PriorityClasses of a snapshot,
    the pods without `spec.priority` admitted (`admit_priority`). Raises SnapshotError (or
    ObjectError, a ValueError too, naming the object) for malformed input: an object without a
    `kind`, no Node at all (the message counts what was found instead), a pod naming a
    PriorityClass the snapshot does not hold."""
    nodes: list[NodeInfo] = []
    pods: list[PodInfo] = []
    unadmitted: list[int] = []  # positions in `pods`
    quotas: list[ResourceQuotaInfo] = []
    budgets: list[PodDisruptionBudget] = []
    classes: list[PriorityClassInfo] = []
    others = 0
    for position, obj in enumerate(_objects(_documents(text, what), what)):
        kind = obj.get("kind")
        if not kind or not isinstance(kind, str):
            raise SnapshotError(
                f"{what}: object {position} has no kind; expected Kubernetes objects, "
                f"the output of `{SNAPSHOT_COMMAND}`"
            )
        others += kind not in _KINDS
        try:
            if kind == "Node":
                nodes.append(read_node(obj))
            elif kind == "Pod":
                if _unadmitted(obj):
                    unadmitted.append(len(pods))
                pods.append(read_pod(obj))
            elif kind == "ResourceQuota":
                quotas.append(read_resource_quota(obj))
            elif kind == "PodDisruptionBudget":
                budgets.append(read_pod_disruption_budget(obj))
            elif kind == "PriorityClass":
                classes.append(read_priority_class(obj))
        except (ObjectError, ValueError) as error:
            raise SnapshotError(f"{what}: object {position} ({kind}): {error}") from None
    if not nodes:
        found = " and ".join(
            f"{count} {name}{'' if count == 1 else 's'}"
            for count, name in ((len(pods), "Pod"), (others, "other object"))
            if count
        )
        raise SnapshotError(
            f"{what}: no Node in the snapshot (found {found or 'nothing'}); expected a "
            f"cluster snapshot, the output of `{SNAPSHOT_COMMAND}`"
        )
    for position in unadmitted:  # the classes may follow the pods (kubectl prints them last)
        pods[position] = admit_priority(pods[position], classes, what)
    return ClusterSnapshot(tuple(nodes), tuple(pods), tuple(quotas), tuple(budgets), tuple(classes))


def read_pod_object(text: str, what: str = "pod") -> Mapping[str, Any]:
    """The one Pod object of a pod file (a Pod document, or a list holding one), as written.
    Raises SnapshotError."""
    objects = list(_objects(_documents(text, what), what))
    if len(objects) != 1:
        raise SnapshotError(f"{what}: expected one pod, found {len(objects)} objects")
    obj = objects[0]
    if obj.get("kind", "Pod") != "Pod":
        raise SnapshotError(f"{what}: expected a Pod, found kind {obj.get('kind')}")
    return obj


def pod_from_object(
    obj: Mapping[str, Any], what: str = "pod", priority_classes: Iterable[PriorityClassInfo] = ()
) -> PodInfo:
    """A Pod object read, admitted with `priority_classes` when it carries no `spec.priority`
    (`admit_priority`). Raises SnapshotError."""
    try:
        pod = read_pod(obj)
    except ObjectError as error:
        raise SnapshotError(f"{what}: {error}") from None
    return admit_priority(pod, priority_classes, what) if _unadmitted(obj) else pod


def parse_pod(
    text: str, what: str = "pod", priority_classes: Iterable[PriorityClassInfo] = ()
) -> PodInfo:
    """Read exactly one pod (`read_pod_object`), admitted with `priority_classes` when it
    carries no `spec.priority` (`pod_from_object`). Raises SnapshotError."""
    return pod_from_object(read_pod_object(text, what), what, priority_classes)


def unhealthy_nodes(snapshot: ClusterSnapshot, now: datetime) -> tuple[str, ...]:
    """The nodes HAMi's CheckHealth finds unhealthy at `now`, judged as a scheduler that has
    not seen them before judges (`check_node_health`), in snapshot order."""
    return tuple(node.name for node in snapshot.nodes if not check_node_health(node, now).healthy)


def build_ledger(snapshot: ClusterSnapshot, now: datetime) -> Ledger:
    """A ledger holding the snapshot's nodes and pods, as a scheduler's informers would, less
    the nodes unhealthy at `now` (`unhealthy_nodes`; each logged). Pods on such a node stay
    tracked, as HAMi keeps them."""
    unhealthy = set(unhealthy_nodes(snapshot, now))
    ledger = Ledger()
    for node in snapshot.nodes:
        if node.name in unhealthy:
            logger.info(
                "node %s not registered: no nvidia.com/gpu allocatable and handshake %r is "
                "60 s old or more",
                node.name,
                node.annotations.get(ANNOTATION_NODE_HANDSHAKE),
            )
            continue
        ledger.update_node(node)
    for pod in snapshot.pods:
        ledger.update_pod(pod)
    return ledger


def build_quota_book(
    snapshot: ClusterSnapshot, ledger: Ledger, resources: ResourceNames | None = None
) -> QuotaBook:
    """The namespace GPU quotas of the snapshot: every ResourceQuota's limits (in snapshot
    order, the last one of a key winning as in HAMi) and the usage of every pod `ledger`
    books."""
    book = QuotaBook(resources=resources or ResourceNames())
    for quota in snapshot.quotas:
        book.add_quota(quota.namespace, quota.hard_map)
    for tracked in ledger.tracked_pods():
        book.follow(tracked.key, tracked)
    return book


def build_book(snapshot: ClusterSnapshot, settings: SchedulerSettings, now: datetime) -> Book:
    """The scheduler's book as its watches would fill it from the snapshot at `now`: the nodes
    (registered while healthy), the pods (every booking trusted, as without booking keys),
    the namespace quotas and the PodDisruptionBudgets; what preemption decides on."""
    book = Book(BookSettings(settings))
    for node in snapshot.nodes:
        book.apply_node(node, now)
    for quota in snapshot.quotas:  # before the pods, as `build_quota_book` adds them
        book.apply_quota(quota.namespace, quota.hard_map, None)
    for pod in snapshot.pods:
        book.apply_pod(pod, None, 0.0)
    for budget in snapshot.budgets:
        book.preemption.apply_budget(budget.key, budget)
    return book
