"""`--booking-key-file`: read at start (a bad file is a start error naming it), re-read when it
changes (a mounted Secret rotated in place), the old keys kept while a new version is bad."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.config import ConfigError
from hami_plugin.config.keys import BookingKeyFile, load_booking_keys

OLD = "o" * 44
NEW = "n" * 44


def write(path: Path, text: str | bytes) -> None:
    """Replace the file as kubelet updates a Secret volume: a new file moved into place."""
    staged = path.with_name(path.name + ".new")
    if isinstance(text, bytes):
        staged.write_bytes(text)
    else:
        staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    path = tmp_path / "booking-keys"
    write(path, f"# the signing key first\n{OLD}\n")
    return path


def test_load_reads_keys_in_order(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    write(path, f"\n{NEW}\n  # rotation: the old key still verifies\n{OLD}\n")
    assert load_booking_keys(str(path)).keys == (NEW.encode(), OLD.encode())


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        ("", "no booking key in the file"),
        ("# nothing but comments\n\n", "no booking key in the file"),
        ("short\n", "booking key 1 has 5 bytes, fewer than 16"),
        (b"\xff\xfe" + b"k" * 20, "not UTF-8"),
        ("k" * (64 * 1024 + 1), "larger than 65536 bytes"),
    ],
)
def test_an_unusable_file_is_a_config_error_naming_it(
    tmp_path: Path, content: str | bytes | None, reason: str
) -> None:
    path = tmp_path / "keys"
    if content is not None:
        write(path, content)
    with pytest.raises(ConfigError) as raised:
        load_booking_keys(str(path))
    assert str(raised.value).startswith(f"--booking-key-file {path}: ")
    assert reason in str(raised.value)
    with pytest.raises(ConfigError, match="--booking-key-file"):
        BookingKeyFile(str(path), clock=ManualClock())


def test_a_changed_file_is_read_again_after_the_recheck_interval(key_path: Path) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), clock=clock, recheck_seconds=5)
    assert keys.keys().keys == (OLD.encode(),)
    write(key_path, f"{NEW}\n{OLD}\n")
    clock.advance(4)
    assert keys.keys().keys == (OLD.encode(),)  # not checked yet
    clock.advance(1)
    assert keys.keys().keys == (NEW.encode(), OLD.encode())
    clock.advance(5)
    assert keys.keys().keys == (NEW.encode(), OLD.encode())  # unchanged: same keys


def test_an_unchanged_file_is_not_read_again(key_path: Path) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), clock=clock)
    first = keys.keys()
    clock.advance(60)
    assert keys.keys() is first  # the same object: callers may cache what they derived


def test_a_bad_new_version_keeps_the_old_keys_and_is_logged_once(
    key_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), clock=clock)
    caplog.set_level(logging.INFO, logger="hami_plugin.config.keys")
    write(key_path, "half-written\n")
    for _ in range(3):
        clock.advance(5)
        assert keys.keys().keys == (OLD.encode(),)
    assert len(warnings(caplog)) == 1
    assert "changed but is unusable" in warnings(caplog)[0]
    assert "booking key 1 has 12 bytes" in warnings(caplog)[0]
    # the Secret is written completely: read at the next check
    write(key_path, f"{NEW}\n")
    clock.advance(5)
    assert keys.keys().keys == (NEW.encode(),)
    assert any("re-read: 1 key(s)" in r.getMessage() for r in caplog.records)


def test_a_vanished_file_keeps_the_old_keys_and_is_logged_once(
    key_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    keys = BookingKeyFile(str(key_path), clock=clock)
    caplog.set_level(logging.WARNING, logger="hami_plugin.config.keys")
    key_path.unlink()
    for _ in range(3):
        clock.advance(5)
        assert keys.keys().keys == (OLD.encode(),)
    assert len(warnings(caplog)) == 1
    assert "is gone" in warnings(caplog)[0]
    write(key_path, f"{NEW}\n")
    clock.advance(5)
    assert keys.keys().keys == (NEW.encode(),)
