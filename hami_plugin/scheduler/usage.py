"""A node's GPU usage snapshot (what its pods book, collapsed per pod by
`protocol.usage.collapse_pod_devices`, docs/hami-reference.md 3.3).

`NodeUsage` is an immutable snapshot the ledger hands to the fit: a fit copies the few
numbers it changes, so a decision never mutates the ledger it reads.

Dynamic MIG (HAMi v2.10): a MIG-mode GPU also carries the MIG reservations in use on it
(`NodeUsage.mig_in_use`, HAMi's `DeviceUsage.MigAllocationsInUse`), read from the pods'
`hami.io/vgpu-mig-allocations` as HAMi's getNodesUsage reads them (`mig_booking`,
scheduler.go:737-830), including the rules that mark a GPU unhealthy when a pod's devices and
its reservations disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import GpuDevice, MigPlacement, OperatingMode
from hami_plugin.scheduler.score import node_score

__all__ = [
    "MigBooking",
    "NodeUsage",
    "has_mig_device",
    "make_node_usage",
    "mig_booking",
    "nvidia_candidates",
]


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """A node's registered GPUs and their usage at one moment, with the node's score.

    The per-GPU tuples are parallel to `devices`; `candidates` are the positions of GPUs whose
    type names NVIDIA (HAMi matches the request type as a case-insensitive substring).
    """

    name: str
    devices: tuple[GpuDevice, ...]
    used: tuple[int, ...]
    used_memory_mib: tuple[int, ...]
    used_cores: tuple[int, ...]
    cordoned: frozenset[str]
    candidates: tuple[int, ...]
    score: float
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """`hami.io/node-nvidia-score` by GPU UUID: score towards each peer UUID (HAMi
    `DevicePairScore`, read by the `topology-aware` policy; empty without the annotation)."""
    mig_in_use: tuple[tuple[MigAllocation, ...], ...] = ()
    """Per GPU (parallel to `devices`), the MIG reservations in use on it (HAMi
    `MigAllocationsInUse`); `()` when the node has no MIG-mode GPU and no reservation."""
    has_mig: bool = False
    """A candidate GPU is in MIG mode: the fit follows HAMi's MIG walk on this node."""

    def occupied(self, position: int) -> tuple[MigPlacement, ...]:
        """The placements in use on the GPU at `position` (HAMi `occupiedMigPlacements`)."""
        if not self.mig_in_use:
            return ()
        return tuple(allocation.placement for allocation in self.mig_in_use[position])


def nvidia_candidates(devices: Sequence[GpuDevice]) -> tuple[int, ...]:
    """Positions of the GPUs an NVIDIA request may use: HAMi matches the request type as a
    case-insensitive substring of the GPU type."""
    return tuple(
        position for position, device in enumerate(devices) if "nvidia" in device.type.lower()
    )


def has_mig_device(devices: Sequence[GpuDevice], candidates: Sequence[int]) -> bool:
    """Whether a candidate GPU is in MIG mode (HAMi isMIGRequest's device test, score.go:54-68)."""
    return any(devices[position].mode == OperatingMode.MIG for position in candidates)


def make_node_usage(
    name: str,
    devices: tuple[GpuDevice, ...],
    used: tuple[int, ...],
    used_memory_mib: tuple[int, ...],
    used_cores: tuple[int, ...],
    cordoned: frozenset[str] = frozenset(),
    pair_scores: Mapping[str, Mapping[str, int]] | None = None,
    mig_in_use: tuple[tuple[MigAllocation, ...], ...] = (),
) -> NodeUsage:
    """Build a snapshot, computing the candidates and the node score. `mig_in_use` is
    parallel to `devices` (or `()`: no reservation anywhere)."""
    candidates = nvidia_candidates(devices)
    return NodeUsage(
        name=name,
        devices=devices,
        used=used,
        used_memory_mib=used_memory_mib,
        used_cores=used_cores,
        cordoned=cordoned,
        candidates=candidates,
        score=node_score(
            sum(device.split_count for device in devices),
            sum(device.cores_percent for device in devices),
            sum(device.memory_mib for device in devices),
            sum(used),
            sum(used_cores),
            sum(used_memory_mib),
        ),
        pair_scores={} if pair_scores is None else pair_scores,
        mig_in_use=mig_in_use,
        has_mig=has_mig_device(devices, candidates),
    )


@dataclass(frozen=True, slots=True)
class MigBooking:
    """What one pod's MIG reservations do to its node (HAMi getNodesUsage): the reservations
    in use per GPU position, and the GPU positions it marks unhealthy."""

    in_use: tuple[tuple[int, MigAllocation], ...] = ()
    unhealthy: tuple[int, ...] = ()


def mig_booking(
    devices: Sequence[GpuDevice],
    positions: Mapping[str, int],
    booked: Sequence[str],
    allocations: Sequence[MigAllocation],
) -> MigBooking:
    """HAMi v2.10 getNodesUsage for one pod (scheduler.go:737-830): `booked` are the UUIDs of
    the pod's collapsed device entries (one per GPU, in order), `allocations` its decoded
    `hami.io/vgpu-mig-allocations` (empty when absent or undecodable: HAMi ignores the error).

    For each booked GPU on the node: the first reservation left for that GPU is in use,
    unless the GPU's mode is `hami-core` ("found a mig task running on a hami-core GPU":
    unhealthy); a MIG-mode GPU with no reservation left is unhealthy ("MIG Pod lacks a
    matching profile/placement reservation"). Reservations left over: on a MIG-mode GPU of
    the node they are in use ("restored MIG reservations missing from cached Pod devices"), on
    another GPU of the node that GPU is unhealthy ("unconsumed MIG reservations reference a
    non-MIG device"), on a GPU the node lacks every MIG-mode GPU of the node is unhealthy."""
    left: dict[str, list[MigAllocation]] = {}
    for allocation in allocations:
        left.setdefault(allocation.gpu_uuid, []).append(allocation)
    in_use: list[tuple[int, MigAllocation]] = []
    unhealthy: list[int] = []
    for uuid in booked:
        position = positions.get(uuid)
        if position is None:
            continue  # "pod allocated unknown or stale device resources"
        device = devices[position]
        remaining = left.get(uuid)
        if remaining:
            if device.mode == OperatingMode.HAMI_CORE:
                unhealthy.append(position)
                continue
            in_use.append((position, remaining.pop(0)))
            continue
        if device.mode == OperatingMode.MIG:
            unhealthy.append(position)
    for uuid, remaining in left.items():
        if not remaining:
            continue
        position = positions.get(uuid)
        if position is None:
            unhealthy.extend(
                p for p, device in enumerate(devices) if device.mode == OperatingMode.MIG
            )
        elif devices[position].mode != OperatingMode.MIG:
            unhealthy.append(position)
        else:
            in_use.extend((position, allocation) for allocation in remaining)
    return MigBooking(tuple(in_use), tuple(unhealthy))
