"""A pod's booking read from annotations as the daemons read it (`protocol.booking`), for
tests that hold a pod's annotations rather than a `PodInfo`, and booking keys made from seeds.

`keys_from(seed, ...)`: the scheduler's keys (Ed25519 private keys, the first signs) made
deterministically from each seed; `private_key_file_text` / `public_key_file_text`: the key
files of the scheduler and of the nodes for the same seeds; `hmac_signature`: a v1 (legacy
HMAC) signature, as the scheduler wrote before Ed25519."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hami_plugin.protocol.booking import read_booking
from hami_plugin.protocol.signature import (
    BookingFields,
    BookingKeys,
    private_key_line,
    public_key_line,
)

Seed = bytes | str


def seeded_key(seed: Seed) -> Ed25519PrivateKey:
    """The Ed25519 private key a seed stands for (the same seed, the same key)."""
    raw = seed.encode() if isinstance(seed, str) else seed
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(raw).digest())


def keys_from(*seeds: Seed, legacy: tuple[bytes, ...] = ()) -> BookingKeys:
    """The scheduler's keys for these seeds (the first signs; each one's public key verifies)."""
    return BookingKeys(private=tuple(seeded_key(seed) for seed in seeds), legacy=legacy)


def private_key_file_text(*seeds: Seed) -> str:
    """The scheduler's `--booking-key-file` for these seeds, the first signing."""
    lines = (private_key_line(seeded_key(seed)) for seed in seeds)
    return "# booking keys, the signing one first\n" + "".join(f"{line}\n" for line in lines)


def public_key_file_text(*seeds: Seed) -> str:
    """A node's `--booking-key-file` for these seeds: their public keys only."""
    lines = (public_key_line(seeded_key(seed).public_key()) for seed in seeds)
    return "# the scheduler's public booking keys\n" + "".join(f"{line}\n" for line in lines)


def hmac_signature(key: bytes, fields: BookingFields) -> str:
    """The v1 signature the scheduler wrote before Ed25519 (HMAC-SHA256 with a shared key)."""
    mac = hmac.new(key, fields.message("v1"), hashlib.sha256).digest()
    return "v1:" + base64.b64encode(mac).decode("ascii")


def signed_fields(uid: str, annotations: Mapping[str, str]) -> BookingFields | None:
    """What a signature over these annotations of the pod `uid` covers (None: a part missing)."""
    booking = read_booking(annotations)
    return None if booking is None else booking.signed_fields(uid)


def verify_pod(keys: BookingKeys, uid: str, annotations: Mapping[str, str]) -> bool:
    """The annotations carry a signature by `keys` of their booking of the pod `uid`."""
    booking = read_booking(annotations)
    return booking is not None and booking.verifies(keys, uid)
