"""The kube-scheduler stand-in's queue records and the pod and node change tests its queue
rules use (`docs/kube-scheduler.md` 3-4)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Attempt",
    "Move",
    "Queued",
    "Queues",
    "is_pod_updated",
    "node_scheduling_change",
    "pod_key",
]

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Move:
    """A pod left the unschedulable pool: `event` names why ("PodUpdate", "NodeAdd", ...)."""

    pod: str
    event: str
    at: float
    """Monotonic seconds."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One scheduling attempt: `outcome` "bound", "error" (the filter failed), "unschedulable"
    (no node left) or "bind-error"; `message` as written to the pod's condition."""

    pod: str
    outcome: str
    node: str = ""
    message: str = ""
    at: float = 0.0


@dataclass(slots=True)
class Queued:
    pod: JsonObject
    attempts: int = 0
    failed_at: float = float("-inf")
    parked_at: float = 0.0
    queued_at: float = 0.0
    """When it last entered the queue (PrioritySort's second key)."""


@dataclass(slots=True)
class Queues:
    active: dict[str, Queued] = field(default_factory=dict)
    backoff: dict[str, Queued] = field(default_factory=dict)
    unschedulable: dict[str, Queued] = field(default_factory=dict)
    in_flight: dict[str, Queued] = field(default_factory=dict)
    assumed: set[str] = field(default_factory=set)

    def find(self, key: str) -> Queued | None:
        for queue in (self.active, self.backoff, self.unschedulable, self.in_flight):
            if key in queue:
                return queue[key]
        return None

    def remove(self, key: str) -> None:
        for queue in (self.active, self.backoff, self.unschedulable):
            queue.pop(key, None)


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name')}"


def is_pod_updated(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """kube-scheduler's `isPodUpdated`: the pods differ once `resourceVersion`, `generation`,
    `managedFields`, `finalizers` and `status` are left out (`docs/kube-scheduler.md` 4)."""

    def strip(pod: Mapping[str, Any]) -> JsonObject:
        stripped = copy.deepcopy(dict(pod))
        metadata = dict(stripped.get("metadata") or {})
        for name in ("resourceVersion", "generation", "managedFields", "finalizers"):
            metadata.pop(name, None)
        stripped["metadata"] = metadata
        stripped.pop("status", None)
        return stripped

    return strip(old) != strip(new)


def node_scheduling_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """1.24's `nodeSchedulingPropertiesChange`: labels, taints, unschedulable, allocatable or
    conditions changed (annotations alone do not count)."""
    fields = (
        ("metadata", "labels"),
        ("spec", "taints"),
        ("spec", "unschedulable"),
        ("status", "allocatable"),
        ("status", "conditions"),
    )
    for section, name in fields:
        # absent, null, empty and false all read as "none"
        before = (old.get(section) or {}).get(name) or None
        after = (new.get(section) or {}).get(name) or None
        if before != after:
            return True
    return False
