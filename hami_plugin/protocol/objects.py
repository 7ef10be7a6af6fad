"""Pods and nodes as the scheduler reads them, from either form they arrive in.

A pod or node is accepted as a plain mapping (YAML/JSON with the API's camelCase keys, or the
snake_case keys of the `kubernetes` client's `to_dict()`) or as the client's model object
(attribute access, snake_case). Nothing here imports `kubernetes`: the model is read by duck
typing. The few fields the scheduler needs are copied once into frozen values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "ContainerSpec",
    "NodeInfo",
    "ObjectError",
    "PodInfo",
    "read_node",
    "read_pod",
]

POD_FAILED = "Failed"
POD_SUCCEEDED = "Succeeded"


class ObjectError(ValueError):
    """A pod or node whose structure cannot be read (wrong types, missing name)."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container's name and resource limits/requests (values left as given)."""

    name: str
    limits: Mapping[str, object] = field(default_factory=dict)
    requests: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the scheduler needs of a pod.

    `init_containers_done` is True when the pod has init containers and every one of them
    terminated with exit code 0 (HAMi then books only the app containers' usage, reference 3.3).
    """

    namespace: str
    name: str
    uid: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    init_containers: tuple[ContainerSpec, ...] = ()
    containers: tuple[ContainerSpec, ...] = ()
    phase: str = ""
    deleting: bool = False
    init_containers_done: bool = False
    node_name: str = ""
    """`spec.nodeName`: empty until the pod is bound."""
    created: datetime | None = None
    """`metadata.creationTimestamp` (kubelet admits new pods in this order)."""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = ""

    @property
    def key(self) -> str:
        """`<namespace>/<name>`, the pod's identity in the ledger."""
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        """Failed or Succeeded: its GPUs are free again."""
        return self.phase in (POD_FAILED, POD_SUCCEEDED)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's name, annotations (the register, handshake and cordon annotations live there),
    labels and `status.allocatable` (quantities left as given)."""

    name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, object] = field(default_factory=dict)
    resource_version: str = ""


def _get(obj: object, camel: str, snake: str | None = None) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        if camel in obj:
            return obj[camel]
        return obj.get(snake) if snake is not None else None
    return getattr(obj, snake if snake is not None else camel, None)


def _text(value: object, what: str, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise ObjectError(f"{what} is missing")
        return ""
    if not isinstance(value, str):
        raise ObjectError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _string_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{what} must be a mapping, got {type(value).__name__}")
    result = {}
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ObjectError(f"{what} must map strings to strings (see {key!r})")
        result[key] = item
    return result


def _resource_map(value: object, what: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{what} must be a mapping, got {type(value).__name__}")
    return {str(key): item for key, item in value.items()}


def _list(value: object, what: str) -> Sequence[Any]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ObjectError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _containers(spec: object, camel: str, snake: str) -> tuple[ContainerSpec, ...]:
    result = []
    for position, container in enumerate(_list(_get(spec, camel, snake), f"spec.{camel}")):
        where = f"spec.{camel}[{position}]"
        if container is None:
            raise ObjectError(f"{where} is empty")
        resources = _get(container, "resources")
        result.append(
            ContainerSpec(
                name=_text(_get(container, "name"), f"{where}.name"),
                limits=_resource_map(_get(resources, "limits"), f"{where}.resources.limits"),
                requests=_resource_map(_get(resources, "requests"), f"{where}.resources.requests"),
            )
        )
    return tuple(result)


def _timestamp(value: object, what: str) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    text = _text(value, what)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ObjectError(f"{what} is not an RFC 3339 time: {text!r}") from None


def _init_containers_done(status: object, expected: int) -> bool:
    if expected == 0:
        return False
    statuses = _list(_get(status, "initContainerStatuses", "init_container_statuses"), "status")
    if len(statuses) < expected:
        return False
    for container_status in statuses:
        terminated = _get(_get(container_status, "state"), "terminated")
        if terminated is None or _get(terminated, "exitCode", "exit_code") != 0:
            return False
    return True


def read_pod(obj: object) -> PodInfo:
    """Copy the scheduler's fields out of a pod (mapping or client model).

    Raises ObjectError when a field has the wrong type or the pod has no name.
    """
    if isinstance(obj, PodInfo):
        return obj
    metadata = _get(obj, "metadata")
    spec = _get(obj, "spec")
    status = _get(obj, "status")
    init_containers = _containers(spec, "initContainers", "init_containers")
    return PodInfo(
        namespace=_text(_get(metadata, "namespace"), "metadata.namespace") or "default",
        name=_text(_get(metadata, "name"), "metadata.name", required=True),
        uid=_text(_get(metadata, "uid"), "metadata.uid"),
        annotations=_string_map(_get(metadata, "annotations"), "metadata.annotations"),
        init_containers=init_containers,
        containers=_containers(spec, "containers", "containers"),
        phase=_text(_get(status, "phase"), "status.phase"),
        deleting=_get(metadata, "deletionTimestamp", "deletion_timestamp") is not None,
        init_containers_done=_init_containers_done(status, len(init_containers)),
        node_name=_text(_get(spec, "nodeName", "node_name"), "spec.nodeName"),
        created=_timestamp(
            _get(metadata, "creationTimestamp", "creation_timestamp"), "metadata.creationTimestamp"
        ),
        resource_version=_text(
            _get(metadata, "resourceVersion", "resource_version"), "metadata.resourceVersion"
        ),
        labels=_string_map(_get(metadata, "labels"), "metadata.labels"),
        scheduler_name=_text(_get(spec, "schedulerName", "scheduler_name"), "spec.schedulerName"),
    )


def read_node(obj: object) -> NodeInfo:
    """Copy a node's name, annotations, labels and allocatable resources. Raises ObjectError
    when the node has no name or a field has the wrong type."""
    if isinstance(obj, NodeInfo):
        return obj
    metadata = _get(obj, "metadata")
    status = _get(obj, "status")
    return NodeInfo(
        name=_text(_get(metadata, "name"), "metadata.name", required=True),
        annotations=_string_map(_get(metadata, "annotations"), "metadata.annotations"),
        labels=_string_map(_get(metadata, "labels"), "metadata.labels"),
        allocatable=_resource_map(_get(status, "allocatable"), "status.allocatable"),
        resource_version=_text(
            _get(metadata, "resourceVersion", "resource_version"), "metadata.resourceVersion"
        ),
    )
