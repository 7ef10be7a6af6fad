"""List-then-watch of one Kubernetes collection into a slim local store.

client-go's reflector and informer, reduced to what the daemons need:

* `run(stop)` lists the collection page by page, then watches from the list's resourceVersion.
  A stream that ends or drops is resumed from the last version seen (events and bookmarks
  advance it), so nothing is lost or seen twice; a stream that brought nothing, and every
  failure, waits a jittered exponential backoff first. `Gone` (410: the version is older than
  the server keeps) means relist: the fresh list is diffed against the store, so objects
  deleted while the watch was away reach the handler as `on_delete` and changed ones as
  `on_upsert`.
* The store keeps only what `transform` makes of each object (`T`, e.g. a `PodInfo`), never
  the raw dicts: the scheduler holds every pod of a large cluster, and a list page is reduced
  before the next one is read.
* The handler is called on the informer's thread, in event order, only when the stored value
  of a key changes: `on_upsert(new, old)` (old None for a new key), `on_delete(old)`, and
  `on_synced()` after the first list and after every relist. A handler that raises is logged
  with its traceback and the loop goes on; an object that `transform` rejects is logged once
  per version and skipped (the store keeps the last version that transformed, until a relist
  no longer lists it).

`run` returns within a fraction of a second of `stop` being set, whether it is reading a watch
(the client wakes the blocked read) or backing off; a list page in flight is bounded by the
client's request timeout.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.api import WatchApi
from hami_plugin.kube.errors import Gone, KubeError
from hami_plugin.kube.records import WatchEvent, object_identity
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.kube.watch import WATCH_READ_TIMEOUT_SECONDS

logger = logging.getLogger(__name__)

T = TypeVar("T")
_T_contra = TypeVar("_T_contra", contravariant=True)


class InformerHandler(Protocol[_T_contra]):
    """What an informer tells about its collection (called on the informer's thread)."""

    def on_upsert(self, new: _T_contra, old: _T_contra | None) -> None:
        """A key appeared (`old` None) or its stored value changed."""

    def on_delete(self, old: _T_contra) -> None:
        """A key is gone; `old` is its last stored value."""

    def on_synced(self) -> None:
        """The store holds a whole list (after the first list and after every relist)."""


@dataclass(frozen=True, slots=True)
class ListWatchOptions:
    """How an informer lists, watches and backs off.

    `watch_timeout_seconds` is asked of the server per watch request (it ends the stream, the
    informer resumes); `watch_read_timeout_seconds` is how long a silent stream lives; lists
    are read `page_size` objects a page. Failures wait `initial_backoff_seconds` doubling to
    `max_backoff_seconds`, with jitter.
    """

    watch_timeout_seconds: int = 300
    watch_read_timeout_seconds: float = WATCH_READ_TIMEOUT_SECONDS
    page_size: int = 500
    initial_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0


class Informer(Generic[T]):
    """Keeps a local store of one collection (`path`, e.g. "/api/v1/pods") up to date.

    `client` is a `KubeClient` or anything with its list and watch (`kube.api.WatchApi`: the
    in-memory `FakeKube` too). `transform` turns an object (a list item or a watch event's
    object) into the stored `T` and may raise on a malformed one; `key` names a `T` uniquely
    (e.g. "namespace/name"). Selectors are passed to the list and the watch as the API server
    applies them. `last_failure` is when the last failure happened (on `clock.monotonic()`),
    so that a caller can tell how long the watch has been healthy.
    """

    def __init__(
        self,
        client: WatchApi,
        path: str,
        transform: Callable[[dict[str, Any]], T],
        key: Callable[[T], str],
        handler: InformerHandler[T],
        *,
        name: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        options: ListWatchOptions = ListWatchOptions(),
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self.last_failure: float | None = None
        """`clock.monotonic()` of the last failed list or watch; None before any."""
        self._path = path
        self._transform = transform
        self._key = key
        self._handler = handler
        self.name = name
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._watch_timeout_seconds = options.watch_timeout_seconds
        self._watch_read_timeout_seconds = options.watch_read_timeout_seconds
        self._page_size = options.page_size
        # Only the backoff formula of RetryPolicy is used (one formula for the package).
        self._backoff = RetryPolicy(
            initial_backoff_seconds=options.initial_backoff_seconds,
            max_backoff_seconds=options.max_backoff_seconds,
        )
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._store: dict[str, T] = {}
        self._resource_version = ""
        # "namespace/name" -> the resourceVersion that failed to transform (logged once).
        self._rejected: dict[str, str] = {}
        self.synced = threading.Event()
        """Set once the first list is in the store."""

    # --- reading the store ----------------------------------------------------------------

    def get(self, key: str) -> T | None:
        """The stored value for `key`, or None."""
        with self._lock:
            return self._store.get(key)

    def items(self) -> list[T]:
        """Every stored value (a snapshot)."""
        with self._lock:
            return list(self._store.values())

    @property
    def last_resource_version(self) -> str:
        """The version the next watch starts from: the list's, then each event's or
        bookmark's."""
        with self._lock:
            return self._resource_version

    # --- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until `stop` is set; never raises for API failures (they are
        logged and retried with backoff)."""
        need_list = True
        page_size = self._page_size
        streak = 0  # consecutive attempts that failed or brought nothing
        while not stop.is_set():
            try:
                if need_list:
                    if not self._relist(stop, page_size):
                        return
                    need_list, page_size, streak = False, self._page_size, 0
                if self._watch(stop):
                    streak = 0
                    continue
                if stop.is_set():
                    return
                streak += 1
                logger.debug("%s: watch ended with no event", self.name)
            except Gone as exc:
                if need_list:
                    # A continue token expired during the list: list again in one page, as
                    # client-go's pager does, so a slow list cannot expire forever.
                    page_size = 0
                    streak += 1
                need_list = True
                logger.info("%s: %s; listing again", self.name, exc)
            except KubeError as exc:
                streak += 1
                self.last_failure = self._clock.monotonic()
                logger.warning("%s: %s", self.name, exc)
            if streak:
                delay = self._backoff.backoff_seconds(min(streak, 32), self._rng)
                logger.debug("%s: retrying in %.2f s", self.name, delay)
                stop.wait(delay)

    def _relist(self, stop: threading.Event, page_size: int) -> bool:
        """List into a fresh store, swap it in and tell the handler the difference. Returns
        False (store untouched) if `stop` was set on the way."""
        fresh: dict[str, T] = {}
        rejected: dict[str, str] = {}
        version = ""
        for page in self._client.list_pages(
            self._path,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            page_size=page_size,
        ):
            for obj in page.items:
                item = self._decode(obj, rejected)
                if item is not None:
                    fresh[item[0]] = item[1]
            version = page.resource_version
            if stop.is_set():
                return False
        with self._lock:
            old_store, self._store = self._store, fresh
            self._resource_version = version
            self._rejected = rejected
        for key, old in old_store.items():
            if key not in fresh:
                self._notify(self._handler.on_delete, key, old)
        for key, new in fresh.items():
            previous = old_store.get(key)
            if previous is None or previous != new:
                self._notify(self._handler.on_upsert, key, new, previous)
        logger.info("%s: listed %d objects at resourceVersion %s", self.name, len(fresh), version)
        self.synced.set()
        self._notify(self._handler.on_synced, "")
        return True

    def _watch(self, stop: threading.Event) -> bool:
        """Watch from the last version until the stream ends; True if it brought an event."""
        received = False
        for event in self._client.watch_objects(
            self._path,
            self.last_resource_version,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=self._watch_timeout_seconds,
            stop=stop,
            read_timeout_seconds=self._watch_read_timeout_seconds,
        ):
            received = True
            self._apply(event)
        return received

    def _apply(self, event: WatchEvent) -> None:
        version = event.resource_version
        if event.type == "BOOKMARK":
            if version:
                with self._lock:
                    self._resource_version = version
            return
        item = self._decode(event.object, self._rejected, forget=event.type == "DELETED")
        if item is None:
            if version:
                with self._lock:
                    self._resource_version = version
            return
        key, value = item
        with self._lock:
            old = self._store.get(key)
            if event.type == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = value
            if version:
                self._resource_version = version
        if event.type == "DELETED":
            if old is not None:
                self._notify(self._handler.on_delete, key, old)
        elif old is None or old != value:
            self._notify(self._handler.on_upsert, key, value, old)

    def _decode(
        self, obj: dict[str, Any], rejected: dict[str, str], *, forget: bool = False
    ) -> tuple[str, T] | None:
        """(key, transformed object), or None after logging (once per object version) why
        `transform` or `key` rejected it. `rejected` remembers the versions logged."""
        identity, version = object_identity(obj)
        try:
            value = self._transform(obj)
            key = self._key(value)
        # `transform` is the caller's decoder: whatever it raises means "malformed object".
        except Exception as exc:
            if rejected.get(identity) != version and self._rejected.get(identity) != version:
                logger.warning(
                    "%s: skipping %s at resourceVersion %s: %s", self.name, identity, version, exc
                )
            rejected[identity] = version
            if forget:
                rejected.pop(identity, None)
            return None
        rejected.pop(identity, None)
        return key, value

    def _notify(self, callback: Callable[..., None], key: str, *args: Any) -> None:
        try:
            callback(*args)
        # The handler is the caller's code: log its failure and keep the store going.
        except Exception:
            logger.exception("%s: %s failed for %r", self.name, _callback_name(callback), key)


def _callback_name(callback: Callable[..., None]) -> str:
    return getattr(callback, "__name__", repr(callback))
