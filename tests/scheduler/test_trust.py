"""The trust rule: which HAMi bookings count once the scheduler has a booking key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICE_SCORING_WEIGHTS,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
)
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingFields,
    BookingKeys,
)
from hami_plugin.scheduler.book.trust import (
    BookingSeal,
    booking_seal,
    untrusted_booking,
    without_booking,
)
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings
from hami_plugin.testing.apiserver import make_container, make_pod
from tests.bookings import keys_from

KEYS = keys_from(b"k" * 32)
OTHER_KEYS = keys_from(b"x" * 32)
SETTINGS = SchedulerSettings()
DEVICES = "GPU-0,NVIDIA,1000,10:;"


def booked(
    *,
    uid: str = "uid-1",
    node: str = "n1",
    node_name: str = "n1",
    gpu: bool = True,
    keys: BookingKeys | None = KEYS,
    signed_uid: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> PodInfo:
    """A pod with the booking a bind writes, signed by `keys` for `signed_uid` (default: its
    own UID); `extra` overrides annotations after signing."""
    annotations = {
        ANNOTATION_VGPU_NODE: node,
        ANNOTATION_VGPU_TIME: "1767268800",
        ANNOTATION_DEVICES_TO_ALLOCATE: DEVICES,
        ANNOTATION_DEVICES_ALLOCATED: DEVICES,
        ANNOTATION_BIND_PHASE: "allocating",
        ANNOTATION_BIND_TIME: "1767268800",
    }
    if keys is not None:
        fields = BookingFields(signed_uid or uid, node, DEVICES, "1767268800")
        annotations[ANNOTATION_BOOKING_SIGNATURE] = keys.sign(fields)
    annotations.update(extra or {})
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"} if gpu else {"cpu": "1"}
    pod: dict[str, Any] = make_pod(
        "p",
        annotations=annotations,
        containers=[make_container("main", limits=limits)],
        node_name=node_name,
        uid=uid,
    )
    return read_pod(pod)


def why(info: PodInfo, **kwargs: Any) -> str | None:
    return untrusted_booking(info, KEYS, SETTINGS, **kwargs)


def test_a_signed_booking_of_a_gpu_pod_bound_to_its_node_counts() -> None:
    assert why(booked()) is None


def test_a_signed_booking_not_bound_yet_counts() -> None:
    """Between the bind's patch and the Binding (this replica's, or a leader's before it)."""
    assert why(booked(node_name="")) is None


def test_a_pod_without_a_booking_is_not_judged() -> None:
    plain = read_pod(make_pod("p", annotations={ANNOTATION_DEVICE_SCORING_WEIGHTS: "1,1,1"}))
    assert booking_seal(plain) is None
    assert why(plain) is None
    # every other booking annotation without the node names nothing anyone counts
    no_node = booked(keys=None, extra={ANNOTATION_VGPU_NODE: ""})
    assert why(no_node) is None


@pytest.mark.parametrize(
    ("info", "reason"),
    [
        (booked(node_name="n2"), "it is bound to node n2, not to node n1 its booking names"),
        (booked(gpu=False), "it asks for no nvidia.com/gpu"),
        (booked(keys=None), "it carries no hami-plugin.io/booking-signature"),
        (booked(keys=OTHER_KEYS), "does not verify"),
        (booked(signed_uid="uid-of-another-pod"), "does not verify"),
        (booked(extra={ANNOTATION_DEVICES_ALLOCATED: "GPU-0,NVIDIA,32768,100:;"}), "not verify"),
        (booked(extra={ANNOTATION_BIND_TIME: "1767268801"}), "does not verify"),
        (booked(extra={ANNOTATION_BOOKING_SIGNATURE: "v1:junk"}), "does not verify"),
        (booked(extra={ANNOTATION_BIND_TIME: ""}), "does not verify"),
        (
            PodInfo(
                "default",
                "p",
                uid="uid-1",
                annotations={ANNOTATION_VGPU_NODE: "n1", ANNOTATION_BOOKING_SIGNATURE: "v1:x"},
                containers=booked().containers,
            ),
            "lacks hami.io/bind-time or hami.io/vgpu-devices-allocated",
        ),
    ],
)
def test_what_does_not_count(info: PodInfo, reason: str) -> None:
    found = why(info)
    assert found is not None and reason in found


def test_the_resource_name_is_the_configured_one() -> None:
    renamed = SchedulerSettings(resources=ResourceNames(count="example.com/vgpu"))
    found = untrusted_booking(booked(), KEYS, renamed)
    assert found == "it asks for no example.com/vgpu"


def test_any_current_key_verifies() -> None:
    rotated = keys_from(b"x" * 32, b"k" * 32)
    assert untrusted_booking(booked(), rotated, SETTINGS) is None
    assert untrusted_booking(booked(), OTHER_KEYS, SETTINGS) is not None


def test_a_known_booking_counts_without_the_key_that_signed_it() -> None:
    """A booking this process verified or signed stays trusted after its key was rotated out;
    any change to it needs a signature by a current key."""
    info = booked()
    seal = booking_seal(info)
    assert seal is not None
    assert untrusted_booking(info, OTHER_KEYS, SETTINGS, known=seal) is None
    tampered = booked(extra={ANNOTATION_DEVICES_ALLOCATED: "GPU-0,NVIDIA,32768,100:;"})
    assert untrusted_booking(tampered, OTHER_KEYS, SETTINGS, known=seal) is not None
    # the other checks still apply to a known booking
    elsewhere = booked(node_name="n2")
    assert untrusted_booking(elsewhere, KEYS, SETTINGS, known=booking_seal(elsewhere)) is not None


def test_the_seal_is_what_the_signature_covers() -> None:
    info = booked()
    seal = booking_seal(info)
    assert seal == BookingSeal(
        BookingFields("uid-1", "n1", DEVICES, "1767268800"),
        info.annotations[ANNOTATION_BOOKING_SIGNATURE],
    )
    # to-allocate is consumed by the device plugin: not part of the seal
    consumed = booked(extra={ANNOTATION_DEVICES_TO_ALLOCATE: ";"})
    assert booking_seal(consumed) == seal
    assert why(consumed) is None


def test_without_booking_keeps_every_other_annotation() -> None:
    info = booked(extra={"team": "ml", ANNOTATION_DEVICE_SCORING_WEIGHTS: "1,1,1"})
    stripped = without_booking(info)
    assert dict(stripped.annotations) == {"team": "ml", ANNOTATION_DEVICE_SCORING_WEIGHTS: "1,1,1"}
    assert not set(stripped.annotations) & set(BOOKING_ANNOTATIONS)
    assert booking_seal(stripped) is None
    assert (stripped.uid, stripped.node_name, stripped.containers) == (
        info.uid,
        info.node_name,
        info.containers,
    )
