"""The booking key files `hami certs` keeps in two Secrets (`keys` in each): the scheduler's
Ed25519 private keys, one `ed25519-private:` line per key, the signing key first; and the
nodes' file, the public key of each, in the same order (`public_file`). The daemons read them
with `hami_plugin.protocol.signature.parse_booking_keys`. A new key is a fresh Ed25519 key.
Pure apart from the randomness.
"""

from __future__ import annotations

import base64
import secrets

from hami_plugin.protocol.signature import (
    PRIVATE_PREFIX,
    parse_booking_keys,
    public_key_line,
)

__all__ = [
    "MAX_KEYS",
    "key_file",
    "new_key",
    "promoted",
    "public_file",
    "read_key_lines",
    "staged",
]

MAX_KEYS = 3
"""How many keys a rotation leaves: the signing key, the new one and one older key."""


def new_key() -> str:
    """A fresh private key line (`ed25519-private:<base64 32-byte seed>`: any 32 random
    bytes are an Ed25519 private key)."""
    return PRIVATE_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def read_key_lines(data: bytes) -> list[str]:
    """The key lines of the private key file, in order (blank and `#` lines left out). Raises
    ValueError with the reason when the file is not UTF-8 or the scheduler could not sign with
    it (an HMAC key of the scheme before included)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None
    keys = parse_booking_keys(text.splitlines())
    if not keys.can_sign or len(keys.private) != len(keys.public):
        raise ValueError("the private key file holds a line that is not ed25519-private")
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def staged(lines: list[str], key: str) -> list[str]:
    """Step 1 of a rotation: `key` second, after the signing key, then the older keys,
    `MAX_KEYS` in all (the oldest goes). Every daemon accepts `key` once it has read its file;
    nothing is signed with it yet."""
    rest = [line for line in lines if line != key]
    return [*rest[:1], key, *rest[1:]][:MAX_KEYS]


def promoted(lines: list[str]) -> list[str]:
    """Step 2: the second key signs from now on (the first two swapped). Unchanged with fewer
    than two keys."""
    if len(lines) < 2:
        return list(lines)
    return [lines[1], lines[0], *lines[2:]]


def key_file(lines: list[str]) -> bytes:
    """The private file's bytes: one key per line."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def public_file(lines: list[str]) -> bytes:
    """The nodes' file for these private key lines: the public key of each, in order, and
    nothing that signs."""
    keys = parse_booking_keys(lines)
    text = "# the scheduler's public booking keys (hami certs)\n"
    return (text + "".join(f"{public_key_line(key)}\n" for key in keys.public)).encode("utf-8")
