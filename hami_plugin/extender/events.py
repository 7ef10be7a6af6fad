"""Kubernetes Events about pods, sent from one background thread through a bounded queue.

Filter and bind answer kube-scheduler within its 30 s extender timeout, so an Event (a POST to
the API server) is never sent on their path: `record` only queues it. When the API server is
slow and the queue is full, new events are dropped and counted (one log line per burst), as
client-go's broadcaster drops events rather than block its callers.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

from hami_plugin.kube.api import EventApi
from hami_plugin.kube.records import ObjectRef

__all__ = ["EventRecorder", "PodEvent"]

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 1000


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event to record about a pod (sent asynchronously by the caller)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    event_type: str = "Normal"


class EventRecorder:
    """Queues pod events and sends them in order from its own thread (`start`/`stop`)."""

    def __init__(self, api: EventApi, component: str, *, capacity: int = DEFAULT_CAPACITY) -> None:
        self._api = api
        self._component = component
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full."""
        with self._lock:
            return self._dropped

    def record(self, event: PodEvent) -> None:
        """Queue an event; never blocks (a full queue drops it)."""
        try:
            self._queue.put_nowait(event)
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
        while True:
            event = self._queue.get()
            if event is None:
                return
            ref = ObjectRef("Pod", event.namespace, event.name, uid=event.uid)
            try:
                self._api.create_event(
                    ref, event.reason, event.message, event.event_type, self._component
                )
            except Exception:  # best effort: an event is never worth the thread
                logger.exception(
                    "event %s for pod %s/%s not sent", event.reason, ref.namespace, ref.name
                )
