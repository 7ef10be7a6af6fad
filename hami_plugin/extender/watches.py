"""The scheduler daemon's watches: pods, nodes, ResourceQuotas and PodDisruptionBudgets, each
an `Informer` feeding `SchedulerState`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.api import WatchApi
from hami_plugin.kube.informer import Informer, ListWatchOptions
from hami_plugin.protocol.objects import read_node, read_pod
from hami_plugin.scheduler.preemption import read_pod_disruption_budget
from hami_plugin.scheduler.quota import read_resource_quota

__all__ = ["Watches", "make_watches"]


@dataclass(frozen=True, slots=True)
class Watches:
    pods: Informer[Any]
    nodes: Informer[Any]
    quotas: Informer[Any]
    budgets: Informer[Any]


def make_watches(
    kube: WatchApi,
    state: SchedulerState,
    node_selector: Mapping[str, str],
    watch_timeout_seconds: int,
) -> Watches:
    """The pod, node, ResourceQuota and PodDisruptionBudget watches that feed the state."""
    options = ListWatchOptions(watch_timeout_seconds=watch_timeout_seconds)
    selector = ",".join(f"{k}={v}" for k, v in node_selector.items())
    pods = Informer(
        kube,
        "/api/v1/pods",
        read_pod,
        lambda pod: pod.key,
        state.pod_events,
        name="pods",
        options=options,
        clock=state.clock,
    )
    nodes = Informer(
        kube,
        "/api/v1/nodes",
        read_node,
        lambda node: node.name,
        state.node_events,
        name="nodes",
        label_selector=selector or None,
        options=options,
    )
    # HAMi's ResourceQuota informer (pkg/scheduler/scheduler.go:376-382)
    quotas = Informer(
        kube,
        "/api/v1/resourcequotas",
        read_resource_quota,
        lambda quota: quota.key,
        state.quota_events,
        name="resourcequotas",
        options=options,
    )
    # preemption honours them as kube-scheduler does (docs/design.md 11)
    budgets = Informer(
        kube,
        "/apis/policy/v1/poddisruptionbudgets",
        read_pod_disruption_budget,
        lambda budget: budget.key,
        state.budget_events,
        name="poddisruptionbudgets",
        options=options,
    )
    return Watches(pods, nodes, quotas, budgets)
