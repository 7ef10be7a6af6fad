"""The booking view (`protocol.booking`): what a pod's annotations book, read once, decoded on
first use and kept; consumed entries; what the signature covers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol import codec
from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS, BOOKING_LABELS, read_booking
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.mig import MigAllocationError
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    ContainerDevice,
    PodDevices,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingFields
from tests.bookings import keys_from

KEY = keys_from(b"k" * 32)
GPU_A = ContainerDevice("GPU-a", "NVIDIA", 1000, 10)
GPU_B = ContainerDevice("GPU-b", "NVIDIA", 2000, 20)
BOOKED: PodDevices = ((GPU_A,), (), (GPU_B, GPU_A))
READ = (*BOOKED, ())  # as every pod list decodes: a trailing empty entry
FIELDS = BookingFields(
    uid="6f1c2b0e-0000-4000-8000-000000000001",
    node="gpu-a100",
    devices=codec.encode_pod_devices(BOOKED),
    bind_time="1767268800",
)


def booked_annotations(**extra: str) -> dict[str, str]:
    return {
        ANNOTATION_VGPU_NODE: FIELDS.node,
        ANNOTATION_VGPU_TIME: "1767268800",
        ANNOTATION_DEVICES_ALLOCATED: FIELDS.devices,
        ANNOTATION_DEVICES_TO_ALLOCATE: FIELDS.devices,
        ANNOTATION_BIND_TIME: FIELDS.bind_time,
        ANNOTATION_BIND_PHASE: "allocating",
        **extra,
    }


def test_the_keys_a_bind_writes_are_listed_once_in_the_webhook_order() -> None:
    assert BOOKING_ANNOTATIONS == (
        ANNOTATION_DEVICES_TO_ALLOCATE,
        ANNOTATION_DEVICES_ALLOCATED,
        ANNOTATION_VGPU_NODE,
        ANNOTATION_VGPU_TIME,
        ANNOTATION_BIND_PHASE,
        ANNOTATION_BIND_TIME,
        ANNOTATION_VGPU_MIG_ALLOCATIONS,
        ANNOTATION_BOOKING_SIGNATURE,
    )
    assert BOOKING_LABELS == (LABEL_VGPU_NODE,)


def test_a_pod_without_booking_annotations_has_no_booking() -> None:
    assert read_booking({"app": "x", "nvidia.com/use-gputype": "A100"}) is None
    assert PodInfo("ns", "p", annotations={"app": "x"}).booking is None
    # any one of the keys is a booking (an author may write just one of them)
    only_phase = read_booking({ANNOTATION_BIND_PHASE: "failed"})
    assert only_phase is not None and only_phase.failed and only_phase.node == ""


def test_the_view_reads_each_annotation() -> None:
    booking = read_booking(booked_annotations(**{ANNOTATION_BOOKING_SIGNATURE: "v1:x"}))
    assert booking is not None
    assert (booking.node, booking.vgpu_time, booking.bind_time) == (
        "gpu-a100",
        "1767268800",
        "1767268800",
    )
    assert booking.allocating and not booking.failed
    assert booking.allocated == booking.to_allocate == READ
    assert booking.allocated_text == FIELDS.devices
    assert booking.signature == "v1:x"
    assert booking.bind_seconds == 1767268800
    assert booking.mig is None


@pytest.mark.parametrize("bind_time", ["", "soon", "1.5"])
def test_a_bind_time_that_is_no_whole_number_has_no_seconds(bind_time: str) -> None:
    booking = read_booking(booked_annotations(**{ANNOTATION_BIND_TIME: bind_time}))
    assert booking is not None and booking.bind_seconds is None


def test_each_list_is_decoded_once_and_kept() -> None:
    pod = PodInfo("ns", "p", annotations=booked_annotations())
    assert pod.booking is not None
    first = pod.booking.allocated
    assert pod.booking.allocated is first  # the same object: decoded once
    assert pod.booking.to_allocate is pod.booking.to_allocate


def test_an_unreadable_list_raises_each_time_it_is_read() -> None:
    booking = read_booking(
        booked_annotations(**{ANNOTATION_DEVICES_TO_ALLOCATE: "GPU-x,NVIDIA,lots,0:;"})
    )
    assert booking is not None
    for _ in range(2):
        with pytest.raises(AnnotationError, match=ANNOTATION_DEVICES_TO_ALLOCATE):
            _ = booking.to_allocate
    assert booking.allocated == READ  # the other list is unaffected
    broken_mig = read_booking(booked_annotations(**{ANNOTATION_VGPU_MIG_ALLOCATIONS: "{"}))
    assert broken_mig is not None
    with pytest.raises(MigAllocationError):
        _ = broken_mig.mig


def test_consumed_entries_read_empty_and_the_texts_stay() -> None:
    booking = read_booking(booked_annotations())
    assert booking is not None
    consumed = booking.consumed({0, 2})
    assert consumed.to_allocate == ((), (), (), ())
    assert consumed.allocated == READ  # the booking itself does not change
    assert consumed.to_allocate_text == booking.to_allocate_text
    assert booking.to_allocate == READ  # the original view is a value: untouched
    assert consumed.consumed({0}) is consumed
    assert booking.consumed(()) is booking


def test_the_view_follows_the_pods_annotations() -> None:
    pod = PodInfo("ns", "p", annotations=booked_annotations())
    stripped = replace(pod, annotations={"app": "x"})
    assert stripped.booking is None
    other = replace(pod, annotations=booked_annotations(**{ANNOTATION_VGPU_NODE: "elsewhere"}))
    assert other.booking is not None and other.booking.node == "elsewhere"
    assert pod == replace(pod)  # the view does not take part in equality


def test_what_the_signature_covers_and_verifies() -> None:
    booking = read_booking(booked_annotations())
    assert booking is not None
    assert booking.signed_fields(FIELDS.uid) == FIELDS
    assert booking.signed_fields("") is None
    signed = read_booking(booked_annotations(**{ANNOTATION_BOOKING_SIGNATURE: KEY.sign(FIELDS)}))
    assert signed is not None
    assert signed.verifies(KEY, FIELDS.uid)
    assert not signed.verifies(KEY, "another-pod")  # a signature copied to another pod
    assert not booking.verifies(KEY, FIELDS.uid)  # none
    # what the device plugin consumes is not signed
    consumed = read_booking(
        booked_annotations(
            **{ANNOTATION_DEVICES_TO_ALLOCATE: "", ANNOTATION_BOOKING_SIGNATURE: KEY.sign(FIELDS)}
        )
    )
    assert consumed is not None and consumed.verifies(KEY, FIELDS.uid)
    for missing in (ANNOTATION_VGPU_NODE, ANNOTATION_DEVICES_ALLOCATED, ANNOTATION_BIND_TIME):
        partial = {k: v for k, v in booked_annotations().items() if k != missing}
        view = read_booking(partial)
        assert view is not None and view.signed_fields(FIELDS.uid) is None


_DEVICE = st.builds(
    ContainerDevice,
    uuid=st.from_regex(r"GPU-[0-9a-f]{1,8}", fullmatch=True),
    type=st.sampled_from(["NVIDIA", "NVIDIA-A100"]),
    used_mem_mib=st.integers(0, 200_000),
    used_cores=st.integers(0, 100),
)
_DEVICES = st.lists(st.lists(_DEVICE, max_size=3).map(tuple), min_size=1, max_size=5).map(tuple)


@given(devices=_DEVICES, served=st.sets(st.integers(0, 6)))
def test_property_the_view_decodes_what_a_bind_encodes_and_consumes_by_index(
    devices: PodDevices, served: set[int]
) -> None:
    text = codec.encode_pod_devices(devices)
    booking = read_booking(
        {ANNOTATION_DEVICES_TO_ALLOCATE: text, ANNOTATION_DEVICES_ALLOCATED: text}
    )
    assert booking is not None
    assert booking.allocated == codec.decode_pod_devices(text)
    left = booking.consumed(served).to_allocate
    assert left is not None
    for index, entry in enumerate(codec.decode_pod_devices(text)):
        assert left[index] == (() if index in served else entry)
