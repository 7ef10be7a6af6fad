"""Binds waiting for HAMi's node lock, queued per node in arrival order.

On a node run by HAMi's device plugin a bind holds the node lock `hami.io/mutex.lock` from
its patch until the device plugin's Allocate releases it: one pod at a time per node. When
every waiting bind tries the lock itself, each release wakes all of them and they race with
conflicting patches (a herd: one GET and one patch per waiter per lock change, nearly all
refused). Here the binds for one node queue in this process instead: only the head of a
node's queue tries the lock, and it leaves the queue as soon as it holds the lock (or gives
up), which hands the turn to the next.

`NodeLockQueue` knows nothing of the lock or the API: it orders the waiters. Thread-safe.
Deadlines are read from the injected `Clock`; a wait wakes at least once a second to read it
again (as `SchedulerState.claim_in_flight` does), so advancing a `ManualClock` ends it and a
stop event set by another thread is noticed.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from hami_plugin.clock import Clock, SystemClock

__all__ = ["LockTicket", "NodeLockQueue"]

_POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class LockTicket:
    """One bind's place in a node's queue (compared by identity: a pod may be queued twice,
    by a bind and its retry)."""

    node: str
    pod_key: str
    turn: threading.Event = field(default_factory=threading.Event, repr=False)
    """Set when the ticket reaches the head of its node's queue."""


class NodeLockQueue:
    """Per-node FIFO of the binds waiting to try a node's lock."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._queues: dict[str, deque[LockTicket]] = {}

    def enter(self, node: str, pod_key: str) -> LockTicket:
        """Queue a bind of pod `pod_key` for `node`'s lock, behind every bind already queued
        there. The caller must `leave` the ticket, whatever happens (in a `finally`)."""
        with self._lock:
            ticket = LockTicket(node, pod_key)
            queue = self._queues.setdefault(node, deque())
            queue.append(ticket)
            if len(queue) == 1:
                ticket.turn.set()
            return ticket

    def wait_turn(
        self, ticket: LockTicket, deadline: float, stop: threading.Event | None = None
    ) -> bool:
        """Block until `ticket` is at the head of its node's queue: True then; False once
        `deadline` (on `clock.monotonic()`) passed or `stop` was set first."""
        while not ticket.turn.is_set():
            left = deadline - self._clock.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return ticket.turn.is_set()
            ticket.turn.wait(min(left, _POLL_SECONDS))
        return True

    def leave(self, ticket: LockTicket) -> None:
        """Take `ticket` out of its queue (its bind holds the lock now, or gave up); when it
        was the head, the next ticket's turn begins. Leaving twice is harmless."""
        with self._lock:
            queue = self._queues.get(ticket.node)
            if queue is None or ticket not in queue:
                return
            was_head = queue[0] is ticket
            queue.remove(ticket)
            if not queue:
                del self._queues[ticket.node]
            elif was_head:
                queue[0].turn.set()

    def ahead(self, ticket: LockTicket) -> int:
        """How many binds are queued before `ticket` (0: its turn; also 0 once it left)."""
        with self._lock:
            queue = self._queues.get(ticket.node)
            if queue is None or ticket not in queue:
                return 0
            return queue.index(ticket)

    def depth(self, node: str) -> int:
        """How many binds are queued for `node`'s lock, the one trying it included."""
        with self._lock:
            queue = self._queues.get(node)
            return len(queue) if queue is not None else 0

    def depths(self) -> dict[str, int]:
        """Node -> queue length, for every node with a bind queued (read at scrape time)."""
        with self._lock:
            return {node: len(queue) for node, queue in self._queues.items()}
