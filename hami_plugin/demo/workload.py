"""The demo's built-in cluster and workload, as plain data: two fake GPU nodes and a dozen pods.

Pure: no I/O. `fake_gpus_document` is the `--fake-gpus` YAML content of a node (as a dict);
`SamplePod.to_pod` builds the Pod object a user would submit (before the admission webhook).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami_plugin.protocol.model import (
    ANNOTATION_NUMA_BIND,
    ANNOTATION_USE_GPUTYPE,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_PERCENTAGE,
)
from hami_plugin.testing.apiserver import make_container, make_pod

__all__ = [
    "NAMESPACE",
    "NODES",
    "NODE_LABELS",
    "SAMPLE_PODS",
    "DemoNode",
    "FakeGpu",
    "SampleContainer",
    "SamplePod",
    "fake_gpus_document",
]

NAMESPACE = "demo"
NODE_LABELS = {"gpu": "on"}
"""HAMi's chart schedules its device plugin on nodes labelled `gpu=on`; the demo's scheduler
is started with `--node-label-selector gpu=on` so the label matters here too."""


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One fake GPU of a node (an entry of the fake NVML file)."""

    uuid: str
    name: str
    memory_mib: int
    numa_node: int


@dataclass(frozen=True, slots=True)
class DemoNode:
    """A fake GPU node: its name, a short name for file paths, and its GPUs."""

    name: str
    short: str
    gpus: tuple[FakeGpu, ...]

    def gpu_index(self, uuid: str) -> int | None:
        """The NVML index of the GPU with `uuid`, None when it is not on this node."""
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return index
        return None


def _gpus(tag: str, name: str, memory_mib: int, numa_nodes: tuple[int, ...]) -> tuple[FakeGpu, ...]:
    # NVML's UUID shape (8-4-4-4-12): the device plugin finds a GPU behind kubelet's slot ID
    # `<uuid>-<n>` by its six dashes, as HAMi does, so shorter made-up UUIDs would not map back.
    return tuple(
        FakeGpu(f"GPU-{tag:0<8}-0000-0000-0000-{index:012d}", name, memory_mib, numa)
        for index, numa in enumerate(numa_nodes)
    )


NODES = (
    # Two NUMA nodes with two GPUs each, as on a DGX-like board: numa-bind has a choice to make.
    DemoNode("gpu-a100", "a100", _gpus("a100", "NVIDIA A100-SXM4-80GB", 81920, (0, 0, 1, 1))),
    DemoNode("gpu-t4", "t4", _gpus("74", "Tesla T4", 15360, (0, 0, 0, 0))),
)


def fake_gpus_document(node: DemoNode) -> dict[str, Any]:
    """The fake NVML YAML content (as a dict) for `node`."""
    return {
        "gpus": [
            {
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_mib": gpu.memory_mib,
                "numa_node": gpu.numa_node,
                "index": index,
                "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
            }
            for index, gpu in enumerate(node.gpus)
        ]
    }


@dataclass(frozen=True, slots=True)
class SampleContainer:
    """A container's GPU limits; None leaves the resource out."""

    name: str
    gpus: int | None = 1
    memory_mib: int | None = None
    cores_percent: int | None = None
    memory_percent: int | None = None

    def limits(self) -> dict[str, str]:
        """The container's resource limits."""
        values = {
            RESOURCE_GPU: self.gpus,
            RESOURCE_GPU_MEMORY: self.memory_mib,
            RESOURCE_GPU_CORES: self.cores_percent,
            RESOURCE_GPU_MEMORY_PERCENTAGE: self.memory_percent,
        }
        return {key: str(value) for key, value in values.items() if value is not None}

    def describe(self) -> str:
        """The request in a few words: `2 x 24576 MiB, 50 %`, `1 x whole GPU`."""
        if self.memory_mib is not None:
            size = f"{self.memory_mib} MiB"
        elif self.memory_percent is not None:
            size = f"{self.memory_percent} % memory"
        else:
            size = "whole GPU"
        cores = f", {self.cores_percent} %" if self.cores_percent is not None else ""
        return f"{self.gpus or 1} x {size}{cores}"


@dataclass(frozen=True, slots=True)
class SamplePod:
    """A pod of the workload. `fits`: whether the demo expects it to find a GPU."""

    name: str
    containers: tuple[SampleContainer, ...]
    init_containers: tuple[SampleContainer, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    fits: bool = True

    def to_pod(self) -> dict[str, Any]:
        """The Pod as submitted (schedulerName default-scheduler; the webhook takes it over)."""
        init = [make_container(c.name, limits=c.limits()) for c in self.init_containers]
        return make_pod(
            self.name,
            NAMESPACE,
            annotations=dict(self.annotations),
            labels={"app": "hami-demo"},
            containers=[make_container(c.name, limits=c.limits()) for c in self.containers],
            init_containers=init or None,
        )

    def describe(self) -> str:
        """The pod's request in a few words: containers joined by `+`, then init containers
        and annotations, e.g. `1 x 8192 MiB, 20 % (init 1 x 2048 MiB, 10 %)`."""
        text = " + ".join(c.describe() for c in self.containers)
        text += "".join(f" (init {c.describe()})" for c in self.init_containers)
        return text + "".join(f", {k.split('/')[-1]}={v}" for k, v in self.annotations)


def _one(name: str, **limits: Any) -> tuple[SampleContainer, ...]:
    return (SampleContainer(name, **limits),)


SAMPLE_PODS: tuple[SamplePod, ...] = (
    SamplePod("whole-gpu", _one("cuda")),
    SamplePod("infer-10g", _one("server", memory_mib=10240, cores_percent=30)),
    SamplePod("train-2gpu", _one("trainer", gpus=2, memory_mib=24576, cores_percent=50)),
    SamplePod("half-gpu", _one("jupyter", memory_percent=50, cores_percent=25)),
    SamplePod(
        "numa-pair",
        _one("allreduce", gpus=2, memory_mib=16384, cores_percent=40),
        annotations=((ANNOTATION_NUMA_BIND, "true"),),
    ),
    SamplePod(
        "with-init",
        _one("app", memory_mib=8192, cores_percent=20),
        init_containers=_one("warmup", memory_mib=2048, cores_percent=10),
    ),
    SamplePod(
        "t4-only",
        _one("encoder", memory_mib=4096, cores_percent=20),
        annotations=((ANNOTATION_USE_GPUTYPE, "T4"),),
    ),
    SamplePod("embed-4g", _one("embed", memory_mib=4096, cores_percent=15)),
    SamplePod(
        "two-containers",
        (
            SampleContainer("model", memory_mib=6144, cores_percent=20),
            SampleContainer("sidecar", memory_mib=1024, cores_percent=5),
        ),
    ),
    SamplePod("notebook", _one("lab", memory_mib=3072, cores_percent=10)),
    SamplePod("small-1g", _one("worker", memory_mib=1024, cores_percent=5)),
    SamplePod("too-big", _one("llm", memory_mib=102400), fits=False),
)
"""Submitted in this order, one at a time (filter, bind, Allocate, then the next)."""
