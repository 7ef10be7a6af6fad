"""Kubernetes Events about pods, correlated as client-go's recorder does and sent from one
background thread through a bounded queue.

Filter and bind answer kube-scheduler within its 30 s extender timeout, so an Event (a call to
the API server) is never sent on their path: `record` only queues it. When the API server is
slow and the queue is full, new events are dropped and counted (one log line per burst), as
client-go's broadcaster drops events rather than block its callers.

HAMi records its events through client-go's broadcaster (pkg/scheduler/event.go:
`record.NewBroadcaster()`, source component the scheduler name), whose `EventCorrelator`
(k8s.io/client-go/tools/record/events_cache.go) decides, before anything is sent, whether an
event is a new Event, a repeat counted onto an existing one, or spam. `EventCorrelator` here
matches it with client-go's defaults:

* dedup (`eventLogger`): an LRU of 4096 Events (`maxLruCacheEntries`) keyed by source,
  involved object, type, reason and message: a repeat is a PATCH of the existing Event
  (count + 1, lastTimestamp, message), not a new POST;
* aggregation (`EventAggregator`): keyed by the same without the message, also an LRU of 4096:
  once 10 distinct messages (`defaultAggregateMaxEvents`) were seen with no gap over 600 s
  (`defaultAggregateIntervalInSeconds`), an event whose message is not among the 9 kept goes
  out as "(combined from similar events): <message>", counted onto one Event per reason;
* spam filter (`EventSourceObjectSpamFilter`): per source and involved object (any reason) a
  token bucket of 25 (`defaultSpamBurst`) refilled at 1 per 300 s (`defaultSpamQPS` 1/300),
  an LRU of 4096 buckets; beyond it events are dropped (`EventRecorder.spam_dropped`).

Applied in client-go's order, aggregate, count, filter: a repeat the spam filter drops is still
counted, so the next one that passes carries the true count. Where this differs, and why:

* events queued for the same Event before the sender reached them go out as ONE call with
  their summed count, and take one token (client-go correlates and sends each);
* a new Event's name is the one `create_event` stored (client-go names it before sending); one
  that was not stored is POSTed again at its next repeat with the count so far, not PATCHed;
* a PATCH that answers 404 (the Event expired, kube-apiserver's `--event-ttl` is 1 h) creates
  it anew, as client-go does; any other failure is logged and not retried (client-go retries
  12 times, 10 s apart, which the one sender thread cannot afford);
* Go's `PopAny` drops an arbitrary message from a full set of similar ones; here the oldest;
* keys are tuples, not joined strings; the source is the recorder's own, the same for all its
  events, and host and fieldPath are empty, so they are left out of the keys.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.api import EventApi
from hami_plugin.kube.errors import KubeError, NotFound
from hami_plugin.kube.events import PodEvent

__all__ = ["EventCorrelator", "EventKey", "EventRecorder", "EventWrite"]

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 1000
MAX_CACHE_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL_SECONDS = 600.0
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
COMBINED_PREFIX = "(combined from similar events): "

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class EventKey:
    """The Event a pod event is counted onto (client-go's `getEventKey`, less the source).
    `message` is None for the combined Event of its reason (the aggregation's key)."""

    namespace: str
    name: str
    uid: str
    event_type: str
    reason: str
    message: str | None

    @classmethod
    def of(cls, event: PodEvent, *, combined: bool = False) -> EventKey:
        """The key of `event`'s own Event, or (`combined`) of its reason's combined Event."""
        message = None if combined else event.message
        return cls(event.namespace, event.name, event.uid, event.event_type, event.reason, message)


@dataclass(frozen=True, slots=True)
class EventWrite:
    """One call to make: POST a new Event (`name` None) or PATCH the Event `name`, seen `count`
    times, the first at `first_seen`, the last at `last_seen`. `event.message` is the message
    to send (combined, when aggregated)."""

    key: EventKey
    event: PodEvent
    count: int
    first_seen: datetime
    last_seen: datetime
    name: str | None = None


class _Lru(Generic[_K, _V]):
    """A bounded map that forgets the least recently read or written key (groupcache's lru)."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[_K, _V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: _K) -> _V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: _K, value: _V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


@dataclass(slots=True)
class _Logged:
    count: int
    first_seen: datetime
    name: str | None


@dataclass(slots=True)
class _Similar:
    messages: dict[str, None]
    """Distinct messages, oldest first (a dict as an ordered set)."""
    last_seen: float


@dataclass(slots=True)
class _Bucket:
    empty_at: float
    """When the bucket was (or would have been) empty: it holds (now - empty_at) / refill
    tokens, at most the burst. Kept as a time, not a token count, so that whole seconds on a
    manual clock give whole tokens, with no rounding."""


class EventCorrelator:
    """Decides, event by event, what the recorder sends (see the module docstring). Pure: no
    I/O; `clock.monotonic()` times the aggregation window and the spam buckets. Not
    thread-safe: the recorder's sender thread is its one user.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        max_entries: int = MAX_CACHE_ENTRIES,
        aggregate_max_events: int = AGGREGATE_MAX_EVENTS,
        aggregate_interval_seconds: float = AGGREGATE_INTERVAL_SECONDS,
        spam_burst: int = SPAM_BURST,
        spam_refill_seconds: float = SPAM_REFILL_SECONDS,
    ) -> None:
        self._clock = clock
        self._max_events = aggregate_max_events
        self._interval = aggregate_interval_seconds
        self._burst = spam_burst
        self._refill = spam_refill_seconds
        self._logged: _Lru[EventKey, _Logged] = _Lru(max_entries)
        self._similar: _Lru[EventKey, _Similar] = _Lru(max_entries)
        self._buckets: _Lru[tuple[str, str, str], _Bucket] = _Lru(max_entries)

    @property
    def cached_events(self) -> int:
        """How many Events the dedup cache remembers (at most `max_entries`)."""
        return len(self._logged)

    def observe(
        self, event: PodEvent, first_seen: datetime, last_seen: datetime, count: int = 1
    ) -> EventWrite | None:
        """`count` occurrences of `event`, recorded between `first_seen` and `last_seen`: the
        call to make, or None when the spam filter drops them."""
        now = self._clock.monotonic()
        key, event = self._aggregate(event, now)
        logged = self._logged.get(key)
        if logged is None:
            logged = _Logged(0, first_seen, None)
        logged.count += count
        self._logged.put(key, logged)
        if not self._take_token(event, now):
            return None
        return EventWrite(key, event, logged.count, logged.first_seen, last_seen, logged.name)

    def created(self, key: EventKey, name: str) -> None:
        """The Event of `key` was stored as `name`: its next repeat PATCHes it."""
        logged = self._logged.get(key)
        if logged is not None:
            logged.name = name

    def _aggregate(self, event: PodEvent, now: float) -> tuple[EventKey, PodEvent]:
        similar_key = EventKey.of(event, combined=True)
        similar = self._similar.get(similar_key)
        if similar is None or now - similar.last_seen > self._interval:
            similar = _Similar({}, now)
        similar.messages[event.message] = None
        similar.last_seen = now
        self._similar.put(similar_key, similar)
        if len(similar.messages) < self._max_events:
            return EventKey.of(event), event
        del similar.messages[next(iter(similar.messages))]
        return similar_key, dataclasses.replace(event, message=COMBINED_PREFIX + event.message)

    def _take_token(self, event: PodEvent, now: float) -> bool:
        key = (event.namespace, event.name, event.uid)
        full_since = now - self._burst * self._refill
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(full_since)
        bucket.empty_at = max(bucket.empty_at, full_since)
        self._buckets.put(key, bucket)
        if now - bucket.empty_at < self._refill:
            return False
        bucket.empty_at += self._refill
        return True


@dataclass(frozen=True, slots=True)
class _Queued:
    event: PodEvent
    seen: datetime


@dataclass(slots=True)
class _Repeats:
    event: PodEvent
    count: int
    first_seen: datetime
    last_seen: datetime


class EventRecorder:
    """Queues pod events and sends them in order from its own thread (`start`/`stop`),
    correlated by an `EventCorrelator` on `clock` (the system clock when None)."""

    def __init__(
        self,
        api: EventApi,
        component: str,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self._component = component
        self._clock: Clock = clock or SystemClock()
        self._correlator = EventCorrelator(self._clock)
        self._capacity = capacity
        self._queue: queue.Queue[_Queued | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._spam_dropped = 0
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full."""
        with self._lock:
            return self._dropped

    @property
    def spam_dropped(self) -> int:
        """Events dropped by the spam filter (25 per pod, then 1 per 5 minutes)."""
        with self._lock:
            return self._spam_dropped

    def record(self, event: PodEvent) -> None:
        """Queue an event; never blocks (a full queue drops it)."""
        try:
            self._queue.put_nowait(_Queued(event, self._clock.now()))
        except queue.Full:
            with self._lock:
                self._dropped += 1
                first = self._dropped == 1 or self._dropped % 1000 == 0
            if first:
                logger.warning(
                    "event queue full: dropping events (%d so far), latest %s for pod %s/%s",
                    self._dropped,
                    event.reason,
                    event.namespace,
                    event.name,
                )

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (for at most `timeout` seconds), then stop the thread."""
        thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            logger.warning("event queue still full at shutdown: remaining events dropped")
        thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self._capacity:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = None in batch
            for write in self._writes([queued for queued in batch if queued is not None]):
                self._send(write)

    def _writes(self, batch: list[_Queued]) -> list[EventWrite]:
        """The calls for what was queued: repeats of one event coalesced, then correlated; a
        later write of the same Event carries the earlier ones' count, so it replaces them."""
        repeats: dict[PodEvent, _Repeats] = {}
        for queued in batch:
            seen = repeats.get(queued.event)
            if seen is None:
                repeats[queued.event] = _Repeats(queued.event, 1, queued.seen, queued.seen)
            else:
                seen.count += 1
                seen.last_seen = queued.seen
        writes: dict[EventKey, EventWrite] = {}
        for group in repeats.values():
            write = self._correlator.observe(
                group.event, group.first_seen, group.last_seen, group.count
            )
            if write is None:
                with self._lock:
                    self._spam_dropped += group.count
                logger.debug(
                    "event %s for pod %s/%s dropped: over its spam budget",
                    group.event.reason,
                    group.event.namespace,
                    group.event.name,
                )
                continue
            writes[write.key] = write
        return list(writes.values())

    def _send(self, write: EventWrite) -> None:
        event = write.event
        try:
            if write.name is not None:
                try:
                    self._api.patch_event(
                        event.namespace or "default",
                        write.name,
                        write.count,
                        write.last_seen,
                        event.message,
                    )
                    return
                except NotFound:
                    logger.debug("event %s expired: recorded anew", write.name)
            name = self._api.create_event(
                event.ref(),
                event.reason,
                event.message,
                event.event_type,
                self._component,
                count=write.count,
                first_timestamp=write.first_seen,
                last_timestamp=write.last_seen,
            )
            if name is not None:
                self._correlator.created(write.key, name)
        except KubeError as exc:
            logger.warning("event not recorded: %s", exc)
        except Exception:  # best effort: an event is never worth the thread
            logger.exception(
                "event %s for pod %s/%s not sent", event.reason, event.namespace, event.name
            )
