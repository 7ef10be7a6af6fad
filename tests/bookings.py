"""A pod's booking read from annotations as the daemons read it (`protocol.booking`), for
tests that hold a pod's annotations rather than a `PodInfo`."""

from __future__ import annotations

from collections.abc import Mapping

from hami_plugin.protocol.booking import read_booking
from hami_plugin.protocol.signature import BookingFields, BookingKeys


def signed_fields(uid: str, annotations: Mapping[str, str]) -> BookingFields | None:
    """What a signature over these annotations of the pod `uid` covers (None: a part missing)."""
    booking = read_booking(annotations)
    return None if booking is None else booking.signed_fields(uid)


def verify_pod(keys: BookingKeys, uid: str, annotations: Mapping[str, str]) -> bool:
    """The annotations carry a signature by `keys` of their booking of the pod `uid`."""
    booking = read_booking(annotations)
    return booking is not None and booking.verifies(keys, uid)
