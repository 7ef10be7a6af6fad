"""Fit a pod's GPU requests onto one node, check by check as HAMi does (reference 3.5, 3.7).

For one container: score every GPU with the request, sort them by the pod's `GpuOrder`, keep
the NVIDIA candidates, and walk them **from the end**; each GPU passes the checks of reference
3.5.2 in HAMi's order or counts one `FitReason`, and the walk stops as soon as enough GPUs
passed. A failure is data (`FitFailure`: reason counts over the candidates); the HAMi string
`"n/N Reason, ..."` is made by `render_failure` at the edge.

For a pod: init containers each fit against the node's usage as it is (they run one after
another), app containers one after another on one copy that books what the earlier ones took.

Not implemented (documented): the namespace quota check (`ResourceQuotaNotFit`) and the
`topology-aware` pair-score choice (such pods are placed by the plain walk); MIG-mode GPUs are
never picked (`CardMigTopologyInfeasible`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami_plugin.model import (
    NVIDIA_DEVICE_TYPE,
    ContainerDevice,
    ContainerDevices,
    GpuDevice,
    GpuPolicy,
    GpuPolicyName,
    PodDevices,
    PodGpuOptions,
    ScoringWeights,
)
from hami_plugin.scheduler.policy import GpuOrder, gpu_order
from hami_plugin.scheduler.requests import ContainerRequest, PodRequests
from hami_plugin.scheduler.score import device_score
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "FitContext",
    "FitFailure",
    "FitReason",
    "PodFit",
    "fit_container",
    "fit_pod",
    "render_failure",
]

MODE_MIG = "mig"


class FitReason(enum.StrEnum):
    """Why a GPU (or a node) cannot take a request; values are HAMi's names."""

    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    NUMA_NOT_FIT = "NumaNotFit"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    # Node-level reasons: HAMi reports these as bare strings, without counts.
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    NODE_UNREGISTERED = "node unregistered"


@dataclass(frozen=True, slots=True)
class FitFailure:
    """Why a node cannot take the pod.

    Either a node-level reason (`node_reason`) or, per reason, how many of the `candidates`
    GPUs failed with it (`counts`, sorted by reason name).
    """

    counts: tuple[tuple[FitReason, int], ...] = ()
    candidates: int = 0
    node_reason: FitReason | None = None


NODE_UNREGISTERED = FitFailure(node_reason=FitReason.NODE_UNREGISTERED)
NODE_INSUFFICIENT_DEVICE = FitFailure(node_reason=FitReason.NODE_INSUFFICIENT_DEVICE)


def render_failure(failure: FitFailure) -> str:
    """HAMi's FailedNodes string: `"<n>/<N> <Reason>"` per reason, sorted as strings, joined
    with `", "`; node-level reasons bare (`NodeInsufficientDevice`, `node unregistered`)."""
    if failure.node_reason is not None:
        return failure.node_reason.value
    return ", ".join(
        sorted(f"{count}/{failure.candidates} {reason.value}" for reason, count in failure.counts)
    )


def _failure(counts: dict[FitReason, int], candidates: int) -> FitFailure:
    return FitFailure(tuple(sorted(counts.items())), candidates)


@dataclass(frozen=True, slots=True)
class FitContext:
    """Everything about the pod that the checks need, resolved once per decision."""

    order: GpuOrder
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    numa_bind: bool = False
    mutex: bool = False
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    vgpu_mode: str | None = None
    _type_cache: dict[tuple[str, str], bool] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def for_pod(
        cls,
        options: PodGpuOptions,
        default_policy: GpuPolicy,
        default_weights: ScoringWeights | None = None,
        numa_grouped_order: bool = False,
    ) -> FitContext:
        """Resolve the pod's annotations against the scheduler defaults."""
        policy = options.gpu_policy or default_policy
        return cls(
            order=gpu_order(policy, options.numa_bind, numa_grouped_order),
            weights=options.scoring_weights or default_weights or ScoringWeights(),
            numa_bind=options.numa_bind,
            mutex=policy.has(GpuPolicyName.MUTEX),
            use_types=tuple(item.upper() for item in options.use_gpu_types),
            nouse_types=tuple(item.upper() for item in options.nouse_gpu_types),
            use_uuids=frozenset(options.use_gpu_uuids),
            nouse_uuids=frozenset(options.nouse_gpu_uuids),
            vgpu_mode=options.vgpu_mode,
        )

    def type_allowed(self, device: GpuDevice) -> bool:
        """`nvidia.com/use-gputype`, `nouse-gputype` (case-insensitive substrings of the card
        type) and `nvidia.com/vgpu-mode` (must contain the GPU's mode)."""
        key = (device.type, device.mode)
        allowed = self._type_cache.get(key)
        if allowed is None:
            card = device.type.upper()
            allowed = (
                (not self.use_types or any(item in card for item in self.use_types))
                and not any(item in card for item in self.nouse_types)
                and (self.vgpu_mode is None or device.mode in self.vgpu_mode)
            )
            self._type_cache[key] = allowed
        return allowed

    def uuid_allowed(self, uuid: str) -> bool:
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


def _check_before_numa(device: GpuDevice, node: NodeUsage, context: FitContext) -> FitReason | None:
    if not device.healthy:
        return FitReason.CARD_NOT_HEALTH
    if device.uuid in node.cordoned:
        return FitReason.CARD_CORDONED
    if not context.type_allowed(device):
        return FitReason.CARD_TYPE_MISMATCH
    return None


def _check_after_numa(
    device: GpuDevice,
    used: int,
    used_memory_mib: int,
    used_cores: int,
    memory_mib: int,
    cores: int,
    context: FitContext,
) -> FitReason | None:
    if not context.uuid_allowed(device.uuid):
        return FitReason.CARD_UUID_MISMATCH
    if device.split_count <= used:
        return FitReason.CARD_TIME_SLICING_EXHAUSTED
    if context.mutex and used > 0:
        return FitReason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if device.memory_mib - used_memory_mib < memory_mib:
        return FitReason.CARD_INSUFFICIENT_MEMORY
    if device.cores_percent - used_cores < cores:
        return FitReason.CARD_INSUFFICIENT_CORE
    if device.cores_percent == 100 and cores == 100 and used > 0:
        return FitReason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if device.cores_percent != 0 and used_cores == device.cores_percent and cores == 0:
        return FitReason.CARD_COMPUTE_UNITS_EXHAUSTED
    if device.mode == MODE_MIG:
        return FitReason.CARD_MIG_TOPOLOGY_INFEASIBLE
    return None


@dataclass(frozen=True, slots=True)
class _Picked:
    positions: tuple[int, ...]
    devices: ContainerDevices


def sorted_candidates(
    node: NodeUsage,
    used: Sequence[int],
    used_memory_mib: Sequence[int],
    used_cores: Sequence[int],
    request: ContainerRequest | None,
    context: FitContext,
) -> list[int]:
    """The node's NVIDIA candidate positions in the pod's GPU order (Fit walks from the end)."""
    order = context.order
    devices = node.devices
    candidates = node.candidates
    if order.uses_score:
        keys = {
            position: order.key(
                device_score(
                    devices[position].split_count,
                    devices[position].cores_percent,
                    devices[position].memory_mib,
                    used[position],
                    used_cores[position],
                    used_memory_mib[position],
                    request,
                    context.weights,
                ),
                devices[position].numa_node,
                used[position],
                devices[position].index,
            )
            for position in candidates
        }
    else:
        keys = {
            position: order.key(
                0.0, devices[position].numa_node, used[position], devices[position].index
            )
            for position in candidates
        }
    return sorted(candidates, key=keys.__getitem__)


def _walk(
    node: NodeUsage,
    order: Sequence[int],
    used: Sequence[int],
    used_memory_mib: Sequence[int],
    used_cores: Sequence[int],
    request: ContainerRequest,
    context: FitContext,
) -> _Picked | FitFailure:
    devices = node.devices
    cores = min(request.cores_percent, 100)  # HAMi clamps Coresreq to 100 in Fit
    needed = request.count
    previous_numa = -1
    picked: list[tuple[int, ContainerDevice]] = []
    counts: dict[FitReason, int] = {}
    for position in reversed(order):
        device = devices[position]
        reason = _check_before_numa(device, node, context)
        if reason is None and context.numa_bind and device.numa_node != previous_numa:
            # A new NUMA node: what was picked on the previous one does not count.
            if picked:
                counts[FitReason.NUMA_NOT_FIT] = counts.get(FitReason.NUMA_NOT_FIT, 0) + len(picked)
            needed = request.count
            previous_numa = device.numa_node
            picked = []
        if reason is None:
            memory_mib = request.memory_on(device.memory_mib)
            reason = _check_after_numa(
                device,
                used[position],
                used_memory_mib[position],
                used_cores[position],
                memory_mib,
                cores,
                context,
            )
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
            continue
        picked.append(
            (position, ContainerDevice(device.uuid, NVIDIA_DEVICE_TYPE, memory_mib, cores))
        )
        needed -= 1
        if needed == 0:
            return _Picked(
                tuple(position for position, _ in picked),
                tuple(chosen for _, chosen in picked),
            )
    if picked:
        counts[FitReason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
    return _failure(counts, len(order))


def fit_container(
    node: NodeUsage,
    request: ContainerRequest,
    context: FitContext,
    used: Sequence[int] | None = None,
    used_memory_mib: Sequence[int] | None = None,
    used_cores: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], ContainerDevices] | FitFailure:
    """Fit one container's request on the node (optionally on usage other than the node's).

    Returns the picked GPU positions and devices, in pick order, or the failure.
    """
    used = node.used if used is None else used
    used_memory_mib = node.used_memory_mib if used_memory_mib is None else used_memory_mib
    used_cores = node.used_cores if used_cores is None else used_cores
    if request.count > len(node.candidates):
        return NODE_INSUFFICIENT_DEVICE
    order = sorted_candidates(node, used, used_memory_mib, used_cores, request, context)
    result = _walk(node, order, used, used_memory_mib, used_cores, request, context)
    if isinstance(result, FitFailure):
        return result
    return result.positions, result.devices


@dataclass(frozen=True, slots=True)
class PodFit:
    """The GPUs each container gets on the node: one entry per container, init containers
    first, an empty entry for a container without a GPU request."""

    devices: PodDevices


def fit_pod(node: NodeUsage, requests: PodRequests, context: FitContext) -> PodFit | FitFailure:
    """Fit every container of the pod on the node (reference 3.7); the first failing
    container's failure is the node's."""
    entries: list[ContainerDevices] = []
    for request in requests.init_requests:
        if request is None:
            entries.append(())
            continue
        result = fit_container(node, request, context)
        if isinstance(result, FitFailure):
            return result
        entries.append(result[1])
    app = requests.app_requests
    remaining = sum(request is not None for request in app)
    used: Sequence[int] = node.used
    used_memory_mib: Sequence[int] = node.used_memory_mib
    used_cores: Sequence[int] = node.used_cores
    booked: tuple[list[int], list[int], list[int]] | None = None
    for request in app:
        if request is None:
            entries.append(())
            continue
        result = fit_container(node, request, context, used, used_memory_mib, used_cores)
        if isinstance(result, FitFailure):
            return result
        positions, devices = result
        entries.append(devices)
        remaining -= 1
        if remaining:
            # Later app containers see what this one took; the node itself stays untouched.
            if booked is None:
                booked = (list(used), list(used_memory_mib), list(used_cores))
                used, used_memory_mib, used_cores = booked
            for position, device in zip(positions, devices, strict=True):
                booked[0][position] += 1
                booked[1][position] += device.used_mem_mib
                booked[2][position] += device.used_cores
    return PodFit(tuple(entries))
