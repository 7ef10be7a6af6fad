"""Health: the pure tracker's rules, and the monitor thread driven through the fake NVML."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hami_plugin.clock import Clock, ManualClock
from hami_plugin.deviceplugin.health import HealthChange, HealthMonitor, HealthTracker
from hami_plugin.deviceplugin.nvml import GpuEvent, NvmlBackend, NvmlError, PhysicalGpu
from hami_plugin.deviceplugin.settings import DevicePluginSettings
from hami_plugin.testing.fakenvml.nvml import FakeNvml

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
XID = 0x8
DBE = 0x2
SETTINGS = DevicePluginSettings(node_name="n", health_wait_ms=50)
WAIT_S = 3.0  # generous bound for a change to arrive; tests never measure time


def xid_event(uuid: str | None, xid: int) -> GpuEvent:
    return GpuEvent(uuid=uuid, event_type=XID, data=xid)


# --- HealthTracker (pure) -----------------------------------------------------------------------


def test_critical_xid_marks_the_gpu_once() -> None:
    tracker = HealthTracker([UUID_A, UUID_B], SETTINGS.health)
    assert tracker.on_event(xid_event(UUID_A, 79), now=10.0) == [
        HealthChange(UUID_A, False, "Xid 79")
    ]
    assert tracker.on_event(xid_event(UUID_A, 48), now=11.0) == []
    assert tracker.unhealthy == frozenset({UUID_A})


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(xid: int) -> None:
    tracker = HealthTracker([UUID_A], SETTINGS.health)
    assert tracker.on_event(xid_event(UUID_A, xid), now=0.0) == []
    assert tracker.unhealthy == frozenset()


def test_settings_decide_which_xids_count() -> None:
    extra = replace(SETTINGS, ignored_xids=frozenset({79}))
    assert HealthTracker([UUID_A], extra.health).on_event(xid_event(UUID_A, 79), 0.0) == []
    assert HealthTracker([UUID_A], extra.health).on_event(xid_event(UUID_A, 13), 0.0) != []
    off = replace(SETTINGS, healthchecks_disabled=True)
    assert HealthTracker([UUID_A], off.health).on_event(xid_event(UUID_A, 79), 0.0) == []


def test_ecc_and_other_events_do_not_change_health() -> None:
    tracker = HealthTracker([UUID_A], SETTINGS.health)
    assert tracker.on_event(GpuEvent(UUID_A, DBE, 0), 0.0) == []
    assert tracker.unhealthy == frozenset()


def test_unknown_gpu_is_ignored_and_unnamed_gpu_marks_all() -> None:
    tracker = HealthTracker([UUID_A, UUID_B], SETTINGS.health)
    assert tracker.on_event(xid_event("GPU-elsewhere", 79), 0.0) == []
    changes = tracker.on_event(xid_event(None, 79), 0.0)
    assert [(c.uuid, c.healthy) for c in changes] == [(UUID_A, False), (UUID_B, False)]


def test_recovery_window_starts_at_the_last_error() -> None:
    tracker = HealthTracker([UUID_A], replace(SETTINGS, health_recovery_seconds=300).health)
    tracker.on_event(xid_event(UUID_A, 79), now=1000.0)
    assert tracker.recovery_candidates(1299.0) == []
    assert tracker.recovery_candidates(1300.0) == [UUID_A]
    tracker.on_event(xid_event(UUID_A, 79), now=1200.0)  # a new error restarts the window
    assert tracker.recovery_candidates(1300.0) == []
    assert tracker.recovery_candidates(1500.0) == [UUID_A]
    assert tracker.mark_healthy(UUID_A, "ok") == [HealthChange(UUID_A, True, "ok")]
    assert tracker.mark_healthy(UUID_A, "ok") == []


def test_carried_state_keeps_unhealthy_gpus_still_watched() -> None:
    settings = replace(SETTINGS, health_recovery_seconds=300)
    old = HealthTracker([UUID_A, UUID_B], settings.health)
    old.mark_all_unhealthy("wait failed", now=1000.0)
    new = HealthTracker([UUID_B, "GPU-new"], settings.health, carried=old)
    assert new.unhealthy == frozenset({UUID_B})
    assert new.recovery_candidates(1299.0) == []
    assert new.recovery_candidates(1300.0) == [UUID_B]


def test_recovery_zero_disables_it() -> None:
    tracker = HealthTracker([UUID_A], replace(SETTINGS, health_recovery_seconds=0).health)
    tracker.mark_all_unhealthy("wait failed", 0.0)
    assert tracker.recovery_candidates(1e9) == []


# --- HealthMonitor through the fake NVML ----------------------------------------------------------


def gpus_yaml(healthy_b: bool = True, xid_b: int | None = None, healthy_a: bool = True) -> str:
    text = (
        f"gpus:\n  - {{uuid: {UUID_A}, healthy: {str(healthy_a).lower()}}}\n"
        f"  - {{uuid: {UUID_B}, healthy: {str(healthy_b).lower()}"
    )
    return text + (f", xid: {xid_b}}}\n" if xid_b is not None else "}\n")


def write(path: Path, text: str) -> None:
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    os.replace(aside, path)


GPUS = [
    PhysicalGpu(UUID_A, 0, "NVIDIA Fake GPU", 16384, -1, False, "00000000:10:00.0", 0),
    PhysicalGpu(UUID_B, 1, "NVIDIA Fake GPU", 16384, -1, False, "00000000:11:00.0", 1),
]


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "gpus.yaml"
        write(self.path, gpus_yaml())
        self.nvml = FakeNvml(str(self.path))
        self.backend = NvmlBackend(self.nvml)
        self.backend.start()
        self.changes: queue.Queue[HealthChange] = queue.Queue()
        self.monitors: list[HealthMonitor] = []

    def monitor(
        self,
        settings: DevicePluginSettings = SETTINGS,
        clock: Clock | None = None,
        on_change: Callable[[HealthChange], None] | None = None,
    ) -> HealthMonitor:
        monitor = HealthMonitor(self.backend, settings.health, on_change or self.changes.put, clock)
        self.monitors.append(monitor)
        return monitor

    def next_change(self) -> HealthChange:
        return self.changes.get(timeout=WAIT_S)

    def no_change_for(self, seconds: float) -> bool:
        try:
            self.changes.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    for monitor in h.monitors:
        monitor.stop()
    assert not [t for t in threading.enumerate() if t.name == "hami-health"]


def test_file_flip_reports_the_gpu_unhealthy(harness: Harness) -> None:
    monitor = harness.monitor()
    monitor.start(GPUS)
    write(harness.path, gpus_yaml(healthy_b=False))
    assert harness.next_change() == HealthChange(UUID_B, False, "Xid 79")
    assert monitor.unhealthy == frozenset({UUID_B})


def test_ignored_xids_change_nothing(harness: Harness) -> None:
    harness.monitor().start(GPUS)
    harness.nvml.inject_event(UUID_B, XID, 13)  # queued in order, so both are seen first
    harness.nvml.inject_event(UUID_A, XID, 31)
    write(harness.path, gpus_yaml(xid_b=48))
    assert harness.next_change() == HealthChange(UUID_B, False, "Xid 48")


def test_wait_failure_marks_every_gpu_unhealthy(harness: Harness) -> None:
    harness.monitor().start(GPUS)
    harness.nvml.inject_wait_error()
    first, second = harness.next_change(), harness.next_change()
    assert {first.uuid, second.uuid} == {UUID_A, UUID_B}
    assert not first.healthy and not second.healthy
    assert first.reason == "NVML event wait failed: Unknown Error"


def test_recovery_with_an_injected_clock(harness: Harness) -> None:
    clock = ManualClock()
    settings = replace(SETTINGS, health_recovery_seconds=300)
    harness.monitor(settings, clock).start(GPUS)
    write(harness.path, gpus_yaml(healthy_b=False))
    assert harness.next_change() == HealthChange(UUID_B, False, "Xid 79")

    clock.advance(400)  # window passed, but the GPU still does not answer NVML
    assert harness.no_change_for(0.3)
    write(harness.path, gpus_yaml(healthy_b=True))
    assert harness.next_change() == HealthChange(
        UUID_B, True, "no errors for 300 s and NVML answers"
    )


def test_no_recovery_before_the_window(harness: Harness) -> None:
    clock = ManualClock()
    settings = replace(SETTINGS, health_recovery_seconds=300)
    harness.monitor(settings, clock).start(GPUS)
    write(harness.path, gpus_yaml(xid_b=48))  # Xid while the GPU still answers NVML
    assert not harness.next_change().healthy
    clock.advance(299)
    assert harness.no_change_for(0.3)
    clock.advance(1)
    assert harness.next_change().healthy


def test_recovery_disabled_by_zero(harness: Harness) -> None:
    clock = ManualClock()
    harness.monitor(replace(SETTINGS, health_recovery_seconds=0), clock).start(GPUS)
    write(harness.path, gpus_yaml(xid_b=48))
    assert not harness.next_change().healthy
    clock.advance(1e6)
    assert harness.no_change_for(0.3)


def test_recovery_through_the_fake_file_with_a_tiny_window(harness: Harness) -> None:
    monitor = harness.monitor(replace(SETTINGS, health_recovery_seconds=0.2))
    monitor.start(GPUS)
    write(harness.path, gpus_yaml(healthy_b=False))
    assert harness.next_change() == HealthChange(UUID_B, False, "Xid 79")
    write(harness.path, gpus_yaml(healthy_b=True))
    assert harness.next_change() == HealthChange(
        UUID_B, True, "no errors for 0.2 s and NVML answers"
    )
    assert monitor.unhealthy == frozenset()


def test_gpu_lost_at_start_is_unhealthy_then_recovers(harness: Harness) -> None:
    write(harness.path, gpus_yaml(healthy_a=False))
    clock = ManualClock()
    harness.monitor(replace(SETTINGS, health_recovery_seconds=10), clock).start(GPUS)
    change = harness.next_change()
    assert (change.uuid, change.healthy) == (UUID_A, False)
    assert "event registration failed: GPU is lost" in change.reason
    write(harness.path, gpus_yaml())
    clock.advance(10)
    assert harness.next_change() == HealthChange(
        UUID_A, True, "no errors for 10 s and NVML answers"
    )
    # re-registered on recovery: a new Xid on it is seen
    write(harness.path, gpus_yaml(healthy_a=False))
    assert harness.next_change() == HealthChange(UUID_A, False, "Xid 79")


def test_disabled_health_checks_start_no_thread(harness: Harness) -> None:
    monitor = harness.monitor(replace(SETTINGS, healthchecks_disabled=True))
    monitor.start(GPUS)
    assert not [t for t in threading.enumerate() if t.name == "hami-health"]
    write(harness.path, gpus_yaml(healthy_b=False))
    assert harness.no_change_for(0.2)


def test_failing_handler_does_not_stop_the_loop(harness: Harness) -> None:
    seen: list[HealthChange] = []

    def handler(change: HealthChange) -> None:
        seen.append(change)
        harness.changes.put(change)
        raise RuntimeError("consumer bug")

    harness.monitor(on_change=handler).start(GPUS)
    write(harness.path, gpus_yaml(healthy_b=False))
    harness.next_change()
    write(harness.path, gpus_yaml(healthy_b=False, healthy_a=False))
    assert harness.next_change().uuid == UUID_A
    assert len(seen) == 2


def test_stop_joins_and_start_again_works(harness: Harness) -> None:
    monitor = harness.monitor(replace(SETTINGS, health_wait_ms=5000))
    monitor.start(GPUS)
    write(harness.path, gpus_yaml(xid_b=48))
    assert harness.next_change().uuid == UUID_B
    with pytest.raises(RuntimeError, match="already running"):
        monitor.start(GPUS)
    monitor.stop()  # the loop waits in slices, so a 5 s NVML wait does not hold this up
    assert not [t for t in threading.enumerate() if t.name == "hami-health"]
    monitor.start(GPUS)
    assert monitor.unhealthy == frozenset({UUID_B})  # a restart does not forget
    monitor.stop()
    monitor.start(GPUS[:1])
    assert monitor.unhealthy == frozenset()  # ... GPUs still listed only
    write(harness.path, gpus_yaml(xid_b=48, healthy_a=False))
    assert harness.next_change().uuid == UUID_A


def test_event_set_failure_leaves_health_checks_off(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    class NoEventSets(NvmlBackend):
        def create_event_set(self) -> object:
            raise NvmlError("NVML event set creation failed: Not Supported")

    backend = NoEventSets(harness.nvml)
    monitor = HealthMonitor(backend, SETTINGS.health, harness.changes.put)
    harness.monitors.append(monitor)
    monitor.start(GPUS)
    monitor.stop()
    assert "continuing with health checks disabled" in caplog.text
