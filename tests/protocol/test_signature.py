"""The booking signature: what it covers, which keys sign and verify, every malformed value."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.signature import (
    MIN_KEY_BYTES,
    BookingFields,
    BookingKeys,
    parse_booking_keys,
)

KEY_A = b"a" * 32
KEY_B = b"b" * 32
FIELDS = BookingFields(
    uid="6f1c2b0e-0000-4000-8000-000000000001",
    node="gpu-a100",
    devices="GPU-0,NVIDIA,1000,10:;",
    bind_time="1767268800",
)


def test_sign_then_verify() -> None:
    keys = BookingKeys((KEY_A,))
    value = keys.sign(FIELDS)
    assert value.startswith("v1:")
    assert len(base64.b64decode(value[3:], validate=True)) == 32
    assert keys.verify(value, FIELDS)
    assert keys.sign(FIELDS) == value  # deterministic: the device plugin recomputes it


def test_the_first_key_signs_and_any_key_verifies() -> None:
    rotating = BookingKeys((KEY_B, KEY_A))
    assert rotating.sign(FIELDS) == BookingKeys((KEY_B,)).sign(FIELDS)
    assert rotating.sign(FIELDS) != BookingKeys((KEY_A,)).sign(FIELDS)
    # signed before the rotation (by A alone), verified during it
    assert rotating.verify(BookingKeys((KEY_A,)).sign(FIELDS), FIELDS)
    assert rotating.verify(BookingKeys((KEY_B,)).sign(FIELDS), FIELDS)
    # after A is removed, what A signed no longer verifies
    assert not BookingKeys((KEY_B,)).verify(BookingKeys((KEY_A,)).sign(FIELDS), FIELDS)


@pytest.mark.parametrize("field", ["uid", "node", "devices", "bind_time"])
def test_a_change_of_any_signed_field_fails(field: str) -> None:
    keys = BookingKeys((KEY_A,))
    value = keys.sign(FIELDS)
    changed = dataclasses.replace(FIELDS, **{field: getattr(FIELDS, field) + "x"})
    assert not keys.verify(value, changed)


def test_the_message_cannot_be_shifted_between_fields() -> None:
    one = BookingFields("uid", "node,a", "dev", "1")
    other = BookingFields("uid", "node", "a,dev", "1")
    assert one.message() != other.message()
    assert not BookingKeys((KEY_A,)).verify(BookingKeys((KEY_A,)).sign(one), other)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "v1",
        "v1:",
        "v2:" + base64.b64encode(b"x" * 32).decode(),  # another version
        "V1:" + base64.b64encode(b"x" * 32).decode(),
        "v1:!!!!",  # not base64
        "v1:" + base64.b64encode(b"x" * 32).decode().rstrip("="),  # padding missing
        "v1:" + base64.b64encode(b"x" * 16).decode(),  # too short for SHA-256
        "v1:" + base64.b64encode(b"x" * 33).decode(),  # too long
        "v1:é" + "A" * 43,  # not ASCII
        "v1: " + base64.b64encode(b"x" * 32).decode(),
    ],
)
def test_malformed_values_fail_without_raising(value: str | None) -> None:
    assert not BookingKeys((KEY_A,)).verify(value, FIELDS)


def test_the_right_mac_under_another_version_fails() -> None:
    keys = BookingKeys((KEY_A,))
    mac = keys.sign(FIELDS).partition(":")[2]
    assert not keys.verify(f"v2:{mac}", FIELDS)
    assert keys.verify(f"v1:{mac}", FIELDS)


def test_no_fields_never_verify() -> None:
    assert not BookingKeys((KEY_A,)).verify(BookingKeys((KEY_A,)).sign(FIELDS), None)


def test_short_or_no_keys_are_refused_and_never_printed() -> None:
    with pytest.raises(ValueError, match="no booking key"):
        BookingKeys(())
    with pytest.raises(ValueError, match=f"booking key 2 has 15 bytes, fewer than {MIN_KEY_BYTES}"):
        BookingKeys((KEY_A, b"k" * 15))
    BookingKeys((b"k" * MIN_KEY_BYTES,))  # the shortest accepted
    assert repr(BookingKeys((KEY_A, KEY_B))) == "BookingKeys(2 key(s))"
    assert "aaaa" not in str(BookingKeys((KEY_A,)))


def test_key_file_lines_comments_and_blanks() -> None:
    keys = parse_booking_keys(
        [
            "# booking keys, the signing one first",
            "",
            "   ",
            f"  {'n' * 44}  ",
            "#old",
            "o" * 20,
        ]
    )
    assert keys.keys == (b"n" * 44, b"o" * 20)
    with pytest.raises(ValueError, match="no booking key in the file"):
        parse_booking_keys(["# only a comment", ""])
    with pytest.raises(ValueError, match="booking key 1 has 5 bytes"):
        parse_booking_keys(["short"])


_TEXT = st.text(max_size=40)
_FIELDS = st.builds(BookingFields, uid=_TEXT, node=_TEXT, devices=_TEXT, bind_time=_TEXT)
_KEYS = st.lists(st.binary(min_size=MIN_KEY_BYTES, max_size=64), min_size=1, max_size=3).map(
    lambda keys: BookingKeys(tuple(keys))
)


@given(keys=_KEYS, fields=_FIELDS, field=st.sampled_from(["uid", "node", "devices", "bind_time"]))
def test_property_verify_sign_and_any_change_fails(
    keys: BookingKeys, fields: BookingFields, field: str
) -> None:
    value = keys.sign(fields)
    assert keys.verify(value, fields)
    changed = dataclasses.replace(fields, **{field: getattr(fields, field) + "\x00"})
    assert not keys.verify(value, changed)


@given(keys=_KEYS, fields=_FIELDS, other=_FIELDS)
def test_property_a_signature_verifies_only_its_own_fields(
    keys: BookingKeys, fields: BookingFields, other: BookingFields
) -> None:
    assert keys.verify(keys.sign(fields), other) == (fields == other)
