"""Pods and nodes as both daemons read them: ONE model, read from the API's JSON.

`read_pod` and `read_node` take an object as the API server sends it (a GET answer, a list item,
a watch event's object) or as a YAML file writes it: a mapping with the API's camelCase keys.
The scheduler, the device plugin, the Kubernetes adapter and the test kubelet all read pods
through them, so a field means the same thing everywhere. The few fields the daemons need are
copied once into frozen values; nothing here imports `kubernetes`.

One reader stays apart on purpose: the admission webhook (`scheduler.webhook`) validates the
raw pod of an AdmissionReview, which the API server has not validated yet, and answers in
controller-runtime's words with the JSON-patch paths of each field it saw; it reads no more
than the mutation needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from hami_plugin.protocol.booking import PodBooking, read_booking

__all__ = [
    "POD_FAILED",
    "POD_PENDING",
    "POD_SUCCEEDED",
    "ContainerSpec",
    "NodeInfo",
    "ObjectError",
    "PodCondition",
    "PodInfo",
    "read_node",
    "read_pod",
]

POD_PENDING = "Pending"
POD_FAILED = "Failed"
POD_SUCCEEDED = "Succeeded"


class ObjectError(ValueError):
    """A pod or node whose structure cannot be read (wrong types, missing name)."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container: its name, resource limits/requests (values left as given) and env."""

    name: str
    limits: Mapping[str, object] = field(default_factory=dict)
    requests: Mapping[str, object] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    """Only literal `value` env entries; `valueFrom` entries are left out."""


@dataclass(frozen=True, slots=True)
class PodCondition:
    """One entry of `status.conditions`, as kube-scheduler writes `PodScheduled`: `status`
    "True"/"False"/"Unknown", its `reason` ("Unschedulable", "SchedulerError") and `message`."""

    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the daemons need of a pod.

    `init_containers_done` is True when the pod has init containers and every one of them
    terminated with exit code 0 (HAMi then books only the app containers' usage).
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
    creation_timestamp: datetime | None = None
    """`metadata.creationTimestamp` (kubelet admits new pods in this order)."""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = ""
    scheduled: PodCondition | None = None
    """The `PodScheduled` condition; None while the pod has none (never tried)."""
    priority: int = 0
    """`spec.priority`, which the Priority admission plugin sets from the PriorityClass (the
    pod author cannot choose a value of its own); 0 when absent."""
    priority_class_name: str = ""
    preemption_policy: str = ""
    """`spec.preemptionPolicy` ("Never" or "PreemptLowerPriority"; empty: the latter)."""
    nominated_node_name: str = ""
    """`status.nominatedNodeName`: the node a preemption freed for the pod (a status field,
    which only the schedulers write)."""
    start_time: datetime | None = None
    """`status.startTime`: when kubelet started the pod (None: not yet)."""
    containers_started: bool = False
    """Some init or app container status is `running` or `terminated`: kubelet admitted the
    pod and started a container of it (a container kubelet never started is `waiting`)."""
    booking: PodBooking | None = field(init=False, default=None, compare=False, repr=False)
    """The HAMi booking its annotations carry (`protocol.booking`), read with the pod."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "booking", read_booking(self.annotations))

    def with_booking(self, booking: PodBooking | None) -> PodInfo:
        """This pod read with `booking` instead of the one its annotations carry (the device
        plugin reads entries it served already as consumed, `PodBooking.consumed`)."""
        pod = replace(self)
        object.__setattr__(pod, "booking", booking)
        return pod

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


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    # JSON gives dicts and lists: test for them first, the ABC checks cost several times more
    # (a device plugin reads every pod of its node on each Allocate).
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _text(value: object, what: str, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise ObjectError(f"{what} is missing")
        return ""
    if not isinstance(value, str):
        raise ObjectError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _string_map(value: object, what: str) -> dict[str, str]:
    result = {}
    for key, item in _mapping(value, what).items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ObjectError(f"{what} must map strings to strings (see {key!r})")
        result[key] = item
    return result


def _resource_map(value: object, what: str) -> dict[str, object]:
    return {str(key): item for key, item in _mapping(value, what).items()}


def _list(value: object, what: str) -> Sequence[Any]:
    if type(value) is list:
        return value
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ObjectError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _env(value: object, where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for position, entry in enumerate(_list(value, f"{where}.env")):
        if not isinstance(entry, dict | Mapping) or not isinstance(entry.get("name"), str):
            raise ObjectError(f"{where}.env[{position}] must be an object with a name: {entry!r}")
        literal = entry.get("value")
        if isinstance(literal, str):
            env[entry["name"]] = literal
    return env


def _containers(spec: Mapping[str, Any], key: str) -> tuple[ContainerSpec, ...]:
    result = []
    for position, item in enumerate(_list(spec.get(key), f"spec.{key}")):
        where = f"spec.{key}[{position}]"
        if item is None:
            raise ObjectError(f"{where} is empty")
        container = _mapping(item, where)
        resources = _mapping(container.get("resources"), f"{where}.resources")
        result.append(
            ContainerSpec(
                name=_text(container.get("name"), f"{where}.name"),
                limits=_resource_map(resources.get("limits"), f"{where}.resources.limits"),
                requests=_resource_map(resources.get("requests"), f"{where}.resources.requests"),
                env=_env(container.get("env"), where),
            )
        )
    return tuple(result)


def _timestamp(value: object, what: str) -> datetime | None:
    # A YAML file's unquoted timestamp arrives already parsed.
    if value is None or isinstance(value, datetime):
        return value
    text = _text(value, what)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ObjectError(f"{what} is not an RFC 3339 time: {text!r}") from None


def _integer(value: object, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ObjectError(f"{what} must be an integer, got {type(value).__name__}")
    return value


def _init_containers_done(status: Mapping[str, Any], expected: int) -> bool:
    if expected == 0:
        return False
    statuses = _list(status.get("initContainerStatuses"), "status.initContainerStatuses")
    if len(statuses) < expected:
        return False
    for container_status in statuses:
        state = container_status.get("state") if isinstance(container_status, Mapping) else None
        terminated = state.get("terminated") if isinstance(state, Mapping) else None
        if not isinstance(terminated, Mapping) or terminated.get("exitCode") != 0:
            return False
    return True


def _containers_started(status: Mapping[str, Any]) -> bool:
    # read as leniently as `_init_containers_done`: an odd entry started nothing
    for key in ("initContainerStatuses", "containerStatuses"):
        for container_status in _list(status.get(key), f"status.{key}"):
            state = container_status.get("state") if isinstance(container_status, Mapping) else None
            if isinstance(state, Mapping) and (
                state.get("running") is not None or state.get("terminated") is not None
            ):
                return True
    return False


def _scheduled_condition(status: Mapping[str, Any]) -> PodCondition | None:
    for position, entry in enumerate(_list(status.get("conditions"), "status.conditions")):
        where = f"status.conditions[{position}]"
        condition = _mapping(entry, where)
        if condition.get("type") == "PodScheduled":
            return PodCondition(
                status=_text(condition.get("status"), f"{where}.status"),
                reason=_text(condition.get("reason"), f"{where}.reason"),
                message=_text(condition.get("message"), f"{where}.message"),
            )
    return None


def read_pod(obj: Mapping[str, Any]) -> PodInfo:
    """Copy the daemons' fields out of a Pod object (camelCase keys, as the API sends it).

    A missing namespace reads as "default" (a pod file without one lands there). Raises
    ObjectError (a ValueError) naming the field when a field has the wrong type or the pod has
    no name.
    """
    metadata = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    init_containers = _containers(spec, "initContainers")
    return PodInfo(
        namespace=_text(metadata.get("namespace"), "metadata.namespace") or "default",
        name=_text(metadata.get("name"), "metadata.name", required=True),
        uid=_text(metadata.get("uid"), "metadata.uid"),
        annotations=_string_map(metadata.get("annotations"), "metadata.annotations"),
        init_containers=init_containers,
        containers=_containers(spec, "containers"),
        phase=_text(status.get("phase"), "status.phase"),
        deleting=metadata.get("deletionTimestamp") is not None,
        init_containers_done=_init_containers_done(status, len(init_containers)),
        node_name=_text(spec.get("nodeName"), "spec.nodeName"),
        creation_timestamp=_timestamp(
            metadata.get("creationTimestamp"), "metadata.creationTimestamp"
        ),
        resource_version=_text(metadata.get("resourceVersion"), "metadata.resourceVersion"),
        labels=_string_map(metadata.get("labels"), "metadata.labels"),
        scheduler_name=_text(spec.get("schedulerName"), "spec.schedulerName"),
        scheduled=_scheduled_condition(status),
        priority=_integer(spec.get("priority"), "spec.priority"),
        priority_class_name=_text(spec.get("priorityClassName"), "spec.priorityClassName"),
        preemption_policy=_text(spec.get("preemptionPolicy"), "spec.preemptionPolicy"),
        nominated_node_name=_text(status.get("nominatedNodeName"), "status.nominatedNodeName"),
        start_time=_timestamp(status.get("startTime"), "status.startTime"),
        containers_started=_containers_started(status),
    )


def read_node(obj: Mapping[str, Any]) -> NodeInfo:
    """Copy a Node object's name, annotations, labels and allocatable resources. Raises
    ObjectError when the node has no name or a field has the wrong type."""
    metadata = _mapping(obj.get("metadata"), "metadata")
    status = _mapping(obj.get("status"), "status")
    return NodeInfo(
        name=_text(metadata.get("name"), "metadata.name", required=True),
        annotations=_string_map(metadata.get("annotations"), "metadata.annotations"),
        labels=_string_map(metadata.get("labels"), "metadata.labels"),
        allocatable=_resource_map(status.get("allocatable"), "status.allocatable"),
        resource_version=_text(metadata.get("resourceVersion"), "metadata.resourceVersion"),
    )
