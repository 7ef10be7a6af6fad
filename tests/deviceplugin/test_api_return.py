"""Allocate just after an API server outage, in process (issue 15, item 3).

When the API server answers again, the write-behind queue still holds the writes of the pods
served during the outage (it waits out its backoff, up to 5 s) and the node's watch is still
down (its backoff reaches 30 s). A pod bound in that window is in neither; kubelet admits it at
once, and a failed Allocate is final for kubelet (the pod ends `UnexpectedAdmissionError`).
So while writes are queued Allocate still asks the API when the watch holds no pod the call
could be for (the read overlaid with the queued writes, which stay in order). Found by
`tests/extender/test_outage_e2e.py`, where about one run in ten lost a pod that way.
"""

from __future__ import annotations

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.allocator import AWAY_HOLD_SECONDS, PodAllocator
from hami_plugin.deviceplugin.nodecache import NodeCache
from hami_plugin.deviceplugin.writebehind import WriteBehind
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    PodDevices,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.deviceplugin.test_signed_wire import GPUS, NODE, entries, gpu_container, stamp
from tests.processes import wait_until


def _add_bound(apiserver: FakeApiServer, name: str, booking: PodDevices, created: int) -> None:
    """A pod as the scheduler's bind leaves it: booked (unsigned) and bound to the node."""
    value = codec.encode_pod_devices(booking)
    apiserver.add_object(
        make_pod(
            name,
            node_name=NODE,
            containers=[gpu_container(len(booking[0]), name="c0")],
            creation_timestamp=stamp(created),
            labels={LABEL_VGPU_NODE: NODE},
            annotations={
                ANNOTATION_DEVICES_TO_ALLOCATE: value,
                ANNOTATION_DEVICES_ALLOCATED: value,
                ANNOTATION_VGPU_NODE: NODE,
                ANNOTATION_BIND_PHASE: "allocating",
                ANNOTATION_BIND_TIME: str(1_772_323_200 + created),
            },
        )
    )


def _in_watch(cache: NodeCache, name: str) -> bool:
    return any(pod.name == name for pod in cache.pods())


def test_a_pod_bound_after_the_api_returns_is_served_while_writes_are_still_queued(
    apiserver: FakeApiServer,
    allocator_parts: tuple[PodAllocator, NodeCache, WriteBehind, ManualClock],
) -> None:
    allocator, cache, writes, clock = allocator_parts
    _add_bound(apiserver, "during", entries((0, 20480)), created=0)
    wait_until(lambda: _in_watch(cache, "during"), "the watch has the pod")

    # the outage: the pod is served from the watch, its writes queued
    apiserver.inject_fault(status=503, times=None)
    served = allocator.allocate([[f"{GPUS[0]}-0"]])
    assert [d.uuid for d in served.containers[0].devices] == [GPUS[0]]
    queued = writes.backlog
    assert queued > 0

    # the API server answers again; the queue has not drained, the watch has not resumed
    apiserver.clear_faults()
    apiserver.inject_fault("GET", ".*", query=".*watch=true.*", times=None, status=503)
    apiserver.drop_watches()
    clock.advance(AWAY_HOLD_SECONDS + 1)
    _add_bound(apiserver, "after", entries((1, 20480)), created=1)
    assert not _in_watch(cache, "after")

    # read from the API (the watch has no pod this call could be for), overlaid with the
    # queued writes: "during" is not served twice, "after" gets its booking
    decision = allocator.allocate([[f"{GPUS[1]}-0"]])
    assert [d.uuid for d in decision.containers[0].devices] == [GPUS[1]]
    assert decision.complete
    # its writes queue behind the earlier ones, in order
    assert writes.backlog > queued
