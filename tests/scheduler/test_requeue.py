"""Which pods kube-scheduler parked, and when each may be nudged again (the pure rules of
`hami_plugin.scheduler.requeue`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.objects import PodCondition, PodInfo, read_pod
from hami_plugin.scheduler.requeue import RequeueTracker, parked
from hami_plugin.scheduler.settings import SchedulerSettings
from tests.extender.helpers import cpu_pod, gpu_pod

SETTINGS = SchedulerSettings()
OURS = "hami-scheduler"
FAILED = PodCondition("False", "Unschedulable", 'Post "http://x/filter": connection refused')


def parked_gpu_pod(name: str = "p", uid: str = "") -> PodInfo:
    pod = read_pod(gpu_pod(name, uid=uid or f"uid-{name}"))
    return replace(pod, scheduler_name=OURS, scheduled=FAILED)


def test_read_pod_keeps_the_pod_scheduled_condition() -> None:
    obj = gpu_pod("p")
    obj["status"]["conditions"] = [
        {"type": "Initialized", "status": "True"},
        {"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": "m"},
    ]
    assert read_pod(obj).scheduled == PodCondition("False", "SchedulerError", "m")
    assert read_pod(gpu_pod("q")).scheduled is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, True),
        ({"scheduled": PodCondition("False", "SchedulerError", "not synced")}, True),
        ({"scheduled": None}, False),
        ({"scheduled": PodCondition("True")}, False),
        ({"scheduled": PodCondition("False", "SchedulingGated")}, False),
        ({"node_name": "gpu-1"}, False),
        ({"deleting": True}, False),
        ({"phase": "Failed"}, False),
        ({"scheduler_name": "default-scheduler"}, False),
    ],
)
def test_a_pod_is_parked_only_when_pending_unbound_ours_and_failed(
    change: dict[str, object], expected: bool
) -> None:
    pod = replace(parked_gpu_pod(), **change)  # type: ignore[arg-type]
    assert parked(pod, OURS, SETTINGS) is expected


def test_a_pod_that_asks_for_no_gpu_is_not_ours_to_nudge() -> None:
    pod = replace(read_pod(cpu_pod("c")), scheduler_name=OURS, scheduled=FAILED)
    assert not parked(pod, OURS, SETTINGS)


def test_nothing_is_due_while_the_window_is_shut() -> None:
    tracker = RequeueTracker()
    pods = [parked_gpu_pod("a")]
    assert tracker.due(pods, 100.0) == []
    tracker.open_window(100.0, 60)
    assert tracker.due(pods, 100.0) == pods
    assert tracker.due(pods, 160.0) == []


def test_a_pod_still_parked_is_due_again_after_2_4_8_then_20_s() -> None:
    tracker = RequeueTracker(first_interval_seconds=2, max_interval_seconds=20)
    tracker.open_window(0.0, 1000)
    pod = parked_gpu_pod("a")
    now, gaps = 0.0, []
    for _ in range(6):
        assert tracker.due([pod], now) == [pod]
        tracker.nudged(pod, now)
        # the first half second at which the pod is due again
        gap = next(t / 2 for t in range(1, 100) if tracker.due([pod], now + t / 2))
        gaps.append(gap)
        now += gap
    assert gaps == [2, 4, 8, 16, 20, 20]


def test_a_new_pod_of_the_same_name_is_due_at_once() -> None:
    tracker = RequeueTracker()
    tracker.open_window(0.0, 1000)
    tracker.nudged(parked_gpu_pod("a", uid="u1"), 10.0)
    successor = parked_gpu_pod("a", uid="u2")
    assert tracker.due([successor], 10.5) == [successor]


def test_once_the_window_shuts_nothing_is_remembered() -> None:
    tracker = RequeueTracker()
    tracker.open_window(0.0, 10)
    pod = parked_gpu_pod("a")
    tracker.nudged(pod, 1.0)
    assert len(tracker) == 1
    assert tracker.due([pod], 10.0) == []
    assert len(tracker) == 0


def test_a_later_window_close_wins() -> None:
    tracker = RequeueTracker()
    tracker.open_window(0.0, 60)
    tracker.open_window(10.0, 5)
    assert tracker.window_open(59.0)
    assert not tracker.window_open(60.0)


@given(
    st.lists(st.tuples(st.sets(st.integers(0, 9)), st.floats(0, 5, allow_nan=False)), max_size=40)
)
def test_memory_follows_the_parked_pods_and_no_pod_is_nudged_twice_within_its_interval(
    passes: list[tuple[set[int], float]],
) -> None:
    tracker = RequeueTracker(first_interval_seconds=1, max_interval_seconds=3)
    tracker.open_window(0.0, 1e9)
    now = 0.0
    last: dict[str, float] = {}
    for present, step in passes:
        now += step
        pods = [parked_gpu_pod(f"p{n}") for n in sorted(present)]
        for pod in tracker.due(pods, now):
            assert pod.key not in last or now - last[pod.key] >= 1
            tracker.nudged(pod, now)
            last[pod.key] = now
        assert len(tracker) <= len(present)
        last = {key: at for key, at in last.items() if key in {p.key for p in pods}}
