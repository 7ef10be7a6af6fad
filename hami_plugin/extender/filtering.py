"""What `/filter` answers: HAMi's ExtenderFilterResult, its events and its failure counts.

The decision itself is `hami_plugin.scheduler.filter.decide`; this module turns its
`FilterResult` into the answer kube-scheduler gets (`FilterAnswer`), the FilteringSucceed /
FilteringFailed events HAMi records, and the per-reason counts of the metrics. Reasons travel
as data (`FitFailure`, `AnnotationError`) up to here and are rendered only here, byte for byte
as HAMi renders them. It also runs HAMi's filter simulation, the `Nodes` form of the call.
Pure: no lock, no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hami_plugin.kube.events import PodEvent
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.govalues import go_quote
from hami_plugin.protocol.model import ANNOTATION_DEVICE_SCORING_WEIGHTS
from hami_plugin.protocol.objects import ObjectError, PodInfo, read_node
from hami_plugin.scheduler.filter import FilterResult, decide
from hami_plugin.scheduler.fit import FitFailure, FitReason, render_failure
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.requests import PodRequests
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "FilterAnswer",
    "annotation_error_message",
    "failure_counts",
    "filter_answer",
    "simulate",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """What /filter answers (HAMi's ExtenderFilterResult fields) and what to tell others.

    `nodes` is the `Nodes` form's answer (the chosen node object), `node_names` the
    node-cache-capable form's. None fields are JSON null.
    """

    node_names: list[str] | None = None
    nodes: list[Mapping[str, Any]] | None = None
    failed_nodes: dict[str, str] | None = None
    error: str = ""
    outcome: str = "fit"
    failure_counts: dict[str, int] = field(default_factory=dict)
    events: tuple[PodEvent, ...] = ()


def _reason_name(reason: FitReason) -> str:
    if reason is FitReason.NODE_UNREGISTERED:
        return "NodeUnregistered"
    return reason.value


def failure_counts(failed: Mapping[str, FitFailure]) -> dict[str, int]:
    """Reason name -> how many nodes failed with it (the metrics' `reason` label)."""
    counts: dict[str, int] = {}
    for failure in failed.values():
        if failure.node_reason is not None:
            name = _reason_name(failure.node_reason)
            counts[name] = counts.get(name, 0) + 1
            continue
        for reason, _ in failure.counts:
            counts[reason.value] = counts.get(reason.value, 0) + 1
    return counts


def annotation_error_message(error: AnnotationError, info: PodInfo) -> str:
    """HAMi's text for a pod whose annotation cannot be read: Filter wraps the scoring-weights
    error as `calcScore failed <err> for pod <name>` (scheduler.go:1105, the error text of
    device_scoring_weights.go)."""
    text = str(error)
    if error.key == ANNOTATION_DEVICE_SCORING_WEIGHTS:
        value = info.annotations.get(error.key, "")
        text = f"invalid {error.key} annotation {go_quote(value)}: {error.detail}"
    return f"calcScore failed {text} for pod {info.name}"


def filter_answer(info: PodInfo, names: Sequence[str], result: FilterResult) -> FilterAnswer:
    """The node-cache-capable form's answer to a decision over `names`, with its events."""
    if result.error is not None:
        message = annotation_error_message(result.error, info)
        event = PodEvent(info.namespace, info.name, info.uid, "FilteringFailed", message, "Warning")
        return FilterAnswer(error=message, outcome="error", events=(event,))
    if result.node is None:
        return FilterAnswer(
            failed_nodes={
                name: render_failure(failure) for name, failure in result.failed_nodes.items()
            },
            outcome="no_fit",
            failure_counts=failure_counts(result.failed_nodes),
            events=_no_fit_events(info, names, result.failed_nodes),
        )
    # HAMi fits every node and lists them all; the fast path stops at the first fit, so
    # the counts are of the nodes tried.
    fits = ",".join(f"{name}:{score:.2f}" for name, score in result.scores.items())
    message = (
        f"find fit node({result.node}), {len(result.failed_nodes)} nodes not fit, "
        f"{len(result.scores)} nodes fit({fits})"
    )
    event = PodEvent(info.namespace, info.name, info.uid, "FilteringSucceed", message)
    return FilterAnswer(node_names=[result.node], outcome="fit", events=(event,))


def _no_fit_events(
    info: PodInfo, names: Sequence[str], failed: Mapping[str, FitFailure]
) -> tuple[PodEvent, ...]:
    """HAMi's FilteringFailed events: one per `n/N Reason` type with its sorted nodes
    (score.go:348-353), then the summary. HAMi parses the reasons back out of the FailedNodes
    strings (common.ParseReason), which finds none in a bare node-level reason; here they are
    read from the failures themselves."""
    by_reason: dict[str, list[str]] = {}
    for node, failure in failed.items():
        if failure.node_reason is None:
            for reason, _ in failure.counts:
                by_reason.setdefault(reason.value, []).append(node)
    events = [
        PodEvent(
            info.namespace,
            info.name,
            info.uid,
            "FilteringFailed",
            f"{len(nodes)} nodes {reason}({','.join(sorted(nodes))})",
            "Warning",
        )
        for reason, nodes in sorted(by_reason.items())
    ]
    events.append(
        PodEvent(
            info.namespace,
            info.name,
            info.uid,
            "FilteringFailed",
            f"no available node, {len(names)} nodes do not meet",
            "Warning",
        )
    )
    return tuple(events)


def simulate(
    info: PodInfo,
    requests: PodRequests,
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
    settings: SchedulerSettings,
) -> FilterAnswer:
    """HAMi's filterSimulation (scheduler.go:1156-1199): the given nodes' GPUs from their
    register annotation, no usage, no health check; every node fitted; the answer is the
    best node's object in `Nodes`, plus FailedNodes. An unreadable node object is skipped."""
    ledger = Ledger()
    names: list[str] = []
    by_name: dict[str, Mapping[str, Any]] = {}
    for node in nodes:
        try:
            node_info = read_node(node)
            if not node_info.name:
                raise ObjectError("node object without metadata.name")
        except ObjectError as error:
            logger.warning("filter: node object skipped: %s", error)
            continue
        ledger.update_node(node_info)
        names.append(node_info.name)
        by_name.setdefault(node_info.name, node)
    result = decide(ledger, info, names, now, settings, exhaustive=True, requests=requests)
    if result.error is not None:
        return FilterAnswer(error=annotation_error_message(result.error, info), outcome="error")
    failed = {name: render_failure(failure) for name, failure in result.failed_nodes.items()}
    if result.node is None:
        return FilterAnswer(
            failed_nodes=failed,
            outcome="no_fit",
            failure_counts=failure_counts(result.failed_nodes),
        )
    return FilterAnswer(nodes=[by_name[result.node]], failed_nodes=failed, outcome="fit")
