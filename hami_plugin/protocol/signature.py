"""The booking signature: proof that a pod's GPU booking was written by our scheduler.

`PodBooking.signed_fields` (`protocol.booking`) gives what a pod's signature covers and
`PodBooking.verifies` checks it.

HAMi's annotations (`hami.io/vgpu-node`, `hami.io/vgpu-devices-to-allocate`,
`hami.io/bind-phase`, ...) are plain pod metadata: anyone who may create or update a pod can
write them. With a booking key shared by the scheduler and the device plugins, the scheduler
adds `hami-plugin.io/booking-signature` when it binds, and both daemons act only on bookings
whose signature verifies (docs/design.md 8).

What is signed (`BookingFields`): the pod's UID (chosen by the API server, so a signature
cannot be copied to another pod), the node the booking names (`hami.io/vgpu-node`), the devices
as booked (the value written to both `hami.io/vgpu-devices-to-allocate` and
`hami.io/vgpu-devices-allocated` at bind) and `hami.io/bind-time`, and for a dynamic-MIG
booking the scheduler's part of `hami.io/vgpu-mig-allocations` (`protocol.mig.signed_mig_part`:
GPU, profile, placement and indexes, not the runtime identity the device plugin adds later).
The message is the JSON array `["v1", uid, node, devices, bind_time]`, with the MIG part as a
sixth element when the annotation is there (unambiguous however the fields are spelt, and
adding or removing the annotation changes it), the MAC HMAC-SHA256, the annotation
`v1:<standard base64 of the 32-byte MAC>`.

Keys (`BookingKeys`): one or more; the first signs, any verifies, so a key is rotated by adding
the new one second, then moving it first, then removing the old one. Pure, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ANNOTATION_BOOKING_SIGNATURE",
    "MIN_KEY_BYTES",
    "SIGNATURE_VERSION",
    "BookingFields",
    "BookingKeys",
    "parse_booking_keys",
]

ANNOTATION_BOOKING_SIGNATURE = "hami-plugin.io/booking-signature"
SIGNATURE_VERSION = "v1"
MIN_KEY_BYTES = 16
"""The shortest key accepted (`hami certs` writes 32 random bytes, base64: 44 characters)."""


@dataclass(frozen=True, slots=True)
class BookingFields:
    """What a booking signature covers."""

    uid: str
    node: str
    devices: str
    bind_time: str
    mig: str | None = None
    """The scheduler's part of `hami.io/vgpu-mig-allocations` (None: no such annotation)."""

    def message(self) -> bytes:
        fields = [SIGNATURE_VERSION, self.uid, self.node, self.devices, self.bind_time]
        if self.mig is not None:
            fields.append(self.mig)
        return json.dumps(
            fields,
            ensure_ascii=True,
            separators=(",", ":"),
        ).encode("ascii")


@dataclass(frozen=True, slots=True)
class BookingKeys:
    """The booking keys, the signing one first. Never empty."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("no booking key")
        for index, key in enumerate(self.keys, 1):
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(
                    f"booking key {index} has {len(key)} bytes, fewer than {MIN_KEY_BYTES}"
                )

    def __repr__(self) -> str:  # never print key material
        return f"BookingKeys({len(self.keys)} key(s))"

    def sign(self, fields: BookingFields) -> str:
        """The annotation value for `fields`, signed with the first key."""
        mac = hmac.new(self.keys[0], fields.message(), hashlib.sha256).digest()
        return f"{SIGNATURE_VERSION}:{base64.b64encode(mac).decode('ascii')}"

    def verify(self, value: str | None, fields: BookingFields | None) -> bool:
        """Whether `value` is a signature of `fields` by any key (constant time per key)."""
        if value is None or fields is None:
            return False
        version, sep, encoded = value.partition(":")
        if version != SIGNATURE_VERSION or not sep:
            return False
        try:
            mac = base64.b64decode(encoded.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            return False
        if len(mac) != hashlib.sha256().digest_size:
            return False
        message = fields.message()
        matched = False
        for key in self.keys:
            expected = hmac.new(key, message, hashlib.sha256).digest()
            matched |= hmac.compare_digest(expected, mac)
        return matched


def parse_booking_keys(lines: Sequence[str]) -> BookingKeys:
    """Keys from the lines of a key file: one key per line (its UTF-8 bytes, surrounding
    blanks stripped); blank lines and lines starting with `#` are skipped. Raises ValueError
    with the reason when no key is left or one is shorter than `MIN_KEY_BYTES`."""
    keys = tuple(
        line.strip().encode("utf-8")
        for line in lines
        if line.strip() and not line.strip().startswith("#")
    )
    if not keys:
        raise ValueError("no booking key in the file (one key per line)")
    return BookingKeys(keys)
