"""A pod's HAMi booking, as its annotations state it: ONE typed view both daemons read.

A bind writes the booking on the pod in one patch (`BOOKING_ANNOTATIONS`, plus the label
`hami.io/vgpu-node`); the device plugin empties one `hami.io/vgpu-devices-to-allocate` entry
per Allocate and sets `hami.io/bind-phase`. Every reader takes `PodInfo.booking`, read once
when the pod is read: the raw values are kept (the signature covers the text as written), the
device lists and MIG reservations are decoded on use through caches keyed by the text, so
however many rules read a pod event or an Allocate, and however many events repeat the value,
it is decoded once. Encoded only where it goes out (`booking_annotations`). Pure, no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from hami_plugin.protocol.codec import decode_pod_devices, encode_pod_devices
from hami_plugin.protocol.mig import (
    MigAllocation,
    MigAllocationError,
    decode_mig_allocations,
    encode_mig_allocations,
    signed_mig_part,
)
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    BindPhase,
    PodDevices,
)
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingFields, BookingKeys

__all__ = [
    "BOOKING_ANNOTATIONS",
    "BOOKING_LABELS",
    "PodBooking",
    "booking_annotations",
    "read_booking",
]

BOOKING_ANNOTATIONS = (
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_BOOKING_SIGNATURE,
)
"""The pod annotations a bind writes, in this order: what the webhook strips at creation, a
failed bind reverts, and an untrusted booking is read without."""

BOOKING_LABELS = (LABEL_VGPU_NODE,)
"""The pod label a bind writes (HAMi's monitor lists pods by it)."""

_KEYS = frozenset(BOOKING_ANNOTATIONS)


class PodBooking(NamedTuple):
    """A typed view of one pod's booking annotations (`annotations`: the pod's own mapping,
    not copied); an absent annotation reads as None.

    `served` are to-allocate entries known to be consumed whatever the annotation says
    (`consumed`). A NamedTuple of two references: one is built for every pod the daemons read.
    The device lists and MIG reservations are decoded on use, through small caches keyed by
    the annotation's text (`_decoded_devices`, `_decoded_mig`), so the readers of one pod event
    or one Allocate decode each value once.
    """

    annotations: Mapping[str, str]
    served: frozenset[int] = frozenset()

    @property
    def node(self) -> str:
        """`hami.io/vgpu-node` ("" when absent)."""
        return self.annotations.get(ANNOTATION_VGPU_NODE) or ""

    @property
    def vgpu_time(self) -> str | None:
        return self.annotations.get(ANNOTATION_VGPU_TIME)

    @property
    def phase(self) -> str | None:
        """`hami.io/bind-phase` as written (compare with `BindPhase`)."""
        return self.annotations.get(ANNOTATION_BIND_PHASE)

    @property
    def bind_time(self) -> str | None:
        return self.annotations.get(ANNOTATION_BIND_TIME)

    @property
    def allocated_text(self) -> str | None:
        """`hami.io/vgpu-devices-allocated`: the booking as signed; nothing changes it later."""
        return self.annotations.get(ANNOTATION_DEVICES_ALLOCATED)

    @property
    def to_allocate_text(self) -> str | None:
        return self.annotations.get(ANNOTATION_DEVICES_TO_ALLOCATE)

    @property
    def mig_text(self) -> str | None:
        return self.annotations.get(ANNOTATION_VGPU_MIG_ALLOCATIONS)

    @property
    def signature(self) -> str | None:
        return self.annotations.get(ANNOTATION_BOOKING_SIGNATURE)

    # --- decoded on use ----------------------------------------------------------------------

    @property
    def allocated(self) -> PodDevices | None:
        """The booked devices; None when absent. Raises AnnotationError when unreadable."""
        if self.allocated_text is None:
            return None
        return _decoded_devices(self.allocated_text, ANNOTATION_DEVICES_ALLOCATED)

    @property
    def to_allocate(self) -> PodDevices | None:
        """What is left to allocate, `served` entries empty; None when absent. Raises
        AnnotationError when unreadable."""
        if self.to_allocate_text is None:
            return None
        devices = _decoded_devices(self.to_allocate_text, ANNOTATION_DEVICES_TO_ALLOCATE)
        if not self.served:
            return devices
        return tuple(() if index in self.served else entry for index, entry in enumerate(devices))

    @property
    def mig(self) -> tuple[MigAllocation, ...] | None:
        """The MIG reservations; None when absent. Raises MigAllocationError when unreadable."""
        return None if self.mig_text is None else _decoded_mig(self.mig_text)

    # --- questions ---------------------------------------------------------------------------

    @property
    def allocating(self) -> bool:
        return self.phase == BindPhase.ALLOCATING

    @property
    def failed(self) -> bool:
        return self.phase == BindPhase.FAILED

    @property
    def bind_seconds(self) -> int | None:
        """`hami.io/bind-time` as Unix seconds; None when absent or not a whole number."""
        if not self.bind_time:
            return None
        try:
            return int(self.bind_time)
        except ValueError:
            return None

    def signed_fields(self, uid: str) -> BookingFields | None:
        """What the signature covers for the pod `uid`; None when a covered part is missing."""
        if not uid or not self.node or self.allocated_text is None or self.bind_time is None:
            return None
        return BookingFields(
            uid=uid,
            node=self.node,
            devices=self.allocated_text,
            bind_time=self.bind_time,
            mig=self._signed_mig(),
        )

    def _signed_mig(self) -> str | None:
        if self.mig_text is None:
            return None
        try:
            return signed_mig_part(self.mig or ())
        except MigAllocationError:
            return self.mig_text

    def verifies(self, keys: BookingKeys, uid: str) -> bool:
        """The signature is one of `keys`' over this booking of the pod `uid`."""
        return keys.verify(self.signature, self.signed_fields(uid))

    def consumed(self, indexes: Collection[int]) -> PodBooking:
        """This booking with the to-allocate entries at `indexes` read as consumed."""
        served = self.served.union(indexes)
        return self if served == self.served else self._replace(served=served)


def booking_annotations(
    node: str, devices: PodDevices, mig: Sequence[MigAllocation], decided_at: datetime
) -> dict[str, str]:
    """What a decision books on the pod, as HAMi writes it (device.go:505-517): the node, the
    decision's time, the devices (to allocate, and as allocated) and the MIG reservations when
    there are any. Encoded only where it goes out: the bind's patch, the dry run's answer."""
    encoded = encode_pod_devices(devices)
    annotations = {
        ANNOTATION_VGPU_NODE: node,
        ANNOTATION_VGPU_TIME: str(int(decided_at.timestamp())),
        ANNOTATION_DEVICES_TO_ALLOCATE: encoded,
        ANNOTATION_DEVICES_ALLOCATED: encoded,
    }
    if mig:
        annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations(mig)
    return annotations


def read_booking(annotations: Mapping[str, str]) -> PodBooking | None:
    """The booking the annotations carry; None when they carry none of `BOOKING_ANNOTATIONS`."""
    return None if _KEYS.isdisjoint(annotations) else PodBooking(annotations)


_DECODE_CACHE_SIZE = 256
"""Distinct annotation values whose decoding is kept (a few hundred bytes each): a pod's
update events, and the readers of one event, repeat the same text."""


@functools.lru_cache(maxsize=_DECODE_CACHE_SIZE)
def _decoded_devices(text: str, key: str) -> PodDevices:
    return decode_pod_devices(text, key)  # immutable: safe to share between readers


@functools.lru_cache(maxsize=_DECODE_CACHE_SIZE)
def _decoded_mig(text: str) -> tuple[MigAllocation, ...]:
    return decode_mig_allocations(text)
