"""`--booking-key-file` and `--legacy-booking-key-file`: the booking keys of a daemon, re-read
when a file changes.

The key file holds one key per line (`hami_plugin.protocol.signature.parse_booking_keys`): the
scheduler's holds its Ed25519 private keys (`KeyRole.SIGN`: at least one, the first signs), a
device plugin's only public keys (`KeyRole.VERIFY`: a private key there is a start error, a node
must not be able to sign). The legacy file holds the HMAC keys of the scheme before (v1): its
bookings verify while the file is there (the upgrade window, docs/install.md); a legacy file
that does not exist gives no legacy key (the Secret is mounted optional, and deleting it closes
the window).

The files are normally Secrets mounted as volumes, which kubelet updates in place, so a rotated
key is picked up without a restart. They are checked at most once per `recheck_seconds`; a new
version of the key file that cannot be read or holds no valid key is logged once and the
previous keys stay in use (a half-written Secret never locks everyone out).
"""

from __future__ import annotations

import enum
import logging
import os
import threading

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.config.values import ConfigError
from hami_plugin.protocol.signature import BookingKeys, parse_booking_keys, parse_legacy_keys

__all__ = ["BookingKeyFile", "KeyRole", "load_booking_keys", "load_legacy_keys"]

logger = logging.getLogger(__name__)

_MAX_FILE_BYTES = 64 * 1024

Stamp = tuple[int, int, int]


class KeyRole(enum.Enum):
    SIGN = "sign"
    """The scheduler: private keys, the first signs."""
    VERIFY = "verify"
    """A device plugin: public keys only."""


def _text(path: str) -> list[str]:
    with open(path, "rb") as handle:
        data = handle.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        raise ValueError(f"larger than {_MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None


def _read(path: str, role: KeyRole) -> BookingKeys:
    keys = parse_booking_keys(_text(path))
    if role is KeyRole.SIGN and not keys.can_sign:
        raise ValueError("no ed25519-private key: the scheduler signs with the first one")
    if role is KeyRole.VERIFY and keys.can_sign:
        raise ValueError(
            "holds a private key: a node must hold only the public keys (ed25519-public lines)"
        )
    return keys


def load_booking_keys(path: str, role: KeyRole = KeyRole.VERIFY) -> BookingKeys:
    """The keys of `path` for `role`; raises ConfigError naming the file and the reason."""
    try:
        return _read(path, role)
    except OSError as error:
        raise ConfigError(f"--booking-key-file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ConfigError(f"--booking-key-file {path}: {error}") from None


def load_legacy_keys(path: str) -> tuple[bytes, ...]:
    """The HMAC keys of `path`, none when it does not exist; raises ConfigError naming the
    file and the reason when it exists but is unusable."""
    try:
        return parse_legacy_keys(_text(path))
    except FileNotFoundError:
        return ()
    except OSError as error:
        raise ConfigError(f"--legacy-booking-key-file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ConfigError(f"--legacy-booking-key-file {path}: {error}") from None


def _stat(path: str) -> Stamp | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


class BookingKeyFile:
    """The keys of one key file (and of a legacy file, if given), current within
    `recheck_seconds`. Thread-safe.

    Construction reads the files and raises ConfigError when one is unusable (a daemon must
    not start with a key it cannot read).
    """

    def __init__(
        self,
        path: str,
        *,
        role: KeyRole = KeyRole.VERIFY,
        legacy_path: str = "",
        clock: Clock | None = None,
        recheck_seconds: float = 5.0,
    ) -> None:
        self.path = path
        self.legacy_path = legacy_path
        self._role = role
        self._clock: Clock = clock or SystemClock()
        self._recheck = recheck_seconds
        self._lock = threading.Lock()
        self._main = load_booking_keys(path, role)
        self._legacy = load_legacy_keys(legacy_path) if legacy_path else ()
        self._keys = self._main.with_legacy(self._legacy)
        self._stamp = _stat(path)
        self._legacy_stamp = _stat(legacy_path) if legacy_path else None
        self._checked = self._clock.monotonic()
        self._bad_stamp: Stamp | None = None
        self._bad_legacy: Stamp | None = None
        if self._legacy:
            logger.warning(
                "legacy booking key file %s: %d HMAC key(s); bookings signed by the scheduler "
                "before the upgrade (v1) verify until the file is removed",
                legacy_path,
                len(self._legacy),
            )

    def keys(self) -> BookingKeys:
        """The current keys (re-read when a file changed since the last check)."""
        with self._lock:
            now = self._clock.monotonic()
            if now - self._checked < self._recheck:
                return self._keys
            self._checked = now
            changed = self._recheck_main()
            changed = self._recheck_legacy() or changed
            if changed:
                self._keys = self._main.with_legacy(self._legacy)
            return self._keys

    def _recheck_main(self) -> bool:
        stamp = _stat(self.path)
        if stamp == self._stamp or stamp is None or stamp == self._bad_stamp:
            if stamp is None and self._bad_stamp != (0, 0, 0):
                self._bad_stamp = (0, 0, 0)
                logger.warning(
                    "booking key file %s is gone; keeping the keys read before", self.path
                )
            return False
        try:
            keys = _read(self.path, self._role)
        except (OSError, ValueError) as error:
            self._bad_stamp = stamp
            logger.warning(
                "booking key file %s changed but is unusable (%s); keeping the keys read before",
                self.path,
                error,
            )
            return False
        self._main = keys
        self._stamp = stamp
        self._bad_stamp = None
        logger.info(
            "booking key file %s re-read: %d private, %d public key(s)",
            self.path,
            len(keys.private),
            len(keys.public),
        )
        return True

    def _recheck_legacy(self) -> bool:
        if not self.legacy_path:
            return False
        stamp = _stat(self.legacy_path)
        if stamp == self._legacy_stamp or (stamp is not None and stamp == self._bad_legacy):
            return False
        if stamp is None:
            self._legacy_stamp = None
            if self._legacy:
                logger.warning(
                    "legacy booking key file %s is gone: bookings signed before the upgrade "
                    "(v1) are refused from now on",
                    self.legacy_path,
                )
            self._legacy = ()
            return True
        try:
            legacy = parse_legacy_keys(_text(self.legacy_path))
        except (OSError, ValueError) as error:
            self._bad_legacy = stamp
            logger.warning(
                "legacy booking key file %s changed but is unusable (%s); keeping the keys "
                "read before",
                self.legacy_path,
                error,
            )
            return False
        self._legacy, self._legacy_stamp, self._bad_legacy = legacy, stamp, None
        logger.info("legacy booking key file %s re-read: %d key(s)", self.legacy_path, len(legacy))
        return True
