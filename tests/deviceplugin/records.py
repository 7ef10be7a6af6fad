"""Pod records as the device plugin reads them from the API server, for its decision tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingKeys
from tests.bookings import keys_from, signed_fields

GPU_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
GPU_B = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
GPU_C = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"
NODE = "node-1"


def make_pod(
    to_allocate: str | None,
    *,
    name: str = "gpu-pod",
    namespace: str = "default",
    containers: Sequence[str] = ("main",),
    init_containers: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    phase: str = "Pending",
    bind_phase: str | None = "allocating",
    bind_time: str | None = "1705054796",
    vgpu_node: str | None = NODE,
) -> PodInfo:
    """A pod bound to NODE as the scheduler leaves it, waiting for its Allocate."""
    annotations: dict[str, str] = {}
    if to_allocate is not None:
        annotations[ANNOTATION_DEVICES_TO_ALLOCATE] = to_allocate
    if bind_phase is not None:
        annotations[ANNOTATION_BIND_PHASE] = bind_phase
    if bind_time is not None:
        annotations[ANNOTATION_BIND_TIME] = bind_time
    if vgpu_node is not None:
        annotations[ANNOTATION_VGPU_NODE] = vgpu_node
    return PodInfo(
        namespace=namespace,
        name=name,
        uid="uid-" + name,
        phase=phase,
        node_name=NODE,
        annotations=annotations,
        labels={},
        init_containers=tuple(ContainerSpec(n) for n in init_containers),
        containers=tuple(ContainerSpec(n, env=dict(env or {})) for n in containers),
        resource_version="1",
        creation_timestamp=None,
    )


KEYS = keys_from(b"device-plugin-test-key-0123456789")
"""The booking key of the decision tests (a scheduler signing with it is trusted)."""


def signed(pod: PodInfo, keys: BookingKeys = KEYS) -> PodInfo:
    """`pod` with the booking signature the scheduler writes at bind, signed with `keys`."""
    fields = signed_fields(pod.uid, pod.annotations)
    assert fields is not None, "the pod lacks a signed field"
    annotations = {**pod.annotations, ANNOTATION_BOOKING_SIGNATURE: keys.sign(fields)}
    return dataclasses.replace(pod, annotations=annotations)
