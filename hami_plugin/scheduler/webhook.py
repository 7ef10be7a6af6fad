"""HAMi's mutating admission webhook (POST /webhook): the decision for one pod, as a pure function.

A pod (a decoded v1.Pod JSON object) and the `WebhookSettings` go in; `admit_pod` answers with a
`PodAdmission`: the verdict and the changes as an RFC 6902 JSON patch against the pod as it
arrived. The AdmissionReview around it is `scheduler.admission_review`.

The rules and their order are HAMi v2.10's (`pkg/scheduler/webhook.go` Handle, `pkg/device/nvidia/
device.go` MutateAdmission; docs/hami-reference.md 2 and 3.11), told step by step in
`docs/scheduler.md`, "Admission webhook". Where each step is in webhook.go: no containers
60-63, another scheduler 64-69, the containers mutated 74-98 (device.go 347-387), privileged
99-102, scheduler name or node assigned 104-113, the namespace quota 114-116
(`fitResourceQuota` 145-190). Step 4, a GPU request the scheduler would misread denied with
`RequestProblem`'s message, is ours; so are the other differences (scheduler-owned annotations
removed, a minimal patch, int64 overflow): `docs/differences.md`, "The admission webhook".

Ours too, and fail closed (docs/scheduler.md, "Who may skip hami-scheduler"): a pod asking for
any of the GPU resources (`asks_gpu`) is denied when it names another scheduler (HAMi lets it
through, webhook.go 64-69), is created with `spec.nodeName`, has a privileged container, or
(outside a namespace the API server sends to `/webhook/gpu-admin`) sets HAMi-core's control
environment (`scheduler.gpu_pods`) in a container. The
ValidatingAdmissionPolicy `hami-gpu-pods` holds the same rules in the API server for when this
webhook is skipped or down.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_UP
from typing import Any

from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS, BOOKING_LABELS
from hami_plugin.protocol.objects import ContainerSpec
from hami_plugin.protocol.quantity import QuantityError, parse_quantity
from hami_plugin.scheduler.gpu_pods import (
    ENV_NVIDIA_VISIBLE_DEVICES,
    HARMLESS_VISIBLE_DEVICES,
    LABEL_WEBHOOK,
    WEBHOOK_IGNORE,
    control_env,
    control_env_refusal,
    reserved_mounts,
)
from hami_plugin.scheduler.requests import RequestProblem, container_request
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings

__all__ = [
    "DEFAULT_SCHEDULER_NAME",
    "ENV_CORE_UTILIZATION_POLICY",
    "ENV_NVIDIA_VISIBLE_DEVICES",
    "ENV_TASK_PRIORITY",
    "AdmissionVerdict",
    "GpuCorePolicy",
    "PodAdmission",
    "WebhookSettings",
    "admit_pod",
]

DEFAULT_SCHEDULER_NAME = "default-scheduler"

ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_CORE_UTILIZATION_POLICY = "GPU_CORE_UTILIZATION_POLICY"

_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EXCLUSIVE_CORES = "100"
_QUANTITY_FORMAT = (
    "quantities must match the regular expression "
    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)  # apimachinery resource.ErrFormatWrong, what decoding such a pod fails with in Go


class GpuCorePolicy(enum.StrEnum):
    """HAMi's `gpuCorePolicy`: how HAMi-core enforces the cores limit in the container."""

    DEFAULT = "default"
    FORCE = "force"
    DISABLE = "disable"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """What the webhook is configured with (HAMi's flags and the device config's `nvidia:`).

    An empty `scheduler_name` leaves `spec.schedulerName` alone (HAMi's `--scheduler-name`
    unset). `default_gpu_num` 0 turns the default GPU count off. The scheduler's
    `default_memory_mib`/`default_cores` are not the webhook's: HAMi reads them only for
    the quota check, which gets them in `quota.reading`. `memory_factor` is the scheduler's (the
    device config's `memoryFactor`): the webhook reads a request's memory range as the scheduler
    will. `quota` None: no quota check (no namespace quotas are known, e.g. outside the daemon).
    """

    scheduler_name: str = "hami-scheduler"
    force_overwrite_default_scheduler: bool = True
    default_gpu_num: int = 1
    overwrite_env: bool = False
    gpu_core_policy: GpuCorePolicy = GpuCorePolicy.DEFAULT
    runtime_class_name: str = ""
    resources: ResourceNames = field(default_factory=ResourceNames)
    memory_factor: int = 1
    quota: QuotaCheck | None = None
    control_env_allowed: bool = False
    """The pod's namespace is an admin namespace (`hami-plugin.io/gpu-admin=true`, which the
    API server tells by calling `/webhook/gpu-admin`): its containers may set the control
    environment."""

    def __post_init__(self) -> None:
        if not 0 <= self.default_gpu_num <= _INT32_MAX:
            raise ValueError("default_gpu_num must be between 0 and 2147483647")
        if self.memory_factor < 1:
            raise ValueError("memory_factor must be at least 1")
        if not self.resources.count:
            raise ValueError("the GPU count resource name must not be empty")
        GpuCorePolicy(self.gpu_core_policy)  # raises ValueError for an unknown policy


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """The webhook's view of the namespace quotas: `fits(namespace, memory_mib, cores)` is
    HAMi's `FitQuota` for the whole pod (the scheduler state's), `reading` the scheduler
    settings its requests are read with (HAMi asks the backend's `GenerateResourceRequests`)."""

    reading: SchedulerSettings
    fits: Callable[[str, int, int], bool]


class AdmissionVerdict(enum.StrEnum):
    """controller-runtime's three kinds of answer."""

    ALLOWED = "allowed"  # Allowed / Patched / PatchResponseFromRaw
    DENIED = "denied"  # Denied: code 403, reason Forbidden
    ERRORED = "errored"  # Errored: code 400 or 500, not allowed


@dataclass(frozen=True, slots=True)
class PodAdmission:
    """The webhook's answer for one pod: verdict, `status.code`, message and JSON patch."""

    verdict: AdmissionVerdict
    code: int
    message: str = ""
    patch: tuple[Mapping[str, Any], ...] = ()

    @property
    def allowed(self) -> bool:
        return self.verdict is AdmissionVerdict.ALLOWED


def _allowed(message: str = "", patch: Sequence[Mapping[str, Any]] = ()) -> PodAdmission:
    return PodAdmission(AdmissionVerdict.ALLOWED, 200, message, tuple(patch))


def _denied(message: str) -> PodAdmission:
    return PodAdmission(AdmissionVerdict.DENIED, 403, message)


def errored(code: int, message: str) -> PodAdmission:
    """controller-runtime's Errored: not allowed, with the code and the reason."""
    return PodAdmission(AdmissionVerdict.ERRORED, code, message)


# --- reading the pod ---------------------------------------------------------------------


class _BadPodError(Exception):
    """The pod is not a v1.Pod Go could decode (HAMi answers code 400)."""


class _RejectedError(Exception):
    """MutateAdmission refused a container (HAMi answers code 500)."""


def _kind(value: object) -> str:
    return type(value).__name__


def _mapping(value: object, what: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _BadPodError(f"pod {what} must be an object, got {_kind(value)}")
    return value


def _text(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _BadPodError(f"pod {what} must be a string, got {_kind(value)}")
    return value


def _string_map(value: object, what: str) -> Mapping[str, Any]:
    mapping = _mapping(value, what) or {}
    for key, item in mapping.items():
        if item is not None and not isinstance(item, str):
            raise _BadPodError(f"pod {what}[{key}] must be a string, got {_kind(item)}")
    return mapping


@dataclass(slots=True)
class _Container:
    """One container as read, and what MutateAdmission adds to it."""

    path: str
    name: str
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    resources_present: bool
    limits_present: bool
    env_present: bool
    privileged: bool
    control_env: tuple[str, ...] = ()
    reserved_mounts: tuple[str, ...] = ()
    added_env: list[dict[str, str]] = field(default_factory=list)
    added_limits: dict[str, str] = field(default_factory=dict)

    def in_limits(self, name: str) -> bool:
        return name in self.limits or name in self.added_limits

    def present(self, name: str) -> bool:
        """HAMi's resourcePresent: in limits or requests; an empty name never is."""
        return bool(name) and (self.in_limits(name) or name in self.requests)

    def where(self, name: str, kind: str) -> str:
        return f"{self.path[1:].replace('/', '.')}.resources.{kind}[{name}]"


@dataclass(frozen=True, slots=True)
class _PodView:
    namespace: str
    annotations: Mapping[str, Any]
    labels: Mapping[str, Any]
    containers: tuple[_Container, ...]  # init containers first
    app_container_count: int
    scheduler_name: str
    scheduler_name_present: bool
    node_name: str
    runtime_class_missing: bool


def _read_container(value: object, path: str) -> _Container:
    what = path[1:].replace("/", ".")
    container = _mapping(value, what)
    if container is None:
        raise _BadPodError(f"pod {what} must be an object, got null")
    resources = _mapping(container.get("resources"), f"{what}.resources")
    limits = _mapping((resources or {}).get("limits"), f"{what}.resources.limits")
    requests = _mapping((resources or {}).get("requests"), f"{what}.resources.requests")
    env = container.get("env")
    if env is not None and not isinstance(env, list):
        raise _BadPodError(f"pod {what}.env must be a list, got {_kind(env)}")
    found_env = control_env(env or (), container.get("envFrom"))
    security = _mapping(container.get("securityContext"), f"{what}.securityContext")
    privileged = (security or {}).get("privileged")
    if privileged is not None and not isinstance(privileged, bool):
        raise _BadPodError(
            f"pod {what}.securityContext.privileged must be a boolean, got {_kind(privileged)}"
        )
    return _Container(
        path=path,
        name=_text(container.get("name"), f"{what}.name"),
        limits=limits or {},
        requests=requests or {},
        resources_present=resources is not None,
        limits_present=limits is not None,
        env_present=env is not None,
        privileged=privileged is True,
        control_env=found_env,
        reserved_mounts=reserved_mounts(container.get("volumeMounts")),
    )


def _read_containers(spec: Mapping[str, Any], key: str) -> list[_Container]:
    items = spec.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise _BadPodError(f"pod spec.{key} must be a list, got {_kind(items)}")
    return [_read_container(item, f"/spec/{key}/{index}") for index, item in enumerate(items)]


def _read_pod(pod: object) -> _PodView:
    if pod is None:
        raise _BadPodError("there is no content to decode")  # controller-runtime's words
    document = _mapping(pod, "object") or {}
    metadata = _mapping(document.get("metadata"), "metadata") or {}
    spec = _mapping(document.get("spec"), "spec") or {}
    runtime_class = spec.get("runtimeClassName")
    _text(runtime_class, "spec.runtimeClassName")
    init_containers = _read_containers(spec, "initContainers")
    app_containers = _read_containers(spec, "containers")
    return _PodView(
        namespace=_text(metadata.get("namespace"), "metadata.namespace"),
        annotations=_string_map(metadata.get("annotations"), "metadata.annotations"),
        labels=_string_map(metadata.get("labels"), "metadata.labels"),
        containers=(*init_containers, *app_containers),
        app_container_count=len(app_containers),
        scheduler_name=_text(spec.get("schedulerName"), "spec.schedulerName"),
        scheduler_name_present="schedulerName" in spec,
        node_name=_text(spec.get("nodeName"), "spec.nodeName"),
        runtime_class_missing=runtime_class is None,
    )


def _go_value(raw: object, where: str) -> int | None:
    """Go's `Quantity.Value()`: rounded up, away from zero. None beyond int64 (Go overflows
    there). JSON null decodes to the zero quantity."""
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise _BadPodError(f"pod {where}: {_QUANTITY_FORMAT}")
    try:
        value = parse_quantity(raw)
    except QuantityError:
        raise _BadPodError(f"pod {where}: {_QUANTITY_FORMAT}") from None
    if value.is_zero():
        return 0
    if value.adjusted() > 18:
        return None
    whole = int(value.to_integral_value(rounding=ROUND_UP))
    return whole if _INT64_MIN <= whole <= _INT64_MAX else None


def _resource_value(container: _Container, name: str) -> tuple[bool, int | None, object]:
    """HAMi's resourceValue: (present, Value(), raw) from limits, else requests."""
    if not name:
        return False, 0, None
    if name in container.limits:
        raw = container.limits[name]
        return True, _go_value(raw, container.where(name, "limits")), raw
    if name in container.requests:
        raw = container.requests[name]
        return True, _go_value(raw, container.where(name, "requests")), raw
    return False, 0, None


# --- MutateAdmission ------------------------------------------------------------------------


def _binary_si(count: int) -> str:
    """`resource.NewQuantity(count, BinarySI)` as Go serialises it: below 1024 in decimal SI
    (`1000` is `1k`), above in the largest exact binary unit (`2048` is `2Ki`)."""
    if count < 1024:
        return "1k" if count == 1000 else str(count)
    suffixes = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    power = 0
    while count % 1024 == 0 and power < len(suffixes) - 1:
        count //= 1024
        power += 1
    return f"{count}{suffixes[power]}"


def _mutate_container(container: _Container, settings: WebhookSettings) -> bool:
    """HAMi's MutateAdmission for one container: record what it adds, say whether the
    container asks for GPUs. Raises _RejectedError or _BadPodError."""
    names = settings.resources
    present, percent, raw = _resource_value(container, names.memory_percentage)
    if present and (percent is None or not 0 <= percent <= 100):
        shown = raw if percent is None else percent
        raise _RejectedError(
            f"invalid {names.memory_percentage} value {shown} in container {container.name}: "
            "must be an integer between 0 and 100"
        )
    if names.priority in container.limits:
        priority = _go_value(
            container.limits[names.priority], container.where(names.priority, "limits")
        )
        if priority is None:
            raise _RejectedError(
                f"invalid {names.priority} value {container.limits[names.priority]} in "
                f"container {container.name}: out of the int64 range"
            )
        container.added_env.append({"name": ENV_TASK_PRIORITY, "value": str(priority)})
    if settings.gpu_core_policy is not GpuCorePolicy.DEFAULT:
        container.added_env.append(
            {"name": ENV_CORE_UTILIZATION_POLICY, "value": str(settings.gpu_core_policy)}
        )

    # mutateContainerResource (device.go 398-415): limits only.
    has_resource = container.in_limits(names.count)
    if not has_resource and settings.default_gpu_num > 0:
        shares = (names.cores, names.memory, names.memory_percentage)
        if any(container.in_limits(name) for name in shares):
            container.added_limits[names.count] = _binary_si(settings.default_gpu_num)
            has_resource = True

    # defaultExclusiveCoreIfNeeded (device.go 417-450): limits or requests.
    if container.present(names.count) and names.cores and not container.present(names.cores):
        if present:
            exclusive = percent == 100
        else:
            exclusive = not names.memory or not container.present(names.memory)
        if exclusive:
            container.added_limits[names.cores] = _EXCLUSIVE_CORES
            has_resource = True

    if not has_resource and settings.overwrite_env:
        container.added_env.append(
            {"name": ENV_NVIDIA_VISIBLE_DEVICES, "value": HARMLESS_VISIBLE_DEVICES}
        )
    return has_resource


def _misread_requests(
    containers: Sequence[_Container], settings: WebhookSettings
) -> list[RequestProblem]:
    """The wrong answers the scheduler's reading of the mutated containers would give."""
    reading = SchedulerSettings(memory_factor=settings.memory_factor, resources=settings.resources)
    problems: list[RequestProblem] = []
    for container in containers:
        spec = ContainerSpec(
            container.name,
            limits={**container.limits, **container.added_limits},
            requests=container.requests,
        )
        _, found = container_request(spec, reading)
        problems.extend(problem for problem in found if problem.wrong_answer)
    return problems


def _fits_quota(view: _PodView, namespace: str, quota: QuotaCheck) -> bool:
    """HAMi's `fitResourceQuota` (webhook.go:145-190) for the NVIDIA backend."""
    init_count = len(view.containers) - view.app_container_count
    app_memory = app_cores = init_memory = init_cores = 0
    for position, container in enumerate(view.containers):
        spec = ContainerSpec(
            container.name,
            limits={**container.limits, **container.added_limits},
            requests=container.requests,
        )
        request, _ = container_request(spec, quota.reading)
        if request is None or request.count == 0:
            continue
        memory = request.memory_mib * request.count
        cores = request.cores_percent * request.count
        if position < init_count:
            init_memory, init_cores = max(init_memory, memory), max(init_cores, cores)
        else:
            app_memory, app_cores = app_memory + memory, app_cores + cores
    memory, cores = max(app_memory, init_memory), max(app_cores, init_cores)
    if memory == 0 and cores == 0:
        return True
    return quota.fits(namespace, memory, cores)


# --- the JSON patch -------------------------------------------------------------------------


def _pointer_token(name: str) -> str:
    """RFC 6901: `~` is written `~0` and `/` is written `~1`."""
    return name.replace("~", "~0").replace("/", "~1")


def _strip_operations(view: _PodView) -> list[dict[str, Any]]:
    operations: list[dict[str, Any]] = []
    for where, owned, present in (
        ("annotations", BOOKING_ANNOTATIONS, view.annotations),
        ("labels", BOOKING_LABELS, view.labels),
    ):
        for key in owned:
            if key in present:
                path = f"/metadata/{where}/{_pointer_token(key)}"
                operations.append({"op": "remove", "path": path})
    return operations


def _container_operations(container: _Container) -> list[dict[str, Any]]:
    operations: list[dict[str, Any]] = []
    if container.added_env:
        if container.env_present:
            operations.extend(
                {"op": "add", "path": f"{container.path}/env/-", "value": variable}
                for variable in container.added_env
            )
        else:
            path = f"{container.path}/env"
            operations.append({"op": "add", "path": path, "value": list(container.added_env)})
    if container.added_limits:
        added = dict(container.added_limits)
        if container.limits_present:
            operations.extend(
                {
                    "op": "add",
                    "path": f"{container.path}/resources/limits/{_pointer_token(name)}",
                    "value": value,
                }
                for name, value in added.items()
            )
        elif container.resources_present:
            path = f"{container.path}/resources/limits"
            operations.append({"op": "add", "path": path, "value": added})
        else:
            path = f"{container.path}/resources"
            operations.append({"op": "add", "path": path, "value": {"limits": added}})
    return operations


def _other_scheduler(name: str, settings: WebhookSettings) -> bool:
    """webhook.go 64-66: the pod names a scheduler that is not ours."""
    if not name:
        return False
    if name == DEFAULT_SCHEDULER_NAME and settings.force_overwrite_default_scheduler:
        return False
    return not settings.scheduler_name or name != settings.scheduler_name


def _asks_gpu(view: _PodView, settings: WebhookSettings) -> bool:
    """A container names one of the GPU resources in its limits or requests."""
    names = settings.resources
    wanted = (names.count, names.memory, names.memory_percentage, names.cores)
    return any(c.present(name) for c in view.containers for name in wanted)


def _control_refusal(view: _PodView, settings: WebhookSettings) -> str | None:
    """Why a GPU pod may not keep its containers' environment; None: it may."""
    if settings.control_env_allowed:
        return None
    for container in view.containers:
        if container.control_env:
            return control_env_refusal(container.name, container.control_env[0])
    return None


def admit_pod(pod: object, settings: WebhookSettings) -> PodAdmission:
    """HAMi v2.10's admission decision for a pod (a decoded v1.Pod JSON object), with the
    JSON patch against that object. Never raises for any input."""
    try:
        view = _read_pod(pod)
        if view.app_container_count == 0:
            return _denied("pod has no containers")
        strip = _strip_operations(view)
        asks_gpu = _asks_gpu(view, settings)
        if not asks_gpu and view.labels.get(LABEL_WEBHOOK) == WEBHOOK_IGNORE:
            return _allowed(patch=strip)
        if _other_scheduler(view.scheduler_name, settings):
            if asks_gpu and settings.scheduler_name:
                return _denied(
                    f"a pod asking for GPUs must be scheduled by {settings.scheduler_name}, "
                    f"not {view.scheduler_name}"
                )
            return _allowed("pod already has different scheduler assigned", strip)
        # Every container is mutated, none skipped once one asks for GPUs.
        has_resource = False
        for container in view.containers:
            has_resource = _mutate_container(container, settings) or has_resource
    except _BadPodError as error:
        return errored(400, str(error))
    except _RejectedError as error:
        return errored(500, str(error))

    misread = _misread_requests(view.containers, settings)
    if misread:
        return _denied("; ".join(problem.render(would=True) for problem in misread))
    if asks_gpu:  # every container that gained a GPU resource asked for one already
        privileged = next((c for c in view.containers if c.privileged), None)
        if privileged is not None:
            return _denied(f"container {privileged.name} is privileged")
        shadowing = next((c for c in view.containers if c.reserved_mounts), None)
        if shadowing is not None:
            return _denied(
                f"container {shadowing.name} mounts a volume at {shadowing.reserved_mounts[0]}: "
                "a GPU container may not mount over the device plugin's HAMi-core files, nor "
                "use .. in a mountPath"
            )
        refusal = _control_refusal(view, settings)
        if refusal is not None:
            return _denied(refusal)
    operations = strip
    for container in view.containers:
        operations.extend(_container_operations(container))
    if has_resource and view.runtime_class_missing and settings.runtime_class_name:
        operations.append(
            {"op": "add", "path": "/spec/runtimeClassName", "value": settings.runtime_class_name}
        )
    if asks_gpu and settings.scheduler_name:
        if view.node_name:
            return _denied("pod has node assigned")
        if view.scheduler_name != settings.scheduler_name:
            operations.append(
                {
                    "op": "replace" if view.scheduler_name_present else "add",
                    "path": "/spec/schedulerName",
                    "value": settings.scheduler_name,
                }
            )
    if settings.quota is not None and not _fits_quota(view, view.namespace, settings.quota):
        return _denied("exceeding resource quota")
    return _allowed(patch=operations)
