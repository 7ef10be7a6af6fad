"""The booking signature: proof that a pod's GPU booking was written by our scheduler.

`PodBooking.signed_fields` (`protocol.booking`) gives what a pod's signature covers and
`PodBooking.verifies` checks it.

HAMi's annotations (`hami.io/vgpu-node`, `hami.io/vgpu-devices-to-allocate`,
`hami.io/bind-phase`, ...) are plain pod metadata: anyone who may create or update a pod can
write them. The scheduler adds `hami-plugin.io/booking-signature` when it binds, and both
daemons act only on bookings whose signature verifies (docs/design.md 8).

What is signed (`BookingFields`): the pod's UID (chosen by the API server, so a signature
cannot be copied to another pod), the node the booking names (`hami.io/vgpu-node`), the devices
as booked (the value written to both `hami.io/vgpu-devices-to-allocate` and
`hami.io/vgpu-devices-allocated` at bind) and `hami.io/bind-time`, and for a dynamic-MIG
booking the scheduler's part of `hami.io/vgpu-mig-allocations` (`protocol.mig.signed_mig_part`:
GPU, profile, placement and indexes, not the runtime identity the device plugin adds later).
The message is the JSON array `[version, uid, node, devices, bind_time]`, with the MIG part as
a sixth element when the annotation is there (unambiguous however the fields are spelt, and
adding or removing the annotation changes it).

Two schemes, told apart by the annotation value's prefix:

* `v2:<standard base64 of the 64-byte Ed25519 signature>` over the message tagged "v2": what
  the scheduler writes. Only the scheduler holds the private key; the device plugins hold the
  public keys, so a node can check a booking but not make one (not even for its own GPUs).
* `v1:<standard base64 of the 32-byte HMAC-SHA256>` over the message tagged "v1": the scheme
  before, with one symmetric key on every node. Verified only with legacy keys (the upgrade
  window, `--legacy-booking-key-file`); never written.

Keys (`BookingKeys`): private keys (the scheduler's; the first signs) and public keys (any
verifies; the public key of each private key is one of them). A key pair is rotated by adding
the new one second, then moving it first, then removing the old one. Key file lines
(`parse_booking_keys`): `ed25519-private:<base64 32-byte seed>` and
`ed25519-public:<base64 32-byte key>`; legacy files (`parse_legacy_keys`): one HMAC key per
line. Pure, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

__all__ = [
    "ANNOTATION_BOOKING_SIGNATURE",
    "ANNOTATION_BOOKING_SIGNATURES",
    "LEGACY_SIGNATURE_VERSION",
    "MIN_KEY_BYTES",
    "PRIVATE_PREFIX",
    "PUBLIC_PREFIX",
    "SIGNATURE_VERSION",
    "BookingFields",
    "BookingKeys",
    "parse_booking_keys",
    "parse_legacy_keys",
    "private_key_line",
    "public_key_line",
    "signature_announcement",
    "signing_version",
]

ANNOTATION_BOOKING_SIGNATURE = "hami-plugin.io/booking-signature"
SIGNATURE_VERSION = "v2"
"""Ed25519, what the scheduler signs."""
LEGACY_SIGNATURE_VERSION = "v1"
"""HMAC-SHA256 with a shared key: verified only with legacy keys; signed only for a node whose
device plugin does not announce v2 yet (`signing_version`), during an upgrade."""
ANNOTATION_BOOKING_SIGNATURES = "hami-plugin.io/booking-signatures"
"""On a node: the signature versions its device plugin verifies (`signature_announcement`), so
that during an upgrade the scheduler signs what a node still on the previous release can check
(`signing_version`)."""
MIN_KEY_BYTES = 16
"""The shortest legacy HMAC key accepted (the old `hami certs` wrote 32 random bytes)."""
PRIVATE_PREFIX = "ed25519-private:"
PUBLIC_PREFIX = "ed25519-public:"
_RAW_KEY_BYTES = 32
_ED25519_SIGNATURE_BYTES = 64
_HMAC_BYTES = hashlib.sha256().digest_size
_VERIFIED_CACHE = 4096


@dataclass(frozen=True, slots=True)
class BookingFields:
    """What a booking signature covers."""

    uid: str
    node: str
    devices: str
    bind_time: str
    mig: str | None = None
    """The scheduler's part of `hami.io/vgpu-mig-allocations` (None: no such annotation)."""

    def message(self, version: str = SIGNATURE_VERSION) -> bytes:
        fields = [version, self.uid, self.node, self.devices, self.bind_time]
        if self.mig is not None:
            fields.append(self.mig)
        return json.dumps(
            fields,
            ensure_ascii=True,
            separators=(",", ":"),
        ).encode("ascii")


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True, eq=False)
class BookingKeys:
    """Booking keys: `private` (the scheduler's, the first signs), `public` (any verifies a
    v2 signature; the public key of each private key is added in front of them) and `legacy`
    (HMAC keys of the old scheme: any verifies a v1 signature). At least one private or
    public key. Compared and hashed by identity (key objects are not hashable)."""

    public: tuple[Ed25519PublicKey, ...] = ()
    private: tuple[Ed25519PrivateKey, ...] = ()
    legacy: tuple[bytes, ...] = ()
    _verified: dict[tuple[str, bytes], bool] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Signatures checked before, with their message (a watch repeats the same pods)."""

    def __post_init__(self) -> None:
        derived = tuple(key.public_key() for key in self.private)
        raws: list[bytes] = []
        merged: list[Ed25519PublicKey] = []
        for key in (*derived, *self.public):
            raw = _raw_public(key)
            if raw not in raws:
                raws.append(raw)
                merged.append(key)
        object.__setattr__(self, "public", tuple(merged))
        if not self.public:
            raise ValueError("no booking key")
        for index, secret in enumerate(self.legacy, 1):
            if len(secret) < MIN_KEY_BYTES:
                raise ValueError(
                    f"legacy booking key {index} has {len(secret)} bytes, fewer than "
                    f"{MIN_KEY_BYTES}"
                )

    def __repr__(self) -> str:  # never print key material
        return (
            f"BookingKeys({len(self.private)} private, {len(self.public)} public, "
            f"{len(self.legacy)} legacy)"
        )

    @property
    def can_sign(self) -> bool:
        return bool(self.private)

    def verifier(self) -> BookingKeys:
        """These keys without the private ones: what a node may hold."""
        return BookingKeys(public=self.public, legacy=self.legacy)

    def with_legacy(self, legacy: Sequence[bytes]) -> BookingKeys:
        """These keys accepting v1 signatures by `legacy` (replacing any before)."""
        return BookingKeys(public=self.public, private=self.private, legacy=tuple(legacy))

    def sign(self, fields: BookingFields, version: str = SIGNATURE_VERSION) -> str:
        """The annotation value for `fields`, signed with the first private key, or for
        `version` v1 with the first legacy key (`signing_version`). Raises ValueError without
        such a key."""
        if version == LEGACY_SIGNATURE_VERSION:
            if not self.legacy:
                raise ValueError("no legacy booking key: a v1 signature cannot be made")
            message = fields.message(LEGACY_SIGNATURE_VERSION)
            mac = hmac.new(self.legacy[0], message, hashlib.sha256).digest()
            return f"{LEGACY_SIGNATURE_VERSION}:{base64.b64encode(mac).decode('ascii')}"
        if not self.private:
            raise ValueError("no private booking key: only the scheduler signs")
        signature = self.private[0].sign(fields.message(SIGNATURE_VERSION))
        return f"{SIGNATURE_VERSION}:{base64.b64encode(signature).decode('ascii')}"

    def verify(self, value: str | None, fields: BookingFields | None) -> bool:
        """Whether `value` is a v2 signature of `fields` by any public key, or (with legacy
        keys) a v1 signature by any legacy key."""
        if value is None or fields is None:
            return False
        version, sep, encoded = value.partition(":")
        if not sep:
            return False
        if version == SIGNATURE_VERSION:
            return self._verify_v2(value, encoded, fields)
        if version == LEGACY_SIGNATURE_VERSION and self.legacy:
            return self._verify_v1(encoded, fields)
        return False

    def _verify_v2(self, value: str, encoded: str, fields: BookingFields) -> bool:
        message = fields.message(SIGNATURE_VERSION)
        cached = self._verified.get((value, message))
        if cached is not None:
            return cached
        signature = _decode(encoded, _ED25519_SIGNATURE_BYTES)
        result = False
        if signature is not None:
            for key in self.public:
                try:
                    key.verify(signature, message)
                except InvalidSignature:
                    continue
                result = True
                break
        if len(self._verified) >= _VERIFIED_CACHE:
            self._verified.clear()
        self._verified[(value, message)] = result
        return result

    def _verify_v1(self, encoded: str, fields: BookingFields) -> bool:
        mac = _decode(encoded, _HMAC_BYTES)
        if mac is None:
            return False
        message = fields.message(LEGACY_SIGNATURE_VERSION)
        matched = False
        for key in self.legacy:
            expected = hmac.new(key, message, hashlib.sha256).digest()
            matched |= hmac.compare_digest(expected, mac)
        return matched


def _decode(encoded: str, size: int) -> bytes | None:
    try:
        raw = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    return raw if len(raw) == size else None


def private_key_line(key: Ed25519PrivateKey) -> str:
    """The key file line of a private key."""
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return PRIVATE_PREFIX + base64.b64encode(raw).decode("ascii")


def public_key_line(key: Ed25519PublicKey) -> str:
    """The key file line of a public key."""
    return PUBLIC_PREFIX + base64.b64encode(_raw_public(key)).decode("ascii")


def _key_lines(lines: Sequence[str]) -> list[str]:
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


def _raw_key(text: str, number: int) -> bytes:
    raw = _decode(text, _RAW_KEY_BYTES)
    if raw is None:
        raise ValueError(f"line {number}: not {_RAW_KEY_BYTES} bytes in standard base64")
    return raw


def parse_booking_keys(lines: Sequence[str]) -> BookingKeys:
    """Keys from the lines of a key file: `ed25519-private:<base64>` and
    `ed25519-public:<base64>` lines in order; blank lines and lines starting with `#` are
    skipped. Raises ValueError with the reason when no key is left or a line is not a key
    (an old HMAC key is named as such: it belongs in the legacy file)."""
    private: list[Ed25519PrivateKey] = []
    public: list[Ed25519PublicKey] = []
    for number, line in enumerate(_key_lines(lines), 1):
        if line.startswith(PRIVATE_PREFIX):
            raw = _raw_key(line.removeprefix(PRIVATE_PREFIX), number)
            private.append(Ed25519PrivateKey.from_private_bytes(raw))
        elif line.startswith(PUBLIC_PREFIX):
            raw = _raw_key(line.removeprefix(PUBLIC_PREFIX), number)
            public.append(Ed25519PublicKey.from_public_bytes(raw))
        else:
            raise ValueError(
                f"key {number} is neither {PRIVATE_PREFIX}... nor {PUBLIC_PREFIX}...: an HMAC "
                "key of the old scheme (v1) is accepted only in --legacy-booking-key-file"
            )
    if not private and not public:
        raise ValueError(
            f"no booking key in the file (one {PRIVATE_PREFIX} or {PUBLIC_PREFIX} line per key)"
        )
    return BookingKeys(public=tuple(public), private=tuple(private))


def parse_legacy_keys(lines: Sequence[str]) -> tuple[bytes, ...]:
    """HMAC keys (scheme v1) from the lines of a legacy key file: one key per line (its UTF-8
    bytes, surrounding blanks stripped); blank and `#` lines skipped. Raises ValueError when no
    key is left or one is shorter than `MIN_KEY_BYTES` or is an Ed25519 line."""
    keys = _key_lines(lines)
    if not keys:
        raise ValueError("no legacy booking key in the file (one HMAC key per line)")
    for number, key in enumerate(keys, 1):
        if key.startswith((PRIVATE_PREFIX, PUBLIC_PREFIX)):
            raise ValueError(f"key {number} is an Ed25519 key, not a legacy HMAC key")
        if len(key.encode("utf-8")) < MIN_KEY_BYTES:
            raise ValueError(
                f"legacy booking key {number} has {len(key.encode('utf-8'))} bytes, fewer "
                f"than {MIN_KEY_BYTES}"
            )
    return tuple(key.encode("utf-8") for key in keys)


def signature_announcement(keys: BookingKeys | None) -> dict[str, str]:
    """A device plugin's node annotation: the versions it verifies (`v2`, and `v1` while it has
    legacy keys); nothing without keys (it checks no signature then)."""
    if keys is None:
        return {}
    versions = [SIGNATURE_VERSION, *([LEGACY_SIGNATURE_VERSION] if keys.legacy else [])]
    return {ANNOTATION_BOOKING_SIGNATURES: ",".join(versions)}


def signing_version(announced: str | None, keys: BookingKeys) -> str:
    """What the scheduler signs a booking on a node with: v2, unless the node's device plugin
    does not announce v2 (still the previous release, mid-upgrade: it checks v1 only) and the
    scheduler holds a legacy key to make v1 with. Once the legacy key is gone, always v2."""
    versions = {part.strip() for part in (announced or "").split(",")}
    if SIGNATURE_VERSION in versions or not keys.legacy:
        return SIGNATURE_VERSION
    return LEGACY_SIGNATURE_VERSION
