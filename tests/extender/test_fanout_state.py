"""The state's side of a burst: when the filter fans out (`scheduler.book.waits.BindWaits`) and when
interchangeable pods share a node (`in-flight/v2`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.extender.state import SchedulerState
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
)
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.protocol.nodelock import lock_value
from hami_plugin.protocol.objects import read_node, read_pod
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.book.bookings import BindPlan
from hami_plugin.scheduler.settings import SchedulerSettings
from tests.extender.helpers import RecordingObserver, gpu_node, gpu_pod

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SAME_SECOND = "2026-01-01T11:00:00Z"


def _state(look_ahead: int = 16) -> tuple[SchedulerState, RecordingObserver]:
    observer = RecordingObserver()
    state = SchedulerState(
        BookSettings(SchedulerSettings(), burst_look_ahead=look_ahead),
        clock=ManualClock(START),
        observer=observer,
    )
    return state, observer


def _filter(state: SchedulerState, pod: dict[str, Any], count: int = 3) -> str:
    answer = state.filter(read_pod(pod), [f"node-{i}" for i in range(count)])
    assert answer.node_names, answer
    return answer.node_names[0]


def test_nothing_in_flight_hamis_choice() -> None:
    state, observer = _state()
    for index in range(3):
        state.node_upserted(read_node(gpu_node(f"node-{index}", 2)))
    first = _filter(state, gpu_pod("a", memory=30000))
    assert first == "node-0"  # all idle: binpack's tie goes to the smaller name
    assert observer.named("filter_fanned_out") == []


def test_lock_mode_a_booking_on_the_first_node_sends_the_next_pod_on() -> None:
    state, observer = _state()
    for index in range(3):
        state.node_upserted(read_node(gpu_node(f"node-{index}", 2)))
    assert _filter(state, gpu_pod("a")) == "node-0"
    # a's booking stands on node-0: b would wait for the lock there, so it goes to node-1,
    # which fits too (b alone would have gone to node-0, the fuller one)
    assert _filter(state, gpu_pod("b")) == "node-1"
    assert observer.named("filter_fanned_out") == [None]


def test_lock_mode_look_ahead_zero_stays() -> None:
    state, _ = _state(look_ahead=0)
    for index in range(3):
        state.node_upserted(read_node(gpu_node(f"node-{index}", 2)))
    assert _filter(state, gpu_pod("a")) == "node-0"
    assert _filter(state, gpu_pod("b")) == "node-0"


def test_lock_mode_a_lock_another_live_pod_holds() -> None:
    state, _ = _state()
    holder = gpu_pod("holder")
    state.pod_upserted(read_pod(holder))
    lock = lock_value(START, "default", "holder")
    state.node_upserted(read_node(gpu_node("node-0", 2, annotations={ANNOTATION_NODE_LOCK: lock})))
    state.node_upserted(read_node(gpu_node("node-1", 2)))
    assert _filter(state, gpu_pod("a"), 2) == "node-1"


def test_lock_mode_a_lock_of_a_gone_pod_or_an_expired_one_makes_no_wait() -> None:
    state, _ = _state()
    gone = lock_value(START, "default", "gone")
    state.node_upserted(read_node(gpu_node("node-0", 2, annotations={ANNOTATION_NODE_LOCK: gone})))
    state.node_upserted(read_node(gpu_node("node-1", 2)))
    assert _filter(state, gpu_pod("a"), 2) == "node-0"


@pytest.mark.parametrize("protocol", [ALLOCATE_PROTOCOL, ALLOCATE_PROTOCOL_V2])
def test_pods_of_other_shapes_created_in_one_second_fan_out(protocol: str) -> None:
    state, _ = _state()
    for index in range(3):
        state.node_upserted(
            read_node(
                gpu_node(f"node-{index}", 2, annotations={ANNOTATION_ALLOCATE_PROTOCOL: protocol})
            )
        )
    a = gpu_pod("a", memory=1000, created=SAME_SECOND)
    assert _filter(state, a) == "node-0"
    # same count, same second, another memory size: kubelet's Allocate could confuse them
    assert _filter(state, gpu_pod("b", memory=2000, created=SAME_SECOND)) == "node-1"


def test_v1_identical_pods_created_in_one_second_fan_out() -> None:
    state, _ = _state()
    for index in range(3):
        state.node_upserted(
            read_node(
                gpu_node(
                    f"node-{index}",
                    2,
                    annotations={ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL},
                )
            )
        )
    assert _filter(state, gpu_pod("a", created=SAME_SECOND)) == "node-0"
    assert _filter(state, gpu_pod("b", created=SAME_SECOND)) == "node-1"


def test_v2_identical_pods_share_the_node_binpack_chose() -> None:
    state, observer = _state()
    for index in range(3):
        state.node_upserted(
            read_node(
                gpu_node(
                    f"node-{index}",
                    2,
                    annotations={ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL_V2},
                )
            )
        )
    pods = [gpu_pod(f"p{i}", created=SAME_SECOND) for i in range(6)]
    nodes = [_filter(state, pod) for pod in pods[:3]]
    assert nodes == ["node-0"] * 3
    assert observer.named("filter_fanned_out") == []
    # and every bind claims its place in flight at once, without waiting for the others
    for pod in pods[:3]:
        plan = state.plan_bind(read_pod(pod), "node-0")
        assert isinstance(plan, BindPlan)
        assert state.claim_in_flight(plan, deadline=0.0) is None
    assert len(state.in_flight("node-0")) == 3


def test_v1_identical_pods_still_wait_at_bind() -> None:
    state, _ = _state(look_ahead=0)
    state.node_upserted(
        read_node(
            gpu_node("node-0", 2, annotations={ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL})
        )
    )
    a, b = (gpu_pod(name, created=SAME_SECOND) for name in ("a", "b"))
    for pod in (a, b):
        assert _filter(state, pod, 1) == "node-0"
    first = state.plan_bind(read_pod(a), "node-0")
    second = state.plan_bind(read_pod(b), "node-0")
    assert isinstance(first, BindPlan) and isinstance(second, BindPlan)
    assert state.claim_in_flight(first, deadline=0.0) is None
    blocker = state.claim_in_flight(second, deadline=0.0)
    assert blocker is not None and "default/a" in blocker


def test_v1_pods_of_successive_seconds_stay_on_binpacks_node() -> None:
    """A booking whose bind has not returned yet is no reason to fan out when kubelet will tell
    the pods apart once it has: the wait at bind is for a Binding (milliseconds)."""
    state, observer = _state()
    for index in range(3):
        notes = {ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL}
        state.node_upserted(read_node(gpu_node(f"node-{index}", 2, annotations=notes)))
    pods = [gpu_pod(f"p{i}", created=f"2026-01-01T11:00:0{i}Z") for i in range(3)]
    for pod in pods:
        state.pod_upserted(read_pod(pod))  # the watch has them: their creation seconds known
    assert [_filter(state, pod) for pod in pods] == ["node-0"] * 3
    assert observer.named("filter_fanned_out") == []
