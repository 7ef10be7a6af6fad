"""Builders shared by the extender tests: GPU nodes and pods as the API server stores them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import ANNOTATION_NODE_REGISTER, GpuDevice
from hami_plugin.testing.apiserver import make_container, make_node, make_pod

V100 = "NVIDIA-Tesla V100-PCIE-32GB"


def gpus(node: str, count: int, *, split: int = 4, memory: int = 32768) -> list[GpuDevice]:
    """`count` GPUs named after the node."""
    return [
        GpuDevice(f"GPU-{node}-{index}", index, split, memory, 100, V100, 0, "hami-core", True)
        for index in range(count)
    ]


def gpu_node(
    name: str,
    count: int = 1,
    *,
    protocol: bool = False,
    split: int = 4,
    memory: int = 32768,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A node whose device plugin registered `count` GPUs and kubelet advertises them.
    `protocol`: the node runs our device plugin (allocate protocol in-flight/v1)."""
    notes = {
        ANNOTATION_NODE_REGISTER: codec.encode_node_devices(
            gpus(name, count, split=split, memory=memory)
        )
    }
    if protocol:
        notes[ANNOTATION_ALLOCATE_PROTOCOL] = ALLOCATE_PROTOCOL
    notes.update(annotations or {})
    node = make_node(
        name,
        annotations=notes,
        labels=labels,
        allocatable={
            "cpu": "8",
            "memory": "32Gi",
            "pods": "110",
            "nvidia.com/gpu": str(count * split),
        },
    )
    node["metadata"]["resourceVersion"] = "1"
    return node


def gpu_pod(
    name: str,
    *,
    gpus: int = 1,
    memory: int | None = 1000,
    namespace: str = "default",
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    containers: int = 1,
) -> dict[str, Any]:
    """A pending pod whose containers each ask `gpus` GPUs of `memory` MiB."""
    limits = {"nvidia.com/gpu": str(gpus)}
    if memory is not None:
        limits["nvidia.com/gpumem"] = str(memory)
    return make_pod(
        name,
        namespace,
        annotations=annotations,
        containers=[make_container(f"c{index}", limits=limits) for index in range(containers)],
        uid=uid or f"uid-{namespace}-{name}",
        creation_timestamp=created,
        resource_version="1",
    )


def cpu_pod(name: str, namespace: str = "default") -> dict[str, Any]:
    return make_pod(name, namespace, uid=f"uid-{namespace}-{name}")


class RecordingObserver:
    """A SchedulerObserver that remembers every call (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []

    def _add(self, name: str, value: Any) -> None:
        with self._lock:
            self.calls.append((name, value))

    def named(self, name: str) -> list[Any]:
        with self._lock:
            return [value for call, value in self.calls if call == name]

    def filter_done(self, seconds: float, outcome: str) -> None:
        self._add("filter_done", outcome)

    def filter_failures(self, reasons: Mapping[str, int]) -> None:
        self._add("filter_failures", dict(reasons))

    def bind_done(self, seconds: float, ok: bool) -> None:
        self._add("bind_done", ok)

    def bind_waited(self, seconds: float) -> None:
        self._add("bind_waited", seconds)

    def booking_expired(self) -> None:
        self._add("booking_expired", None)

    def filter_fanned_out(self) -> None:
        self._add("filter_fanned_out", None)

    def pod_recovered(self, reason: str) -> None:
        self._add("pod_recovered", reason)

    def leader_changed(self, is_leader: bool) -> None:
        self._add("leader_changed", is_leader)

    def preemption_attempted(self, outcome: str) -> None:
        self._add("preemption_attempted", outcome)

    def preemption_victims(self, count: int) -> None:
        self._add("preemption_victims", count)

    def preemptor_running(self, seconds: float) -> None:
        self._add("preemptor_running", seconds)


class SplitClock:
    """A `hami_plugin.clock.Clock` from two callables: the leader tests' fake seconds and a
    wall time of their choosing (derived from them, or skewed)."""

    def __init__(self, monotonic: Callable[[], float], wall: Callable[[], datetime]) -> None:
        self._monotonic = monotonic
        self._wall = wall

    def now(self) -> datetime:
        return self._wall()

    def monotonic(self) -> float:
        return self._monotonic()
