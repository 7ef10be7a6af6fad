"""Dynamic MIG over the wire: a MIG-mode A100 node registered on the API server double, `/filter`
and `/bind` over HTTP with a booking key, and the `hami.io/vgpu-mig-allocations` the bind
writes: byte-equal to HAMi's EncodeMigAllocations (device.go:505-517, mig_allocations.go:48-73)
and covered by the booking signature (the device plugin's runtime identity aside)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hami_plugin.protocol import codec
from hami_plugin.protocol.mig import decode_mig_allocations, encode_mig_allocations
from hami_plugin.protocol.model import (
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    GpuDevice,
    MigPlacement,
    MigProfile,
)
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.apiserver import FakeApiServer, make_node
from tests.bookings import verify_pod
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import KEYS, write_key_file
from tests.processes import wait_until

A100 = "NVIDIA-A100-SXM4-40GB"


def _p(start: int, size: int) -> MigPlacement:
    return MigPlacement(start, size)


PROFILES = (
    MigProfile("1g.5gb", 5120, 14, 1, tuple(_p(i, 1) for i in range(7))),
    MigProfile("2g.10gb", 10240, 28, 2, (_p(0, 2), _p(2, 2), _p(4, 2))),
    MigProfile("3g.20gb", 20480, 42, 3, (_p(0, 4), _p(4, 4))),
)


def mig_node(name: str) -> dict[str, Any]:
    device = GpuDevice(f"GPU-{name}-0", 0, 7, 40960, 100, A100, 0, "mig", True, PROFILES)
    node = make_node(
        name,
        annotations={ANNOTATION_NODE_REGISTER: codec.encode_node_devices([device])},
        allocatable={"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "7"},
    )
    node["metadata"]["resourceVersion"] = "1"
    return node


def annotations_of(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return dict(pod["metadata"].get("annotations", {}))


def reservation(apiserver: FakeApiServer, name: str) -> str:
    wait_until(
        lambda: ANNOTATION_VGPU_MIG_ALLOCATIONS in annotations_of(apiserver, name),
        what=f"{name}'s MIG reservation",
    )
    return annotations_of(apiserver, name)[ANNOTATION_VGPU_MIG_ALLOCATIONS]


def test_a_mig_bind_writes_a_signed_hami_reservation(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.add_object(mig_node("n1"))
    mode = {"nvidia.com/vgpu-mode": "mig"}
    first = apiserver.add_object(gpu_pod("small", memory=8000, annotations=mode))
    second = apiserver.add_object(gpu_pod("tiny", memory=4000, containers=2))
    key_file = write_key_file(tmp_path / "booking-keys")
    with running_scheduler(apiserver, booking_key_file=str(key_file)) as scheduler:
        assert scheduler.schedule(first, ["n1"]) == "n1"
        raw = reservation(apiserver, "small")
        assert raw == (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"2g.10gb",'
            '"placement":{"start":0,"size":2}}]'
        )
        notes = annotations_of(apiserver, "small")
        assert notes["hami.io/vgpu-devices-allocated"] == "GPU-n1-0,NVIDIA,10240,28:;"
        uid = first["metadata"]["uid"]
        assert verify_pod(KEYS, uid, notes)
        # the device plugin's runtime identity keeps the signature; a moved placement breaks it
        (allocation,) = decode_mig_allocations(raw)
        realised = dict(notes)
        realised[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations(
            [allocation.with_runtime("MIG-1", 3, 0)]
        )
        assert verify_pod(KEYS, uid, realised)
        moved = copy.deepcopy(notes)
        moved[ANNOTATION_VGPU_MIG_ALLOCATIONS] = raw.replace('"start":0', '"start":2')
        assert not verify_pod(KEYS, uid, moved)
        assert ANNOTATION_BOOKING_SIGNATURE in notes
        # the watch event of the bound pod keeps the reservation booked (its booking verifies)
        scheduler.sees_pod(
            "default", "small", lambda p: ANNOTATION_VGPU_MIG_ALLOCATIONS in p.annotations
        )
        tracked = scheduler.state.tracked("default/small")
        assert tracked is not None and tracked.mig == (allocation,)

        # the reservation counts at once: the next pod's two 1g instances avoid slices 0-1
        apiserver.update_object(
            "nodes", "", "n1", lambda n: n["metadata"]["annotations"].pop(ANNOTATION_NODE_LOCK)
        )
        assert scheduler.schedule(second, ["n1"]) == "n1"
        assert reservation(apiserver, "tiny") == (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"1g.5gb",'
            '"placement":{"start":6,"size":1}},'
            '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"1g.5gb",'
            '"placement":{"start":5,"size":1}}]'
        )
        assert verify_pod(KEYS, second["metadata"]["uid"], annotations_of(apiserver, "tiny"))


def test_a_stale_reservation_is_removed_by_a_bind_without_mig(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """A pod still carrying an earlier booking's reservation (a revert that did not reach
    it) bound to a hami-core GPU: the bind removes the reservation, so the signed booking
    verifies and the reservation books nothing."""
    apiserver.add_object(gpu_node("n1"))
    stale = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    pod = apiserver.add_object(
        gpu_pod("again", memory=1000, annotations={ANNOTATION_VGPU_MIG_ALLOCATIONS: stale})
    )
    key_file = write_key_file(tmp_path / "booking-keys")
    with running_scheduler(apiserver, booking_key_file=str(key_file)) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        wait_until(
            lambda: ANNOTATION_BOOKING_SIGNATURE in annotations_of(apiserver, "again"),
            what="the signed booking",
        )
        notes = annotations_of(apiserver, "again")
        assert ANNOTATION_VGPU_MIG_ALLOCATIONS not in notes
        assert verify_pod(KEYS, pod["metadata"]["uid"], notes)
