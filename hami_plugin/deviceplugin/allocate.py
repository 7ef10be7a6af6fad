"""What the device plugin answers to kubelet's Allocate and GetPreferredAllocation.

Pure decisions, no I/O: the gRPC edge (`deviceplugin.server`) fetches the pod and the node lock,
calls these functions and carries out the result (host directories, annotation patches, events).

HAMi v2.10 behaviour being matched (reference 4.4 / 4.5):
- the pending pod is the one the node lock names, else a Pending pod bound to this node whose
  `hami.io/bind-phase` is `allocating`; where several such pods are in flight (our scheduler on
  a node marked `hami-plugin.io/allocate-protocol`), `inflight.choose` tells them apart from
  kubelet's device count (HAMi takes whatever the API list order gives);
- each ContainerAllocateRequest consumes the next non-empty entry of
  `hami.io/vgpu-devices-to-allocate`; the number of devices must equal kubelet's;
- the environment and the mounts are HAMi-core's, in HAMi's order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from hami_plugin.deviceplugin.inventory import physical_uuid_of
from hami_plugin.protocol import codec, govalues, inflight
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    BindPhase,
    ContainerDevice,
    ContainerDevices,
    NodeLock,
    PodDevices,
)

POD_PHASE_PENDING = "Pending"
VGPU_LOCK_CONTAINER_PATH = "/tmp/vgpulock"
LD_SO_PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
LICENSE_CONTAINER_PATH = "/tmp/license"
VGPU_VALIDATOR_CONTAINER_PATH = "/usr/bin/vgpuvalidator"
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"


# --- inputs ------------------------------------------------------------------------------------


class ContainerLike(Protocol):
    """The parts of a pod's container the decision reads (k8s.ContainerSpec fits)."""

    @property
    def name(self) -> str: ...

    @property
    def env(self) -> Mapping[str, str]: ...


class PodLike(Protocol):
    """The parts of a pod the decision reads (k8s.PodRecord fits)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def node_name(self) -> str: ...

    @property
    def creation_timestamp(self) -> datetime | None: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...

    @property
    def init_containers(self) -> Sequence[ContainerLike]: ...

    @property
    def containers(self) -> Sequence[ContainerLike]: ...


@dataclass(frozen=True, slots=True)
class AllocateConfig:
    """The stable configuration Allocate depends on (kubelet replays responses, so nothing else).

    `libvgpu_host_path` is `<hook>/vgpu/libvgpu.so.<version>` when the edge found that file, else
    `<hook>/vgpu/libvgpu.so`; `license_present` says whether `<hook>/vgpu/license` exists.
    """

    hook_path: str = "/usr/local"
    memory_scaling: float = 1.0
    libcuda_log_level: str | None = None
    disable_core_limit: bool = False
    enable_preferred_allocation: bool = True
    vgpulock_host_path: str = VGPU_LOCK_CONTAINER_PATH
    libvgpu_host_path: str | None = None
    license_present: bool = False

    @property
    def vgpu_dir(self) -> str:
        """`<hook>/vgpu`, the directory HAMi-core lives in (same path in the container)."""
        return self.hook_path.rstrip("/") + "/vgpu"

    def container_dir(self, pod_uid: str, container_name: str) -> str:
        """Host directory of one container's shared-region files."""
        return f"{self.vgpu_dir}/containers/{pod_uid}_{container_name}"


# --- outputs -----------------------------------------------------------------------------------


class FailureReason(enum.StrEnum):
    """Why an Allocate could not be answered; the edge maps each to a gRPC status."""

    NO_PENDING_POD = "NoPendingPod"
    NO_MATCHING_POD = "NoMatchingPod"
    MALFORMED_ANNOTATION = "MalformedAnnotation"
    NO_PENDING_ENTRY = "NoPendingEntry"
    DEVICE_COUNT_MISMATCH = "DeviceCountMismatch"
    INVALID_REQUEST = "InvalidRequest"
    INVALID_POD = "InvalidPod"


class AllocateFailure(Exception):  # noqa: N818 - the name the edge and the brief use
    """Allocate cannot be answered; `str(error)` says what was wrong, in words for the user.

    `pod_known` is False when no pod was found (then nothing is patched: HAMi returns the error
    to kubelet only).
    """

    def __init__(self, reason: FailureReason, message: str, *, pod_known: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.pod_known = pod_known


@dataclass(frozen=True, slots=True)
class MountSpec:
    """One kubelet Mount: `host_path` shown in the container at `container_path`."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The answer for one ContainerAllocateRequest and the host directory it needs.

    `kubelet_ids_not_used` lists kubelet's IDs whose GPU differs from the scheduler's booking,
    which the container got instead (the edge logs them).
    """

    container_name: str
    entry_index: int
    devices: ContainerDevices
    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    host_dir: str
    kubelet_ids_not_used: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationDecision:
    """What Allocate does to the pod: the responses, the new to-allocate value, and whether the
    pod is complete (every entry consumed, so `hami.io/bind-phase` becomes `success`)."""

    containers: tuple[ContainerAllocation, ...]
    remaining_to_allocate: str
    complete: bool


PodT = TypeVar("PodT", bound=PodLike)


@dataclass(frozen=True, slots=True)
class PendingPodChoice(Generic[PodT]):
    """The pod Allocate works on. `lock_warning` explains a node lock that could not be used."""

    pod: PodT
    via_lock: bool
    lock_warning: str | None = None


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One ContainerPreferredAllocationRequest."""

    available: Sequence[str]
    must_include: Sequence[str] = ()
    size: int = 0


@dataclass(frozen=True, slots=True)
class PreferredAnswer:
    """The device IDs for one request; `fallback_note` is set when the hint could not be used."""

    device_ids: tuple[str, ...]
    fallback_note: str | None = None


# --- pending pod ---------------------------------------------------------------------------------


def _bind_time_key(pod: PodLike) -> tuple[int, int, str, str]:
    text = pod.annotations.get(ANNOTATION_BIND_TIME, "")
    try:
        return (0, int(text), pod.namespace, pod.name)
    except ValueError:
        # An unreadable bind-time sorts after every readable one.
        return (1, 0, pod.namespace, pod.name)


def is_pending_on(pod: PodLike, node_name: str) -> bool:
    """True when the pod waits for its devices on `node_name` (reference 4.4 step 1): bound
    here, Pending, `hami.io/bind-phase: allocating`, with a bind-time and `hami.io/vgpu-node`.

    A pod being deleted still qualifies: kubelet admits a pod it has not seen before even when
    its deletionTimestamp is set (HandlePodAdditions only skips pods its pod workers already
    terminate), so an Allocate may still be for it.
    """
    annotations = pod.annotations
    return (
        pod.phase == POD_PHASE_PENDING
        and pod.node_name == node_name
        and ANNOTATION_BIND_TIME in annotations
        and annotations.get(ANNOTATION_BIND_PHASE) == BindPhase.ALLOCATING
        and annotations.get(ANNOTATION_VGPU_NODE) == node_name
    )


def _choose_in_flight(
    node_name: str, candidates: Sequence[PodT], device_count: int
) -> tuple[PodT | None, str]:
    """The candidate kubelet's call for `device_count` devices is for (`inflight.choose`).

    A candidate without a usable booking (to-allocate missing, unreadable or all consumed) could
    be any Allocate: it is taken instead whenever kubelet could be admitting it, that is when
    nothing else matches or the match is a not-started pod created no earlier; it then fails on
    its annotation, and the caller's kubelet call with it, rather than another pod's GPUs going
    to it.
    """
    readable: dict[tuple[str, str], PodT] = {}
    views = []
    unusable: list[PodT] = []
    for pod in candidates:
        view = inflight.in_flight_pod(
            pod.namespace, pod.name, pod.creation_timestamp, pod.annotations
        )
        if view is None or view.finished:
            unusable.append(pod)
        else:
            readable[view.key] = pod
            views.append(view)
    choice = inflight.choose(views, device_count)
    if unusable:
        wildcard = min(
            unusable,
            key=lambda p: (inflight.created_seconds_of(p.creation_timestamp), p.namespace, p.name),
        )
        wildcard_created = inflight.created_seconds_of(wildcard.creation_timestamp)
        if choice.pod is None or (
            not choice.pod.started and wildcard_created <= choice.pod.created_seconds
        ):
            return wildcard, ""
    if choice.pod is None:
        return None, (
            f"node {node_name}: cannot tell which pod an allocation of {device_count} device(s) "
            f"is for: {choice.reason}"
        )
    return readable[choice.pod.key], ""


def select_pending_pod(
    node_name: str, lock_value: str | None, pods: Sequence[PodT], device_count: int
) -> PendingPodChoice[PodT]:
    """Choose the pod kubelet is admitting, from the node lock, the pods on the node and the
    number of devices kubelet asks (`len(devices_ids)`, or `allocation_size`).

    The pod the lock names wins when it is a Pending pod on this node (HAMi's scheduler). Else
    the one pod pending on this node (`is_pending_on`), whatever the count: a wrong count then
    fails it with "device number not matched", as in HAMi. Several (our scheduler's in-flight
    protocol): `inflight.choose` over their bookings. A malformed lock does not block allocation
    (HAMi fails every Allocate until the lock expires); the choice carries a warning instead.

    Raises AllocateFailure(NO_PENDING_POD) when no pod qualifies, and (NO_MATCHING_POD) when
    several do and none can be told to be the one; `pod_known` is False for both (nothing is
    patched).
    """
    warning: str | None = None
    lock: NodeLock | None = None
    if lock_value:
        try:
            lock = codec.parse_node_lock(lock_value)
        except ValueError as error:
            warning = f"ignoring node lock: {error}"
    if lock is not None:
        # A legacy lock (time only) is owned by no pod.
        for pod in pods:
            if lock.owned_by(pod.namespace, pod.name) and pod.phase == POD_PHASE_PENDING:
                return PendingPodChoice(pod=pod, via_lock=True)
    candidates = sorted((p for p in pods if is_pending_on(p, node_name)), key=_bind_time_key)
    if not candidates:
        raise AllocateFailure(
            FailureReason.NO_PENDING_POD,
            f"no binding pod found on node {node_name}",
            pod_known=False,
        )
    if len(candidates) == 1:
        return PendingPodChoice(pod=candidates[0], via_lock=False, lock_warning=warning)
    chosen, reason = _choose_in_flight(node_name, candidates, device_count)
    if chosen is None:
        raise AllocateFailure(FailureReason.NO_MATCHING_POD, reason, pod_known=False)
    return PendingPodChoice(pod=chosen, via_lock=False, lock_warning=warning)


def lock_releasable_by(lock_value: str | None, namespace: str, name: str) -> bool:
    """True when the pod `namespace/name` may delete the node lock `lock_value` (HAMi's rule).

    Decided on the text, as HAMi does, so that an unreadable lock cannot stay forever: a value
    with commas belongs to the pod it ends with (`,<ns>,<name>`); one without commas (a legacy
    timestamp, or garbage) has no owner, and whoever finishes releases it.
    """
    if not lock_value:
        return False
    return "," not in lock_value or lock_value.endswith(f",{namespace},{name}")


# --- Allocate ------------------------------------------------------------------------------------


def check_requests(requests: Sequence[Sequence[str]]) -> None:
    """Reject an Allocate that cannot be any container's admission, before a pod is chosen.

    Raises AllocateFailure(INVALID_REQUEST, pod_known=False) when there is no container request.
    """
    if not requests:
        raise AllocateFailure(
            FailureReason.INVALID_REQUEST, "allocate request has no containers", pod_known=False
        )


def check_device_ids(requests: Sequence[Sequence[str]], advertised: Collection[str]) -> None:
    """Every kubelet device ID must be one this plugin advertises, and used once in the call.

    Raises AllocateFailure(INVALID_REQUEST) naming the first offending ID.
    """
    seen: set[str] = set()
    for kubelet_ids in requests:
        for device_id in kubelet_ids:
            if device_id not in advertised:
                raise AllocateFailure(
                    FailureReason.INVALID_REQUEST,
                    f"device ID {govalues.go_quote(device_id)} is not one this plugin advertises",
                )
            if device_id in seen:
                raise AllocateFailure(
                    FailureReason.INVALID_REQUEST,
                    f"device ID {govalues.go_quote(device_id)} is requested twice",
                )
            seen.add(device_id)


def decode_to_allocate(pod: PodLike) -> PodDevices:
    """Decode the pod's `hami.io/vgpu-devices-to-allocate` (missing → no entries).

    Raises AllocateFailure(MALFORMED_ANNOTATION) naming the key and the bad part, also for a
    negative memory or cores value.
    """
    value = pod.annotations.get(ANNOTATION_DEVICES_TO_ALLOCATE)
    if value is None:
        return ()
    try:
        entries = codec.decode_pod_devices(value, ANNOTATION_DEVICES_TO_ALLOCATE)
    except ValueError as error:
        raise AllocateFailure(FailureReason.MALFORMED_ANNOTATION, str(error)) from error
    for index, entry in enumerate(entries):
        for device in entry:
            # HAMi-core would get "-3000m" as a memory limit: no scheduler writes that.
            if device.used_mem_mib < 0 or device.used_cores < 0:
                raise AllocateFailure(
                    FailureReason.MALFORMED_ANNOTATION,
                    f"{ANNOTATION_DEVICES_TO_ALLOCATE}: entry {index} device {device.uuid}: "
                    f"negative memory ({device.used_mem_mib}) or cores ({device.used_cores})",
                )
    return entries


def _container_at(pod: PodLike, index: int) -> ContainerLike:
    # v2.9+ indexes: init containers first, then app containers (reference 1.4.4).
    init = pod.init_containers
    if index < len(init):
        return init[index]
    app_index = index - len(init)
    if app_index < len(pod.containers):
        return pod.containers[app_index]
    raise AllocateFailure(
        FailureReason.MALFORMED_ANNOTATION,
        f"annotation {ANNOTATION_DEVICES_TO_ALLOCATE}: entry {index} has no matching container "
        f"(pod has {len(init)} init and {len(pod.containers)} app containers)",
    )


def _go_parse_bool_true(value: str | None) -> bool:
    # HAMi reads CUDA_DISABLE_CONTROL with Go's ParseBool; anything unparsable counts as false.
    if value is None:
        return False
    try:
        return govalues.parse_go_bool(value)
    except ValueError:
        return False


def _align_with_kubelet(
    devices: ContainerDevices, kubelet_ids: Sequence[str], node_gpus: Collection[str] | None
) -> tuple[ContainerDevices, tuple[str, ...]]:
    """The GPUs the container gets, and the kubelet IDs whose GPU was not used.

    HAMi gives the i-th device the GPU of kubelet's i-th ID. We keep the scheduler's booking
    whenever the booked GPU is on this node: kubelet may hand out IDs of another GPU (it reuses
    an init container's devices for an app container without asking GetPreferredAllocation),
    and following it would run the container on a GPU the scheduler did not book, so a later
    pod could oversubscribe it. Only a booked GPU that is not here (or an unknown node
    inventory) takes kubelet's GPU, as in HAMi.
    """
    aligned = []
    overridden = []
    for device, device_id in zip(devices, kubelet_ids, strict=True):
        gpu_uuid = physical_uuid_of(device_id)
        if not gpu_uuid or gpu_uuid == device.uuid:
            aligned.append(device)
        elif node_gpus is not None and device.uuid in node_gpus:
            aligned.append(device)
            overridden.append(device_id)
        else:
            aligned.append(
                ContainerDevice(
                    uuid=gpu_uuid,
                    type=device.type,
                    used_mem_mib=device.used_mem_mib,
                    used_cores=device.used_cores,
                )
            )
    return tuple(aligned), tuple(overridden)


def container_envs(
    devices: ContainerDevices, config: AllocateConfig, cache_id: str
) -> dict[str, str]:
    """HAMi-core's environment for one container's devices (reference 4.4), in HAMi's order."""
    visible = list(dict.fromkeys(device.uuid for device in devices))
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(visible)}
    for position, device in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{device.used_mem_mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].used_cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{config.vgpu_dir}/{cache_id}.cache"
    if config.memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if config.libcuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = config.libcuda_log_level
    if config.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    return envs


def container_mounts(
    container: ContainerLike, host_dir: str, config: AllocateConfig
) -> tuple[MountSpec, ...]:
    """HAMi-core's mounts for one container, in HAMi's order (reference 4.4)."""
    vgpu_dir = config.vgpu_dir
    mounts = [
        MountSpec(
            container_path=f"{vgpu_dir}/libvgpu.so",
            host_path=config.libvgpu_host_path or f"{vgpu_dir}/libvgpu.so",
            read_only=True,
        ),
        MountSpec(container_path=vgpu_dir, host_path=host_dir, read_only=False),
        MountSpec(
            container_path=VGPU_LOCK_CONTAINER_PATH,
            host_path=config.vgpulock_host_path,
            read_only=False,
        ),
    ]
    if not _go_parse_bool_true(container.env.get(ENV_DISABLE_CONTROL)):
        mounts.append(
            MountSpec(
                container_path=LD_SO_PRELOAD_CONTAINER_PATH,
                host_path=f"{vgpu_dir}/ld.so.preload",
                read_only=True,
            )
        )
    if config.license_present:
        mounts.append(
            MountSpec(
                container_path=LICENSE_CONTAINER_PATH,
                host_path=f"{vgpu_dir}/license",
                read_only=True,
            )
        )
        mounts.append(
            MountSpec(
                container_path=VGPU_VALIDATOR_CONTAINER_PATH,
                host_path=f"{vgpu_dir}/vgpuvalidator",
                read_only=True,
            )
        )
    return tuple(mounts)


def decide_allocation(
    pod: PodLike,
    requests: Sequence[Sequence[str]],
    config: AllocateConfig,
    new_cache_id: Callable[[], str],
    advertised: Collection[str] | None = None,
) -> AllocationDecision:
    """Answer kubelet's Allocate for `pod`: one ContainerAllocation per request, in order.

    `requests` holds the `devices_ids` of each ContainerAllocateRequest; `new_cache_id` returns
    a fresh UUIDv4 string for `CUDA_DEVICE_MEMORY_SHARED_CACHE`; `advertised` (when given) is
    every device ID this plugin lists to kubelet, healthy or not.

    Raises AllocateFailure: MALFORMED_ANNOTATION, NO_PENDING_ENTRY ("no pending device
    allocation found"), DEVICE_COUNT_MISMATCH ("device number not matched"), INVALID_REQUEST
    (no container request, an ID not advertised or given twice), INVALID_POD (no pod UID: the
    host directory would be shared with other pods). Without preferred-allocation alignment an
    annotated GPU that `advertised` does not cover is MALFORMED_ANNOTATION.
    """
    check_requests(requests)
    if advertised is not None:
        check_device_ids(requests, advertised)
    if not pod.uid:
        raise AllocateFailure(
            FailureReason.INVALID_POD,
            f"pod {pod.namespace}/{pod.name} has no uid: cannot name its host directory",
        )
    entries = list(decode_to_allocate(pod))
    node_gpus = None if advertised is None else {physical_uuid_of(i) for i in advertised}
    answers = []
    next_index = 0
    for kubelet_ids in requests:
        while next_index < len(entries) and not entries[next_index]:
            next_index += 1
        if next_index >= len(entries):
            raise AllocateFailure(
                FailureReason.NO_PENDING_ENTRY,
                f"no pending device allocation found for pod {pod.namespace}/{pod.name}",
            )
        devices = entries[next_index]
        if len(devices) != len(kubelet_ids):
            raise AllocateFailure(
                FailureReason.DEVICE_COUNT_MISMATCH,
                f"device number not matched: pod {pod.namespace}/{pod.name} entry {next_index} "
                f"has {len(devices)} device(s), kubelet asked for {len(kubelet_ids)}",
            )
        container = _container_at(pod, next_index)
        overridden: tuple[str, ...] = ()
        if config.enable_preferred_allocation:
            devices, overridden = _align_with_kubelet(devices, kubelet_ids, node_gpus)
        elif node_gpus is not None:
            # The annotated GPUs are used as they are: one that is not here cannot be mounted.
            stray = next((d.uuid for d in devices if d.uuid not in node_gpus), None)
            if stray is not None:
                raise AllocateFailure(
                    FailureReason.MALFORMED_ANNOTATION,
                    f"{ANNOTATION_DEVICES_TO_ALLOCATE}: entry {next_index} names GPU {stray}, "
                    "which is not on this node",
                )
        host_dir = config.container_dir(pod.uid, container.name)
        answers.append(
            ContainerAllocation(
                container_name=container.name,
                entry_index=next_index,
                devices=devices,
                envs=container_envs(devices, config, new_cache_id()),
                mounts=container_mounts(container, host_dir, config),
                host_dir=host_dir,
                kubelet_ids_not_used=overridden,
            )
        )
        entries[next_index] = ()
    return AllocationDecision(
        containers=tuple(answers),
        remaining_to_allocate=codec.encode_pod_devices(tuple(entries)),
        complete=not any(entries),
    )


# --- GetPreferredAllocation ----------------------------------------------------------------------


def pending_entries(pod: PodLike | None) -> tuple[ContainerDevices, ...]:
    """The non-empty to-allocate entries of `pod`, in order; () when none or unreadable."""
    if pod is None:
        return ()
    try:
        return tuple(entry for entry in decode_to_allocate(pod) if entry)
    except AllocateFailure:
        return ()


def _prefer_one(request: PreferredRequest, wanted: ContainerDevices) -> PreferredAnswer:
    size = max(request.size, 0)
    chosen: list[str] = list(dict.fromkeys(request.must_include))
    if len(chosen) >= size:
        return PreferredAnswer(device_ids=tuple(chosen))
    taken = set(chosen)
    # Each must-include ID already covers one annotated device on its GPU.
    covered: dict[str, int] = {}
    for device_id in chosen:
        gpu = physical_uuid_of(device_id)
        covered[gpu] = covered.get(gpu, 0) + 1
    missing: list[str] = []
    for device in wanted[:size]:
        if covered.get(device.uuid, 0) > 0:
            covered[device.uuid] -= 1
            continue
        pick = next(
            (
                device_id
                for device_id in request.available
                if device_id not in taken and physical_uuid_of(device_id) == device.uuid
            ),
            None,
        )
        if pick is None:
            missing.append(device.uuid)
            continue
        chosen.append(pick)
        taken.add(pick)
        if len(chosen) >= size:
            break
    note = None
    if missing:
        note = "no available device on GPU(s) " + ",".join(missing)
    elif not wanted:
        note = "no pending allocation to follow"
    if len(chosen) < size:
        _top_up(chosen, taken, request.available, size)
    return PreferredAnswer(device_ids=tuple(chosen), fallback_note=note)


def _top_up(chosen: list[str], taken: set[str], available: Sequence[str], size: int) -> None:
    # Fallback: first IDs on GPUs not used yet (a vGPU count means distinct GPUs), then any.
    used_gpus = {physical_uuid_of(device_id) for device_id in chosen}
    for device_id in available:
        if len(chosen) >= size:
            return
        gpu = physical_uuid_of(device_id)
        if device_id not in taken and gpu not in used_gpus:
            chosen.append(device_id)
            taken.add(device_id)
            used_gpus.add(gpu)
    for device_id in available:
        if len(chosen) >= size:
            return
        if device_id not in taken:
            chosen.append(device_id)
            taken.add(device_id)


def decide_preferred(
    pod: PodLike | None, requests: Sequence[PreferredRequest]
) -> tuple[PreferredAnswer, ...]:
    """Answer GetPreferredAllocation; never fails.

    The i-th request follows the i-th non-empty to-allocate entry of `pod` (reference 4.5):
    must-include IDs first, then for each annotated GPU the first available ID on it. When the
    pod is unknown, its annotation unreadable or a chosen GPU has no available ID (it died), the
    answer is topped up from `available` (distinct GPUs first), so it always holds
    `size` IDs when `available` has that many, and always every must-include ID.
    """
    entries = pending_entries(pod)
    answers = []
    for position, request in enumerate(requests):
        wanted = entries[position] if position < len(entries) else ()
        answers.append(_prefer_one(request, wanted))
    return tuple(answers)
