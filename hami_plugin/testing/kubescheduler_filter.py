"""The kube-scheduler stand-in's Filter phase: the in-tree NodeResourcesFit, then the
extender's filter verb on the nodes that passed (`pkg/scheduler/generic_scheduler.go` v1.24
`findNodesThatPassFilters` and `findNodesThatPassExtenders`; the extender is not called
when no node is left). The extender's `FailedNodes` are Unschedulable, its
`FailedAndUnresolvableNodes` (which win) UnschedulableAndUnresolvable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_plugin.testing.kubescheduler_fit import Code, NodeState, NodeStatus, fits_node
from hami_plugin.testing.kubescheduler_http import ExtenderError

__all__ = ["FilterOutcome", "find_nodes_that_fit"]

JsonObject = dict[str, Any]
FilterCall = Callable[[Sequence[str]], JsonObject]
"""POST `ExtenderArgs` for these node names to the filter verb; raises ExtenderError."""


@dataclass(slots=True)
class FilterOutcome:
    """The nodes that fit, why each other node does not, or the error that ended the phase."""

    feasible: list[str] = field(default_factory=list)
    statuses: dict[str, NodeStatus] = field(default_factory=dict)
    error: str = ""


def find_nodes_that_fit(
    pod: Mapping[str, Any], names: Sequence[str], nodes: Mapping[str, NodeState], call: FilterCall
) -> FilterOutcome:
    """Filter `names` (of `nodes`) for `pod`, in-tree first, then through `call`."""
    outcome = FilterOutcome()
    passed: list[str] = []
    for name in names:
        reasons = fits_node(pod, nodes[name])
        if reasons:
            outcome.statuses[name] = NodeStatus(Code.UNSCHEDULABLE, tuple(reasons))
        else:
            passed.append(name)
    if not passed:
        return outcome
    try:
        result = call(passed)
        outcome.error = str(result.get("Error") or "")
    except ExtenderError as failure:
        outcome.error = str(failure)
    if outcome.error:
        return outcome
    unresolvable = result.get("FailedAndUnresolvableNodes") or {}
    for name, message in unresolvable.items():
        outcome.statuses[str(name)] = NodeStatus(Code.UNRESOLVABLE, (str(message),))
    for name, message in (result.get("FailedNodes") or {}).items():
        if name not in unresolvable:
            outcome.statuses[str(name)] = NodeStatus(Code.UNSCHEDULABLE, (str(message),))
    outcome.feasible = [str(name) for name in result.get("NodeNames") or ()]
    return outcome
