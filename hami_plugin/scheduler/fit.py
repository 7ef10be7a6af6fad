"""Fit a pod's GPU requests onto one node, check by check as HAMi does
(docs/hami-reference.md 3.5, 3.7).

For one container: score every GPU with the request, sort them by the pod's `GpuOrder`, keep
the NVIDIA candidates, and walk them **from the end**; each GPU passes the checks of
docs/hami-reference.md 3.5.2 in HAMi's order or counts one `FitReason`, and the walk stops as soon
as enough GPUs passed. A failure is data (`FitFailure`: reason counts over the candidates); the HAMi
string `"n/N Reason, ..."` is made by `render_failure` at the edge.

For a pod: init containers each fit against the node's usage as it is (they run one after
another), app containers one after another on one copy that books what the earlier ones took.
As in HAMi, where every container re-sorts the same device list in place, an app container's
sort starts from the order the previous GPU container left behind, so GPUs that compare equal
keep that order (the first container, and every init container, start from index order).

Two counts are numbers of GPUs picked, as in HAMi v2.10 (`pkg/device/nvidia/device.go`, Fit,
lines 746-754 and 871-873: `len(tmpDevs[k.Type])`): `NumaNotFit` grows by the number of GPUs
picked on a NUMA node each time the walk leaves it, and `AllocatedCardsInsufficientRequest` is
the number of GPUs picked when the walk ends short (v2.10's `device_test.go` expects
`2/2 AllocatedCardsInsufficientRequest` for 3 asked of 2 free GPUs). HAMi v2.8 and v2.9 added
`len(tmpDevs)`, the size of the per-type map, which was always 1.

The namespace quota check (`ResourceQuotaNotFit`, check 10) is HAMi v2.10's `fitQuota`
(`pkg/device/nvidia/device.go:666-691`): for each GPU, the pod's devices so far in this phase
(earlier init containers for an init container, earlier app containers for an app container,
only containers with GPUs), this container's picks and this GPU, collapsed as
`CollapseInitContainerUsage` collapses them with the pod's init-container count (so, as in
HAMi, the first app containers of a pod with init containers count by their peak), summed, must
fit the namespace quota (`FitContext.quota`). The check depends on what was picked before, so a
pod with a quota is fitted without the score-free screening.

With the `topology-aware` policy the walk is HAMi v2.10's (device.go Fit, lines 724, 830-868):
it does not stop when enough GPUs passed but collects every GPU that passes (with numa-bind,
those of the last NUMA node it walks, and `NumaNotFit` is never counted, as `k.Nums` never
moves there), then `policy.topology_choice` picks among them by the node's pair scores
(`NodeUsage.pair_scores`). Such a walk is never screened.

Dynamic MIG (HAMi v2.10, device.go:602-664 and 714-875, score.go:54-140): on a node with a
MIG-mode candidate GPU the walk carries a `MigView` and follows HAMi's loop literally. After
every other check a MIG-mode GPU must still give the request a profile at a free placement
(`CustomFilterRule`: the placements in use plus this container's earlier picks on that GPU, each
replayed with its own memory; else `CardMigTopologyInfeasible`), and after a pick the walk
visits the same GPU again (`if dev.Mode == "mig" { i++ }`), so one GPU can give a container
several MIG instances (and a request may ask more devices than the node has GPUs:
`isMIGRequest`). Once a container fits, each booked MIG device becomes its profile
(`AddResourceUsage`: the profile's memory and cores, the profile and placement recorded, the
placement in use for the later containers of the phase; "AddResourceUsage failed for device
<uuid>: ..." when none is left); `PodFit.mig` holds the reservations, indexed as HAMi's
`EncodeMigAllocations` indexes them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import (
    NVIDIA_DEVICE_TYPE,
    ContainerDevice,
    ContainerDevices,
    GpuDevice,
    GpuPolicy,
    GpuPolicyName,
    MigPlacement,
    PodDevices,
    PodGpuOptions,
    ScoringWeights,
)
from hami_plugin.protocol.usage import collapse_pod_devices
from hami_plugin.scheduler.mig import select_mig_candidate
from hami_plugin.scheduler.policy import GpuOrder, SortKey, gpu_order, topology_choice
from hami_plugin.scheduler.requests import ContainerRequest, PodRequests
from hami_plugin.scheduler.score import device_score
from hami_plugin.scheduler.usage import MODE_MIG, NodeUsage

__all__ = [
    "FitContext",
    "FitFailure",
    "FitReason",
    "MigView",
    "PodFit",
    "QuotaFit",
    "fit_container",
    "fit_pod",
    "render_failure",
    "sorted_candidates",
]


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
    GPUs failed with it (`counts`, sorted by reason name). `detail` is a failure HAMi reports
    as a sentence of its own (`AddResourceUsage failed for device ...`, score.go:125-128).
    """

    counts: tuple[tuple[FitReason, int], ...] = ()
    candidates: int = 0
    node_reason: FitReason | None = None
    detail: str = ""


NODE_UNREGISTERED = FitFailure(node_reason=FitReason.NODE_UNREGISTERED)
NODE_INSUFFICIENT_DEVICE = FitFailure(node_reason=FitReason.NODE_INSUFFICIENT_DEVICE)


def render_failure(failure: FitFailure) -> str:
    """HAMi's FailedNodes string: `"<n>/<N> <Reason>"` per reason, sorted as strings, joined
    with `", "`; node-level reasons bare (`NodeInsufficientDevice`, `node unregistered`)."""
    if failure.detail:
        return failure.detail
    if failure.node_reason is not None:
        return failure.node_reason.value
    return ", ".join(
        sorted(f"{count}/{failure.candidates} {reason.value}" for reason, count in failure.counts)
    )


def _failure(counts: dict[FitReason, int], candidates: int) -> FitFailure:
    return FitFailure(tuple(sorted(counts.items())), candidates)


QuotaFit = Callable[[int, int], bool]
"""The namespace quota's verdict on the pod's total MiB and cores (HAMi's `FitQuota` with the
memory factor applied); see `scheduler/quota.py`."""


@dataclass(frozen=True, slots=True)
class FitContext:
    """Everything about the pod that the checks need, resolved once per decision.

    `use_types`/`use_uuids` are None when the pod sets no such constraint; an empty value
    means the annotation is set but lists nothing (every GPU mismatches). Card types are kept
    upper-cased. `vgpu_mode` is the annotation as written (None when absent; `""` admits only
    GPUs without a mode, as HAMi's substring test does). `quota` is set only when the pod's
    namespace has a GPU quota limit (None: no check, HAMi's `FitQuota` returns true);
    `init_count` is the pod's number of init containers, which the quota collapse needs.
    """

    order: GpuOrder
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    numa_bind: bool = False
    mutex: bool = False
    topology: bool = False
    """The `topology-aware` policy: collect every passing GPU, then pick by pair scores."""
    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] | None = None
    nouse_uuids: frozenset[str] = frozenset()
    vgpu_mode: str | None = None
    quota: QuotaFit | None = None
    init_count: int = 0
    _type_cache: dict[tuple[str, str], bool] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def for_pod(
        cls,
        options: PodGpuOptions,
        default_policy: GpuPolicy,
        numa_grouped_order: bool = False,
    ) -> FitContext:
        """Resolve the pod's parsed annotations against the scheduler defaults."""
        policy = options.gpu_policy or default_policy
        use_types = options.use_gpu_types
        return cls(
            order=gpu_order(policy, options.numa_bind, numa_grouped_order),
            weights=options.scoring_weights or ScoringWeights(),
            numa_bind=options.numa_bind,
            mutex=policy.has(GpuPolicyName.MUTEX),
            topology=policy.has(GpuPolicyName.TOPOLOGY_AWARE),
            use_types=None if use_types is None else tuple(item.upper() for item in use_types),
            nouse_types=tuple(item.upper() for item in options.nouse_gpu_types or ()),
            use_uuids=None if options.use_gpu_uuids is None else frozenset(options.use_gpu_uuids),
            nouse_uuids=frozenset(options.nouse_gpu_uuids or ()),
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
                (self.use_types is None or any(item in card for item in self.use_types))
                and not any(item in card for item in self.nouse_types)
                and (self.vgpu_mode is None or device.mode in self.vgpu_mode)
            )
            self._type_cache[key] = allowed
        return allowed

    def mig_request(self, node: NodeUsage) -> bool:
        """HAMi's `isMIGRequest`: the node has a MIG-mode candidate GPU and the pod's
        `vgpu-mode` (if set) names `mig`. Such a request skips the `NodeInsufficientDevice`
        count check (a MIG GPU can host several instances)."""
        if self.vgpu_mode is not None and MODE_MIG not in self.vgpu_mode:
            return False
        devices = node.devices
        return any(devices[position].mode == MODE_MIG for position in node.candidates)


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
    base: Sequence[int] | None = None,
) -> list[int]:
    """The node's NVIDIA candidate positions in the pod's GPU order (Fit walks from the end).

    The sort is stable and starts from `base` (default: the candidates in index order), so
    GPUs that compare equal keep their order in `base`. GPU scores (which read the memory and
    cores in use and the request) are computed only when the order uses them.
    """
    order = context.order
    devices = node.devices
    candidates = node.candidates if base is None else base
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
    allocated: Sequence[ContainerDevices] = (),
    mig: MigView | None = None,
) -> _Picked | FitFailure:
    """HAMi's Fit loop (docs/hami-reference.md 3.5.2): GPUs from the end of `order`, checks in
    HAMi's order, the first failing check counted, stop when enough GPUs passed. `allocated`:
    the pod's devices in this phase so far, for the quota check. On a node with a MIG-mode
    GPU (`mig`: the placements in use in this phase, the node's own when None), check 15 is
    HAMi's `CustomFilterRule` (`CardMigTopologyInfeasible`) and after a pick on a MIG-mode GPU
    the same GPU is visited again (device.go:846-848), every check re-run."""
    if mig is None and node.has_mig:
        mig = MigView(node)
    devices = node.devices
    cordoned = node.cordoned
    type_allowed = context.type_allowed
    use_uuids, nouse_uuids = context.use_uuids, context.nouse_uuids
    numa_bind, mutex = context.numa_bind, context.mutex
    topology = context.topology
    quota = context.quota
    cores = min(request.cores_percent, 100)  # 8. HAMi clamps Coresreq to 100 (sticky)
    needed = request.count
    previous_numa = -1
    picked: list[int] = []
    booked: list[int] = []
    counts: dict[FitReason, int] = {}
    index = len(order)
    while index:
        index -= 1
        position = order[index]
        device = devices[position]
        if not device.healthy:  # 1.
            reason = FitReason.CARD_NOT_HEALTH
        elif device.uuid in cordoned:  # 2.
            reason = FitReason.CARD_CORDONED
        elif not type_allowed(device):  # 3.
            reason = FitReason.CARD_TYPE_MISMATCH
        else:
            if numa_bind and device.numa_node != previous_numa:  # 4.
                # A new NUMA node: what was picked on the previous one does not count, and
                # every GPU picked there counts as NumaNotFit (v2.10 device.go:748 adds
                # len(tmpDevs[k.Type]), the GPUs picked so far).
                if picked and not topology:
                    so_far = counts.get(FitReason.NUMA_NOT_FIT, 0)
                    counts[FitReason.NUMA_NOT_FIT] = so_far + len(picked)
                needed = request.count
                previous_numa = device.numa_node
                picked, booked = [], []
            in_use = used[position]
            memory_mib = request.memory_on(device.memory_mib)  # 9. per GPU
            if (  # 5.
                use_uuids is not None and device.uuid not in use_uuids
            ) or device.uuid in nouse_uuids:
                reason = FitReason.CARD_UUID_MISMATCH
            elif device.split_count <= in_use:  # 6.
                reason = FitReason.CARD_TIME_SLICING_EXHAUSTED
            elif mutex and in_use > 0:  # 7.
                reason = FitReason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
            elif quota is not None and not _quota_fits(  # 10.
                quota, allocated, devices, picked, booked, position, memory_mib, cores, context
            ):
                reason = FitReason.RESOURCE_QUOTA_NOT_FIT
            elif device.memory_mib - used_memory_mib[position] < memory_mib:  # 11.
                reason = FitReason.CARD_INSUFFICIENT_MEMORY
            elif device.cores_percent - used_cores[position] < cores:  # 12.
                reason = FitReason.CARD_INSUFFICIENT_CORE
            elif device.cores_percent == 100 and cores == 100 and in_use > 0:  # 13.
                reason = FitReason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
            elif (  # 14.
                device.cores_percent != 0
                and used_cores[position] == device.cores_percent
                and cores == 0
            ):
                reason = FitReason.CARD_COMPUTE_UNITS_EXHAUSTED
            elif (  # 15.
                mig is not None
                and device.mode == MODE_MIG
                and not _mig_filter(
                    device, mig.occupied(position), devices, picked, booked, memory_mib
                )
            ):
                reason = FitReason.CARD_MIG_TOPOLOGY_INFEASIBLE
            else:  # 16.-17. pick; done when enough GPUs passed
                picked.append(position)
                booked.append(memory_mib)
                if not topology:
                    needed -= 1
                    if needed == 0:
                        return _Picked(
                            tuple(picked),
                            tuple(
                                ContainerDevice(
                                    devices[chosen].uuid, NVIDIA_DEVICE_TYPE, mib, cores
                                )
                                for chosen, mib in zip(picked, booked, strict=True)
                            ),
                        )
                if mig is not None and device.mode == MODE_MIG:
                    index += 1  # the same MIG GPU again
                continue
        counts[reason] = counts.get(reason, 0) + 1
    return _walk_end(node, picked, booked, counts, request, context, cores, len(order))


def _walk_end(
    node: NodeUsage,
    picked: list[int],
    booked: list[int],
    counts: dict[FitReason, int],
    request: ContainerRequest,
    context: FitContext,
    cores: int,
    candidates: int,
) -> _Picked | FitFailure:
    """The end of HAMi's Fit loop (device.go:849-874): the `topology-aware` choice among the
    GPUs that passed, or the failure with `AllocatedCardsInsufficientRequest`."""
    devices = node.devices
    topology = context.topology
    if topology and len(picked) >= request.count:
        chosen = topology_choice(
            [devices[position].uuid for position in picked], request.count, node.pair_scores
        )
        return _Picked(
            tuple(picked[i] for i in chosen),
            tuple(
                ContainerDevice(devices[picked[i]].uuid, NVIDIA_DEVICE_TYPE, booked[i], cores)
                for i in chosen
            ),
        )
    if picked:
        # v2.10 device.go:871-872 sets len(tmpDevs[k.Type]): the GPUs picked (on the last
        # NUMA node with numa-bind), not 1 as v2.8/v2.9's len(tmpDevs) did.
        counts[FitReason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
    return _failure(counts, candidates)


class MigView:
    """The MIG placements in use during one phase of a pod's fit (HAMi's node copy's
    `MigAllocationsInUse`): the node's, plus what the phase's earlier containers booked."""

    __slots__ = ("_extra", "_node")

    def __init__(self, node: NodeUsage) -> None:
        self._node = node
        self._extra: dict[int, list[MigPlacement]] = {}

    def occupied(self, position: int) -> list[MigPlacement]:
        """The placements in use on the GPU at `position` (a new list)."""
        return [*self._node.occupied(position), *self._extra.get(position, ())]

    def add(self, position: int, placement: MigPlacement) -> None:
        self._extra.setdefault(position, []).append(placement)


def _mig_filter(
    device: GpuDevice,
    occupied: list[MigPlacement],
    devices: Sequence[GpuDevice],
    picked: Sequence[int],
    booked: Sequence[int],
    memory_mib: int,
) -> bool:
    """HAMi's `CustomFilterRule` for a MIG-mode GPU (device.go:602-619): this container's
    picks on the same GPU replayed, each with its own memory, onto the placements in use, and
    still a profile with a free placement for `memory_mib`."""
    profiles = device.mig_profiles
    for chosen, mib in zip(picked, booked, strict=True):
        if devices[chosen].uuid != device.uuid:
            continue
        candidate = select_mig_candidate(profiles, occupied, mib)
        if candidate is None:
            return False
        occupied.append(candidate[1])
    return select_mig_candidate(profiles, occupied, memory_mib) is not None


def _add_mig_usage(
    node: NodeUsage,
    positions: Sequence[int],
    picked: ContainerDevices,
    mig: MigView,
    container_index: int,
    reservations: list[MigAllocation],
) -> ContainerDevices | FitFailure:
    """HAMi's `AddResourceUsage` for one container's picks (device.go:645-664, called by
    fitInDevices, score.go:107-131): each MIG-mode GPU's device becomes the profile chosen for
    its memory at a placement free in `mig` (the placement then in use there), with the
    profile's memory and cores; the reservation is appended to `reservations`."""
    devices = node.devices
    out: list[ContainerDevice] = []
    for device_index, (position, booked) in enumerate(zip(positions, picked, strict=True)):
        device = devices[position]
        if device.mode != MODE_MIG:
            out.append(booked)
            continue
        candidate = select_mig_candidate(
            device.mig_profiles, mig.occupied(position), booked.used_mem_mib
        )
        if candidate is None:
            return FitFailure(
                detail=f"AddResourceUsage failed for device {device.uuid}: "
                "MIG profile and placement allocation failed"
            )
        profile, placement = candidate
        mig.add(position, placement)
        out.append(ContainerDevice(device.uuid, booked.type, profile.memory_mib, profile.cores))
        reservations.append(
            MigAllocation(container_index, device_index, device.uuid, profile.name, placement)
        )
    return tuple(out)


def _quota_fits(
    quota: QuotaFit,
    allocated: Sequence[ContainerDevices],
    devices: Sequence[GpuDevice],
    picked: Sequence[int],
    booked: Sequence[int],
    position: int,
    memory_mib: int,
    cores: int,
    context: FitContext,
) -> bool:
    """HAMi's `fitQuota` (device.go:666-691): the phase's devices so far plus this
    container's picks plus this GPU, collapsed, summed, against the namespace quota."""
    current = [
        ContainerDevice(devices[chosen].uuid, NVIDIA_DEVICE_TYPE, mib, cores)
        for chosen, mib in zip(picked, booked, strict=True)
    ]
    current.append(ContainerDevice(devices[position].uuid, NVIDIA_DEVICE_TYPE, memory_mib, cores))
    tallies = collapse_pod_devices((*allocated, tuple(current)), context.init_count)
    return quota(sum(t.memory_mib for t in tallies), sum(t.cores for t in tallies))


def _screening_order(
    node: NodeUsage, used: Sequence[int], context: FitContext, base: Sequence[int] | None
) -> Sequence[int] | None:
    """A GPU order, found without scores, whose walk gives the same verdict and the same
    failure counts as the pod's own order (None when there is none).

    Each GPU's checks depend only on that GPU, so without numa-bind the walk fails or
    succeeds, with the same counts, whatever the order. With numa-bind the order is NUMA
    first (`gpu_order` makes it so whenever it uses scores): the walk meets the NUMA groups
    in the same sequence, and the order inside a group changes neither verdict nor counts
    (a group the walk leaves, or ends in, had every GPU that passed picked, so the picked
    counts are the same too). Only which GPUs a fitting node hands out depends on the
    scores. An order without scores is the pod's own order (sorted from `base`).
    """
    order = context.order
    if not order.uses_score:
        return sorted_candidates(node, used, (), (), None, context, base)
    if not context.numa_bind:
        return node.candidates
    if not order.numa_first:
        return None
    devices = node.devices
    sign = -1 if order.keys[0] is SortKey.NUMA_DESC else 1
    return sorted(node.candidates, key=lambda position: sign * devices[position].numa_node)


def fit_container(
    node: NodeUsage,
    request: ContainerRequest,
    context: FitContext,
    used: Sequence[int] | None = None,
    used_memory_mib: Sequence[int] | None = None,
    used_cores: Sequence[int] | None = None,
    *,
    screen: bool = True,
) -> tuple[tuple[int, ...], ContainerDevices] | FitFailure:
    """Fit one container's request on the node (optionally on usage other than the node's).

    Returns the picked GPU positions and devices, in pick order, or the failure. With
    `screen` (the default) the node is first checked in a score-free order that gives the
    same verdict and counts (`_screening_order`), and GPUs are scored and sorted only when it
    fits; `screen=False` runs HAMi's procedure literally (score, sort, walk).
    """
    result = _fit_container(
        node, request, context, used, used_memory_mib, used_cores, None, screen=screen
    )
    if isinstance(result, FitFailure):
        return result
    return result[0], result[1]


def _fit_container(
    node: NodeUsage,
    request: ContainerRequest,
    context: FitContext,
    used: Sequence[int] | None,
    used_memory_mib: Sequence[int] | None,
    used_cores: Sequence[int] | None,
    base: Sequence[int] | None,
    *,
    screen: bool,
    allocated: Sequence[ContainerDevices] = (),
    mig: MigView | None = None,
) -> tuple[tuple[int, ...], ContainerDevices, Sequence[int]] | FitFailure:
    """`fit_container`, sorting from `base`; also returns the sorted order it walked.
    `allocated` is the pod's devices in this phase so far (for the quota check), `mig` the
    MIG placements in use in this phase (default: the node's)."""
    used = node.used if used is None else used
    used_memory_mib = node.used_memory_mib if used_memory_mib is None else used_memory_mib
    used_cores = node.used_cores if used_cores is None else used_cores
    if request.count > len(node.candidates) and not context.mig_request(node):
        return NODE_INSUFFICIENT_DEVICE
    if screen and context.quota is None and not context.topology:
        screening = _screening_order(node, used, context, base)
        if screening is not None:
            outcome = _walk(
                node, screening, used, used_memory_mib, used_cores, request, context, (), mig
            )
            if isinstance(outcome, FitFailure):
                return outcome
            if not context.order.uses_score:
                return outcome.positions, outcome.devices, screening
    order = sorted_candidates(node, used, used_memory_mib, used_cores, request, context, base)
    result = _walk(node, order, used, used_memory_mib, used_cores, request, context, allocated, mig)
    if isinstance(result, FitFailure):
        return result
    return result.positions, result.devices, order


@dataclass(frozen=True, slots=True)
class PodFit:
    """The GPUs each container gets on the node: one entry per container, init containers
    first, an empty entry for a container without a GPU request. `mig`: the MIG reservations
    (one per MIG device booked, in container and device order; `()` without MIG), what
    `hami.io/vgpu-mig-allocations` carries."""

    devices: PodDevices
    mig: tuple[MigAllocation, ...] = ()


def fit_pod(
    node: NodeUsage, requests: PodRequests, context: FitContext, *, screen: bool = True
) -> PodFit | FitFailure:
    """Fit every container of the pod on the node (docs/hami-reference.md 3.7); the first failing
    container's failure is the node's. `screen` as for `fit_container`."""
    entries: list[ContainerDevices] = []
    # The quota check's view of the phase so far: HAMi's `allocated` holds the NVIDIA devices
    # of earlier containers with GPUs (score.go:226-283), init and app phases apart.
    phase: list[ContainerDevices] = []
    has_mig = node.has_mig
    reservations: list[MigAllocation] = []
    for request in requests.init_requests:
        if request is None:
            entries.append(())
            continue
        # HAMi fits each init container on its own copy of the node (score.go:226-233)
        init_view = MigView(node) if has_mig else None
        init_fit = _fit_container(
            node,
            request,
            context,
            None,
            None,
            None,
            None,
            screen=screen,
            allocated=phase,
            mig=init_view,
        )
        if isinstance(init_fit, FitFailure):
            return init_fit
        init_devices = init_fit[1]
        if init_view is not None:
            added = _add_mig_usage(
                node, init_fit[0], init_devices, init_view, len(entries), reservations
            )
            if isinstance(added, FitFailure):
                return added
            init_devices = added
        entries.append(init_devices)
        phase.append(init_devices)
    phase = []
    app_view = MigView(node) if has_mig else None  # HAMi's appNodeCopy (score.go:320)
    app = requests.app_requests
    remaining = sum(request is not None for request in app)
    used: Sequence[int] = node.used
    used_memory_mib: Sequence[int] = node.used_memory_mib
    used_cores: Sequence[int] = node.used_cores
    booked: tuple[list[int], list[int], list[int]] | None = None
    order: Sequence[int] | None = None  # the GPU order the previous app container left
    for request in app:
        if request is None:
            entries.append(())
            continue
        fitted = _fit_container(
            node,
            request,
            context,
            used,
            used_memory_mib,
            used_cores,
            order,
            screen=screen,
            allocated=phase,
            mig=app_view,
        )
        if isinstance(fitted, FitFailure):
            return fitted
        positions, devices, order = fitted
        if app_view is not None:
            added = _add_mig_usage(node, positions, devices, app_view, len(entries), reservations)
            if isinstance(added, FitFailure):
                return added
            devices = added
        entries.append(devices)
        phase.append(devices)
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
    return PodFit(tuple(entries), tuple(reservations))
