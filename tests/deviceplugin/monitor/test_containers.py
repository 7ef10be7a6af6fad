"""Scanning <hook>/vgpu/containers: mapping, hostile files, descriptor cache, cleanup, feedback."""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner, FeedbackLoop
from hami_plugin.deviceplugin.monitor.region import LAYOUT_V1
from hami_plugin.kube.errors import Retryable
from hami_plugin.protocol.hostpaths import containers_dir
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import BookingKeys
from tests.deviceplugin.monitor.helpers import container_dir, pod, region_file
from tests.deviceplugin.monitor.region_writer import (
    DeviceMemory,
    Proc,
    RegionSpec,
    field_offset,
    write_region,
)

UUID = "GPU-0b7e3d4c-1111-2222-3333-444455556666"
LOGGER = "hami_plugin.deviceplugin.monitor.containers"


def spec(total: int = 100, **kwargs: object) -> RegionSpec:
    values: dict[str, object] = {
        "uuids": [UUID],
        "limits": [1 << 30],
        "procs": [Proc(used=[DeviceMemory(total=total)], sm_util=[10])],
    }
    values.update(kwargs)
    return RegionSpec(**values)  # type: ignore[arg-type]


NOW = 2_000_000_000.0
"""The test clock's wall time, in Unix seconds (directory mtimes are set relative to it)."""


def booked(uid: str, priority: int | None = None, gpus: Iterable[str] = (UUID,)) -> PodInfo:
    """A pod whose `main` container the scheduler booked on `gpus`, with `CUDA_TASK_PRIORITY`
    set as the webhook sets it from `nvidia.com/priority` (unset when None)."""
    env = {} if priority is None else {"main": {"CUDA_TASK_PRIORITY": str(priority)}}
    return pod(uid, uid.removeprefix("uid-"), booked={"main": list(gpus)}, env=env)


def clock_at(unix_seconds: float = NOW) -> ManualClock:
    return ManualClock(datetime.fromtimestamp(unix_seconds, UTC))


class Pods:
    """A pod source that counts calls and can fail."""

    def __init__(self, pods: Iterable[PodInfo] = ()) -> None:
        self.pods = list(pods)
        self.calls = 0
        self.error: Exception | None = None

    def __call__(self) -> list[PodInfo]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.pods)


def scanner_for(
    hook: Path,
    pods: Callable[[], Iterable[PodInfo]],
    clock: ManualClock | None = None,
    keys: BookingKeys | None = None,
) -> ContainerScanner:
    return ContainerScanner(
        containers_dir(str(hook)),
        pods,
        resync_interval_seconds=300.0,
        pod_refresh_seconds=5.0,
        clock=clock or clock_at(),
        booking_keys=None if keys is None else (lambda: keys),
    )


def warnings_for(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def test_directory_maps_back_to_its_pod(tmp_path: Path) -> None:
    region_file(tmp_path, "uid-1", "main", spec(total=123))
    region_file(tmp_path, "uid-2", "worker", spec(total=7))
    pods = Pods([pod("uid-1", "train", namespace="ml"), pod("uid-2", "other", ["worker"])])
    scanner = scanner_for(tmp_path, pods)
    usages = scanner.scan()
    assert [(u.pod_uid, u.container_name) for u in usages] == [
        ("uid-1", "main"),
        ("uid-2", "worker"),
    ]
    first = usages[0]
    assert first.pod is not None and (first.pod.namespace, first.pod.name) == ("ml", "train")
    assert first.region.devices[0].memory_used_bytes == 123
    assert first.cache_path.endswith("/vgpu/containers/uid-1_main/a1b2.cache")
    scanner.close()


def test_unknown_pod_is_read_without_a_pod(tmp_path: Path) -> None:
    region_file(tmp_path, "uid-9", "main", spec())
    scanner = scanner_for(tmp_path, Pods())
    [usage] = scanner.scan()
    assert usage.pod is None
    scanner.close()


def test_missing_containers_dir_is_empty(tmp_path: Path) -> None:
    scanner = scanner_for(tmp_path / "nothing", Pods())
    assert scanner.scan() == []
    assert scanner.remove_stale_dirs() == []


def test_bad_directory_name_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    containers = Path(containers_dir(str(tmp_path)))
    (containers / "no-underscore").mkdir(parents=True)
    region_file(tmp_path, "uid-1", "main", spec())
    scanner = scanner_for(tmp_path, Pods())
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(3):
        assert len(scanner.scan()) == 1
    assert len(warnings_for(caplog, "no-underscore")) == 1
    scanner.close()


def test_first_cache_file_by_name(tmp_path: Path) -> None:
    directory = container_dir(tmp_path, "uid-1", "main")
    write_region(directory / "b.cache", spec(total=2))
    write_region(directory / "a.cache", spec(total=1))
    scanner = scanner_for(tmp_path, Pods())
    [usage] = scanner.scan()
    assert usage.cache_path.endswith("/a.cache")
    assert usage.region.devices[0].memory_used_bytes == 1
    scanner.close()


def test_libvgpu_named_cache_is_not_the_region(tmp_path: Path) -> None:
    directory = container_dir(tmp_path, "uid-1", "main")
    write_region(directory / "libvgpu.so.v1.cache", spec(total=2))
    write_region(directory / "z.cache", spec(total=3))
    [usage] = scanner_for(tmp_path, Pods()).scan()
    assert usage.cache_path.endswith("/z.cache")


def test_more_than_two_matching_files_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    region_file(tmp_path, "uid-1", "main", spec())
    directory = container_dir(tmp_path, "uid-1", "main")
    (directory / "libvgpu.so.2").touch()  # 3 matches: libvgpu.so, libvgpu.so.2, a1b2.cache
    (directory / "unrelated.txt").touch()
    scanner = scanner_for(tmp_path, Pods())
    caplog.set_level(logging.WARNING, LOGGER)
    assert scanner.scan() == []
    assert scanner.scan() == []
    assert len(warnings_for(caplog, "at most 2 expected")) == 1


def test_no_cache_file_yet_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (container_dir(tmp_path, "uid-1", "main") / "libvgpu.so").touch()
    caplog.set_level(logging.WARNING, LOGGER)
    assert scanner_for(tmp_path, Pods()).scan() == []
    assert not warnings_for(caplog, "")


def test_directory_with_too_many_entries(tmp_path: Path) -> None:
    directory = container_dir(tmp_path, "uid-1", "main")
    write_region(directory / "a.cache", spec())
    for index in range(100):
        (directory / f"junk{index}").touch()
    assert scanner_for(tmp_path, Pods()).scan() == []


def test_hostile_files_skipped_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host_secret = tmp_path / "host-secret"
    write_region(host_secret, spec())
    (container_dir(tmp_path, "uid-link", "main") / "x.cache").symlink_to(host_secret)
    os.mkfifo(container_dir(tmp_path, "uid-fifo", "main") / "x.cache")
    (container_dir(tmp_path, "uid-dir", "main") / "x.cache").mkdir()
    region_file(tmp_path, "uid-magic", "main", spec(magic=0))
    region_file(tmp_path, "uid-procnum", "main", spec(procnum=5000))
    region_file(tmp_path, "uid-num", "main", spec(num=99))
    short = container_dir(tmp_path, "uid-short", "main") / "x.cache"
    short.write_bytes(b"\x01\x02")
    region_file(tmp_path, "uid-good", "main", spec(total=42))
    scanner = scanner_for(tmp_path, Pods([booked("uid-good")]))
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(3):
        usages = scanner.scan()
        assert [u.pod_uid for u in usages] == ["uid-good"]
    messages = warnings_for(caplog, "")
    assert len(messages) == 7, messages
    for uid in ("link", "fifo", "dir", "magic", "procnum", "num", "short"):
        assert sum(f"uid-{uid}_main" in m for m in messages) == 1, uid
    scanner.close()


def test_region_truncated_after_it_was_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workload shrinking its file under us is a log line, not a SIGBUS."""
    path = region_file(tmp_path, "uid-1", "main", spec())
    scanner = scanner_for(tmp_path, Pods([booked("uid-1")]))
    assert len(scanner.scan()) == 1
    os.truncate(path, 100)
    caplog.set_level(logging.WARNING, LOGGER)
    assert scanner.scan() == []
    assert len(warnings_for(caplog, "a1b2.cache")) == 1
    scanner.close()


def test_descriptors_are_cached_and_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [region_file(tmp_path, f"uid-{i}", "main", spec(total=i)) for i in range(5)]
    scanner = scanner_for(tmp_path, Pods())
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    scanner.scan()
    assert len(opened) == 5
    assert scanner.open_files == 5
    opened.clear()
    for _ in range(3):
        scanner.scan()
    assert opened == []  # unchanged files are not reopened

    write_region(paths[0], spec(total=999, extra_bytes=8))  # size changes: reopened
    paths[1].unlink()  # vanished: closed
    write_region(paths[1].with_name("new.cache"), spec(total=5))  # a new region in that dir
    opened.clear()  # the writer's own opens
    usages = {u.pod_uid: u for u in scanner.scan()}
    assert usages["uid-0"].region.devices[0].memory_used_bytes == 999
    assert usages["uid-1"].cache_path.endswith("/new.cache")
    assert sorted(Path(p).name for p in opened) == ["a1b2.cache", "new.cache"]
    assert scanner.open_files == 5

    for path in paths[2:]:
        path.parent.joinpath("libvgpu.so").unlink()
        path.unlink()
    scanner.scan()
    assert scanner.open_files == 2
    scanner.close()
    assert scanner.open_files == 0


def test_pods_listed_at_most_every_refresh_interval(tmp_path: Path) -> None:
    region_file(tmp_path, "uid-1", "main", spec())
    pods = Pods([pod("uid-1", "a")])
    clock = clock_at()
    scanner = scanner_for(tmp_path, pods, clock=clock)
    for _ in range(10):
        scanner.scan()
    assert pods.calls == 1
    clock.advance(5.0)
    scanner.scan()
    assert pods.calls == 2


def test_a_failing_pod_list_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    region_file(tmp_path, "uid-1", "main", spec())
    pods = Pods([pod("uid-1", "a")])
    clock = clock_at()
    scanner = scanner_for(tmp_path, pods, clock=clock)
    assert scanner.scan()[0].pod is not None
    pods.error = Retryable("apiserver down")
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(3):
        clock.advance(10.0)
        [usage] = scanner.scan()
        assert usage.pod is not None and usage.pod.name == "a"
    assert pods.calls == 4
    assert len(warnings_for(caplog, "apiserver down")) == 1


def old_dir(hook: Path, uid: str, age_seconds: float, now: float) -> Path:
    path = region_file(hook, uid, "main", spec()).parent
    os.utime(path, (now - age_seconds, now - age_seconds))
    return path


def test_cleanup_removes_old_directories_of_gone_pods(tmp_path: Path) -> None:
    now = NOW
    gone_old = old_dir(tmp_path, "uid-gone", 301, now)
    gone_recent = old_dir(tmp_path, "uid-new", 299, now)
    alive_old = old_dir(tmp_path, "uid-alive", 10_000, now)
    odd_name = Path(containers_dir(str(tmp_path))) / "odd"
    odd_name.mkdir()
    os.utime(odd_name, (0, 0))
    scanner = scanner_for(tmp_path, Pods([pod("uid-alive", "a")]), clock=clock_at(now))
    assert len(scanner.scan()) == 3
    assert scanner.open_files == 3
    assert scanner.remove_stale_dirs() == [str(gone_old)]
    assert not gone_old.exists()
    assert gone_recent.exists() and alive_old.exists() and odd_name.exists()
    assert scanner.open_files == 2  # the removed region's descriptor is closed
    scanner.close()


def test_no_cleanup_while_the_pod_list_fails(tmp_path: Path) -> None:
    now = NOW
    gone = old_dir(tmp_path, "uid-gone", 10_000, now)
    pods = Pods()
    pods.error = Retryable("down")
    scanner = scanner_for(tmp_path, pods, clock=clock_at(now))
    assert scanner.remove_stale_dirs() == []
    assert gone.exists()


def read_i32(path: Path, version: int, field: str) -> int:
    with path.open("rb") as file:
        file.seek(field_offset(version, field))
        value: int = struct.unpack("<i", file.read(4))[0]
        return value


@pytest.mark.parametrize("version", [0, 1])
def test_feedback_writes_the_two_fields_in_place(tmp_path: Path, version: int) -> None:
    high = region_file(
        tmp_path, "uid-high", "main", spec(version=version, priority=0, recent_kernel=3)
    )
    low = region_file(
        tmp_path, "uid-low", "main", spec(version=version, priority=1, recent_kernel=3)
    )
    other = region_file(
        tmp_path,
        "uid-other",
        "main",
        spec(version=version, uuids=["GPU-other"], priority=1, recent_kernel=0),
    )
    before = other.read_bytes()
    high_before = high.read_bytes()
    pods = [booked("uid-high", 0), booked("uid-low", 1), booked("uid-other", 1, ["GPU-other"])]
    scanner = scanner_for(tmp_path, Pods(pods))
    assert scanner.apply_feedback() == 2
    assert read_i32(high, version, "recent_kernel") == 2
    assert read_i32(high, version, "utilization_switch") == 0
    assert read_i32(low, version, "recent_kernel") == -1
    assert read_i32(low, version, "utilization_switch") == 1
    assert other.read_bytes() == before  # nothing to change: not written
    changed = [
        offset
        for offset, (a, b) in enumerate(zip(high_before, high.read_bytes(), strict=True))
        if a != b
    ]
    assert changed == [field_offset(version, "recent_kernel")]  # only that byte moved (3 -> 2)

    assert scanner.apply_feedback() == 1  # 2 -> 1, still active: the low one stays blocked
    assert read_i32(high, version, "recent_kernel") == 1
    assert read_i32(low, version, "recent_kernel") == -1

    assert scanner.apply_feedback() == 2  # 1 -> 0: no longer active, the low one is released
    assert read_i32(high, version, "recent_kernel") == 0
    assert read_i32(low, version, "recent_kernel") == 0
    assert read_i32(low, version, "utilization_switch") == 0
    scanner.close()


def _points_to(fd: str, path: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


def test_feedback_reads_files_read_only_between_rounds(tmp_path: Path) -> None:
    path = region_file(tmp_path, "uid-1", "main", spec(recent_kernel=0))
    scanner = scanner_for(tmp_path, Pods())
    scanner.scan()
    [fd] = [fd for fd in os.listdir("/proc/self/fd") if _points_to(fd, path)]
    flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
    assert flags & os.O_ACCMODE == os.O_RDONLY
    assert scanner.apply_feedback() == 0
    assert path.stat().st_size == LAYOUT_V1.size
    scanner.close()


def test_feedback_loop_runs_and_stops(tmp_path: Path) -> None:
    path = region_file(tmp_path, "uid-1", "main", spec(recent_kernel=50))
    scanner = scanner_for(tmp_path, Pods([booked("uid-1")]))
    done = threading.Event()
    real_apply = scanner.apply_feedback

    def apply_and_signal() -> int:
        written = real_apply()
        done.set()
        return written

    scanner.apply_feedback = apply_and_signal  # type: ignore[method-assign]
    loop = FeedbackLoop(scanner, interval_seconds=0.01)
    loop.start()
    assert done.wait(30)
    loop.stop()
    assert read_i32(path, 1, "recent_kernel") < 50
    scanner.close()


def test_feedback_loop_survives_an_unexpected_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scanner = scanner_for(tmp_path, Pods())

    def broken() -> int:
        raise RuntimeError("bug")

    scanner.apply_feedback = broken  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR, LOGGER)
    FeedbackLoop(scanner).run_once()
    assert any("feedback round failed" in r.getMessage() for r in caplog.records)
