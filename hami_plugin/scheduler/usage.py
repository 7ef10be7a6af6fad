"""GPU usage values: what one pod books (collapsed, docs/hami-reference.md 3.3) and a node's usage
snapshot.

`NodeUsage` is an immutable snapshot the ledger hands to the fit: a fit copies the few
numbers it changes, so a decision never mutates the ledger it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami_plugin.protocol.model import GpuDevice, PodDevices
from hami_plugin.scheduler.score import node_score

__all__ = [
    "DeviceTally",
    "NodeUsage",
    "collapse_pod_devices",
    "make_node_usage",
    "nvidia_candidates",
]


@dataclass(frozen=True, slots=True)
class DeviceTally:
    """What one pod books on one GPU: slots (vGPUs), MiB and percent of cores."""

    uuid: str
    slots: int
    memory_mib: int
    cores: int


def collapse_pod_devices(
    devices: PodDevices, init_count: int, app_only: bool = False
) -> tuple[DeviceTally, ...]:
    """Collapse a pod's per-container devices into one tally per GPU (sorted by UUID).

    Init containers run one after another, so they count with their peak (largest memory,
    largest cores, one slot); app containers run together and add up (one slot each). A GPU
    books the larger of the two, component-wise, and at least one slot. With `app_only` (all
    init containers have finished) only the app containers count.
    """
    init_peak: dict[str, list[int]] = {}
    app_sum: dict[str, list[int]] = {}
    for position, container in enumerate(devices):
        is_init = position < init_count
        if is_init and app_only:
            continue
        for device in container:
            if is_init:
                peak = init_peak.setdefault(device.uuid, [0, 0, 0])
                peak[0] = 1
                peak[1] = max(peak[1], device.used_mem_mib)
                peak[2] = max(peak[2], device.used_cores)
            else:
                total = app_sum.setdefault(device.uuid, [0, 0, 0])
                total[0] += 1
                total[1] += device.used_mem_mib
                total[2] += device.used_cores
    tallies = []
    for uuid in sorted(init_peak.keys() | app_sum.keys()):
        peak = init_peak.get(uuid, [0, 0, 0])
        total = app_sum.get(uuid, [0, 0, 0])
        tallies.append(
            DeviceTally(
                uuid,
                max(peak[0], total[0], 1),
                max(peak[1], total[1]),
                max(peak[2], total[2]),
            )
        )
    return tuple(tallies)


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


def nvidia_candidates(devices: Sequence[GpuDevice]) -> tuple[int, ...]:
    """Positions of the GPUs an NVIDIA request may use: HAMi matches the request type as a
    case-insensitive substring of the GPU type."""
    return tuple(
        position for position, device in enumerate(devices) if "nvidia" in device.type.lower()
    )


def make_node_usage(
    name: str,
    devices: tuple[GpuDevice, ...],
    used: tuple[int, ...],
    used_memory_mib: tuple[int, ...],
    used_cores: tuple[int, ...],
    cordoned: frozenset[str] = frozenset(),
    pair_scores: Mapping[str, Mapping[str, int]] | None = None,
) -> NodeUsage:
    """Build a snapshot, computing the candidates and the node score."""
    return NodeUsage(
        name=name,
        devices=devices,
        used=used,
        used_memory_mib=used_memory_mib,
        used_cores=used_cores,
        cordoned=cordoned,
        candidates=nvidia_candidates(devices),
        score=node_score(
            sum(device.split_count for device in devices),
            sum(device.cores_percent for device in devices),
            sum(device.memory_mib for device in devices),
            sum(used),
            sum(used_cores),
            sum(used_memory_mib),
        ),
        pair_scores={} if pair_scores is None else pair_scores,
    )
