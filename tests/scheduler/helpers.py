"""Small builders shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hami_plugin.protocol.codec import parse_gpu_policy
from hami_plugin.protocol.model import GpuDevice, PodGpuOptions, ScoringWeights
from hami_plugin.scheduler.fit import FitContext
from hami_plugin.scheduler.usage import NodeUsage, make_node_usage

V100 = "NVIDIA-Tesla V100-PCIE-32GB"


def gpu(
    uuid: str,
    index: int = 0,
    *,
    numa: int = 0,
    count: int = 10,
    memory: int = 32768,
    cores: int = 100,
    type: str = V100,
    mode: str = "hami-core",
    healthy: bool = True,
) -> GpuDevice:
    return GpuDevice(uuid, index, count, memory, cores, type, numa, mode, healthy)


def node(
    *devices: GpuDevice,
    used: Sequence[int] | None = None,
    memory: Sequence[int] | None = None,
    cores: Sequence[int] | None = None,
    cordoned: Sequence[str] = (),
    name: str = "node",
) -> NodeUsage:
    size = len(devices)
    return make_node_usage(
        name,
        tuple(devices),
        tuple(used or [0] * size),
        tuple(memory or [0] * size),
        tuple(cores or [0] * size),
        frozenset(cordoned),
    )


def context(
    policy: str = "spread",
    *,
    numa_bind: bool = False,
    weights: ScoringWeights | None = None,
    grouped: bool = False,
    **options: Any,
) -> FitContext:
    pod_options = PodGpuOptions(numa_bind=numa_bind, scoring_weights=weights, **options)
    return FitContext.for_pod(pod_options, parse_gpu_policy(policy), numa_grouped_order=grouped)
