"""Fit one container's GPU request onto one node, as HAMi v2.10's `Fit` does
(`pkg/device/nvidia/device.go:714-875`, docs/hami-reference.md 3.5).

The walk (`walk_gpus`) is HAMi's loop: the node's NVIDIA candidates sorted by the pod's
`GpuOrder` (`sorted_candidates`) and visited **from the end**, each through HAMi's checks in
HAMi's order (docs/hami-reference.md 3.5.2), the first failing one counted as a `FitReason`. It
says which GPUs pass and why the others fail; a chooser turns that into the container's GPUs
or a `FitFailure`: the first GPUs that pass (HAMi's default: the walk stops at enough), or,
with the `topology-aware` policy, a choice by the node's pair scores among every GPU that
passes (`policy.topology_choice`; device.go:724, 830-868). The HAMi string `"n/N Reason, ..."`
is made by `render_failure` at the edge. Fitting a whole pod is `scheduler.pod_fit`.

Counts as in v2.10 (device.go:746-754, 871-873: `len(tmpDevs[k.Type])`; v2.8 and v2.9 counted
1): `NumaNotFit` grows by the GPUs passed on each NUMA node the walk leaves (never with
`topology-aware`: `k.Nums` does not move there), `AllocatedCardsInsufficientRequest` is the
number of GPUs passed when the walk ends short.

On a node with a MIG-mode candidate GPU, check 15 is HAMi's `CustomFilterRule`
(`mig.has_mig_placement`, else `CardMigTopologyInfeasible`) and after a pass on a MIG-mode GPU
the walk visits the same GPU again (device.go:846-848), so one GPU can give a container
several MIG instances.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hami_plugin.protocol.model import (
    NVIDIA_DEVICE_TYPE,
    ContainerDevice,
    ContainerDevices,
    GpuDevice,
    GpuPolicy,
    GpuPolicyName,
    OperatingMode,
    PodGpuOptions,
    ScoringWeights,
)
from hami_plugin.protocol.usage import collapse_pod_devices
from hami_plugin.scheduler.mig import MigView, has_mig_placement
from hami_plugin.scheduler.policy import GpuOrder, SortKey, gpu_order, topology_choice
from hami_plugin.scheduler.requests import ContainerRequest
from hami_plugin.scheduler.score import device_score
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "NODE_INSUFFICIENT_DEVICE",
    "NODE_UNREGISTERED",
    "ContainerFit",
    "FitContext",
    "FitFailure",
    "FitReason",
    "GpuWalk",
    "QuotaFit",
    "fit_container",
    "render_failure",
    "sorted_candidates",
    "walk_gpus",
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
    """Why a node cannot take the pod: a node-level reason (`node_reason`), or per reason how
    many of the `candidates` GPUs failed with it (`counts`, sorted by reason name). `detail` is
    a failure HAMi reports as a sentence of its own (`AddResourceUsage failed for device ...`,
    score.go:125-128)."""

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


QuotaFit = Callable[[int, int], bool]
"""The namespace quota's verdict on the pod's total MiB and cores (HAMi's `FitQuota` with the
memory factor applied); see `scheduler/quota.py`."""


@dataclass(frozen=True, slots=True)
class FitContext:
    """Everything about the pod that the checks need, resolved once per decision.

    `use_types`/`use_uuids`: None when the pod sets no such constraint, empty when the
    annotation lists nothing (every GPU mismatches); card types upper-cased. `vgpu_mode`: the
    annotation as written (`""` admits only GPUs without a mode, HAMi's substring test).
    `quota`: the namespace quota check (None: no GPU limit); `init_count`: the pod's init
    containers, which the quota's collapse needs.
    """

    order: GpuOrder
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    numa_bind: bool = False
    mutex: bool = False
    topology: bool = False
    """The `topology-aware` policy: every passing GPU collected, then a pick by pair scores."""
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
        if self.vgpu_mode is not None and OperatingMode.MIG not in self.vgpu_mode:
            return False
        devices = node.devices
        return any(devices[position].mode == OperatingMode.MIG for position in node.candidates)


def sorted_candidates(
    node: NodeUsage,
    request: ContainerRequest | None,
    context: FitContext,
    base: Sequence[int] | None = None,
) -> list[int]:
    """The node's NVIDIA candidate positions in the pod's GPU order (the walk starts at the
    end). The sort is stable and starts from `base` (default: index order). GPU scores (over
    the node's usage and `request`) are computed only when the order uses them."""
    order = context.order
    devices = node.devices
    used = node.used
    candidates = node.candidates if base is None else base
    if order.uses_score:
        used_memory_mib, used_cores = node.used_memory_mib, node.used_cores
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


GpuWalk = tuple[list[int], list[int], dict[FitReason, int]]
"""What HAMi's Fit loop found for one container on one node, `(passed, memory_mib, failures)`:
the GPUs that passed every check, as positions in walk order (with numa-bind, those of the
NUMA node the walk ended on), what each would give the container (the request on that GPU's
memory), and how many GPUs failed with each reason. A plain tuple: one is made per node fitted."""


def walk_gpus(
    node: NodeUsage,
    order: Sequence[int],
    request: ContainerRequest,
    context: FitContext,
    stop_at: int | None = None,
    allocated: Sequence[ContainerDevices] = (),
    mig: MigView | None = None,
) -> GpuWalk:
    """HAMi's Fit loop (docs/hami-reference.md 3.5.2): the GPUs of `order` from its end, each
    through HAMi's checks (numbered as there), until `stop_at` GPUs passed (None: every GPU, as
    `topology-aware` walks). `allocated`: the pod's devices in this phase so far (quota check);
    `mig`: the MIG placements in use in this phase (default: the node's)."""
    if mig is None and node.has_mig:
        mig = MigView(node)
    devices, cordoned = node.devices, node.cordoned
    used, used_memory_mib, used_cores = node.used, node.used_memory_mib, node.used_cores
    type_allowed = context.type_allowed
    use_uuids, nouse_uuids = context.use_uuids, context.nouse_uuids
    numa_bind, mutex = context.numa_bind, context.mutex
    cores = min(request.cores_percent, 100)  # 8. HAMi clamps Coresreq to 100 (sticky)
    quota_fits = None
    if context.quota is not None:
        quota_fits = _quota_check(context.quota, context.init_count, allocated, devices, cores)
    previous_numa = -1
    passed: list[int] = []
    booked: list[int] = []
    failures: dict[FitReason, int] = {}
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
            if numa_bind and device.numa_node != previous_numa:  # 4. a new NUMA node
                if passed and stop_at is not None:  # those passed on the one left (k.Nums moved)
                    so_far = failures.get(FitReason.NUMA_NOT_FIT, 0)
                    failures[FitReason.NUMA_NOT_FIT] = so_far + len(passed)
                previous_numa = device.numa_node
                passed, booked = [], []
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
            elif quota_fits is not None and not quota_fits(  # 10.
                passed, booked, position, memory_mib
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
                and device.mode == OperatingMode.MIG
                and not has_mig_placement(
                    device, mig.occupied(position), devices, passed, booked, memory_mib
                )
            ):
                reason = FitReason.CARD_MIG_TOPOLOGY_INFEASIBLE
            else:  # 16.-17.
                passed.append(position)
                booked.append(memory_mib)
                if stop_at is not None and len(passed) == stop_at:
                    break
                if mig is not None and device.mode == OperatingMode.MIG:
                    index += 1  # the same MIG GPU again
                continue
        failures[reason] = failures.get(reason, 0) + 1
    return passed, booked, failures


def _quota_check(
    quota: QuotaFit,
    init_count: int,
    allocated: Sequence[ContainerDevices],
    devices: Sequence[GpuDevice],
    cores: int,
) -> Callable[[Sequence[int], Sequence[int], int, int], bool]:
    """HAMi's `fitQuota` (device.go:666-691) as `fits(passed, booked, position, mib)`: the
    phase's devices so far (`allocated`: earlier init containers for an init container, earlier
    app containers for an app one), the container's GPUs passed so far (`booked` MiB each) and
    the GPU at `position` (`mib`), collapsed with the pod's `init_count` (so, as in HAMi, the
    first app containers of a pod with init containers count by their peak), summed, against
    the namespace quota."""

    def fits(passed: Sequence[int], booked: Sequence[int], position: int, mib: int) -> bool:
        current = [
            ContainerDevice(devices[chosen].uuid, NVIDIA_DEVICE_TYPE, chosen_mib, cores)
            for chosen, chosen_mib in zip((*passed, position), (*booked, mib), strict=True)
        ]
        tallies = collapse_pod_devices((*allocated, tuple(current)), init_count)
        return quota(sum(t.memory_mib for t in tallies), sum(t.cores for t in tallies))

    return fits


class ContainerFit(NamedTuple):
    """The GPUs one container gets on the node."""

    positions: tuple[int, ...]
    """The GPUs chosen, as positions into the node's devices, in pick order."""
    devices: ContainerDevices
    order: Sequence[int]
    """The GPU order the walk sorted: the next app container's sort starts from it (HAMi sorts
    one device list in place for every container, so equal GPUs keep the order left behind)."""


def _too_few(walk: GpuWalk, candidates: int) -> FitFailure:
    """The walk ended short: HAMi's failure, with `AllocatedCardsInsufficientRequest` the
    GPUs passed (on the last NUMA node with numa-bind; device.go:871-872)."""
    passed, _, failures = walk
    counts: Iterable[tuple[FitReason, int]] = failures.items()
    if passed:
        counts = [*counts, (FitReason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST, len(passed))]
    return FitFailure(tuple(sorted(counts)), candidates)


def _first_fit(
    node: NodeUsage, order: Sequence[int], walk: GpuWalk, request: ContainerRequest
) -> ContainerFit | FitFailure:
    """HAMi's default choice: the first GPUs to pass, if the walk found enough."""
    if len(walk[0]) < request.count:
        return _too_few(walk, len(order))
    return _take(node, order, walk, range(request.count), request)


def _topology_fit(
    node: NodeUsage, order: Sequence[int], walk: GpuWalk, request: ContainerRequest
) -> ContainerFit | FitFailure:
    """The `topology-aware` choice among every GPU that passed (device.go:849-868)."""
    passed = walk[0]
    if len(passed) < request.count:
        return _too_few(walk, len(order))
    devices = node.devices
    uuids = [devices[position].uuid for position in passed]
    chosen = topology_choice(uuids, request.count, node.pair_scores)
    return _take(node, order, walk, chosen, request)


def _take(
    node: NodeUsage,
    order: Sequence[int],
    walk: GpuWalk,
    chosen: Sequence[int],
    request: ContainerRequest,
) -> ContainerFit:
    """The container's devices on the `chosen` GPUs (indexes into those the walk passed)."""
    passed, memory_mib, _ = walk
    devices = node.devices
    cores = min(request.cores_percent, 100)
    return ContainerFit(
        tuple(passed[i] for i in chosen),
        tuple(
            ContainerDevice(devices[passed[i]].uuid, NVIDIA_DEVICE_TYPE, memory_mib[i], cores)
            for i in chosen
        ),
        order,
    )


def _screening_order(
    node: NodeUsage, context: FitContext, base: Sequence[int] | None
) -> Sequence[int] | None:
    """A GPU order, found without scores, whose walk gives the same verdict and failure counts
    as the pod's own order (None when there is none).

    Each GPU's checks depend only on that GPU (no quota), so without numa-bind any order
    gives the same verdict and counts. With numa-bind a NUMA-first order meets the NUMA
    groups in the same sequence, and the order inside a group changes neither verdict nor
    counts. Only which GPUs a fitting node hands out depends on the scores.
    """
    order = context.order
    if not order.uses_score:
        return sorted_candidates(node, None, context, base)
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
    *,
    base: Sequence[int] | None = None,
    allocated: Sequence[ContainerDevices] = (),
    mig: MigView | None = None,
    screen: bool = True,
) -> ContainerFit | FitFailure:
    """Fit one container's request on the node as its usage stands, the GPU order sorted from
    `base`; `allocated` and `mig` as for `walk_gpus`.

    With `screen` (the default, for a pod without a quota or `topology-aware`) the node is
    first walked in a score-free order that gives the same verdict and counts
    (`_screening_order`), and GPUs are scored and sorted only when it fits; `screen=False`
    runs HAMi's procedure literally (score, sort, walk).
    """
    if request.count > len(node.candidates) and not context.mig_request(node):
        return NODE_INSUFFICIENT_DEVICE
    if context.topology:
        order = sorted_candidates(node, request, context, base)
        walk = walk_gpus(node, order, request, context, None, allocated, mig)
        return _topology_fit(node, order, walk, request)
    if screen and context.quota is None:
        screening = _screening_order(node, context, base)
        if screening is not None:
            walk = walk_gpus(node, screening, request, context, request.count, (), mig)
            if len(walk[0]) < request.count:
                return _too_few(walk, len(screening))
            if not context.order.uses_score:
                return _take(node, screening, walk, range(request.count), request)
    order = sorted_candidates(node, request, context, base)
    walk = walk_gpus(node, order, request, context, request.count, allocated, mig)
    return _first_fit(node, order, walk, request)
