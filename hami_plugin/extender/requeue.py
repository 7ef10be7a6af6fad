"""The requeue loop: once this replica can answer again, ask kube-scheduler to retry the GPU
pods it parked while it could not.

kube-scheduler 1.24 to 1.27 parks a pod whose extender call failed until a cluster event, an
update of the pod, or its 5-minute flush (`docs/kube-scheduler.md` 2, 3); nothing the cluster
does while `hami scheduler` restarts or changes leader is such an event. So when this replica
becomes able to answer (`active()`: leader, caches synced, not shutting down; false -> true at
start, on taking the lead, after answering "not synced"), the loop opens a window
(`window_seconds`) in which it merge-patches `hami-plugin.io/requeue: <time>` on every parked
pod (`hami_plugin.scheduler.requeue.parked`), which kube-scheduler sees as an update of the pod
and retries it after its backoff (`docs/kube-scheduler.md` 4). 1.28 and later retry such pods
by themselves; the patch then costs one write per pod and changes nothing.

Passes run every `pass_interval_seconds` while the window is open, so a pod whose failure
kube-scheduler writes a little after the window opened is caught too; a pod still parked is
patched again 2 s later, then 4, 8, up to 20 s apart (`RequeueTracker`), since kube-scheduler's
retry can fail once more while the Service does not route to this replica yet; at most `qps`
patches a second in all. A pod that has a
filter booking or a bind in progress here (`busy`) is left alone: kube-scheduler is placing it
and the patch would only cost the bind a conflict retry. Best effort: a pod gone is skipped;
any other API failure ends the pass (logged once until a patch succeeds again), the pod is
retried at the next pass and the window stays open until one pass gets through.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.api import PodPatchApi
from hami_plugin.kube.errors import KubeError, NotFound
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.requeue import ANNOTATION_REQUEUE, RequeueTracker, parked
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = ["Requeuer"]

logger = logging.getLogger(__name__)


class Requeuer:
    """The loop of the module docstring. `pods()` is every pod as the watch shows it;
    `busy(pod)` whether this process is placing it; `active()` whether this replica answers
    filter and bind now. `run` runs in one thread."""

    def __init__(
        self,
        api: PodPatchApi,
        pods: Callable[[], Iterable[PodInfo]],
        active: Callable[[], bool],
        busy: Callable[[PodInfo], bool],
        *,
        scheduler_name: str,
        settings: SchedulerSettings,
        clock: Clock | None = None,
        qps: float = 20.0,
        window_seconds: float = 60.0,
        first_interval_seconds: float = 2.0,
        max_interval_seconds: float = 20.0,
        pass_interval_seconds: float = 1.0,
    ) -> None:
        if qps <= 0:
            raise ValueError("qps must be positive")
        self._api = api
        self._pods = pods
        self._active = active
        self._busy = busy
        self._scheduler_name = scheduler_name
        self._settings = settings
        self._clock = clock or SystemClock()
        self._spacing = 1.0 / qps
        self._window = window_seconds
        self._pass_interval = pass_interval_seconds
        self._tracker = RequeueTracker(
            first_interval_seconds=first_interval_seconds,
            max_interval_seconds=max_interval_seconds,
        )
        self._was_active = False
        self._failing = False

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until `stop` is set."""
        while not stop.is_set():
            self.run_pass(stop)
            stop.wait(self._pass_interval)

    def run_pass(self, stop: threading.Event | None = None) -> int:
        """One pass: open the window if `active()` just turned true, then patch the pods due.
        Returns how many were patched."""
        active = self._active()
        was_active, self._was_active = self._was_active, active
        if not active:
            return 0
        now = self._clock.monotonic()
        if not was_active:
            self._tracker.open_window(now, self._window)
        if not self._tracker.window_open(now):
            self._tracker.due((), now)  # forget the last window's pods
            return 0
        candidates = [
            pod
            for pod in self._pods()
            if parked(pod, self._scheduler_name, self._settings) and not self._busy(pod)
        ]
        due = self._tracker.due(candidates, now)
        patched = 0
        stop = stop or threading.Event()
        for position, pod in enumerate(due):
            if stop.is_set() or (position and stop.wait(self._spacing)):
                break
            if not self._active():
                break
            outcome = self._patch(pod)
            if outcome is None:
                # keep the window open until a pass gets through
                self._tracker.open_window(self._clock.monotonic(), 2 * self._pass_interval)
                break
            if outcome:
                patched += 1
                self._tracker.nudged(pod, self._clock.monotonic())
        if patched:
            logger.info("asked kube-scheduler to retry %d parked GPU pod(s)", patched)
        return patched

    def _patch(self, pod: PodInfo) -> bool | None:
        """True when written, False when the pod is gone, None on another failure."""
        stamp = self._clock.now().isoformat(timespec="microseconds")
        try:
            self._api.patch_pod_metadata(pod.namespace, pod.name, {ANNOTATION_REQUEUE: stamp})
        except NotFound:
            return False
        except KubeError as error:
            if not self._failing:
                logger.warning("requeue of parked pods paused: patch pod %s: %s", pod.key, error)
            self._failing = True
            return None
        if self._failing:
            logger.info("requeue of parked pods resumed")
        self._failing = False
        return True
