"""The writes of Allocate while the API server does not answer: queued in order, applied later.

Kubelet cannot wait for the API server: an Allocate that fails makes it mark the pod Failed
(`UnexpectedAdmissionError`), for good. So once an Allocate is decided (from the API, or from
this node's watch when the API server is away, `deviceplugin.nodecache`), a write of it that
finds the API server away (a `Retryable` error: refused, dropped, timed out, 5xx) does not fail
the pod: it joins one ordered queue, which a worker thread applies head first once the API
server answers again, with a jittered exponential backoff between attempts. The writes: the
pod's consumed `hami.io/vgpu-devices-to-allocate` entry and `hami.io/bind-phase`, the node lock
release, the pod's events. One queue for the node keeps each pod's patches in their order and
a lock release after the patch it follows; while anything is queued, every new write joins the
queue behind it instead of overtaking it. A write the API server refuses for good (the pod is
gone, 403, 422) is dropped with a warning, and a gone pod's later writes with it.

What is queued or written is also remembered per pod UID and applied to every later read of
the node's pods (from the watch or from the API, `applied`), and a released lock value to every
read of the node (`node_applied`): the next container of a pod is never given an entry already
served while its patch waits, and a pod served while its `success` waits is never taken for a
pending one. Queued writes are applied before `allocator.ServedEntries` reads the pods (so
it does not take a waiting patch for an author writing an entry back); written ones after it.

Bounded: at most `max_writes` queued (beyond it a write raises `WriteQueueFullError`, which fails
that Allocate); remembered UIDs are forgotten when a full listing of the node no longer has the
pod, and beyond `MAX_REMEMBERED` the oldest go. Nothing survives a restart: a restart during an
outage loses the queue. The pods served before it then read `allocating` with unconsumed
entries until kubelet reports them Running (no side takes a Running pod for a pending one);
until then an Allocate whose count matches one of them can be taken for it: the second
container of that very pod, or a pod bound after the API server returns. That is the risk left
(persisting the queue on the host would close it); during the outage itself the restarted
process has no watch listing and fails every Allocate instead. Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.kube.api import AllocateApi
from hami_plugin.kube.errors import KubeError, NotFound, Retryable
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.nodelock import KeptChanging, release_node_lock
from hami_plugin.kube.retry import CONFLICT_RETRIES, RetryPolicy
from hami_plugin.protocol import nodelock
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.protocol.nodelock import LockRelease
from hami_plugin.protocol.objects import NodeInfo, PodInfo

logger = logging.getLogger(__name__)

MAX_WRITES = 10_000
"""Writes queued at most; about three per pod served during an outage."""
MAX_REMEMBERED = 10_000
"""Pod UIDs (and released lock values) remembered at most."""
APPLY_BUDGET_SECONDS = 5.0
"""All API calls of applying one queued write: after a hang, the queue moves again at most this
long (plus one backoff, at most `max_backoff_seconds`) after the API server answers."""
_LOCK_RELEASE_RETRIES = dataclasses.replace(CONFLICT_RETRIES, attempts=4)
"""The device plugin's lock release reads the node four times at most (the scheduler's
compare-and-patches, three)."""


class WriteQueueFullError(Exception):
    """The queue holds `max_writes` already: the write was not taken."""


@dataclass(frozen=True, slots=True)
class PodPatch:
    """Merge-patch of a pod's annotations (None deletes a key)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str | None]


Write = PodPatch | LockRelease | PodEvent
"""The pod's patch, the lock release (`nodelock.releasable_by`, HAMi's rule) and the event."""


def describe(write: Write) -> str:
    """The write in a few words, for the log."""
    if isinstance(write, PodPatch):
        keys = ", ".join(f"{key}={value}" for key, value in write.annotations.items())
        return f"patch pod {write.namespace}/{write.name} ({keys})"
    if isinstance(write, LockRelease):
        return f"release node {write.node}'s lock of pod {write.namespace}/{write.name}"
    return f"{write.event_type} event {write.reason} for pod {write.namespace}/{write.name}"


def release_lock_now(
    kube: AllocateApi, node_name: str, namespace: str, name: str, *, read: NodeInfo | None = None
) -> None:
    """Delete `node_name`'s lock if pod namespace/name may (`kube.nodelock.release_node_lock`,
    from `read`, the node as already read, when given). Raises Retryable when the API server
    does not answer; any other failure is logged, not raised."""
    try:
        release_node_lock(kube, node_name, namespace, name, read=read, retry=_LOCK_RELEASE_RETRIES)
    except Retryable:
        raise
    except KeptChanging as error:
        logger.warning("%s", error)
    except Exception as error:
        logger.warning("node %s: lock not released: %s", node_name, error)


@dataclass(slots=True)
class _Remembered:
    queued: dict[str, str | None] = dataclasses.field(default_factory=dict)
    written: dict[str, str | None] = dataclasses.field(default_factory=dict)


def _overlay(pod: PodInfo, annotations: Mapping[str, str | None]) -> PodInfo:
    merged = dict(pod.annotations)
    for key, value in annotations.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return pod if merged == pod.annotations else dataclasses.replace(pod, annotations=merged)


class WriteBehind:
    """The node's queue of writes the API server has not taken yet, and its worker thread.

    `start()` runs the worker, `stop()` ends it (what is still queued is logged and lost).
    `backlog` says how many writes wait: non-zero means the API server did not answer the
    last one, and the allocator then reads from the watch without asking the API first.
    """

    def __init__(
        self,
        kube: AllocateApi,
        *,
        max_writes: int = MAX_WRITES,
        max_remembered: int = MAX_REMEMBERED,
        apply_budget_seconds: float = APPLY_BUDGET_SECONDS,
        initial_backoff_seconds: float = 0.2,
        max_backoff_seconds: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self._kube = kube
        self._max_writes = max_writes
        self._max_remembered = max_remembered
        self._apply_budget = apply_budget_seconds
        self._backoff = RetryPolicy(
            initial_backoff_seconds=initial_backoff_seconds,
            max_backoff_seconds=max_backoff_seconds,
        )
        self._rng = rng or random.Random()
        # `_order` is held while a write is sent (directly or from the queue), so a write
        # never overtakes one queued before it; `_state` guards the queue and the memory.
        self._order = threading.Lock()
        self._state = threading.Condition()
        self._queue: deque[Write] = deque()
        self._pods: OrderedDict[str, _Remembered] = OrderedDict()
        self._released_locks: OrderedDict[str, None] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied_from_queue = 0
        """Writes applied from the queue so far (for tests and logs)."""

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="write-behind", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the worker; writes still queued are logged and lost."""
        self._stop.set()
        with self._state:
            self._state.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._state:
            left = list(self._queue)
        if left:
            logger.warning(
                "stopping with %d write(s) the API server never took, lost: %s",
                len(left),
                "; ".join(describe(write) for write in left),
            )

    @property
    def backlog(self) -> int:
        with self._state:
            return len(self._queue)

    # --- the writes -----------------------------------------------------------------------

    def patch_pod(
        self, pod: PodInfo, annotations: Mapping[str, str | None], *, queue: bool = False
    ) -> bool:
        """Patch the pod's annotations now, or queue the patch (at once with `queue`: the
        caller knows the API server is away); True when written now.

        Raises WriteQueueFullError, or the KubeError of a patch the API server refused (not a
        Retryable one: that one is queued).
        """
        write = PodPatch(pod.namespace, pod.name, pod.uid, dict(annotations))
        return self._send(write, queue=queue)

    def release_lock(
        self, node: NodeInfo, namespace: str, name: str, *, queue: bool = False
    ) -> None:
        """Release the node lock if pod namespace/name may, now or queued (`queue` as in
        `patch_pod`); never raises (a full queue is logged: the scheduler's recovery expires
        the lock)."""
        value = node.annotations.get(ANNOTATION_NODE_LOCK)
        if value is None or not nodelock.releasable_by(value, namespace, name):
            return
        try:
            self._send(LockRelease(node.name, namespace, name, value), node, queue=queue)
        except WriteQueueFullError as error:
            logger.warning("node %s: lock not released: %s", node.name, error)
            return
        except KubeError as error:  # release_lock_now raises nothing else
            logger.warning("node %s: lock not released: %s", node.name, error)
            return
        with self._state:
            self._released_locks[value] = None
            self._released_locks.move_to_end(value)
            while len(self._released_locks) > self._max_remembered:
                self._released_locks.popitem(last=False)

    def record(self, event: PodEvent, *, queue: bool = False) -> None:
        """Record an event now or queued (`queue` as in `patch_pod`): the device plugin's
        `EventSink`. Never raises (a lost event is logged)."""
        try:
            self._send(event, queue=queue)
        except Exception as error:
            logger.warning("no event for pod %s/%s: %s", event.namespace, event.name, error)

    def _send(self, write: Write, node: NodeInfo | None = None, *, queue: bool = False) -> bool:
        # Joining the queue never waits for the worker's attempt in flight (it may hang for
        # its whole budget); a direct write holds `_order`, so nothing queued overtakes it.
        with self._state:
            if queue or self._queue:
                self._enqueue(write)
                return False
        with self._order:
            with self._state:
                if self._queue:
                    self._enqueue(write)
                    return False
            try:
                self._apply(write, node)
            except Retryable as error:
                with self._state:
                    self._enqueue(write)
                logger.warning(
                    "the API server does not answer (%s): %s is queued until it does",
                    error,
                    describe(write),
                )
                return False
            with self._state:
                self._note(write, written=True)
            return True

    def _enqueue(self, write: Write) -> None:
        # Under `_state`.
        if len(self._queue) >= self._max_writes:
            raise WriteQueueFullError(
                f"{len(self._queue)} writes are already waiting for the API server"
            )
        self._queue.append(write)
        self._note(write, written=False)
        self._state.notify_all()

    def _note(self, write: Write, *, written: bool) -> None:
        """Remember a pod patch as queued or written (under `_state`)."""
        if isinstance(write, PodPatch):
            remembered = self._remember(write.uid)
            if remembered is not None:
                (remembered.written if written else remembered.queued).update(write.annotations)

    def _apply(self, write: Write, node: NodeInfo | None = None) -> None:
        kube = self._kube
        if isinstance(write, PodPatch):
            kube.patch_pod_metadata(write.namespace, write.name, write.annotations)
        elif isinstance(write, LockRelease):
            release_lock_now(kube, write.node, write.namespace, write.name, read=node)
        else:
            kube.create_pod_event(write)

    # --- the worker -----------------------------------------------------------------------

    def _run(self) -> None:
        streak = 0
        while not self._stop.is_set():
            with self._state:
                while not self._queue and not self._stop.is_set():
                    self._state.wait()
            if self._stop.is_set():
                return
            if self._apply_head():
                streak = 0
                continue
            streak += 1
            self._stop.wait(self._backoff.backoff_seconds(streak, self._rng))

    def _within(self) -> contextlib.AbstractContextManager[object]:
        deadline: Callable[[float], contextlib.AbstractContextManager[object]] | None = getattr(
            self._kube, "deadline", None
        )
        return deadline(self._apply_budget) if deadline is not None else contextlib.nullcontext()

    def _apply_head(self) -> bool:
        """Apply the oldest queued write; False when the API server still does not answer."""
        with self._order:
            with self._state:
                if not self._queue:
                    return True
                write = self._queue[0]
            try:
                with self._within():
                    self._apply(write)
            except Retryable as error:
                logger.debug("still queued: %s: %s", describe(write), error)
                return False
            except NotFound as error:
                logger.warning("dropped, the object is gone: %s: %s", describe(write), error)
                self._drop(write, gone=True)
                return True
            # A refusal for good (403, 422, a bug): retrying cannot help, the rest must go on.
            except Exception as error:
                logger.warning("dropped, refused: %s: %s", describe(write), error)
                self._drop(write, gone=False)
                return True
            self._drop(write, gone=False, written=True)
            left = self.backlog
        logger.info("applied %s (%d write(s) still queued)", describe(write), left)
        return True

    def _drop(self, write: Write, *, gone: bool, written: bool = False) -> None:
        """Take `write` (the head) off the queue; with `gone`, every later write of its pod."""
        with self._state:
            self._queue.popleft()
            if written:
                self.applied_from_queue += 1
            key = _pod_of(write)
            if gone and key is not None:
                self._queue = deque(w for w in self._queue if _pod_of(w) != key)
            if isinstance(write, PodPatch):
                remembered = self._pods.get(write.uid)
                if remembered is not None:
                    if written:
                        remembered.written.update(write.annotations)
                    remembered.queued = {}
                    for waiting in self._queue:
                        if isinstance(waiting, PodPatch) and waiting.uid == write.uid:
                            remembered.queued.update(waiting.annotations)

    # --- reads with what was written or queued --------------------------------------------

    def _remember(self, uid: str) -> _Remembered | None:
        # Under `_state`. No pod without a UID is served (decide_allocation refuses it).
        if not uid:
            return None
        remembered = self._pods.get(uid)
        if remembered is None:
            remembered = self._pods[uid] = _Remembered()
        self._pods.move_to_end(uid)
        while len(self._pods) > self._max_remembered:
            self._pods.popitem(last=False)
        return remembered

    def applied(self, pods: Sequence[PodInfo], *, queued: bool) -> list[PodInfo]:
        """`pods` (every pod bound to the node) as this process left them: with the
        annotations of its queued patches (`queued`), else of its written ones. Forgets the
        UIDs the listing does not have."""
        with self._state:
            listed = {pod.uid for pod in pods}
            for uid in [uid for uid in self._pods if uid not in listed]:
                del self._pods[uid]
            overlays = {
                uid: dict(r.queued if queued else r.written) for uid, r in self._pods.items()
            }
        return [_overlay(pod, overlays[pod.uid]) if pod.uid in overlays else pod for pod in pods]

    def node_applied(self, node: NodeInfo) -> NodeInfo:
        """`node` without a lock this process released (or queued to release)."""
        value = node.annotations.get(ANNOTATION_NODE_LOCK)
        with self._state:
            released = value is not None and value in self._released_locks
        if not released:
            return node
        annotations = {k: v for k, v in node.annotations.items() if k != ANNOTATION_NODE_LOCK}
        return dataclasses.replace(node, annotations=annotations)


def _pod_of(write: Write) -> tuple[str, str] | None:
    if isinstance(write, PodPatch):
        return write.namespace, write.name
    if isinstance(write, PodEvent):
        return write.namespace, write.name
    return None
