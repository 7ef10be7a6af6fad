"""Cluster snapshots for the dry run: what `kubectl get nodes,pods,resourcequotas -A -o yaml`
prints (a `v1 List` or a `NodeList`/`PodList` with `items`, a stream of YAML documents, or any
mix; objects of other kinds skipped).

A snapshot must hold at least one Node, and every object must name its `kind`: anything else is
an error that says what was expected, never a cluster in which no node fits. The ledger built
from it registers the nodes a HAMi v2.10 scheduler would (`scheduler.health`: a node whose
device plugin is gone is left out, judged at the time the caller passes), books what the pods
hold (MIG reservations and the GPUs HAMi's getNodesUsage marks unhealthy included; no booking
key, so every booking counts, as in HAMi), and `build_quota_book` gives the namespace GPU
quotas from the ResourceQuota objects.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml

from hami_plugin.protocol.model import ANNOTATION_NODE_HANDSHAKE
from hami_plugin.protocol.objects import NodeInfo, ObjectError, PodInfo, read_node, read_pod
from hami_plugin.scheduler.health import check_node_health
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.quota import QuotaBook, ResourceQuotaInfo, read_resource_quota
from hami_plugin.scheduler.settings import ResourceNames

__all__ = [
    "ClusterSnapshot",
    "SnapshotError",
    "build_ledger",
    "build_quota_book",
    "parse_pod",
    "parse_snapshot",
    "unhealthy_nodes",
]

logger = logging.getLogger(__name__)

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SnapshotError(ValueError):
    """A snapshot or pod file that is not what kubectl would print."""


_SNAPSHOT_COMMAND = "kubectl get nodes,pods -A -o yaml"


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeInfo, ...]
    pods: tuple[PodInfo, ...]
    quotas: tuple[ResourceQuotaInfo, ...] = ()


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


def parse_snapshot(text: str, what: str = "snapshot") -> ClusterSnapshot:
    """Read the nodes and pods of a snapshot. Raises SnapshotError (or ObjectError, a
    ValueError too, naming the object) for malformed input: an object without a `kind`, or no
    Node at all (the message counts what was found instead)."""
    nodes: list[NodeInfo] = []
    pods: list[PodInfo] = []
    quotas: list[ResourceQuotaInfo] = []
    others = 0
    for position, obj in enumerate(_objects(_documents(text, what), what)):
        kind = obj.get("kind")
        if not kind or not isinstance(kind, str):
            raise SnapshotError(
                f"{what}: object {position} has no kind; expected Kubernetes objects, "
                f"the output of `{_SNAPSHOT_COMMAND}`"
            )
        others += kind not in ("Node", "Pod", "ResourceQuota")
        try:
            if kind == "Node":
                nodes.append(read_node(obj))
            elif kind == "Pod":
                pods.append(read_pod(obj))
            elif kind == "ResourceQuota":
                quotas.append(read_resource_quota(obj))
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
            f"cluster snapshot, the output of `{_SNAPSHOT_COMMAND}`"
        )
    return ClusterSnapshot(tuple(nodes), tuple(pods), tuple(quotas))


def parse_pod(text: str, what: str = "pod") -> PodInfo:
    """Read exactly one pod (a Pod document, or a list holding one). Raises SnapshotError."""
    objects = list(_objects(_documents(text, what), what))
    if len(objects) != 1:
        raise SnapshotError(f"{what}: expected one pod, found {len(objects)} objects")
    obj = objects[0]
    if obj.get("kind", "Pod") != "Pod":
        raise SnapshotError(f"{what}: expected a Pod, found kind {obj.get('kind')}")
    try:
        return read_pod(obj)
    except ObjectError as error:
        raise SnapshotError(f"{what}: {error}") from None


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
