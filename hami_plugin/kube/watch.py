"""Watch streams as the API server sends them: one JSON event per line of a chunked response.

Events are read line by line from the raw response with a read timeout, so that a silent
connection cannot hang a watcher, and a `stop` event wakes a blocked read (`StopGuard`).
`hami_plugin.kube.client.KubeClient.watch_objects` opens the stream; `read_events` reads it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import urllib3

from hami_plugin.clock import Clock
from hami_plugin.kube.errors import (
    TRANSPORT_ERRORS,
    KubeError,
    describe_transport_error,
    status_exception,
    translate_errors,
)
from hami_plugin.kube.records import WatchEvent, json_object

logger = logging.getLogger(__name__)

WATCH_READ_TIMEOUT_SECONDS = 90.0
"""How long a watch stream may stay silent before it counts as dead. The API server sends a
bookmark about once a minute to watchers that allow them, so a live but quiet stream is not
cut; a dead one (a half-open connection) is noticed within this time and the watch resumed."""
_STOP_POLL_SECONDS = 0.1
"""How often a watch's stop guard looks at its stop event (see StopGuard)."""
_MAX_WATCH_LINE_BYTES = 16 * 1024 * 1024
"""Kubernetes objects are at most ~1.5 MiB in etcd; a longer line is a broken stream."""

_WATCH_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


def read_events(
    response: urllib3.BaseHTTPResponse,
    what: str,
    *,
    stop: threading.Event | None,
    end: float,
    clock: Clock,
) -> Iterator[WatchEvent]:
    """The events of an open watch `response` until the server ends the stream, the connection
    drops or stays silent past its read timeout, `clock.monotonic()` passes `end`, or `stop` is
    set (a blocked read is woken). The response is closed (or released for reuse when read to
    its end) however the iterator ends.

    Raises Gone, Retryable or KubeError for an ERROR event (by its code) and KubeError for a
    malformed event, naming `what`.
    """
    guard = StopGuard(stop, response) if stop is not None else None
    finished = False
    try:
        lines = _lines(response, what)
        while stop is None or not stop.is_set():
            try:
                line = next(lines)
            except StopIteration:
                finished = True
                return
            except TRANSPORT_ERRORS as exc:
                if stop is None or not stop.is_set():
                    logger.debug("%s: stream ended: %s", what, describe_transport_error(exc))
                return
            with translate_errors(what, clock=clock):
                event = _watch_event(line)
                if event.type == "ERROR":
                    raise status_exception(event.object)
            yield event
            if clock.monotonic() > end:
                logger.debug("%s: past its timeout; ending it", what)
                return
    finally:
        if guard is not None:
            guard.close()
        if not finished:
            # Unread data (or a broken stream) stays behind: never reuse this connection.
            response.close()
        response.release_conn()


class StopGuard:
    """Wakes a read blocked on a streaming `response` once `stop` is set, by shutting the
    socket down for reading from a helper thread (the read then fails at once).

    `threading.Event` cannot be waited on together with another event, so the helper polls
    `stop` every `_STOP_POLL_SECONDS`; `close()` ends it (the stream is done) and joins it.
    """

    def __init__(self, stop: threading.Event, response: urllib3.BaseHTTPResponse) -> None:
        self._stop = stop
        self._response = response
        self._done = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="k8s-watch-stop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            stopped = self._stop.wait(_STOP_POLL_SECONDS)
            with self._lock:
                if self._done:
                    return
                if stopped:
                    # The response may be between reads or already broken: nothing to wake.
                    with contextlib.suppress(Exception):
                        self._response.shutdown()
                    return

    def close(self) -> None:
        """End the helper thread and wait for it."""
        with self._lock:
            self._done = True
        self._thread.join()


def _lines(response: urllib3.BaseHTTPResponse, what: str) -> Iterator[bytes]:
    """The non-empty lines of a streamed response as they arrive (the API server sends one
    JSON watch event per line, usually one per chunk). Raises KubeError naming `what` for a
    line longer than `_MAX_WATCH_LINE_BYTES` (a server that never ends a line must not exhaust
    memory)."""
    buffer = bytearray()
    for data in response.stream(amt=None):
        buffer.extend(data)
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > _MAX_WATCH_LINE_BYTES:
            raise KubeError(
                f"{what}: malformed response from the API server: an event longer than "
                f"{_MAX_WATCH_LINE_BYTES} bytes"
            )
    if buffer.strip():
        yield bytes(buffer)


def _watch_event(line: bytes) -> WatchEvent:
    """Decode one line of a watch stream. Raises ValueError on a malformed event."""
    decoded = json_object(line)
    kind, obj = decoded.get("type"), decoded.get("object")
    if kind not in _WATCH_TYPES:
        raise ValueError(f"unknown watch event type {kind!r}")
    if not isinstance(obj, dict):
        raise ValueError(f"watch event object should be an object, got {type(obj).__name__}")
    return WatchEvent(str(kind), obj)
