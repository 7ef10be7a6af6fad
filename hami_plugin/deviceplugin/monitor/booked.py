"""What a container's HAMi-core region may claim: the GPUs its pod's booking gives it and the
priority its spec sets. Pure, no I/O.

The region file belongs to the workload: it can write any GPU identity and any priority there.
HAMi's feedback (`cmd/vGPUmonitor/feedback.go:83-97`, v2.10) and metrics
(`cmd/vGPUmonitor/metrics.go:451-460`) trust both, so one container could block (`recentKernel
= -1`) and switch (`utilizationSwitch = 1`) another tenant's containers on a GPU it was never
given, and publish series for invented GPUs. Here:

* the GPUs a region may name are the container's entry of `hami.io/vgpu-devices-allocated`
  (init containers first, then app containers: the index Allocate serves, docs/hami-reference.md
  1.4.4), and with booking keys only when the booking's signature verifies
  (`deviceplugin.pending.booking_refusal`'s rule); other identities are ignored;
* the priority is the one HAMi-core sets from the container's environment when it creates the
  region: `CUDA_TASK_PRIORITY` parsed with C `atoi`, 1 when unset (HAMi-core
  `src/multiprocess/multiprocess_memory_limit.c`, `try_create_shrreg`); HAMi's webhook writes
  that variable from the `nvidia.com/priority` limit (`pkg/device/nvidia/device.go:352-357`),
  so it is what the pod spec says, not what the file says now;
* a region of a pod that is not on this node, or whose booking is missing, unreadable or not
  signed, is not booked: it takes no part in the feedback and exports no series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.signature import BookingKeys

ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
DEFAULT_TASK_PRIORITY = 1
"""HAMi-core's `priority` when `CUDA_TASK_PRIORITY` is unset."""

_ATOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class BookedContainer:
    """What the booking and the spec say about one container."""

    gpus: frozenset[str]
    """UUIDs of the GPUs its booking entry holds, and of the MIG instances the device plugin
    created for it on them (`hami.io/vgpu-mig-allocations`' runtime identity, which only the
    device plugin may write): HAMi-core inside a MIG instance sees the instance's UUID."""
    priority: int


@dataclass(frozen=True, slots=True)
class NotBooked:
    """Why a region is not trusted; `reason` is a short stable code (log once per reason)."""

    reason: str
    message: str


def task_priority(container: ContainerSpec) -> int:
    """The priority HAMi-core writes into the container's region: C `atoi` of
    `CUDA_TASK_PRIORITY` (leading blanks, a sign, digits; 0 when none), 1 when unset.

    A value beyond int32 (undefined for `atoi`) is clamped.
    """
    value = container.env.get(ENV_TASK_PRIORITY)
    if value is None:
        return DEFAULT_TASK_PRIORITY
    match = _ATOI.match(value)
    if match is None:
        return 0
    return max(_INT32_MIN, min(_INT32_MAX, int(match.group(1))))


def _container_index(pod: PodInfo, name: str) -> tuple[int, ContainerSpec] | None:
    for index, container in enumerate((*pod.init_containers, *pod.containers)):
        if container.name == name:
            return index, container
    return None


def booked_container(
    pod: PodInfo | None, container_name: str, keys: BookingKeys | None
) -> BookedContainer | NotBooked:
    """What the region of `container_name` in `pod` may claim, or why it may claim nothing.

    `pod`: the pod on this node with the directory's UID (None: unknown). `keys`: the booking
    keys (None: bookings are trusted unsigned, as in HAMi).
    """
    if pod is None:
        return NotBooked("unknown-pod", "no pod with this UID on the node")
    found = _container_index(pod, container_name)
    if found is None:
        return NotBooked(
            "unknown-container", f"pod {pod.namespace}/{pod.name} has no such container"
        )
    index, container = found
    booking = pod.booking
    if booking is None or booking.allocated_text is None:
        return NotBooked("no-booking", f"pod {pod.namespace}/{pod.name} has no booking")
    if keys is not None and not booking.verifies(keys, pod.uid):
        return NotBooked(
            "not-signed", f"the booking of pod {pod.namespace}/{pod.name} is not signed"
        )
    if pod.node_name and booking.node and booking.node != pod.node_name:
        return NotBooked("other-node", f"pod {pod.namespace}/{pod.name} is booked on another node")
    try:
        entries = booking.allocated or ()
    except ValueError as error:
        return NotBooked("bad-booking", f"pod {pod.namespace}/{pod.name}: {error}")
    entry = entries[index] if index < len(entries) else ()
    if not entry:
        return NotBooked(
            "no-gpus", f"pod {pod.namespace}/{pod.name}: the booking gives this container no GPU"
        )
    gpus = {device.uuid for device in entry}
    try:
        reservations = booking.mig or ()
    except ValueError:
        reservations = ()  # an unreadable MIG annotation adds no instance
    gpus |= {
        mig.mig_uuid
        for mig in reservations
        if mig.container_index == index and mig.gpu_uuid in gpus and mig.mig_uuid
    }
    return BookedContainer(gpus=frozenset(gpus), priority=task_priority(container))
