"""Where Allocate is decided: what the device plugin answers to kubelet's Allocate.

Pure decisions, no I/O: the Allocate edge (`deviceplugin.allocator`) fetches the pod and the
node lock, picks the pod (`deviceplugin.pending`), calls `decide_allocation` and carries out
the result (host directories, annotation patches, events). GetPreferredAllocation is decided in
`deviceplugin.preferred`.

HAMi v2.10 behaviour being matched (docs/hami-reference.md 4.4):
- each ContainerAllocateRequest consumes the next non-empty entry of
  `hami.io/vgpu-devices-to-allocate`; the number of devices must equal kubelet's;
- the environment and the mounts are HAMi-core's, in HAMi's order, at the paths of
  `protocol.hostpaths`;
- the GPU list reaches the runtime as `--device-list-strategy` says (`deviceplugin.device_list`:
  `NVIDIA_VISIBLE_DEVICES`, `/var/run/nvidia-container-devices` mounts, CDI annotations or CRI
  CDI devices), with `NVIDIA_GDRCOPY`/`NVIDIA_GDS`/`NVIDIA_MOFED`, before HAMi-core's part.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hami_plugin.deviceplugin.device_list import (
    VOLUME_MOUNTS_HOST_PATH,
    DeviceListAnswer,
    DeviceListConfig,
    DeviceListStrategy,
    device_list_answer,
)
from hami_plugin.deviceplugin.inventory import physical_uuid_of
from hami_plugin.protocol import codec, govalues, gpu_admin, hostpaths
from hami_plugin.protocol.booking import PodBooking
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ContainerDevice,
    ContainerDevices,
    PodDevices,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo

ENV_DISABLE_CONTROL = gpu_admin.ENV_DISABLE_CONTROL
"""HAMi leaves the preload out for a container that sets it true (v2.10 plugin/server.go
866-883), so HAMi-core never loads and nothing limits it. Any pod author could, also through
an envFrom admission cannot read: we leave it out only in a namespace labelled
`hami-plugin.io/gpu-admin=true` (`AllocateConfig.gpu_admin_namespace`)."""


# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocateConfig:
    """The stable configuration Allocate depends on (kubelet replays responses, so nothing else).

    `libvgpu_host_path` is the HAMi-core library the edge found (`hamicore.HamiCoreCheck`;
    None: `<hook>/vgpu/libvgpu.so`); `license_present` says whether `<hook>/vgpu/license`
    exists. `library_problem` and `preload_problem` say, naming the node and the file, why
    HAMi-core cannot be handed out (None: nothing wrong): every container needs the library,
    every one that gets the preload (`gets_preload`) the preload.
    `device_list` is how the GPU list reaches the runtime (`deviceplugin.device_list`).
    """

    gpu_admin_namespace: Callable[[str], bool] | None = None
    """Whether a namespace is labelled `hami-plugin.io/gpu-admin=true` (the adapter reads it
    from the API server), asked only for a container that sets `CUDA_DISABLE_CONTROL=true`; it
    answers False when it cannot tell. None: no namespace is (every container gets the
    preload)."""
    hook_path: str = hostpaths.DEFAULT_HOOK_PATH
    memory_scaling: float = 1.0
    libcuda_log_level: str | None = None
    disable_core_limit: bool = False
    enable_preferred_allocation: bool = True
    vgpulock_host_path: str = hostpaths.VGPU_LOCK_HOST_PATH
    libvgpu_host_path: str | None = None
    license_present: bool = False
    library_problem: str | None = None
    preload_problem: str | None = None
    device_list: DeviceListConfig = field(default_factory=DeviceListConfig)
    mig_mode: bool = False
    """A dynamic-MIG node (`operatingmode: mig`): containers get MIG instances, not HAMi-core,
    so a missing HAMi-core refuses nothing (`deviceplugin.mig.allocate`)."""


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
    BOOKING_NOT_SIGNED = "BookingNotSigned"
    """A booking key is configured and the pod's booking is not the one the scheduler signed
    (no or a wrong signature, or a to-allocate that is not the signed booking)."""
    HAMI_CORE_MISSING = "HamiCoreMissing"
    """HAMi-core's library, or the preload a container needs, is not installed on the node:
    the container would fail on its mount or run without limits."""
    MIG_ALLOCATION_FAILED = "MigAllocationFailed"
    """Dynamic MIG: the container's MIG reservations do not fit its booking, or an instance
    could not be created (`deviceplugin.mig.allocate`)."""


class AllocateFailure(Exception):  # noqa: N818 - an answer to kubelet, not a bug
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
    which the container got instead (the edge logs them). `annotations` and `cdi_devices` are
    the CDI strategies' part of the response (empty without them).
    """

    container_name: str
    entry_index: int
    devices: ContainerDevices
    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    host_dir: str
    kubelet_ids_not_used: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    @property
    def gpu_list(self) -> str:
        """The container's GPUs as a comma list of UUIDs (for logs: with a CDI or the
        volume-mounts strategy `NVIDIA_VISIBLE_DEVICES` is absent or a path)."""
        return ",".join(dict.fromkeys(device.uuid for device in self.devices))


@dataclass(frozen=True, slots=True)
class AllocationDecision:
    """What Allocate does to the pod: the responses, the new to-allocate value, and whether the
    pod is complete (every entry consumed, so `hami.io/bind-phase` becomes `success`)."""

    containers: tuple[ContainerAllocation, ...]
    remaining_to_allocate: str
    complete: bool


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


def entries_to_allocate(pod: PodInfo) -> PodDevices:
    """The pod's to-allocate entries, as its booking reads them (none when absent).

    Raises AllocateFailure(MALFORMED_ANNOTATION) naming the key and the bad part, also for a
    negative memory or cores value.
    """
    try:
        entries = pod.booking.to_allocate if pod.booking is not None else None
    except ValueError as error:
        raise AllocateFailure(FailureReason.MALFORMED_ANNOTATION, str(error)) from error
    for index, entry in enumerate(entries or ()):
        for device in entry:
            # HAMi-core would get "-3000m" as a memory limit: no scheduler writes that.
            if device.used_mem_mib < 0 or device.used_cores < 0:
                raise AllocateFailure(
                    FailureReason.MALFORMED_ANNOTATION,
                    f"{ANNOTATION_DEVICES_TO_ALLOCATE}: entry {index} device {device.uuid}: "
                    f"negative memory ({device.used_mem_mib}) or cores ({device.used_cores})",
                )
    return entries or ()


def _entry_text(entry: ContainerDevices) -> str:
    return codec.encode_container_devices(entry, ANNOTATION_DEVICES_TO_ALLOCATE) or "(none)"


def to_allocate_problem(booking: PodBooking) -> str | None:
    """Why the booking's to-allocate is not its booked devices with some entries consumed; None
    when it is. For a booking whose signature verified: the signature proves the booking
    (`-allocated`), not what was written into to-allocate since.

    Our Allocate only ever empties entries, so each must equal the booked one or be empty.
    Empty entries past the end on either side do not count (every Allocate's write re-encodes
    the list with a trailing empty entry). A missing or unreadable to-allocate is no problem
    here: nothing can be served from it (`decide_allocation` says why).
    """
    try:
        current = booking.to_allocate
    except ValueError:
        return None
    if current is None:
        return None
    mismatch = f"{ANNOTATION_DEVICES_TO_ALLOCATE} does not match the signed booking"
    try:
        booked = booking.allocated or ()
    except ValueError as error:
        return f"{mismatch}: the booking does not decode: {error}"
    for index in range(max(len(current), len(booked))):
        entry = current[index] if index < len(current) else ()
        booked_entry = booked[index] if index < len(booked) else ()
        if entry and entry != booked_entry:
            return (
                f"{mismatch} ({ANNOTATION_DEVICES_ALLOCATED}): entry {index} is "
                f"{_entry_text(entry)}, booked {_entry_text(booked_entry)}"
            )
    return None


def with_entries_consumed(pod: PodInfo, served: Collection[int]) -> PodInfo:
    """`pod` read with the to-allocate entries at the indexes `served` consumed, whatever the
    annotation says; the pod itself when none of them is offered there.

    For entries this process has served already (`allocator.ServedEntries`): the author of a
    signed pod can write a consumed entry back (it still equals the booking, so
    `to_allocate_problem` sees nothing wrong), and a later container would get its GPUs again.
    A missing or unreadable to-allocate is left as it is (nothing is served from it).
    """
    booking = pod.booking
    if booking is None or not served:
        return pod
    consumed = booking.consumed(served)
    try:
        if consumed.to_allocate == booking.to_allocate:
            return pod
    except ValueError:
        return pod
    return pod.with_booking(consumed)


def _container_at(pod: PodInfo, index: int) -> ContainerSpec:
    # v2.9+ indexes: init containers first, then app containers (docs/hami-reference.md 1.4.4).
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
    devices: ContainerDevices,
    config: AllocateConfig,
    cache_id: str,
    device_list: DeviceListAnswer | None = None,
) -> dict[str, str]:
    """One container's environment, in HAMi's order (docs/hami-reference.md 4.4): the device
    list strategies' (`device_list`; None: computed from `config.device_list`, which needs no
    response id unless `cdi-annotations` is on), then HAMi-core's (HAMi v2.10 plugin/server.go
    826-847: `getAllocateResponse` first, HAMi-core's on top)."""
    if device_list is None:
        device_list = device_list_answer((d.uuid for d in devices), config.device_list, "")
    envs = dict(device_list.envs)
    for position, device in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{device.used_mem_mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].used_cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = hostpaths.shared_cache_path(
        config.hook_path, cache_id
    )
    if config.memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if config.libcuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = config.libcuda_log_level
    if config.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    return envs


def _go_parse_bool_true(value: str | None) -> bool:
    # HAMi reads CUDA_DISABLE_CONTROL with Go's ParseBool; anything unparsable counts as false.
    if value is None:
        return False
    try:
        return govalues.parse_go_bool(value)
    except ValueError:
        return False


def gets_preload(namespace: str, container: ContainerSpec, config: AllocateConfig) -> bool:
    """HAMi-core's preload goes into every container but one that sets
    `CUDA_DISABLE_CONTROL=true` in a gpu-admin namespace (`ENV_DISABLE_CONTROL`)."""
    if not _go_parse_bool_true(container.env.get(ENV_DISABLE_CONTROL)):
        return True
    return config.gpu_admin_namespace is None or not config.gpu_admin_namespace(namespace)


def check_hamicore(config: AllocateConfig, preload: bool = True) -> None:
    """Refuse a container HAMi-core cannot be handed to: the library is missing, or the
    preload is while the container gets it (`gets_preload`).

    Raises AllocateFailure(HAMI_CORE_MISSING) with the config's problem sentence.
    """
    if config.library_problem is not None:
        raise AllocateFailure(FailureReason.HAMI_CORE_MISSING, config.library_problem)
    if config.preload_problem is not None and preload:
        raise AllocateFailure(FailureReason.HAMI_CORE_MISSING, config.preload_problem)


def container_mounts(
    host_dir: str,
    config: AllocateConfig,
    device_list: DeviceListAnswer | None = None,
    *,
    preload: bool = True,
) -> tuple[MountSpec, ...]:
    """One container's mounts, in HAMi's order (docs/hami-reference.md 4.4): the
    `volume-mounts` strategy's (`/dev/null` at `/var/run/nvidia-container-devices/<uuid>`,
    read-write as HAMi's, when `device_list` has them), then HAMi-core's."""
    hook = config.hook_path
    library = hostpaths.libvgpu_path(hook)
    mounts = [
        MountSpec(container_path=path, host_path=VOLUME_MOUNTS_HOST_PATH, read_only=False)
        for path in (device_list.mount_paths if device_list is not None else ())
    ]
    mounts += [
        MountSpec(
            container_path=library,
            host_path=config.libvgpu_host_path or library,
            read_only=True,
        ),
        MountSpec(container_path=hostpaths.vgpu_dir(hook), host_path=host_dir, read_only=False),
        MountSpec(
            container_path=hostpaths.VGPU_LOCK_CONTAINER_PATH,
            host_path=config.vgpulock_host_path,
            read_only=False,
        ),
    ]
    if preload:  # `gets_preload`
        mounts.append(
            MountSpec(
                container_path=hostpaths.LD_SO_PRELOAD_CONTAINER_PATH,
                host_path=hostpaths.ld_so_preload_path(hook),
                read_only=True,
            )
        )
    if config.license_present:
        mounts.append(
            MountSpec(
                container_path=hostpaths.LICENSE_CONTAINER_PATH,
                host_path=hostpaths.license_path(hook),
                read_only=True,
            )
        )
        mounts.append(
            MountSpec(
                container_path=hostpaths.VGPU_VALIDATOR_CONTAINER_PATH,
                host_path=hostpaths.vgpu_validator_path(hook),
                read_only=True,
            )
        )
    return tuple(mounts)


def decide_allocation(
    pod: PodInfo,
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
    host directory would be shared with other pods), HAMI_CORE_MISSING (`check_hamicore`).
    Without preferred-allocation alignment an annotated GPU that `advertised` does not cover
    is MALFORMED_ANNOTATION.
    """
    check_requests(requests)
    if advertised is not None:
        check_device_ids(requests, advertised)
    if not pod.uid:
        raise AllocateFailure(
            FailureReason.INVALID_POD,
            f"pod {pod.namespace}/{pod.name} has no uid: cannot name its host directory",
        )
    entries = list(entries_to_allocate(pod))
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
        preload = gets_preload(pod.namespace, container, config)
        if not config.mig_mode:
            check_hamicore(config, preload)
        overridden: tuple[str, ...] = ()
        if config.enable_preferred_allocation and not config.mig_mode:  # HAMi server.go:807
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
        host_dir = hostpaths.container_dir(config.hook_path, pod.uid, container.name)
        # HAMi names the CDI annotation with a fresh UUIDv4 before the shared cache's.
        response_id = (
            new_cache_id()
            if DeviceListStrategy.CDI_ANNOTATIONS in config.device_list.strategies
            else ""
        )
        device_list = device_list_answer((d.uuid for d in devices), config.device_list, response_id)
        answers.append(
            ContainerAllocation(
                container_name=container.name,
                entry_index=next_index,
                devices=devices,
                envs=container_envs(devices, config, new_cache_id(), device_list),
                mounts=container_mounts(host_dir, config, device_list, preload=preload),
                host_dir=host_dir,
                kubelet_ids_not_used=overridden,
                annotations=device_list.annotations,
                cdi_devices=device_list.cdi_devices,
            )
        )
        entries[next_index] = ()
    return AllocationDecision(
        containers=tuple(answers),
        remaining_to_allocate=codec.encode_pod_devices(tuple(entries)),
        complete=not any(entries),
    )
