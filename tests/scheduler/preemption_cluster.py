"""A book on a small GPU cluster for preemption tests: A100 80 GB nodes, pods booked at a
priority, a preemptor filtered over the nodes. Pure: no wire (the wire tests are in
tests/extender/test_preemption_wire.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hami_plugin.protocol import codec
from hami_plugin.protocol.booking import booking_annotations
from hami_plugin.protocol.model import (
    ANNOTATION_NODE_REGISTER,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    ContainerDevice,
    GpuDevice,
)
from hami_plugin.protocol.objects import ContainerSpec, NodeInfo, PodInfo
from hami_plugin.scheduler.book.book import Book, BookSettings, Change
from hami_plugin.scheduler.filter import FilterResult
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings

A100_MIB = 81920
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)


def gpus(node: str, count: int = 2, memory: int = A100_MIB) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(f"GPU-{node}-{i}", i, 10, memory, 100, "NVIDIA-A100", 0, "hami-core", True)
        for i in range(count)
    )


def node_info(name: str, count: int = 2, memory: int = A100_MIB) -> NodeInfo:
    register = codec.encode_node_devices(gpus(name, count, memory))
    return NodeInfo(name, annotations={ANNOTATION_NODE_REGISTER: register})


def pod(
    name: str,
    memory: int,
    *,
    priority: int = 0,
    count: int = 1,
    namespace: str = "default",
    policy: str = "",
    labels: dict[str, str] | None = None,
) -> PodInfo:
    """A Pending pod asking `count` GPUs of `memory` MiB each."""
    limits: dict[str, object] = {RESOURCE_GPU: str(count), RESOURCE_GPU_MEMORY: str(memory)}
    return PodInfo(
        namespace,
        name,
        uid=f"uid-{name}",
        containers=(ContainerSpec("main", limits=limits),),
        phase="Pending",
        creation_timestamp=T0,
        priority=priority,
        preemption_policy=policy,
        labels=labels or {},
    )


def running(base: PodInfo, node: str, uuids: tuple[str, ...], started: int = 0) -> PodInfo:
    """`base` bound to `node` and running on the GPUs `uuids`, booked as the scheduler books."""
    memory = int(str(base.containers[0].limits[RESOURCE_GPU_MEMORY]))
    devices = (tuple(ContainerDevice(uuid, "NVIDIA", memory, 0) for uuid in uuids),)
    annotations = booking_annotations(node, devices, (), T0)
    return replace(
        base,
        annotations=annotations,
        node_name=node,
        phase="Running",
        start_time=T0 + timedelta(seconds=started),
    )


class Cluster:
    """A book with nodes and running pods; `filter` a pod over every node."""

    def __init__(self, *nodes: NodeInfo, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings or SchedulerSettings()
        self.book = Book(BookSettings(self.settings))
        self.nodes = [info.name for info in nodes]
        for info in nodes:
            self.book.apply_node(info, T0)
        self.monotonic = 0.0

    def add(self, info: PodInfo) -> PodInfo:
        self.book.apply_pod(info, None, self.monotonic)
        return info

    def filter(self, info: PodInfo, nodes: list[str] | None = None) -> tuple[FilterResult, Change]:
        self.monotonic += 1.0
        return self.book.filter(
            info,
            pod_requests(info, self.settings),
            nodes if nodes is not None else self.nodes,
            T0,
            self.monotonic,
        )

    def terminate(self, info: PodInfo) -> PodInfo:
        """The pod's deletion began (grace period running): the watch shows it deleting."""
        going = replace(info, deleting=True)
        self.book.apply_pod(going, None, self.monotonic)
        return going

    def gone(self, info: PodInfo) -> None:
        self.book.delete_pod(info)

    def memory_used(self, node: str) -> tuple[int, ...]:
        usage = self.book.node_usage(node)
        assert usage is not None
        return usage.used_memory_mib
