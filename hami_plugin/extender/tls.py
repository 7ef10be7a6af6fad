"""The TLS files a listener serves with, reloaded when they change.

A certificate and key (`--cert-file`, `--key-file`), and optionally the CA that client
certificates must be signed by (`--client-ca-file`: mutual TLS, so that only kube-scheduler,
holding a certificate from that CA, reaches `/filter` and `/bind`). The files are checked at
most once per second, on new connections, and reloaded when any of them changed, as HAMi's
certificate watcher does for the serving pair: a renewed certificate or a rotated CA is served
without a restart. A new set that does not load (a half-written file, a key that does not match)
is logged and the old context kept, so a rotation in progress never takes the listener down.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

from hami_plugin.clock import Clock, SystemClock

__all__ = ["TLS_RECHECK_SECONDS", "TlsFiles"]

logger = logging.getLogger(__name__)

TLS_RECHECK_SECONDS = 1.0
"""How often (at most) the files are looked at for a change."""


class TlsFiles:
    """A certificate and key served over TLS, with an optional client CA; the context is
    rebuilt when any of the files changes. Thread-safe.

    Raises OSError or ssl.SSLError at construction when the files cannot be read or do not
    form a usable pair.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca_file: str = "",
        clock: Clock | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._context = self._load()
        self._checked = self._clock.monotonic()

    def _paths(self) -> tuple[str, ...]:
        paths = (self.cert_file, self.key_file)
        return (*paths, self.client_ca_file) if self.client_ca_file else paths

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        result = []
        for path in self._paths():
            info = os.stat(path)
            result.append((info.st_mtime_ns, info.st_size, info.st_ino))
        return tuple(result)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.client_ca_file)
        return context

    def context(self) -> ssl.SSLContext:
        """The current context; reloads the files when they changed (a bad new set is logged
        and the old one kept)."""
        with self._lock:
            now = self._clock.monotonic()
            if now - self._checked < TLS_RECHECK_SECONDS:
                return self._context
            self._checked = now
            try:
                signature = self._stat()
            except OSError as error:
                logger.warning("TLS files not reloaded, keeping the old ones: %s", error)
                return self._context
            if signature == self._signature:
                return self._context
            # a set that does not load is tried again only once a file changes again (the
            # rest of a rotation being written), so it is logged once, not every second
            self._signature = signature
            try:
                self._context = self._load()
            except (OSError, ssl.SSLError) as error:
                logger.warning("TLS files not reloaded, keeping the old ones: %s", error)
            else:
                logger.info("TLS files reloaded: %s", ", ".join(self._paths()))
            return self._context
