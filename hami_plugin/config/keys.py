"""`--booking-key-file`: the booking keys both daemons share, re-read when the file changes.

The file holds one key per line (`hami_plugin.protocol.signature.parse_booking_keys`); it is
normally a Secret mounted as a volume, which kubelet updates in place when the Secret changes,
so a rotated key is picked up without a restart. The file is checked at most once per
`recheck_seconds`; a new version that cannot be read or holds no valid key is logged once and
the previous keys stay in use (a half-written Secret never locks everyone out).
"""

from __future__ import annotations

import logging
import os
import threading

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.config.values import ConfigError
from hami_plugin.protocol.signature import BookingKeys, parse_booking_keys

__all__ = ["BookingKeyFile", "load_booking_keys"]

logger = logging.getLogger(__name__)

_MAX_FILE_BYTES = 64 * 1024


def _read(path: str) -> BookingKeys:
    with open(path, "rb") as handle:
        data = handle.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        raise ValueError(f"larger than {_MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None
    return parse_booking_keys(text.splitlines())


def load_booking_keys(path: str) -> BookingKeys:
    """The keys of `path`; raises ConfigError naming the file and the reason."""
    try:
        return _read(path)
    except OSError as error:
        raise ConfigError(f"--booking-key-file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ConfigError(f"--booking-key-file {path}: {error}") from None


class BookingKeyFile:
    """The keys of one file, current within `recheck_seconds`. Thread-safe.

    Construction reads the file and raises ConfigError when it is unusable (a daemon must not
    start with a key it cannot read).
    """

    def __init__(
        self, path: str, *, clock: Clock | None = None, recheck_seconds: float = 5.0
    ) -> None:
        self.path = path
        self._clock: Clock = clock or SystemClock()
        self._recheck = recheck_seconds
        self._lock = threading.Lock()
        self._keys = load_booking_keys(path)
        self._stamp = self._stat()
        self._checked = self._clock.monotonic()
        self._bad_stamp: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def keys(self) -> BookingKeys:
        """The current keys (re-read when the file changed since the last check)."""
        with self._lock:
            now = self._clock.monotonic()
            if now - self._checked < self._recheck:
                return self._keys
            self._checked = now
            stamp = self._stat()
            if stamp == self._stamp or stamp is None or stamp == self._bad_stamp:
                if stamp is None and self._bad_stamp != (0, 0, 0):
                    self._bad_stamp = (0, 0, 0)
                    logger.warning(
                        "booking key file %s is gone; keeping the keys read before", self.path
                    )
                return self._keys
            try:
                keys = _read(self.path)
            except (OSError, ValueError) as error:
                self._bad_stamp = stamp
                logger.warning(
                    "booking key file %s changed but is unusable (%s); keeping the keys read "
                    "before",
                    self.path,
                    error,
                )
                return self._keys
            self._keys = keys
            self._stamp = stamp
            self._bad_stamp = None
            logger.info("booking key file %s re-read: %d key(s)", self.path, len(keys.keys))
            return self._keys
