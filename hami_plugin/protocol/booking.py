"""A pod's HAMi booking, as its annotations state it: ONE typed view both daemons read.

A bind writes the booking on the pod in one patch (`BOOKING_ANNOTATIONS`, plus the label
`hami.io/vgpu-node`); the device plugin empties one `hami.io/vgpu-devices-to-allocate` entry
per Allocate and sets `hami.io/bind-phase`. Every reader takes `PodInfo.booking`, read once
when the pod is read: the raw values are kept (the signature covers the text as written), the
device lists and MIG reservations are decoded on first use and kept with the view, so one pod
event or one Allocate decodes each annotation once, however many rules read it. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

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


@dataclass(frozen=True, slots=True)
class PodBooking:
    """The booking annotations of one pod; a `None` field is an absent annotation.

    `served` are to-allocate entries known to be consumed whatever the annotation says
    (`consumed`). The decoded lists are cached on first use, errors included.
    """

    node: str = ""
    """`hami.io/vgpu-node` ("" when absent)."""
    vgpu_time: str | None = None
    phase: str | None = None
    """`hami.io/bind-phase` as written (compare with `BindPhase`)."""
    bind_time: str | None = None
    allocated_text: str | None = None
    """`hami.io/vgpu-devices-allocated`: the booking as signed; nothing changes it after bind."""
    to_allocate_text: str | None = None
    mig_text: str | None = None
    signature: str | None = None
    served: frozenset[int] = frozenset()
    _decoded: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    # --- decoded on first use --------------------------------------------------------------

    @property
    def allocated(self) -> PodDevices | None:
        """The booked devices; None when absent. Raises AnnotationError when unreadable."""
        return self._devices("allocated", self.allocated_text, ANNOTATION_DEVICES_ALLOCATED)

    @property
    def to_allocate(self) -> PodDevices | None:
        """What is left to allocate, `served` entries empty; None when absent. Raises
        AnnotationError when unreadable."""
        devices = self._devices(
            "to_allocate", self.to_allocate_text, ANNOTATION_DEVICES_TO_ALLOCATE
        )
        if devices is None or not self.served:
            return devices
        return tuple(() if index in self.served else entry for index, entry in enumerate(devices))

    @property
    def mig(self) -> tuple[MigAllocation, ...] | None:
        """The MIG reservations; None when absent. Raises MigAllocationError when unreadable."""
        if self.mig_text is None:
            return None
        return self._cached("mig", lambda: decode_mig_allocations(self.mig_text or ""))

    def _devices(self, slot: str, text: str | None, key: str) -> PodDevices | None:
        if text is None:
            return None
        return self._cached(slot, lambda: decode_pod_devices(text, key))

    def _cached(self, slot: str, decode: Callable[[], _T]) -> _T:
        found = self._decoded.get(slot, _MISSING)
        if found is _MISSING:
            try:
                found = decode()
            except ValueError as error:
                found = _Failed(error)
            self._decoded[slot] = found
        if isinstance(found, _Failed):
            raise found.error.with_traceback(None)
        return found  # type: ignore[return-value]

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
        if served == self.served:
            return self
        # the texts are the same: what is decoded already is shared
        return replace(self, served=served, _decoded=dict(self._decoded))


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
    if _KEYS.isdisjoint(annotations):
        return None
    get = annotations.get
    return PodBooking(
        node=get(ANNOTATION_VGPU_NODE) or "",
        vgpu_time=get(ANNOTATION_VGPU_TIME),
        phase=get(ANNOTATION_BIND_PHASE),
        bind_time=get(ANNOTATION_BIND_TIME),
        allocated_text=get(ANNOTATION_DEVICES_ALLOCATED),
        to_allocate_text=get(ANNOTATION_DEVICES_TO_ALLOCATE),
        mig_text=get(ANNOTATION_VGPU_MIG_ALLOCATIONS),
        signature=get(ANNOTATION_BOOKING_SIGNATURE),
    )


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: ValueError) -> None:
        self.error = error


_MISSING = object()
_T = TypeVar("_T")
