"""The booking key file `hami certs` keeps in its Secret (`keys`): one key per line, the
signing key first (`hami_plugin.protocol.signature.parse_booking_keys` reads it). A new key is
32 random bytes in standard base64, one line of 44 characters. Pure apart from the randomness.
"""

from __future__ import annotations

import base64
import secrets

from hami_plugin.protocol.signature import parse_booking_keys

__all__ = [
    "KEY_BYTES",
    "MAX_KEYS",
    "key_file",
    "new_key",
    "promoted",
    "read_key_lines",
    "staged",
]

KEY_BYTES = 32
MAX_KEYS = 3
"""How many keys a rotation leaves: the signing key, the new one and one older key."""


def new_key() -> str:
    """A fresh key line: `KEY_BYTES` random bytes, standard base64."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def read_key_lines(data: bytes) -> list[str]:
    """The key lines of a key file, in order (blank and `#` lines left out). Raises ValueError
    with the reason when the file is not UTF-8 or the daemons could not use it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None
    parse_booking_keys(text.splitlines())
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def staged(lines: list[str], key: str) -> list[str]:
    """Step 1 of a rotation: `key` second, after the signing key, then the older keys,
    `MAX_KEYS` in all (the oldest goes). Every daemon accepts `key` once it has read the file;
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
    """The file's bytes: one key per line."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8")
