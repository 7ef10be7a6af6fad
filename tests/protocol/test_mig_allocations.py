"""`hami.io/vgpu-mig-allocations`: HAMi v2.10's encoding byte for byte and its decoder's checks
(ported from pkg/device/nvidia/mig_profiles_test.go, which tests mig_allocations.go)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.mig import (
    MigAllocation,
    MigAllocationError,
    decode_mig_allocations,
    encode_mig_allocations,
    signed_mig_part,
)
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    MigPlacement,
)
from tests.bookings import keys_from, signed_fields

_A = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1))


def test_encode_is_go_marshal_in_struct_order() -> None:
    # TestEncodeDecodeMigAllocations: GPU-a, 1g.5gb at start 6 size 1.
    raw = encode_mig_allocations([_A])
    assert raw == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    assert decode_mig_allocations(raw) == (_A,)


def test_runtime_identity_keeps_zero_ids() -> None:
    # TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs.
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2},"migUUID":"MIG-a","gpuInstanceID":4,'
        '"computeInstanceID":0}]'
    )
    (allocation,) = decode_mig_allocations(raw)
    assert allocation.gpu_instance_id == 4
    assert allocation.compute_instance_id == 0
    assert allocation.runtime_ready
    assert encode_mig_allocations([allocation]) == raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # TestDecodeMigAllocationsRejectsDuplicateDeviceIndex
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
            '"placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":0,'
            '"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]',
            "duplicate MIG allocation for container 0 device 0",
        ),
        # TestDecodeMigAllocationsRejectsPartialRuntimeIdentity
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
            '"placement":{"start":0,"size":2},"migUUID":"MIG-a"}]',
            "MIG allocation 0 has partial runtime identity",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb"}]',
            "MIG allocation 0 is incomplete",
        ),
        (
            '[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"g","profile":"p",'
            '"placement":{"start":0,"size":1}}]',
            "MIG allocation 0 is incomplete",
        ),
        ("{}", "json: cannot unmarshal object into Go value of type []nvidia.MigAllocation"),
        (
            '[{"containerIndex":"0"}]',
            "json: cannot unmarshal string into Go struct field MigAllocation.containerIndex "
            "of type int",
        ),
        (
            '[{"placement":{"start":-1,"size":1}}]',
            "json: cannot unmarshal number -1 into Go struct field "
            "MigAllocation.placement.start of type uint32",
        ),
    ],
)
def test_decode_rejects_as_hami(raw: str, message: str) -> None:
    with pytest.raises(MigAllocationError) as caught:
        decode_mig_allocations(raw)
    assert str(caught.value) == message


def test_decode_folds_keys_and_ignores_unknown_ones_as_go_does() -> None:
    raw = (
        '[{"CONTAINERINDEX":1,"deviceindex":2,"GpuUuid":"GPU-b","profile":"3g.40gb",'
        '"placement":{"Start":4,"SIZE":4},"extra":true,"gpuInstanceID":null}]'
    )
    assert decode_mig_allocations(raw) == (
        MigAllocation(1, 2, "GPU-b", "3g.40gb", MigPlacement(4, 4)),
    )
    assert decode_mig_allocations("") == ()
    assert decode_mig_allocations("null") == ()


_allocations = st.lists(
    st.builds(
        MigAllocation,
        container_index=st.integers(0, 8),
        device_index=st.integers(0, 8),
        gpu_uuid=st.text(min_size=1, max_size=12),
        profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "x<&>\u2028"]),
        placement=st.builds(MigPlacement, st.integers(0, 2**32 - 1), st.integers(1, 8)),
    ),
    max_size=6,
    unique_by=lambda allocation: (allocation.container_index, allocation.device_index),
)


@given(_allocations, st.booleans())
def test_round_trip(allocations: list[MigAllocation], realised: bool) -> None:
    if realised:
        allocations = [
            allocation.with_runtime(f"MIG-{i}", i, 0) for i, allocation in enumerate(allocations)
        ]
    raw = encode_mig_allocations(allocations)
    assert decode_mig_allocations(raw) == tuple(allocations)
    # The encoding is valid JSON with the fields in HAMi's struct order.
    for obj in json.loads(raw):
        keys = list(obj)
        assert keys[:5] == ["containerIndex", "deviceIndex", "gpuUUID", "profile", "placement"]
    # The signed part ignores the runtime identity only.
    plain = encode_mig_allocations([allocation.scheduler_part() for allocation in allocations])
    assert signed_mig_part(decode_mig_allocations(raw)) == plain


_KEYS = keys_from(b"k" * 32)


def _booked(mig: str | None) -> dict[str, str]:
    annotations = {
        ANNOTATION_VGPU_NODE: "node-a",
        ANNOTATION_DEVICES_ALLOCATED: "GPU-a,NVIDIA,10240,14:;",
        ANNOTATION_BIND_TIME: "1700000000",
    }
    if mig is not None:
        annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS] = mig
    return annotations


def test_signature_covers_the_reservation_but_not_the_runtime_identity() -> None:
    booked = _booked(encode_mig_allocations([_A]))
    fields = signed_fields("uid-1", booked)
    assert fields is not None
    signature = _KEYS.sign(fields)
    # The device plugin fills the runtime identity in: still verifies.
    realised = dict(booked)
    realised[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations(
        [_A.with_runtime("MIG-x", 1, 0)]
    )
    assert _KEYS.verify(signature, signed_fields("uid-1", realised))
    # A tenant moves the placement, drops the annotation, or adds one: none verifies.
    moved = dict(booked)
    moved[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations(
        [MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(0, 1))]
    )
    assert not _KEYS.verify(signature, signed_fields("uid-1", moved))
    assert not _KEYS.verify(signature, signed_fields("uid-1", _booked(None)))
    plain = signed_fields("uid-1", _booked(None))
    assert plain is not None
    plain_signature = _KEYS.sign(plain)
    assert not _KEYS.verify(plain_signature, fields)
    broken = dict(booked)
    broken[ANNOTATION_VGPU_MIG_ALLOCATIONS] = "[not json"
    assert not _KEYS.verify(signature, signed_fields("uid-1", broken))
