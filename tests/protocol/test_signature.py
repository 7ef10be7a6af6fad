"""The booking signature: what it covers, which keys sign and verify, every malformed value,
the public keys a node holds (they verify, never sign) and the legacy HMAC scheme (v1)."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURES,
    MIN_KEY_BYTES,
    BookingFields,
    BookingKeys,
    parse_booking_keys,
    parse_legacy_keys,
    private_key_line,
    public_key_line,
    signature_announcement,
    signing_version,
)
from tests.bookings import hmac_signature, keys_from, seeded_key

KEY_A = b"a" * 32
KEY_B = b"b" * 32
LEGACY = b"an-old-shared-hmac-booking-key-0123456789"
FIELDS = BookingFields(
    uid="6f1c2b0e-0000-4000-8000-000000000001",
    node="gpu-a100",
    devices="GPU-0,NVIDIA,1000,10:;",
    bind_time="1767268800",
)


def test_sign_then_verify() -> None:
    keys = keys_from(KEY_A)
    value = keys.sign(FIELDS)
    assert value.startswith("v2:")
    assert len(base64.b64decode(value[3:], validate=True)) == 64
    assert keys.verify(value, FIELDS)
    assert keys.sign(FIELDS) == value  # Ed25519 is deterministic


def test_the_public_keys_verify_but_cannot_sign() -> None:
    node = keys_from(KEY_A).verifier()
    assert not node.can_sign and node.private == ()
    assert node.verify(keys_from(KEY_A).sign(FIELDS), FIELDS)
    with pytest.raises(ValueError, match="only the scheduler signs"):
        node.sign(FIELDS)


def test_what_a_node_could_compute_does_not_verify() -> None:
    """The attack on the HMAC scheme: a node held the one key and signed what it liked. With
    the public key alone, the values it can make are refused: the public key's bytes as an
    HMAC key (v1 and v2), the signature of another pod moved onto this one, a signature of its
    own key pair."""
    scheduler = keys_from(KEY_A)
    node = scheduler.verifier()
    public_raw = base64.b64decode(public_key_line(node.public[0]).partition(":")[2])
    assert not node.verify(hmac_signature(public_raw, FIELDS), FIELDS)
    assert not node.verify("v2:" + hmac_signature(public_raw, FIELDS)[3:], FIELDS)
    other_pod = dataclasses.replace(FIELDS, uid="another-pod")
    assert not node.verify(scheduler.sign(other_pod), FIELDS)
    assert not node.verify(keys_from(b"the node's own pair").sign(FIELDS), FIELDS)


def test_the_first_key_signs_and_any_key_verifies() -> None:
    rotating = keys_from(KEY_B, KEY_A)
    assert rotating.sign(FIELDS) == keys_from(KEY_B).sign(FIELDS)
    assert rotating.sign(FIELDS) != keys_from(KEY_A).sign(FIELDS)
    # signed before the rotation (by A alone), verified during it, also by the public keys
    for verifier in (rotating, rotating.verifier()):
        assert verifier.verify(keys_from(KEY_A).sign(FIELDS), FIELDS)
        assert verifier.verify(keys_from(KEY_B).sign(FIELDS), FIELDS)
    # after A is removed, what A signed no longer verifies
    assert not keys_from(KEY_B).verify(keys_from(KEY_A).sign(FIELDS), FIELDS)


def test_legacy_hmac_signatures_verify_only_with_the_legacy_keys() -> None:
    old = hmac_signature(LEGACY, FIELDS)
    assert not keys_from(KEY_A).verify(old, FIELDS)
    assert not keys_from(KEY_A).verifier().verify(old, FIELDS)
    window = keys_from(KEY_A, legacy=(LEGACY,))
    assert window.verify(old, FIELDS)
    assert window.verifier().verify(old, FIELDS)
    assert not window.verify(hmac_signature(b"another-hmac-key-0123456789", FIELDS), FIELDS)
    assert not window.verify(old, dataclasses.replace(FIELDS, node="other"))
    # the scheduler never signs HMAC again, and a v1 MAC under v2 is nothing
    assert window.sign(FIELDS).startswith("v2:")
    assert not window.verify("v2:" + old[3:], FIELDS)
    assert not window.with_legacy(()).verify(old, FIELDS)


@pytest.mark.parametrize("field", ["uid", "node", "devices", "bind_time", "mig"])
def test_a_change_of_any_signed_field_fails(field: str) -> None:
    keys = keys_from(KEY_A)
    value = keys.sign(FIELDS)
    changed = dataclasses.replace(FIELDS, **{field: (getattr(FIELDS, field) or "") + "x"})
    assert not keys.verify(value, changed)


def test_the_message_cannot_be_shifted_between_fields() -> None:
    one = BookingFields("uid", "node,a", "dev", "1")
    other = BookingFields("uid", "node", "a,dev", "1")
    assert one.message() != other.message()
    assert not keys_from(KEY_A).verify(keys_from(KEY_A).sign(one), other)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "v2",
        "v2:",
        "v3:" + base64.b64encode(b"x" * 64).decode(),  # another version
        "V2:" + base64.b64encode(b"x" * 64).decode(),
        "v2:!!!!",  # not base64
        "v2:" + base64.b64encode(b"x" * 64).decode().rstrip("="),  # padding missing
        "v2:" + base64.b64encode(b"x" * 32).decode(),  # too short for Ed25519
        "v2:" + base64.b64encode(b"x" * 65).decode(),  # too long
        "v2:" + base64.b64encode(bytes(64)).decode(),  # zeros
        "v2:é" + "A" * 86,  # not ASCII
        "v2: " + base64.b64encode(b"x" * 64).decode(),
        "v1:" + base64.b64encode(b"x" * 32).decode(),  # v1 without legacy keys
    ],
)
def test_malformed_values_fail_without_raising(value: str | None) -> None:
    assert not keys_from(KEY_A, legacy=(LEGACY,)).verify(value, FIELDS)
    assert not keys_from(KEY_A).verifier().verify(value, FIELDS)


def test_no_fields_never_verify() -> None:
    assert not keys_from(KEY_A).verify(keys_from(KEY_A).sign(FIELDS), None)


def test_short_or_no_keys_are_refused_and_never_printed() -> None:
    with pytest.raises(ValueError, match="no booking key"):
        BookingKeys()
    with pytest.raises(ValueError, match="no booking key"):
        BookingKeys(legacy=(LEGACY,))  # a legacy key alone verifies nothing new
    with pytest.raises(
        ValueError, match=f"legacy booking key 2 has 15 bytes, fewer than {MIN_KEY_BYTES}"
    ):
        keys_from(KEY_A, legacy=(LEGACY, b"k" * 15))
    keys = keys_from(KEY_A, KEY_B, legacy=(LEGACY,))
    assert repr(keys) == "BookingKeys(2 private, 2 public, 1 legacy)"
    seed_line = private_key_line(seeded_key(KEY_A)).partition(":")[2]
    assert seed_line not in str(keys) and "an-old" not in str(keys)


def test_key_file_lines_comments_and_blanks() -> None:
    private_a = private_key_line(seeded_key(KEY_A))
    public_b = public_key_line(seeded_key(KEY_B).public_key())
    keys = parse_booking_keys(
        ["# booking keys, the signing one first", "", "   ", f"  {private_a}  ", "#old", public_b]
    )
    assert keys.can_sign and keys.sign(FIELDS) == keys_from(KEY_A).sign(FIELDS)
    assert keys.verify(keys_from(KEY_B).sign(FIELDS), FIELDS)
    node = parse_booking_keys([public_key_line(seeded_key(KEY_A).public_key())])
    assert not node.can_sign and node.verify(keys_from(KEY_A).sign(FIELDS), FIELDS)
    with pytest.raises(ValueError, match="no booking key in the file"):
        parse_booking_keys(["# only a comment", ""])
    with pytest.raises(ValueError, match="only in --legacy-booking-key-file"):
        parse_booking_keys([base64.b64encode(KEY_A).decode()])  # an HMAC key of before
    with pytest.raises(ValueError, match="line 1: not 32 bytes"):
        parse_booking_keys(["ed25519-public:" + base64.b64encode(b"x" * 31).decode()])


def test_legacy_key_file_lines() -> None:
    assert parse_legacy_keys(["# old", "", f" {LEGACY.decode()} "]) == (LEGACY,)
    with pytest.raises(ValueError, match="no legacy booking key"):
        parse_legacy_keys(["# nothing"])
    with pytest.raises(ValueError, match="legacy booking key 1 has 5 bytes"):
        parse_legacy_keys(["short"])
    with pytest.raises(ValueError, match="an Ed25519 key"):
        parse_legacy_keys([public_key_line(seeded_key(KEY_A).public_key())])


_TEXT = st.text(max_size=40)
_FIELDS = st.builds(BookingFields, uid=_TEXT, node=_TEXT, devices=_TEXT, bind_time=_TEXT)
_KEYS = st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=3).map(
    lambda seeds: keys_from(*seeds)
)


@settings(max_examples=50)
@given(keys=_KEYS, fields=_FIELDS, field=st.sampled_from(["uid", "node", "devices", "bind_time"]))
def test_property_verify_sign_and_any_change_fails(
    keys: BookingKeys, fields: BookingFields, field: str
) -> None:
    value = keys.sign(fields)
    assert keys.verifier().verify(value, fields)
    changed = dataclasses.replace(fields, **{field: getattr(fields, field) + "\x00"})
    assert not keys.verifier().verify(value, changed)


@settings(max_examples=50)
@given(keys=_KEYS, fields=_FIELDS, other=_FIELDS)
def test_property_a_signature_verifies_only_its_own_fields(
    keys: BookingKeys, fields: BookingFields, other: BookingFields
) -> None:
    assert keys.verifier().verify(keys.sign(fields), other) == (fields == other)


def test_a_node_announces_what_it_checks_and_the_scheduler_signs_what_it_can() -> None:
    fields = BookingFields(uid="u", node="n", devices="d", bind_time="1")
    current = keys_from("k")
    in_window = keys_from("k", legacy=(b"h" * 32,))
    assert signature_announcement(None) == {}
    assert signature_announcement(current) == {ANNOTATION_BOOKING_SIGNATURES: "v2"}
    assert signature_announcement(in_window) == {ANNOTATION_BOOKING_SIGNATURES: "v2,v1"}
    # a node that does not announce v2 runs the previous release: v1 while a legacy key exists
    assert signing_version(None, in_window) == "v1"
    assert signing_version("v1", in_window) == "v1"
    assert signing_version("v2", in_window) == "v2"
    assert signing_version(" v1 , v2 ", in_window) == "v2"
    assert signing_version(None, current) == "v2"
    v1 = in_window.sign(fields, "v1")
    assert v1 == hmac_signature(b"h" * 32, fields)
    assert in_window.verify(v1, fields) and not current.verify(v1, fields)
    with pytest.raises(ValueError, match="no legacy booking key"):
        current.sign(fields, "v1")
