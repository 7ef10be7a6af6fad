"""Allocate through an API server outage, over real wires (issue 15, item 3).

`hami device-plugin --nvml fake --booking-key-file ...` runs as a sub-process against the API
server double; pods are booked and bound as the scheduler's bind leaves them (signed with the
booking key), the plugin's watch sees them, then every call to the API server fails (refused,
503, or hangs) and its watches are cut. The test kubelet then admits the pods it already has,
as kubelet does after an API server goes away: GetPreferredAllocation and Allocate per GPU
container, oldest pod first. The outage lasts as long as the admissions take (a few seconds):
nothing in the plugin depends on how long it lasts, only on whether the API server answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.allocator import AWAY_HOLD_SECONDS, PodAllocator
from hami_plugin.deviceplugin.nodecache import NodeCache
from hami_plugin.deviceplugin.preferred import PreferredRequest
from hami_plugin.deviceplugin.writebehind import WriteBehind
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec, inflight
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    PodDevices,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingFields
from hami_plugin.testing.apiserver import FakeApiServer, JsonObject, make_pod
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.kubelet import FakeKubelet
from tests.deviceplugin.test_signed_wire import (
    EPOCH,
    GPUS,
    KEYS,
    NODE,
    SPLIT,
    Node,
    entries,
    gpu_container,
    key_file_args,
    slots_allocated,
    stamp,
    start_plugin,
)
from tests.processes import wait_until

T = TypeVar("T")

CALL_TIMEOUT = 30.0
"""gRPC deadline of kubelet's calls: the first Allocate of an outage may spend the plugin's read
budget (5 s) on a hanging API server."""

OUTAGES = ("refused", "http-503", "hangs")
LOCK = "2026-03-01T00:00:00Z,default,locked"
"""HAMi's scheduler's node lock, naming the pod `locked`."""


@contextlib.contextmanager
def running(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    node_annotations: Mapping[str, str],
) -> Iterator[Node]:
    """The device plugin with a booking key, registered with the test kubelet, its watch of
    the node (with `node_annotations`) listed."""
    apiserver.add_node(NODE, annotations=dict(node_annotations))
    with FakeKubelet(sock_dir) as kubelet:
        # Without kubelet's PodResources API (in-flight/v1, creation order): the outage is
        # what is tested here; kubelet's confirmation of each call is `test_admission_wire`'s.
        no_podresources = ("--pod-resources-socket", "")
        plugin, url = start_plugin(
            tmp_path, sock_dir, apiserver, *key_file_args(tmp_path), *no_podresources
        )
        try:
            kubelet.wait_for_registrations(1, timeout=15)
            kubelet.wait_for_list(lambda states: len(states) == len(GPUS) * SPLIT, timeout=30.0)
            plugin.wait_for_log(rf"informer: node {NODE}: listed 1 objects")
            yield Node(apiserver, kube, kubelet, plugin, url)
            apiserver.clear_faults()  # the plugin's shutdown withdraws its annotation
            code = plugin.stop(20)
        finally:
            plugin.kill()  # only when something above failed: the exit status is kept
        assert code == 0, plugin.log()


@pytest.fixture
def node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    with running(sock_dir, tmp_path, apiserver, kube, {}) as started:
        yield started


@pytest.fixture
def locked_node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The same, on a node whose lock names the pod `locked` before the plugin lists it."""
    with running(sock_dir, tmp_path, apiserver, kube, {ANNOTATION_NODE_LOCK: LOCK}) as started:
        yield started


def bind_signed(node: Node, name: str, booking: PodDevices, created: int) -> None:
    """A pod with one container per booked entry, booked, signed and bound as the scheduler's
    bind leaves it (one annotation patch, then the Binding)."""
    containers = [
        gpu_container(len(entry), name=f"c{index}") for index, entry in enumerate(booking)
    ]
    pod = make_pod(name, containers=containers, creation_timestamp=stamp(created))
    uid = str(node.apiserver.add_pod(pod)["metadata"]["uid"])
    node.kube.patch_pod_metadata("default", name, booking_annotations(uid, booking, created))
    node.kube.bind_pod("default", name, uid, NODE)


def booking_annotations(uid: str, booking: PodDevices, created: int) -> dict[str, str | None]:
    value = codec.encode_pod_devices(booking)
    bind_time = str(int(EPOCH.timestamp()) + created + 1)
    signature = KEYS.sign(BookingFields(uid=uid, node=NODE, devices=value, bind_time=bind_time))
    return {
        ANNOTATION_DEVICES_TO_ALLOCATE: value,
        ANNOTATION_DEVICES_ALLOCATED: value,
        ANNOTATION_VGPU_NODE: NODE,
        ANNOTATION_BIND_PHASE: "allocating",
        ANNOTATION_BIND_TIME: bind_time,
        ANNOTATION_BOOKING_SIGNATURE: signature,
    }


def annotations_of(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return dict(pod["metadata"]["annotations"])


def pod_status(apiserver: FakeApiServer, name: str) -> JsonObject:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return dict(pod.get("status") or {})


def all_consumed(apiserver: FakeApiServer, name: str) -> bool:
    view = inflight.in_flight_pod(
        PodInfo("default", name, annotations=annotations_of(apiserver, name))
    )
    return view is not None and view.finished


def start_outage(apiserver: FakeApiServer, outage: str = "refused") -> None:
    """Every request is refused (the connection closed), answered 503, or hangs (30 s, then
    closed); every open watch is cut."""
    if outage == "refused":
        apiserver.inject_fault(times=None, disconnect=True)
    elif outage == "http-503":
        apiserver.inject_fault(times=None, status=503)
    else:
        apiserver.inject_fault(times=None, hang_seconds=30, disconnect=True)
    apiserver.drop_watches()


def end_outage(apiserver: FakeApiServer) -> int:
    """The API server answers again; returns where its request log stood just before (an
    attempt logged between the two is a retry of the write that is applied next)."""
    since = len(apiserver.requests)
    apiserver.clear_faults()
    return since


def without_retries(items: list[T]) -> list[T]:
    """`items` without an item equal to the one before it (a failed attempt, sent again)."""
    return [item for index, item in enumerate(items) if index == 0 or items[index - 1] != item]


def slots(*gpu_indexes: int) -> list[str]:
    return [f"{GPUS[index]}-{slot}" for index in gpu_indexes for slot in range(SPLIT)]


def admit_container(node: Node, available: list[str], count: int) -> tuple[str, list[str]]:
    """kubelet's calls for one container: GetPreferredAllocation, then Allocate with its
    answer. Returns NVIDIA_VISIBLE_DEVICES and the IDs used."""
    chosen = node.kubelet.preferred(available, size=count, timeout=CALL_TIMEOUT)
    (container,) = node.kubelet.allocate(chosen, timeout=CALL_TIMEOUT).container_responses
    for device_id in chosen:
        available.remove(device_id)
    return container.envs["NVIDIA_VISIBLE_DEVICES"], chosen


def patches_of(requests: list[RecordedRequest], name: str) -> list[dict[str, str | None]]:
    path = f"/api/v1/namespaces/default/pods/{name}"
    return without_retries(
        [
            r.json()["metadata"]["annotations"]
            for r in requests
            if r.method == "PATCH" and r.path == path
        ]
    )


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("outage", OUTAGES)
def test_pods_the_watch_saw_are_served_through_an_outage_and_written_after_it(
    node: Node, outage: str
) -> None:
    a = entries((0, 20480))
    b = (*entries((1, 20480)), *entries((2, 20480), (3, 20480)))  # two containers: 1 GPU, 2 GPUs
    c = entries((0, 20480), (1, 20480))
    bind_signed(node, "a", a, created=0)
    bind_signed(node, "b", b, created=1)
    bind_signed(node, "c", c, created=2)
    booked = {GPUS[0]: 2, GPUS[1]: 2, GPUS[2]: 1, GPUS[3]: 1}
    wait_until(lambda: slots_allocated(node) == booked, "the plugin's watch has the pods")

    start_outage(node.apiserver, outage)
    available = slots(0, 1, 2, 3)
    # kubelet admits the pods it has, oldest first, one container at a time.
    assert admit_container(node, available, 1)[0] == GPUS[0]  # a
    assert admit_container(node, available, 1)[0] == GPUS[1]  # b, c0
    served, ids = admit_container(node, available, 2)  # b, c1: GetPreferredAllocation followed
    assert served == f"{GPUS[2]},{GPUS[3]}"
    assert sorted({i.rsplit("-", 1)[0] for i in ids}) == sorted([GPUS[2], GPUS[3]])
    assert admit_container(node, available, 2)[0] == f"{GPUS[0]},{GPUS[1]}"  # c
    assert "chosen from the node's watch" in node.plugin.log()
    # Nothing could be written meanwhile: the pods still read as the bind left them.
    for name in "abc":
        assert annotations_of(node.apiserver, name)[ANNOTATION_BIND_PHASE] == "allocating"
        assert pod_status(node.apiserver, name).get("phase") != "Failed"

    since = end_outage(node.apiserver)
    wait_until(
        lambda: all(
            annotations_of(node.apiserver, name)[ANNOTATION_BIND_PHASE] == "success"
            for name in "abc"
        ),
        "every pod's bind-phase is success",
        timeout=60,  # after a hang, a write in flight first spends its budget (10 s)
    )
    for name in "abc":
        assert all_consumed(node.apiserver, name)
    written = node.apiserver.requests[since:]
    # b's two patches in the order of its containers: entry 0 consumed, then entry 1 + success.
    first, second = patches_of(written, "b")
    assert ANNOTATION_BIND_PHASE not in first
    assert codec.decode_pod_devices(first[ANNOTATION_DEVICES_TO_ALLOCATE] or "")[0] == ()
    assert second[ANNOTATION_BIND_PHASE] == "success"
    assert [p[ANNOTATION_BIND_PHASE] for p in patches_of(written, "a")] == ["success"]
    assert ANNOTATION_NODE_LOCK not in (node.apiserver.get_node(NODE) or {})["metadata"].get(
        "annotations", {}
    )
    assert node.apiserver.events("default") == []  # no failure to report
    # Served once each: the watch, back too, counts what the bookings say.
    wait_until(lambda: slots_allocated(node) == booked, "the bookings counted once")


def test_the_node_lock_of_a_pod_served_during_an_outage_is_released_after_its_patches(
    locked_node: Node,
) -> None:
    node = locked_node
    booking = (*entries((0, 10240)), *entries((1, 10240)))
    bind_signed(node, "locked", booking, created=0)
    wait_until(lambda: slots_allocated(node)[GPUS[1]] == 1, "the plugin's watch has the pod")

    start_outage(node.apiserver)
    available = slots(0, 1)
    assert admit_container(node, available, 1)[0] == GPUS[0]
    assert admit_container(node, available, 1)[0] == GPUS[1]
    since = end_outage(node.apiserver)
    wait_until(
        lambda: (
            ANNOTATION_NODE_LOCK
            not in (node.apiserver.get_node(NODE) or {})["metadata"]["annotations"]
        ),
        "the lock released",
    )
    written = node.apiserver.requests[since:]
    pod_path = "/api/v1/namespaces/default/pods/locked"
    order = without_retries(
        [
            ("pod" if r.path == pod_path else "node", r.json()["metadata"]["annotations"])
            for r in written
            if r.method == "PATCH"
            and r.path in (pod_path, f"/api/v1/nodes/{NODE}")
            and (r.path == pod_path or ANNOTATION_NODE_LOCK in r.json()["metadata"]["annotations"])
        ]
    )
    assert [kind for kind, _ in order] == ["pod", "pod", "node"]
    assert order[1][1][ANNOTATION_BIND_PHASE] == "success"
    assert order[2][1] == {ANNOTATION_NODE_LOCK: None}
    assert annotations_of(node.apiserver, "locked")[ANNOTATION_BIND_PHASE] == "success"


def test_a_pod_the_watch_never_saw_fails_clearly_and_disturbs_no_other(node: Node) -> None:
    bind_signed(node, "seen", entries((0, 20480)), created=0)
    wait_until(lambda: slots_allocated(node)[GPUS[0]] == 1, "the plugin's watch has the pod")

    start_outage(node.apiserver)
    # Bound just before the outage, delivered to kubelet but never to the plugin's watch.
    unseen = make_pod(
        "unseen", node_name=NODE, containers=[gpu_container(2, name="c0")],
        creation_timestamp=stamp(1), labels={LABEL_VGPU_NODE: NODE},
    )  # fmt: skip
    uid = str(node.apiserver.add_pod(unseen)["metadata"]["uid"])
    booking = entries((2, 20480), (3, 20480))
    node.apiserver.update_object(
        "pods",
        "default",
        "unseen",
        lambda pod: pod["metadata"]["annotations"].update(
            {k: v for k, v in booking_annotations(uid, booking, 1).items() if v is not None}
        ),
    )
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate(slots(2)[:1] + slots(3)[:1], timeout=CALL_TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details()
    assert "the API server does not answer" in details
    assert "node's watch" in details and "holds none that this call could be for" in details
    # The pod it has is served as booked all the same.
    available = slots(0, 1)
    assert admit_container(node, available, 1)[0] == GPUS[0]

    end_outage(node.apiserver)
    wait_until(
        lambda: annotations_of(node.apiserver, "seen")[ANNOTATION_BIND_PHASE] == "success",
        "the served pod's success written",
    )
    # The plugin never knew the unseen pod: it wrote nothing to it (kubelet fails it itself).
    assert annotations_of(node.apiserver, "unseen")[ANNOTATION_BIND_PHASE] == "allocating"
    assert annotations_of(node.apiserver, "unseen")[ANNOTATION_DEVICES_TO_ALLOCATE] == (
        codec.encode_pod_devices(booking)
    )
    assert node.apiserver.events("default") == []


# --- in process: when Allocate asks the API server again -----------------------------------------


def test_after_a_read_finds_the_api_away_the_next_reads_skip_it_for_a_while(
    apiserver: FakeApiServer,
    allocator_parts: tuple[PodAllocator, NodeCache, WriteBehind, ManualClock],
) -> None:
    allocator, _, writes, clock = allocator_parts
    apiserver.inject_fault(status=503, times=None)
    request = PreferredRequest(available=(f"{GPUS[0]}-0",), must_include=(), size=1)
    allocator.preferred([request])  # the API read fails: from the watch
    asked = len(apiserver.requests)
    clock.advance(AWAY_HOLD_SECONDS / 2)
    allocator.preferred([request])
    assert len(apiserver.requests) == asked  # held: the API server was not asked
    clock.advance(AWAY_HOLD_SECONDS)
    apiserver.clear_faults()
    allocator.preferred([request])
    assert len(apiserver.requests) > asked  # asked again, and it answered
    apiserver.inject_fault(status=503, times=None)
    asked = len(apiserver.requests)
    allocator.preferred([request])
    assert len(apiserver.requests) > asked  # no hold after a read that succeeded
    assert writes.backlog == 0
