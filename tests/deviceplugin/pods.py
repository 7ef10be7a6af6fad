"""Pending pods and node locks as the scheduler leaves them, for the daemon's wire tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami_plugin.deviceplugin.inventory import VgpuDevice
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.testing.apiserver import FakeApiServer, JsonObject, make_container, make_pod

NODE = "gpu-node-1"
GPU_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
GPU_B = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def vgpus(*gpus: str, split: int = 2, healthy: bool = True) -> list[VgpuDevice]:
    return [VgpuDevice(f"{g}-{i}", g, healthy, None) for g in gpus for i in range(split)]


def dev(uuid: str, mem: int = 3000, cores: int = 30) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def add_pending_pod(
    apiserver: FakeApiServer,
    name: str,
    entries: Sequence[Sequence[ContainerDevice]] = (),
    *,
    raw_value: str | None = None,
    containers: Sequence[str] = ("main",),
    env: Mapping[str, str] | None = None,
    bind_time: int = 100,
    bind_phase: str = "allocating",
    lock: str | None = "owned",
    created: str | None = None,
) -> JsonObject:
    """A pod as the scheduler leaves it after Bind. `lock`: "owned" (the node lock names this
    pod), None (no lock) or a raw lock value; `created`: its creationTimestamp (default: now)."""
    value = raw_value if raw_value is not None else codec.encode_pod_devices(
        tuple(tuple(e) for e in entries)
    )  # fmt: skip
    pod = make_pod(
        name,
        node_name=NODE,
        annotations={
            ANNOTATION_DEVICES_TO_ALLOCATE: value,
            ANNOTATION_DEVICES_ALLOCATED: value,
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_TIME: str(bind_time),
            ANNOTATION_BIND_PHASE: bind_phase,
        },
        containers=[make_container(c, env=env) for c in containers],
    )
    if created is not None:
        pod["metadata"]["creationTimestamp"] = created
    pod = apiserver.add_pod(pod)
    if lock is not None:
        set_lock(apiserver, f"2026-01-01T00:00:00Z,default,{name}" if lock == "owned" else lock)
    return pod


def set_lock(apiserver: FakeApiServer, value: str) -> None:
    apiserver.update_object(
        "nodes",
        "",
        NODE,
        lambda node: node["metadata"]["annotations"].update({ANNOTATION_NODE_LOCK: value}),
    )


def pod_annotations(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return dict(pod["metadata"]["annotations"])


def node_annotations(apiserver: FakeApiServer) -> dict[str, str]:
    node = apiserver.get_node(NODE)
    assert node is not None
    return dict(node["metadata"]["annotations"])
