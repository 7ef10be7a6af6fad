"""Scheduler settings the placement rules read: default policies, request defaults, names.

Resolved once at the edge (flags, config file) and passed in; the core never reads the
environment. Defaults are HAMi v2.10's (its flags and device ConfigMap,
`docs/hami-reference.md` 3.12).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hami_plugin.protocol.model import (
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_PERCENTAGE,
    RESOURCE_GPU_PRIORITY,
    GpuPolicy,
    GpuPolicyName,
    NodePolicy,
)

DEFAULT_GPU_POLICY = GpuPolicy(names=(GpuPolicyName.SPREAD,), chain=False)


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The extended-resource names a container asks GPUs with (HAMi's `resource*Name`)."""

    count: str = RESOURCE_GPU
    memory: str = RESOURCE_GPU_MEMORY
    memory_percentage: str = RESOURCE_GPU_MEMORY_PERCENTAGE
    cores: str = RESOURCE_GPU_CORES
    priority: str = RESOURCE_GPU_PRIORITY
    """Copied into `CUDA_TASK_PRIORITY` by the admission webhook; not a scheduling input."""


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Everything the pure scheduler core is configured with.

    `numa_grouped_order` applies the design note's NUMA-grouped GPU order (NUMA first, then
    score) to every pod whose policy is a single `binpack`/`spread`, not only to pods with
    `nvidia.com/numa-bind` (`docs/design.md` 9.4).
    """

    node_policy: NodePolicy = NodePolicy.BINPACK
    gpu_policy: GpuPolicy = DEFAULT_GPU_POLICY
    default_memory_mib: int = 0
    default_cores: int = 0
    memory_factor: int = 1
    numa_grouped_order: bool = False
    resources: ResourceNames = field(default_factory=ResourceNames)

    def __post_init__(self) -> None:
        if self.default_memory_mib < 0:
            raise ValueError("default_memory_mib must not be negative")
        if not 0 <= self.default_cores <= 100:
            raise ValueError("default_cores must be between 0 and 100")
        if self.memory_factor < 1:
            raise ValueError("memory_factor must be at least 1")
