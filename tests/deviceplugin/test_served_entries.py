"""With a booking key an entry is served once per pod, whatever its author writes back.

The allocator against the API server double: a signed two-container pod whose author restores
its consumed `hami.io/vgpu-devices-to-allocate` between the containers' Allocate calls (it still
equals the signed booking), and the record of what was served (`allocator.ServedEntries`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.allocate import AllocateConfig, AllocationDecision
from hami_plugin.deviceplugin.allocator import PodAllocationError, PodAllocator, ServedEntries
from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
from hami_plugin.deviceplugin.preferred import PreferredRequest
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_DEVICES_TO_ALLOCATE
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.apiserver import FakeApiServer, JsonObject
from hami_plugin.testing.hamicore import install_fake_hamicore
from tests.bookings import signed_fields
from tests.deviceplugin.pods import (
    GPU_A,
    GPU_B,
    NODE,
    add_pending_pod,
    dev,
    pod_annotations,
    vgpus,
)
from tests.deviceplugin.records import KEYS

ADVERTISED = {device.id for device in vgpus(GPU_A, GPU_B)}
BOOKING = codec.encode_pod_devices(((dev(GPU_A, 1000),), (dev(GPU_B, 2000),)))


@pytest.fixture(autouse=True)
def node(apiserver: FakeApiServer) -> None:
    apiserver.add_node(NODE)


def make_allocator(kube: KubeClient, tmp_path: Path, *, with_key: bool = True) -> PodAllocator:
    install_fake_hamicore(tmp_path / "hook")
    return PodAllocator(
        kube,
        NODE,
        AllocateConfig(hook_path=str(tmp_path / "hook"), vgpulock_host_path=str(tmp_path / "l")),
        booking_keys=(lambda: KEYS) if with_key else None,
        hamicore=HamiCoreWatch(str(tmp_path / "hook"), node_name=NODE, version="9.9.9"),
    )


def add_signed_pod(apiserver: FakeApiServer, name: str) -> str:
    """A two-container pod booked GPU A (1000 MiB) then GPU B (2000 MiB), signed as the
    scheduler's bind signs it; returns its UID."""
    pod = add_pending_pod(apiserver, name, raw_value=BOOKING, containers=("a", "b"), lock=None)
    uid = str(pod["metadata"]["uid"])
    fields = signed_fields(uid, pod["metadata"]["annotations"])
    assert fields is not None
    signature = KEYS.sign(fields)
    set_annotations(apiserver, name, {ANNOTATION_BOOKING_SIGNATURE: signature})
    return uid


def set_annotations(apiserver: FakeApiServer, name: str, values: dict[str, str]) -> None:
    """What the pod's author can write at any time (pod update rights)."""

    def update(pod: JsonObject) -> None:
        pod["metadata"]["annotations"].update(values)

    apiserver.update_object("pods", "default", name, update)


def served_gpu(decision: AllocationDecision) -> tuple[int, str]:
    (container,) = decision.containers
    return container.entry_index, container.envs["NVIDIA_VISIBLE_DEVICES"]


def test_an_entry_written_back_after_it_was_served_goes_to_no_later_container(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uid = add_signed_pod(apiserver, "tenant")
    allocator = make_allocator(kube, tmp_path)
    assert served_gpu(allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)) == (0, GPU_A)
    assert allocator.served is not None
    assert allocator.served.served(uid) == {0}

    # The author restores entry 0: the signed booking again, so no refusal can tell.
    set_annotations(apiserver, "tenant", {ANNOTATION_DEVICES_TO_ALLOCATE: BOOKING})
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.allocator"):
        # GetPreferredAllocation follows the entry still due, GPU B, as Allocate does.
        (answer,) = allocator.preferred([_request(size=1)])
        assert answer.device_ids == (f"{GPU_B}-0",)
        decision = allocator.allocate([[f"{GPU_A}-1"]], ADVERTISED)
    assert served_gpu(decision) == (1, GPU_B)  # not GPU A a second time
    assert decision.complete
    annotations = pod_annotations(apiserver, "tenant")
    assert annotations[ANNOTATION_BIND_PHASE] == "success"
    assert not any(codec.decode_pod_devices(annotations[ANNOTATION_DEVICES_TO_ALLOCATE]))
    assert allocator.served.served(uid) == {0, 1}
    assert any(
        "offers entries 0 again, which were served already" in r.getMessage()
        for r in caplog.records
    )


def test_without_a_key_a_written_back_entry_is_served_again_as_in_hami(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path
) -> None:
    add_signed_pod(apiserver, "tenant")
    allocator = make_allocator(kube, tmp_path, with_key=False)
    assert allocator.served is None
    assert served_gpu(allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)) == (0, GPU_A)
    set_annotations(apiserver, "tenant", {ANNOTATION_DEVICES_TO_ALLOCATE: BOOKING})
    assert served_gpu(allocator.allocate([[f"{GPU_A}-1"]], ADVERTISED)) == (0, GPU_A)


def test_an_entry_counts_as_served_only_once_its_patch_succeeded(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path
) -> None:
    uid = add_signed_pod(apiserver, "tenant")
    allocator = make_allocator(kube, tmp_path)
    assert allocator.served is not None
    # Both attempts of the consuming patch fail; the failure report then goes through.
    apiserver.inject_fault("PATCH", "/api/v1/namespaces/default/pods/tenant", status=500, times=2)
    with pytest.raises(PodAllocationError):
        allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    annotations = pod_annotations(apiserver, "tenant")
    assert annotations[ANNOTATION_BIND_PHASE] == "failed"
    assert annotations[ANNOTATION_DEVICES_TO_ALLOCATE] == BOOKING  # nothing was consumed
    assert allocator.served.served(uid) == frozenset()
    # A retried Allocate the annotation still allows is answered with the same entry.
    set_annotations(apiserver, "tenant", {ANNOTATION_BIND_PHASE: "allocating"})
    assert served_gpu(allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)) == (0, GPU_A)
    assert allocator.served.served(uid) == {0}


def test_the_record_of_a_pod_that_is_gone_is_dropped(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path
) -> None:
    first = add_signed_pod(apiserver, "first")
    allocator = make_allocator(kube, tmp_path)
    assert allocator.served is not None
    allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert apiserver.delete_pod("default", "first")
    second = add_signed_pod(apiserver, "second")
    allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert allocator.served.served(first) == frozenset()
    assert allocator.served.served(second) == {0}
    assert len(allocator.served) == 1


# --- the record itself ---------------------------------------------------------------------------


def listed(*uids: str) -> list[PodInfo]:
    return [PodInfo(namespace="default", name=uid, uid=uid) for uid in uids]


def test_the_record_keeps_at_most_max_pods_the_longest_served_going_first() -> None:
    record = ServedEntries(max_pods=2)
    record.record("a", [0])
    record.record("b", [0])
    record.record("a", [1])  # served again: now the most recent
    record.record("c", [0])
    assert len(record) == 2
    assert record.served("b") == frozenset()
    assert record.served("a") == {0, 1}
    assert record.served("c") == {0}
    record.record("", [0])  # a pod without a UID is never served
    assert len(record) == 2


def test_the_record_forgets_the_pods_a_listing_lacks_and_leaves_the_others_as_they_are() -> None:
    record = ServedEntries()
    record.record("a", [0])
    record.record("b", [0])
    pods = listed("b", "x")  # no to-allocate: nothing to consume
    assert [p is q for p, q in zip(record.applied(pods), pods, strict=True)] == [True, True]
    assert record.served("a") == frozenset()
    assert record.served("b") == {0}


def _request(size: int) -> PreferredRequest:
    return PreferredRequest(available=tuple(sorted(ADVERTISED)), must_include=(), size=size)
