"""Which allocate protocol this node claims in `hami-plugin.io/allocate-protocol`.

The annotation goes out with the register annotation (`deviceplugin.register`):
`in-flight/v2` while kubelet's PodResources API (`--pod-resources-socket`) answers a `List`,
probed at every register round, else `in-flight/v1` (docs/design.md 5.6). An Allocate that
finds the API failing (`failed_at_allocate`) makes the next round write v1 whatever its probe
says (the rounds after it probe again), and the caller wakes the register loop, so the scheduler
stops sending interchangeable pods together within moments. `recently_v2` tells Allocate
whether pods bound under v2 may still be waiting: kubelet's list is then the only safe way to
tell them apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.podresources import PodResourcesClient, PodResourcesError
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
)

__all__ = ["V2_GRACE_SECONDS", "ProtocolClaim"]

logger = logging.getLogger(__name__)

V2_GRACE_SECONDS = 600.0
"""After the node last claimed v2, how long pods bound under it may still wait for kubelet
(longer than the scheduler's `--allocation-timeout`, 2 min, after which it fails them)."""


class ProtocolClaim:
    """The value of `hami-plugin.io/allocate-protocol` for each register round: v2 while
    `client` answers, else v1; always v1 without a client. Thread-safe: Allocate reports
    failures while the register loop decides."""

    def __init__(self, client: PodResourcesClient | None, *, clock: Clock | None = None) -> None:
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._failed_at_allocate = False
        self._decided: str | None = None
        self._pending: tuple[str, bool] | None = None
        self._last_v2: float | None = None
        """When a round claiming v2 was last written (monotonic)."""
        self.claimed: str | None = None
        """The value of the last register round that was written (None before any)."""

    def annotations(self) -> Mapping[str, str]:
        """This round's `also_annotate` (`RegisterPublisher`): the protocol decided now."""
        value, forced = self._decide()
        with self._lock:
            self._pending = (value, forced)
        return {ANNOTATION_ALLOCATE_PROTOCOL: value}

    def written(self, annotations: Mapping[str, str]) -> None:
        """The round that returned `annotations` was written to the node (or found there)."""
        with self._lock:
            pending, self._pending = self._pending, None
            before, self.claimed = self.claimed, annotations.get(ANNOTATION_ALLOCATE_PROTOCOL)
            if ALLOCATE_PROTOCOL_V2 in (before, self.claimed):
                self._last_v2 = self._clock.monotonic()  # v2 until now
            if pending is not None and pending[1]:
                self._failed_at_allocate = False

    def recently_v2(self) -> bool:
        """The node claims v2, or claimed it within `V2_GRACE_SECONDS`: pods the scheduler
        bound together under v2 may still be waiting for kubelet."""
        with self._lock:
            if self.claimed == ALLOCATE_PROTOCOL_V2:
                return True
            last = self._last_v2
        return last is not None and self._clock.monotonic() - last < V2_GRACE_SECONDS

    def failed_at_allocate(self) -> bool:
        """An Allocate found the API failing: the next round says v1. True when the node
        claims v2 now (the register loop should run at once)."""
        with self._lock:
            self._failed_at_allocate = True
            return self.claimed == ALLOCATE_PROTOCOL_V2

    def _decide(self) -> tuple[str, bool]:
        client = self._client
        with self._lock:
            forced = self._failed_at_allocate
        reason = ""
        if client is None:
            value, reason = ALLOCATE_PROTOCOL, "--pod-resources-socket is empty"
        elif forced:
            value, reason = (
                ALLOCATE_PROTOCOL,
                "an Allocate found kubelet's PodResources API failing",
            )
        else:
            try:
                client.list()
                value = ALLOCATE_PROTOCOL_V2
            except PodResourcesError as error:
                value, reason = ALLOCATE_PROTOCOL, str(error)
        with self._lock:
            changed, self._decided = value != self._decided, value
        if changed and value == ALLOCATE_PROTOCOL_V2:
            logger.info(
                "allocate protocol %s: kubelet's PodResources API on %s answers",
                value,
                client.socket_path if client is not None else "",
            )
        elif changed:
            log = logger.warning if client is not None else logger.info
            log("allocate protocol %s: %s", value, reason)
        return value, forced
