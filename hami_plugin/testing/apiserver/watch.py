"""WATCH (`?watch=true`) of every collection, cluster-wide or in a namespace, as the watch cache
serves it: from `resourceVersion` (unset or "0": the current objects first, as ADDED), replayed
from the store's history; a version older than the history gets one ERROR event carrying a 410
`Expired` Status. Selectors apply to events: an object that stops matching is sent as DELETED,
one that starts matching as ADDED. `allowWatchBookmarks=true` gets a BOOKMARK every
`bookmark_interval_seconds` of silence; `timeoutSeconds` ends the stream cleanly. `http` writes
the events out as a chunked stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.apiserver.routes import route
from hami_plugin.testing.apiserver.selectors import Selector
from hami_plugin.testing.apiserver.status import ApiError, expired_status
from hami_plugin.testing.apiserver.store import RESOURCES, ObjectStore

# How often an idle watch checks that its client is still there: the real server lets a watcher
# go when its client closes the connection, so a watch closed by a client must not linger.
_CLIENT_CHECK_SECONDS = 0.2


@dataclass(slots=True)
class Watch:
    """One open watch stream: where it is in the history and what it asked for."""

    plural: str
    selector: Selector
    position: int
    """The last resourceVersion the stream has covered."""
    deadline: float
    bookmarks: bool
    generation: int
    """`Watches` drop generation when opened; a newer one means "cut"."""
    next_bookmark: float
    pending: list[JsonObject] = field(default_factory=list)
    """Events to send before reading the history (the initial ADDED events, or an ERROR)."""
    ended: bool = False
    """Set with an ERROR in `pending`: the stream ends after it."""


class Watches:
    """The open watch streams over one store. Thread-safe: every method takes the store's lock.

    `stopping` set (and the store's `changed` notified) ends every stream, as `drop_all` does.
    """

    def __init__(
        self, store: ObjectStore, stopping: threading.Event, bookmark_interval_seconds: float
    ) -> None:
        self._store = store
        self._stopping = stopping
        self.bookmark_interval_seconds = bookmark_interval_seconds
        """How long a watch that allows bookmarks stays silent before it gets one."""
        self._drop_generation = 0
        self._open: set[int] = set()

    @property
    def count(self) -> int:
        """How many watch streams are open now."""
        with self._store.lock:
            return len(self._open)

    def open(self, request: RecordedRequest) -> Watch | None:
        """A `Watch` for a watch request (None for any other request). Raises ApiError for a
        bad one (unknown path, bad selector or version)."""
        if request.method != "GET" or request.param("watch") not in ("true", "1"):
            return None
        target = route(request.path)
        if target.kind != "collection":
            return None
        plural, store = target.plural, self._store
        selector = Selector.parse(plural, target.namespace, request)
        version_text = request.param("resourceVersion") or ""
        if version_text and not version_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {version_text!r}")
        timeout_text = request.param("timeoutSeconds") or "1800"
        if not timeout_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid timeoutSeconds {timeout_text!r}")
        now = time.monotonic()
        with store.lock:
            watch = Watch(
                plural=plural,
                selector=selector,
                position=store.resource_version,
                deadline=now + int(timeout_text),
                bookmarks=request.param("allowWatchBookmarks") == "true",
                generation=self._drop_generation,
                next_bookmark=now + self.bookmark_interval_seconds,
            )
            if version_text in ("", "0"):
                # No version: the current state first, as ADDED events, then changes.
                watch.pending = [
                    {"type": "ADDED", "object": obj} for obj in store.matching(plural, selector)
                ]
            elif int(version_text) < store.history_floor:
                # As the watch cache: HTTP 200, then one ERROR event with the 410 Status.
                message = f"too old resource version: {version_text} ({store.history_floor})"
                watch.pending = [{"type": "ERROR", "object": expired_status(message)}]
                watch.ended = True
            else:
                watch.position = int(version_text)
            self._open.add(id(watch))
        return watch

    def close(self, watch: Watch) -> None:
        """Forget a stream that has ended."""
        with self._store.lock:
            self._open.discard(id(watch))

    def drop_all(self) -> None:
        """Make every open stream end as "dropped" (see `next_events`)."""
        with self._store.lock:
            self._drop_generation += 1
            self._store.changed.notify_all()

    def next_events(
        self, watch: Watch, client_gone: Callable[[], bool]
    ) -> tuple[list[JsonObject], str | None]:
        """Block until the watch has something to send: (events, end) where end is None (go
        on), "timeout" (end the stream cleanly), "error" (end it after these events) or
        "dropped" (cut the connection; also when `client_gone()`, checked while waiting)."""
        store = self._store
        with store.lock:
            while True:
                if self._stopping.is_set() or watch.generation != self._drop_generation:
                    return [], "dropped"
                if watch.pending:
                    events, watch.pending = watch.pending, []
                    return events, "error" if watch.ended else None
                if watch.position < store.history_floor:
                    message = f"too old resource version: {watch.position} ({store.history_floor})"
                    return [{"type": "ERROR", "object": expired_status(message)}], "error"
                events = []
                for change in store.changes_after(watch.position):
                    if change.plural == watch.plural:
                        event = change.event_for(watch.selector)
                        if event is not None:
                            events.append(event)
                watch.position = store.resource_version
                now = time.monotonic()
                if events:
                    watch.next_bookmark = now + self.bookmark_interval_seconds
                    return events, None
                if now >= watch.deadline:
                    return [], "timeout"
                if watch.bookmarks and now >= watch.next_bookmark:
                    watch.next_bookmark = now + self.bookmark_interval_seconds
                    resource = RESOURCES[watch.plural]
                    bookmark = {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(watch.position)},
                    }
                    return [{"type": "BOOKMARK", "object": bookmark}], None
                if client_gone():
                    return [], "dropped"
                wake = watch.deadline
                if watch.bookmarks:
                    wake = min(wake, watch.next_bookmark)
                store.changed.wait(min(max(0.0, wake - now), _CLIENT_CHECK_SECONDS))
