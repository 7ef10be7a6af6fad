"""Whether a pod's HAMi booking counts, when the scheduler has a booking key.

HAMi's booking annotations are pod metadata any pod author can write. Counted as they stand,
a pod that asks for no GPU and is bound nowhere, carrying `hami.io/vgpu-node` and
`hami.io/vgpu-devices-allocated` naming every GPU of a node, makes that node look full; one
`allocating` with an unreadable `hami.io/vgpu-devices-to-allocate` stops every bind there
(docs/design.md 8). With a booking key, a booking counts only when all of these hold:

* the pod asks for the GPU resource (a booking of a pod that asks for none was never ours);
* it is bound to the node its booking names, or not bound yet (between the bind's patch and
  the Binding, of this replica or of another leader; a pod bound elsewhere holds nothing there);
* its `hami-plugin.io/booking-signature` verifies with the current keys
  (`hami_plugin.protocol.signature`: over the UID, so a signature copied from another pod fails),
  or it is a booking this process signed or verified before (`known`).

A booking that fails is treated as no booking at all: `without_booking` is the pod as the
ledger and the in-flight view then see it. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS
from hami_plugin.protocol.model import ANNOTATION_BIND_TIME, ANNOTATION_DEVICES_ALLOCATED
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingFields, BookingKeys
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "BookingSeal",
    "booking_seal",
    "untrusted_booking",
    "without_booking",
]

_BOOKING_KEYS = frozenset(BOOKING_ANNOTATIONS)


@dataclass(frozen=True, slots=True)
class BookingSeal:
    """A booking as a pod's annotations state it: the signed fields (None when one is
    missing) and the signature (None when absent). Two equal seals verify alike."""

    fields: BookingFields | None
    signature: str | None


def booking_seal(info: PodInfo) -> BookingSeal | None:
    """The pod's booking and its signature; None when the pod names no node
    (`hami.io/vgpu-node`): then it books nothing that anyone counts."""
    booking = info.booking
    if booking is None or not booking.node:
        return None
    return BookingSeal(booking.signed_fields(info.uid), booking.signature)


def untrusted_booking(
    info: PodInfo,
    keys: BookingKeys,
    settings: SchedulerSettings,
    *,
    known: BookingSeal | None = None,
) -> str | None:
    """None when the pod's booking counts (or it carries none), else why it does not.

    `known` is a booking of this very pod (same UID) that this process signed or verified
    before: equal to the pod's, it counts without a new HMAC (and still counts after the key
    that signed it was rotated out) nor a new look at its requests (extended resources such as
    the GPU cannot be resized in place)."""
    seal = booking_seal(info)
    if seal is None:
        return None
    node = info.booking.node if info.booking is not None else ""
    if info.node_name and info.node_name != node:
        return f"it is bound to node {info.node_name}, not to node {node} its booking names"
    if known is not None and seal == known:
        return None  # it asked for a GPU then, and a pod's GPU requests never change
    if not pod_requests(info, settings).wants_gpu:
        return f"it asks for no {settings.resources.count}"
    if seal.signature is None:
        return f"it carries no {ANNOTATION_BOOKING_SIGNATURE}"
    if seal.fields is None:
        return (
            f"its booking lacks {ANNOTATION_BIND_TIME} or {ANNOTATION_DEVICES_ALLOCATED}, which "
            "the signature covers"
        )
    if not keys.verify(seal.signature, seal.fields):
        return (
            f"its {ANNOTATION_BOOKING_SIGNATURE} does not verify: not written by this scheduler "
            "for this pod's booking"
        )
    return None


def without_booking(info: PodInfo) -> PodInfo:
    """The pod as if it carried no HAMi booking (its other annotations kept)."""
    return replace(
        info,
        annotations={
            key: value for key, value in info.annotations.items() if key not in _BOOKING_KEYS
        },
    )
