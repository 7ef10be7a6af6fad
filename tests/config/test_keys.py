"""`--booking-key-file` and `--legacy-booking-key-file`: read at start (a bad file is a start
error naming it; a private key on a node or none on the scheduler too), re-read when they
change (a mounted Secret rotated in place), the old keys kept while a new version is bad, the
legacy keys dropped when their file goes (the end of the upgrade window)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.config import ConfigError
from hami_plugin.config.keys import BookingKeyFile, KeyRole, load_booking_keys, load_legacy_keys
from hami_plugin.protocol.signature import BookingFields, BookingKeys, public_key_line
from tests.bookings import (
    hmac_signature,
    keys_from,
    private_key_file_text,
    public_key_file_text,
)

OLD = "old-booking-key-seed"
NEW = "new-booking-key-seed"
LEGACY = "an-old-shared-hmac-booking-key-0123456789"
FIELDS = BookingFields("uid-1", "node-1", "GPU-0,NVIDIA,1000,10:;", "1767268800")


def write(path: Path, text: str | bytes) -> None:
    """Replace the file as kubelet updates a Secret volume: a new file moved into place."""
    staged = path.with_name(path.name + ".new")
    if isinstance(text, bytes):
        staged.write_bytes(text)
    else:
        staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def public(keys: BookingKeys) -> tuple[str, ...]:
    """Which keys verify, as their public key lines, in order."""
    return tuple(public_key_line(key) for key in keys.public)


def expected(*seeds: str) -> tuple[str, ...]:
    return public(keys_from(*seeds))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    path = tmp_path / "booking-keys"
    write(path, private_key_file_text(OLD))
    return path


def test_load_reads_keys_in_order(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    write(path, private_key_file_text(NEW, OLD))
    keys = load_booking_keys(str(path), KeyRole.SIGN)
    assert public(keys) == expected(NEW, OLD)
    assert keys.sign(FIELDS) == keys_from(NEW).sign(FIELDS)
    write(path, public_key_file_text(NEW, OLD))
    node = load_booking_keys(str(path))
    assert public(node) == expected(NEW, OLD) and not node.can_sign


@pytest.mark.parametrize(
    ("content", "role", "reason"),
    [
        (None, KeyRole.VERIFY, "No such file or directory"),
        ("", KeyRole.VERIFY, "no booking key in the file"),
        ("# nothing but comments\n\n", KeyRole.SIGN, "no booking key in the file"),
        ("k" * 44 + "\n", KeyRole.SIGN, "only in --legacy-booking-key-file"),
        (b"\xff\xfe" + b"k" * 20, KeyRole.VERIFY, "not UTF-8"),
        ("k" * (64 * 1024 + 1), KeyRole.VERIFY, "larger than 65536 bytes"),
        (private_key_file_text(OLD), KeyRole.VERIFY, "a node must hold only the public keys"),
        (public_key_file_text(OLD), KeyRole.SIGN, "no ed25519-private key"),
    ],
    ids=["missing", "empty", "comments", "hmac", "utf8", "large", "private-on-node", "no-signer"],
)
def test_an_unusable_file_is_a_config_error_naming_it(
    tmp_path: Path, content: str | bytes | None, role: KeyRole, reason: str
) -> None:
    path = tmp_path / "keys"
    if content is not None:
        write(path, content)
    with pytest.raises(ConfigError) as raised:
        load_booking_keys(str(path), role)
    assert str(raised.value).startswith(f"--booking-key-file {path}: ")
    assert reason in str(raised.value)
    with pytest.raises(ConfigError, match="--booking-key-file"):
        BookingKeyFile(str(path), role=role, clock=ManualClock())


def test_a_changed_file_is_read_again_after_the_recheck_interval(key_path: Path) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), role=KeyRole.SIGN, clock=clock, recheck_seconds=5)
    assert public(keys.keys()) == expected(OLD)
    write(key_path, private_key_file_text(NEW, OLD))
    clock.advance(4)
    assert public(keys.keys()) == expected(OLD)  # not checked yet
    clock.advance(1)
    assert public(keys.keys()) == expected(NEW, OLD)
    clock.advance(5)
    assert public(keys.keys()) == expected(NEW, OLD)  # unchanged: same keys


def test_an_unchanged_file_is_not_read_again(key_path: Path) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), role=KeyRole.SIGN, clock=clock)
    first = keys.keys()
    clock.advance(60)
    assert keys.keys() is first  # the same object: callers may cache what they derived


def test_a_bad_new_version_keeps_the_old_keys_and_is_logged_once(
    key_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), role=KeyRole.SIGN, clock=clock)
    caplog.set_level(logging.INFO, logger="hami_plugin.config.keys")
    write(key_path, "half-written\n")
    for _ in range(3):
        clock.advance(5)
        assert public(keys.keys()) == expected(OLD)
    assert len(warnings(caplog)) == 1
    assert "changed but is unusable" in warnings(caplog)[0]
    assert "only in --legacy-booking-key-file" in warnings(caplog)[0]
    # the Secret is written completely: read at the next check
    write(key_path, private_key_file_text(NEW))
    clock.advance(5)
    assert public(keys.keys()) == expected(NEW)
    assert any("re-read: 1 private, 1 public key(s)" in r.getMessage() for r in caplog.records)


def test_a_vanished_file_keeps_the_old_keys_and_is_logged_once(
    key_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), role=KeyRole.SIGN, clock=clock)
    caplog.set_level(logging.WARNING, logger="hami_plugin.config.keys")
    key_path.unlink()
    for _ in range(3):
        clock.advance(5)
        assert public(keys.keys()) == expected(OLD)
    assert len(warnings(caplog)) == 1
    assert "is gone" in warnings(caplog)[0]
    write(key_path, private_key_file_text(NEW))
    clock.advance(5)
    assert public(keys.keys()) == expected(NEW)


def test_the_legacy_file_verifies_v1_until_it_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The upgrade window: HMAC bookings of the scheduler before verify while the old Secret
    is mounted, and are refused once it is gone (a missing file at start: no window)."""
    caplog.set_level(logging.INFO, logger="hami_plugin.config.keys")
    node_file = tmp_path / "public"
    write(node_file, public_key_file_text(NEW))
    legacy = tmp_path / "legacy"
    old_booking = hmac_signature(LEGACY.encode(), FIELDS)
    clock = ManualClock()
    closed = BookingKeyFile(str(node_file), legacy_path=str(legacy), clock=clock)
    assert not closed.keys().verify(old_booking, FIELDS)
    assert load_legacy_keys(str(legacy)) == ()
    write(legacy, f"# the HMAC key of before\n{LEGACY}\n")
    window = BookingKeyFile(str(node_file), legacy_path=str(legacy), clock=clock)
    assert window.keys().verify(old_booking, FIELDS)
    assert window.keys().verify(keys_from(NEW).sign(FIELDS), FIELDS)
    assert any("verify until the file is removed" in line for line in warnings(caplog))
    legacy.unlink()
    clock.advance(5)
    assert not window.keys().verify(old_booking, FIELDS)
    assert window.keys().verify(keys_from(NEW).sign(FIELDS), FIELDS)
    assert any("are refused from now on" in line for line in warnings(caplog))
    write(legacy, "short\n")
    with pytest.raises(ConfigError, match=f"--legacy-booking-key-file {legacy}: .* 5 bytes"):
        BookingKeyFile(str(node_file), legacy_path=str(legacy), clock=clock)
