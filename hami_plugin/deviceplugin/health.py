"""GPU health: NVML error events in, `HealthChange`s out, with recovery.

A producer, as the NVIDIA plugin does it (docs/kubelet-deviceplugin.md 3.2,
docs/hami-reference.md 4.3): watch XidCriticalError (+ ECC, masked by what the GPU supports) on an
NVML event set, skip the Xids that are application errors, and report the GPU unhealthy; a failing
wait marks every GPU unhealthy. Unlike NVIDIA and HAMi, a GPU comes back: once it has had no error
for `HealthConfig.recovery_seconds` and answers NVML again, it is reported healthy (logged).

`HealthTracker` holds the decisions (pure, clock passed in); `HealthMonitor` runs the NVML wait
loop on one thread and calls `on_change` for each change. The consumer (the daemon) marks all
vGPU slots of the GPU accordingly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.nvml import (
    EventsNotSupportedError,
    GpuEvent,
    NvmlBackend,
    NvmlError,
    PhysicalGpu,
)

logger = logging.getLogger(__name__)

_MAX_WAIT_SLICE_MS = 500
"""NVML's wait cannot be interrupted, so the loop waits at most this long per call; a timeout
only loops again, so this keeps `stop()` under a second and changes nothing else."""


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A physical GPU turned healthy or unhealthy, and why."""

    uuid: str
    healthy: bool
    reason: str


DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Xids that are application errors, not GPU faults (NVIDIA plugin and HAMi ignore them)."""


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """What decides a GPU's health (`DP_DISABLE_HEALTHCHECKS`, `DP_ENABLE_HEALTHCHECKS`,
    `--health-recovery-seconds`, `--health-wait-ms`).

    `only_xids`, when set, are the only Xids that count; otherwise every Xid outside
    `ignored_xids` does. `recovery_seconds` 0 turns recovery off.
    """

    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    only_xids: frozenset[int] | None = None
    disabled: bool = False
    recovery_seconds: float = 300.0
    wait_ms: int = 5000

    def xid_is_critical(self, xid: int) -> bool:
        """True when an XidCriticalError event with this Xid should mark the GPU unhealthy."""
        if self.disabled:
            return False
        if self.only_xids is not None:
            return xid in self.only_xids
        return xid not in self.ignored_xids


class HealthTracker:
    """Which GPUs are unhealthy and since when; what an event or the passing time changes.

    Pure: no NVML, no threads; `now` is a monotonic time in seconds passed by the caller.
    """

    def __init__(
        self,
        uuids: Iterable[str],
        config: HealthConfig,
        carried: HealthTracker | None = None,
    ) -> None:
        """Watch `uuids`; `carried` hands over the unhealthy state of the watched GPUs."""
        self._config = config
        self._watched = list(dict.fromkeys(uuids))
        self._last_error_at: dict[str, float] = {}
        if carried is not None:
            self._last_error_at = {
                uuid: since
                for uuid, since in carried._last_error_at.items()
                if uuid in self._watched
            }

    @property
    def unhealthy(self) -> frozenset[str]:
        return frozenset(self._last_error_at)

    def mark_unhealthy(self, uuid: str, reason: str, now: float) -> list[HealthChange]:
        """Record an error on the GPU; a change only if it was healthy."""
        was_healthy = uuid not in self._last_error_at
        self._last_error_at[uuid] = now
        return [HealthChange(uuid, False, reason)] if was_healthy else []

    def mark_all_unhealthy(self, reason: str, now: float) -> list[HealthChange]:
        changes: list[HealthChange] = []
        for uuid in self._watched:
            changes.extend(self.mark_unhealthy(uuid, reason, now))
        return changes

    def mark_healthy(self, uuid: str, reason: str) -> list[HealthChange]:
        if self._last_error_at.pop(uuid, None) is None:
            return []
        return [HealthChange(uuid, True, reason)]

    def on_event(self, event: GpuEvent, now: float) -> list[HealthChange]:
        """The health changes one NVML event means (NVIDIA's rules, see the module docstring)."""
        xid = event.xid
        if xid is None:
            logger.info(
                "GPU %s: NVML event type 0x%x (data %d) does not change health",
                event.uuid or "<unknown>",
                event.event_type,
                event.data,
            )
            return []
        if not self._config.xid_is_critical(xid):
            logger.info("GPU %s: Xid %d ignored (application error)", event.uuid or "?", xid)
            return []
        if event.uuid is None:
            return self.mark_all_unhealthy(f"Xid {xid} from a GPU NVML could not name", now)
        if event.uuid not in self._watched:
            logger.debug("Xid %d on GPU %s, which is not watched: ignored", xid, event.uuid)
            return []
        return self.mark_unhealthy(event.uuid, f"Xid {xid}", now)

    def recovery_candidates(self, now: float) -> list[str]:
        """Unhealthy GPUs without an error for the recovery window (none when it is 0)."""
        window = self._config.recovery_seconds
        if window <= 0:
            return []
        return [uuid for uuid, since in self._last_error_at.items() if now - since >= window]


class HealthMonitor:
    """Runs the NVML event loop on one worker thread and reports `HealthChange`s."""

    def __init__(
        self,
        backend: NvmlBackend,
        config: HealthConfig,
        on_change: Callable[[HealthChange], None],
        clock: Clock | None = None,
        *,
        mig_event: Callable[[GpuEvent], bool] | None = None,
    ) -> None:
        """`mig_event` sees every event first; True: it was about one MIG device and was
        handled there (static MIG, `migserve`), so the GPU itself keeps its health."""
        self._mig_event = mig_event
        self._backend = backend
        self._config = config
        self._on_change = on_change
        self._clock: Clock = clock or SystemClock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tracker = HealthTracker((), config)

    @property
    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs currently reported unhealthy."""
        with self._lock:
            return self._tracker.unhealthy

    def start(self, gpus: Sequence[PhysicalGpu]) -> None:
        """Watch these GPUs; the wait loop runs on a new worker thread.

        The event set is created and the GPUs registered before this returns, so no event
        after `start` is missed; a GPU whose registration fails is reported unhealthy from this
        call (through `on_change`). Starting again after `stop` (for a new GPU list) keeps the
        unhealthy GPUs that are still listed unhealthy, with their recovery clocks. Raises
        RuntimeError if already running.
        """
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("health monitor already running")
        with self._lock:
            # A restart (new GPU list) keeps what is known about GPUs still present.
            self._tracker = HealthTracker(
                (gpu.uuid for gpu in gpus), self._config, carried=self._tracker
            )
        if self._config.disabled:
            logger.warning("health checks disabled (DP_DISABLE_HEALTHCHECKS)")
            return
        try:
            event_set = self._backend.create_event_set()
        except NvmlError as error:
            logger.error("%s; continuing with health checks disabled", error)
            return
        unregistered = {gpu.uuid for gpu in gpus if not self._register(event_set, gpu.uuid)}
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(event_set, unregistered), name="hami-health", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker and wait for it (it notices within half a second)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)
            if thread.is_alive():
                logger.error("health monitor thread did not stop (NVML wait stuck?)")

    # -- worker thread --

    def _emit(self, changes: Iterable[HealthChange]) -> None:
        for change in changes:
            if change.healthy:
                logger.info("GPU %s is healthy again: %s", change.uuid, change.reason)
            else:
                logger.warning("GPU %s marked unhealthy: %s", change.uuid, change.reason)
            try:
                self._on_change(change)
            except Exception:
                logger.exception("health change handler failed for GPU %s", change.uuid)

    def _run(self, event_set: Any, unregistered: set[str]) -> None:
        slice_ms = min(self._config.wait_ms, _MAX_WAIT_SLICE_MS)
        try:
            while not self._stop.is_set():
                try:
                    event = self._backend.wait_event(event_set, slice_ms)
                except NvmlError as error:
                    now = self._clock.monotonic()
                    with self._lock:
                        changes = self._tracker.mark_all_unhealthy(str(error), now)
                    self._emit(changes)
                    self._stop.wait(slice_ms / 1000.0)
                    continue
                if event is not None and not (self._mig_event and self._mig_event(event)):
                    with self._lock:
                        changes = self._tracker.on_event(event, self._clock.monotonic())
                    self._emit(changes)
                self._recover(event_set, unregistered)
        except Exception:
            logger.exception("health monitor stopped by an unexpected error")
        finally:
            self._backend.free_event_set(event_set)

    def _register(self, event_set: Any, uuid: str) -> bool:
        """Register the GPU's events; False when that failed (the GPU is then unhealthy)."""
        try:
            self._backend.register_events(event_set, uuid)
        except EventsNotSupportedError as error:
            logger.warning("%s; GPU %s is not watched for errors", error, uuid)
        except NvmlError as error:
            with self._lock:
                changes = self._tracker.mark_unhealthy(uuid, str(error), self._clock.monotonic())
            self._emit(changes)
            return False
        return True

    def _recover(self, event_set: Any, unregistered: set[str]) -> None:
        with self._lock:
            candidates = self._tracker.recovery_candidates(self._clock.monotonic())
        for uuid in candidates:
            if not self._backend.is_responsive(uuid):
                continue
            if uuid in unregistered:
                if not self._register(event_set, uuid):
                    continue
                unregistered.discard(uuid)
            reason = f"no errors for {self._config.recovery_seconds:g} s and NVML answers"
            with self._lock:
                changes = self._tracker.mark_healthy(uuid, reason)
            self._emit(changes)
