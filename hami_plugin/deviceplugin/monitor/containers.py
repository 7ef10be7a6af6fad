"""HAMi-core's per-container regions on this node: find, read, map to pods, clean up, feed back.

Layout (`protocol.hostpaths`): Allocate creates `<hook>/vgpu/containers/<podUID>_<name>`, the
workload sees it as `<hook>/vgpu` and HAMi-core creates its `<uuid>.cache` region there. As
HAMi's monitor (`pkg/monitor/nvidia/cudevshr.go`, v2.10):

* a directory name splits at the first `_` into pod UID and container name; other names are
  skipped (cudevshr.go:188-192);
* a directory with more than 2 entries whose name contains `libvgpu.so` or ends in `.cache` is
  skipped; the region is the first `.cache` entry by name that is not a `libvgpu.so` one
  (cudevshr.go:233-256);
* directories of pods no longer on the node are removed once their mtime is older than the
  resync interval (HAMI_RESYNC_INTERVAL, 5 m; cudevshr.go:98,195-206).

Deliberate differences:

* Regions are read with `os.pread` on a cached read-only descriptor, and the feedback writer
  uses `os.pwrite`, not mmap: the file belongs to the workload, and a workload that truncates
  it under a mapping makes the next access raise SIGBUS, which kills the whole daemon (HAMi's
  monitor has this hole). A shrunk file here is a short read, i.e. one `truncated` log line.
  Descriptors are cached per path and keyed by (device, inode, size), so a scrape does not
  reopen unchanged files; descriptors of vanished or changed files are closed.
* Files are opened with O_NOFOLLOW | O_NONBLOCK and must be regular files (a workload could
  leave a symlink to a host file or a FIFO there); a directory with more than
  `MAX_DIR_ENTRIES` entries is skipped without listing it further.
* Nothing is removed while the pod list cannot be refreshed (a stale list would make running
  pods look gone).
* A region claims only what its pod's booking and spec say (`booked`): the GPUs of the
  container's booking entry (signed, with booking keys) and the priority of its
  `CUDA_TASK_PRIORITY`. Other GPU identities in the file are ignored, and a region of a pod not
  on the node (HAMi only loads regions of pods its informer knows) or without a trusted booking
  takes no part in the feedback and exports nothing; each is logged once per file and reason.

Every bad file or directory is logged once per (path, reason) while it exists, and skipped.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.monitor.booked import BookedContainer, NotBooked, booked_container
from hami_plugin.deviceplugin.monitor.feedback import ContainerActivity, decide_feedback
from hami_plugin.deviceplugin.monitor.region import (
    DeviceUsage,
    Region,
    RegionError,
    parse_region_from,
)
from hami_plugin.logsafe import safe_text
from hami_plugin.protocol.hostpaths import split_container_dir
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import BookingKeys

logger = logging.getLogger(__name__)

DEFAULT_RESYNC_INTERVAL_SECONDS = 300.0
"""HAMi's HAMI_RESYNC_INTERVAL default (cudevshr.go:98); our flag `--vgpu-resync-interval`."""
DEFAULT_POD_REFRESH_SECONDS = 5.0
FEEDBACK_INTERVAL_SECONDS = 5.0
"""HAMi's feedback ticker (`cmd/vGPUmonitor/feedback.go:143`)."""
MAX_CACHE_FILES = 2
MAX_DIR_ENTRIES = 64
"""A HAMi-core directory holds the region and the `libvgpu.so` mount point; far more entries
means a workload filling its directory, which must not slow every scrape down."""

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_INT32 = struct.Struct("<i")

PodLister = Callable[[], Iterable[PodInfo]]
KeySource = Callable[[], BookingKeys]


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's region as read by the last scan, with its pod when known."""

    pod_uid: str
    container_name: str
    cache_path: str
    region: Region
    pod: PodInfo | None
    """The pod on this node with that UID; None when the pod list does not have it."""
    booked: BookedContainer | None = None
    """What the pod's booking and spec let the region claim; None when nothing (`booked`)."""

    def booked_devices(self) -> list[DeviceUsage]:
        """The region's devices whose UUID the booking holds (none when not booked)."""
        if self.booked is None:
            return []
        gpus = self.booked.gpus
        return [device for device in self.region.devices if device.gpu_key in gpus]


@dataclass(frozen=True, slots=True)
class _OpenRegion:
    fd: int
    device: int
    inode: int
    size: int


class _OnceLog:
    """Logs a problem once per (path, reason); forgets a path once it is gone."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def warn(self, path: str, reason: str, message: str) -> None:
        if (path, reason) not in self._seen:
            self._seen.add((path, reason))
            # The workload names its region file: escaped here even without SafeFormatter.
            logger.warning("%s: %s (skipped; logged once)", safe_text(path), message)

    def retain(self, paths: set[str]) -> None:
        self._seen = {key for key in self._seen if key[0] in paths}


class _PodCache:
    """The pods on this node by UID, listed at most every `refresh_seconds`.

    A failing list keeps the last good one and marks it stale. Only one caller lists at a time;
    others use the current list meanwhile.
    """

    def __init__(self, list_pods: PodLister, refresh_seconds: float, clock: Clock) -> None:
        self._list_pods = list_pods
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._refreshing = threading.Lock()
        self._by_uid: dict[str, PodInfo] = {}
        self._fresh = False
        self._failing = False
        self._next_refresh = float("-inf")

    def get(self) -> tuple[dict[str, PodInfo], bool]:
        """(pods by UID, whether the last list call succeeded)."""
        clock = self._clock
        if clock.monotonic() >= self._next_refresh and self._refreshing.acquire(blocking=False):
            try:
                if clock.monotonic() >= self._next_refresh:
                    self._next_refresh = clock.monotonic() + self._refresh_seconds
                    self._refresh()
            finally:
                self._refreshing.release()
        return self._by_uid, self._fresh

    def _refresh(self) -> None:
        try:
            pods = list(self._list_pods())
        except Exception as error:  # any adapter error: keep the last good list
            if not self._failing:
                logger.warning(
                    "listing the pods on this node failed, keeping the last list of %d "
                    "(logged once until it works again): %s",
                    len(self._by_uid),
                    error,
                )
            self._failing = True
            self._fresh = False
            return
        if self._failing:
            logger.info("listing the pods on this node works again (%d pods)", len(pods))
        self._by_uid = {pod.uid: pod for pod in pods}
        self._failing = False
        self._fresh = True


class ContainerScanner:
    """Reads every container region under `containers_dir`; thread-safe.

    `list_pods` returns the pods on this node (e.g. `lambda: kube.list_pods_on_node(node)`); it
    is called at most every `pod_refresh_seconds` of `clock.monotonic()`; `clock.now()` is
    compared with directory mtimes. `booking_keys`: the daemon's current booking keys (None:
    bookings are trusted unsigned, as in HAMi).
    """

    def __init__(
        self,
        containers_dir: str,
        list_pods: PodLister,
        *,
        resync_interval_seconds: float = DEFAULT_RESYNC_INTERVAL_SECONDS,
        pod_refresh_seconds: float = DEFAULT_POD_REFRESH_SECONDS,
        clock: Clock | None = None,
        booking_keys: KeySource | None = None,
    ) -> None:
        self.containers_dir = containers_dir.rstrip("/") or "/"
        self._booking_keys = booking_keys
        self.resync_interval_seconds = resync_interval_seconds
        self._clock: Clock = clock or SystemClock()
        self._pods = _PodCache(list_pods, pod_refresh_seconds, self._clock)
        self._lock = threading.Lock()
        self._open: dict[str, _OpenRegion] = {}
        self._once = _OnceLog()
        self._missing_logged = False

    @property
    def open_files(self) -> int:
        """Descriptors held for cached regions (for tests and benchmarks)."""
        with self._lock:
            return len(self._open)

    def scan(self) -> list[ContainerUsage]:
        """Read every readable region now, in directory-name order. Never raises for content."""
        pods, fresh = self._pods.get()
        with self._lock:
            found = self._read_all()
            return [
                ContainerUsage(
                    pod_uid,
                    container_name,
                    path,
                    region,
                    pods.get(pod_uid),
                    self._booked(pods.get(pod_uid), container_name, path, region, fresh),
                )
                for pod_uid, container_name, path, region in found
            ]

    def remove_stale_dirs(self) -> list[str]:
        """Remove directories of pods gone from the node whose mtime is older than the resync
        interval; returns the removed paths. Does nothing while the pod list is stale."""
        pods, fresh = self._pods.get()
        if not fresh:
            return []
        removed: list[str] = []
        now = self._clock.now().timestamp()
        with self._lock:
            for entry in self._container_dirs():
                parts = split_container_dir(entry.name)
                if parts is None or parts[0] in pods:
                    continue
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue  # gone meanwhile
                if mtime + self.resync_interval_seconds > now:
                    continue
                self._close_under(entry.path + "/")
                try:
                    shutil.rmtree(entry.path)
                except OSError as error:
                    self._once.warn(entry.path, "remove", f"cannot remove: {error}")
                    continue
                logger.info("removed %s: pod %s is not on this node", entry.path, parts[0])
                removed.append(entry.path)
        return removed

    def apply_feedback(self) -> int:
        """One priority-feedback round over every readable region (feedback.py); writes the
        changed `recentKernel` / `utilizationSwitch` fields in place. Returns regions written."""
        pods, fresh = self._pods.get()
        with self._lock:
            found = self._read_all()
            regions: dict[str, Region] = {}
            activities: dict[str, ContainerActivity] = {}
            for pod_uid, container_name, path, region in found:
                booked = self._booked(pods.get(pod_uid), container_name, path, region, fresh)
                if booked is None:
                    continue
                regions[path] = region
                activities[path] = ContainerActivity(
                    gpus=tuple(key for key in region.gpu_keys if key in booked.gpus),
                    priority=booked.priority,
                    recent_kernel=region.recent_kernel,
                    utilization_switch=region.utilization_switch,
                )
            decisions = decide_feedback(activities)
            written = 0
            for path, decision in decisions.items():
                region = regions[path]
                layout = region.layout
                changes = [
                    (offset, old, new)
                    for offset, old, new in (
                        (layout.recent_kernel_offset, region.recent_kernel, decision.recent_kernel),
                        (
                            layout.utilization_switch_offset,
                            region.utilization_switch,
                            decision.utilization_switch,
                        ),
                    )
                    if old != new
                ]
                if changes and self._write_fields(path, region, changes):
                    written += 1
            return written

    def close(self) -> None:
        """Close every cached descriptor. The scanner stays usable (it reopens on demand)."""
        with self._lock:
            self._close_under("")

    # --- internals (callers hold self._lock) --------------------------------------------------

    def _booked(
        self, pod: PodInfo | None, container_name: str, path: str, region: Region, fresh: bool
    ) -> BookedContainer | None:
        """What the region may claim; None (logged once per file and reason) when nothing.
        An unknown pod is logged only while the pod list is current (a stale or not yet
        filled list would name every running pod)."""
        keys = self._booking_keys() if self._booking_keys is not None else None
        booked = booked_container(pod, container_name, keys)
        if isinstance(booked, NotBooked):
            if fresh or booked.reason != "unknown-pod":
                self._once.warn(path, booked.reason, f"not fed back nor exported: {booked.message}")
            return None
        foreign = sum(1 for key in region.gpu_keys if key not in booked.gpus)
        if foreign:
            self._once.warn(
                path,
                "foreign-gpu",
                f"names {foreign} GPU(s) its booking does not hold: those are ignored",
            )
        return booked

    def _container_dirs(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.containers_dir) as entries:
                dirs = [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            if not self._missing_logged:
                logger.info("%s does not exist yet: no container regions", self.containers_dir)
                self._missing_logged = True
            return []
        except OSError as error:
            self._once.warn(self.containers_dir, "list", f"cannot list: {error}")
            return []
        self._missing_logged = False
        dirs.sort(key=lambda entry: entry.name)
        return dirs

    def _read_all(self) -> list[tuple[str, str, str, Region]]:
        found: list[tuple[str, str, str, Region]] = []
        live_paths = {self.containers_dir}
        used_files: set[str] = set()
        for entry in self._container_dirs():
            live_paths.add(entry.path)
            parts = split_container_dir(entry.name)
            if parts is None:
                self._once.warn(entry.path, "name", "name is not <podUID>_<containerName>")
                continue
            cache_path = self._find_cache_file(entry.path)
            if cache_path is None:
                continue
            live_paths.add(cache_path)
            region = self._read_region(cache_path)
            if cache_path in self._open:
                used_files.add(cache_path)
            if region is not None:
                found.append((parts[0], parts[1], cache_path, region))
        for path in [path for path in self._open if path not in used_files]:
            self._close(path)
        self._once.retain(live_paths)
        return found

    def _find_cache_file(self, dir_path: str) -> str | None:
        matched = 0
        caches: list[str] = []
        try:
            with os.scandir(dir_path) as entries:
                for count, entry in enumerate(entries, start=1):
                    if count > MAX_DIR_ENTRIES:
                        self._once.warn(dir_path, "entries", f"more than {MAX_DIR_ENTRIES} entries")
                        return None
                    if "libvgpu.so" in entry.name:
                        matched += 1
                    elif entry.name.endswith(".cache"):
                        matched += 1
                        caches.append(entry.name)
        except FileNotFoundError:
            return None
        except OSError as error:
            self._once.warn(dir_path, "list", f"cannot list: {error}")
            return None
        if matched > MAX_CACHE_FILES:
            self._once.warn(
                dir_path,
                "files",
                f"{matched} libvgpu.so/.cache files, at most {MAX_CACHE_FILES} expected",
            )
            return None
        return f"{dir_path}/{min(caches)}" if caches else None

    def _read_region(self, path: str) -> Region | None:
        handle = self._open_region(path)
        if handle is None:
            return None

        def read(offset: int, length: int) -> bytes:
            return os.pread(handle.fd, length, offset)

        try:
            return parse_region_from(read, handle.size)
        except RegionError as error:
            self._once.warn(path, error.reason, str(error))
        except OSError as error:
            self._close(path)
            self._once.warn(path, "read", f"cannot read: {error}")
        return None

    def _open_region(self, path: str) -> _OpenRegion | None:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            self._close(path)
            return None
        except OSError as error:
            self._close(path)
            self._once.warn(path, "stat", f"cannot stat: {error}")
            return None
        if not stat.S_ISREG(info.st_mode):
            self._close(path)
            self._once.warn(path, "type", "not a regular file")
            return None
        cached = self._open.get(path)
        if cached is not None:
            if (cached.device, cached.inode, cached.size) == (
                info.st_dev,
                info.st_ino,
                info.st_size,
            ):
                return cached
            self._close(path)
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError as error:
            self._once.warn(path, "open", f"cannot open: {error}")
            return None
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
            info.st_dev,
            info.st_ino,
        ):
            os.close(fd)
            return None  # replaced between lstat and open: the next scan sees the new file
        handle = _OpenRegion(fd, opened.st_dev, opened.st_ino, opened.st_size)
        self._open[path] = handle
        return handle

    def _write_fields(
        self, path: str, region: Region, changes: Sequence[tuple[int, int, int]]
    ) -> bool:
        """pwrite each int32 whose current value is still the one the decision read (else
        HAMi-core changed it meanwhile and the next round decides again)."""
        expected = self._open.get(path)
        try:
            fd = os.open(path, os.O_RDWR | _OPEN_FLAGS)
        except OSError as error:
            self._once.warn(path, "open-rw", f"cannot open for feedback: {error}")
            return False
        try:
            info = os.fstat(fd)
            if (
                expected is None
                or not stat.S_ISREG(info.st_mode)
                or (info.st_dev, info.st_ino) != (expected.device, expected.inode)
                or info.st_size < region.layout.size
            ):
                return False  # replaced or shrunk since the read: the next round decides
            wrote = False
            for offset, old, new in changes:
                current = os.pread(fd, 4, offset)
                if len(current) == 4 and _INT32.unpack(current)[0] == old:
                    os.pwrite(fd, _INT32.pack(new), offset)
                    wrote = True
            return wrote
        except OSError as error:
            self._once.warn(path, "write", f"cannot write feedback: {error}")
            return False
        finally:
            os.close(fd)

    def _close(self, path: str) -> None:
        handle = self._open.pop(path, None)
        if handle is not None:
            os.close(handle.fd)

    def _close_under(self, prefix: str) -> None:
        for path in [path for path in self._open if path.startswith(prefix)]:
            self._close(path)


class FeedbackLoop:
    """Every `interval_seconds`: remove stale directories, then one feedback round.

    One daemon thread; `stop()` returns once the current round (if any) has ended.
    """

    def __init__(
        self, scanner: ContainerScanner, *, interval_seconds: float = FEEDBACK_INTERVAL_SECONDS
    ) -> None:
        self._scanner = scanner
        self._interval_seconds = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        """One round; an unexpected error is logged with its traceback, never raised."""
        try:
            self._scanner.remove_stale_dirs()
            self._scanner.apply_feedback()
        except Exception:
            logger.exception("vGPU feedback round failed; trying again next round")

    def start(self) -> None:
        """Start the thread (first round at once)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vgpu-feedback", daemon=True)
        self._thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self._interval_seconds)
