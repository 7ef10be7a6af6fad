"""The scheduler state's rules: bookings, the watch-fed ledger, health, in-flight pods."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.extender.bind import refusal_message
from hami_plugin.extender.state import SchedulerState
from hami_plugin.protocol.codec import encode_pod_devices
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICE_SCORING_WEIGHTS,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
)
from hami_plugin.protocol.nodelock import LockRelease
from hami_plugin.protocol.objects import PodInfo, read_node, read_pod
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.book.bookings import BindPlan, BindRefusal, BookingPhase
from hami_plugin.scheduler.settings import SchedulerSettings
from tests.extender.helpers import RecordingObserver, cpu_pod, gpu_node, gpu_pod

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def state(clock: ManualClock, observer: RecordingObserver) -> SchedulerState:
    return SchedulerState(BookSettings(SchedulerSettings()), clock=clock, observer=observer)


def add_node(state: SchedulerState, node: dict[str, Any]) -> None:
    state.node_upserted(read_node(node))


def add_pod(state: SchedulerState, pod: dict[str, Any]) -> PodInfo:
    info = read_pod(pod)
    state.pod_upserted(info)
    return info


def used_slots(state: SchedulerState, node: str) -> int:
    usage = state.node_usage(node)
    assert usage is not None
    return sum(usage.used)


def patched(pod: dict[str, Any], plan: BindPlan, *, bound: bool = False) -> dict[str, Any]:
    """The pod as the watch shows it after bind's patch (and Binding)."""
    pod = {**pod, "metadata": dict(pod["metadata"]), "spec": dict(pod["spec"])}
    pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], **plan.annotations}
    pod["metadata"]["resourceVersion"] = "2"
    if bound:
        pod["spec"]["nodeName"] = plan.node
    return pod


def bound_plan(state: SchedulerState, pod: dict[str, Any], node: str) -> BindPlan:
    plan = state.plan_bind(read_pod(pod), node)
    assert isinstance(plan, BindPlan), plan
    return plan


# --- filter -------------------------------------------------------------------------------------


def test_filter_books_the_chosen_node_in_memory(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    answer = state.filter(read_pod(gpu_pod("a")), ["n1"])
    assert answer.node_names == ["n1"]
    assert answer.failed_nodes is None
    assert answer.outcome == "fit"
    assert state.bookings() == {"default/a": ("n1", BookingPhase.FILTERED)}
    # the one slot is booked: the next pod does not fit
    second = state.filter(read_pod(gpu_pod("b")), ["n1"])
    assert second.node_names is None
    assert second.failed_nodes == {"n1": "1/1 CardTimeSlicingExhausted"}
    assert second.outcome == "no_fit"
    assert second.failure_counts == {"CardTimeSlicingExhausted": 1}


def test_no_gpu_pod_passes_every_node_untouched(state: SchedulerState) -> None:
    answer = state.filter(read_pod(cpu_pod("web")), ["n1", "n2"])
    assert answer.node_names == ["n1", "n2"]
    assert answer.outcome == "no_gpu"
    assert state.bookings() == {}


def test_unregistered_nodes_and_hamis_reasons(state: SchedulerState) -> None:
    add_node(state, gpu_node("small", 1, memory=500))
    answer = state.filter(read_pod(gpu_pod("a", memory=1000)), ["small", "cpu-only"])
    assert answer.failed_nodes == {
        "small": "1/1 CardInsufficientMemory",
        "cpu-only": "node unregistered",
    }
    assert answer.failure_counts == {"CardInsufficientMemory": 1, "NodeUnregistered": 1}
    messages = [event.message for event in answer.events]
    assert messages == [
        "1 nodes CardInsufficientMemory(small)",
        "no available node, 2 nodes do not meet",
    ]


def test_invalid_annotation_is_hamis_error(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1"))
    pod = gpu_pod("a", annotations={ANNOTATION_DEVICE_SCORING_WEIGHTS: "slot=x"})
    answer = state.filter(read_pod(pod), ["n1"])
    assert answer.error == (
        'calcScore failed invalid hami.io/device-scoring-weights annotation "slot=x": '
        "expected slot, core, and memory weights for pod a"
    )
    assert answer.node_names is None and answer.failed_nodes is None
    assert state.bookings() == {}


def test_booking_expires_and_is_counted(
    state: SchedulerState, clock: ManualClock, observer: RecordingObserver
) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    assert state.filter(read_pod(gpu_pod("a")), ["n1"]).node_names == ["n1"]
    clock.advance(29)
    assert state.expire_bookings() == 0
    clock.advance(2)
    assert state.expire_bookings() == 1
    assert observer.named("booking_expired") == [None]
    assert used_slots(state, "n1") == 0
    assert state.filter(read_pod(gpu_pod("b")), ["n1"]).node_names == ["n1"]


def test_refilter_drops_the_previous_booking(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    add_node(state, gpu_node("n2", 1, split=1))
    assert state.filter(read_pod(gpu_pod("a")), ["n1"]).node_names == ["n1"]
    assert state.filter(read_pod(gpu_pod("a")), ["n2"]).node_names == ["n2"]
    assert used_slots(state, "n1") == 0
    assert used_slots(state, "n2") == 1


def test_pod_event_without_annotations_keeps_the_booking(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    add_pod(state, pod)  # e.g. a status update between filter and bind
    assert used_slots(state, "n1") == 1
    assert state.booking_phase("default", "a") is BookingPhase.FILTERED


def test_bind_patch_event_replaces_the_booking_never_double(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=2))
    pod = gpu_pod("a")
    add_pod(state, pod)
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    assert state.booking_phase("default", "a") is BookingPhase.BINDING
    state.bind_succeeded(plan)
    assert state.booking_phase("default", "a") is BookingPhase.BOUND
    # a late event from before the patch does not free the GPUs
    add_pod(state, pod)
    assert used_slots(state, "n1") == 1
    add_pod(state, patched(pod, plan))
    assert state.booking_phase("default", "a") is None
    assert used_slots(state, "n1") == 1
    add_pod(state, patched(pod, plan, bound=True))
    assert used_slots(state, "n1") == 1


def test_a_bound_pod_is_known_bound_until_the_watch_shows_it(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=2))
    pod = gpu_pod("a")
    add_pod(state, pod)
    info = read_pod(pod)
    state.filter(info, ["n1"])
    plan = bound_plan(state, pod, "n1")
    assert state.bound_node(info) is None  # BINDING: the Binding may still fail
    state.bind_succeeded(plan)
    assert state.bound_node(info) == "n1"
    assert state.bound_node(replace(info, uid="another-pod-of-that-name")) is None
    add_pod(state, patched(pod, plan, bound=True))
    assert state.bound_node(info) is None  # the watch shows it: the pod itself says so now


def test_failed_pending_pod_is_not_counted(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    state.bind_succeeded(plan)
    shown = patched(pod, plan)
    add_pod(state, shown)
    assert used_slots(state, "n1") == 1
    shown["metadata"]["annotations"][ANNOTATION_BIND_PHASE] = "failed"
    add_pod(state, shown)
    assert used_slots(state, "n1") == 0


def test_bind_failure_frees_the_booking(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    state.bind_failed(plan)
    assert used_slots(state, "n1") == 0
    assert state.bookings() == {}


def test_bind_without_booking_decides_again(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    plan = bound_plan(state, gpu_pod("a"), "n1")
    assert plan.rebooked
    assert plan.annotations[ANNOTATION_VGPU_NODE] == "n1"
    assert plan.needs_lock and not plan.protocol
    refused = state.plan_bind(read_pod(gpu_pod("b")), "n1")
    assert isinstance(refused, BindRefusal) and refused.annotation_error is None
    assert refusal_message(refused) == (
        "pod default/b does not fit on node n1: 1/1 CardTimeSlicingExhausted"
    )


def test_bind_refusal_keeps_the_annotation_error_as_data(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1"))
    pod = gpu_pod("a", annotations={ANNOTATION_DEVICE_SCORING_WEIGHTS: "slot=x"})
    refused = state.plan_bind(read_pod(pod), "n1")
    assert isinstance(refused, BindRefusal) and refused.failure is None
    assert refused.annotation_error is not None
    assert refused.annotation_error.key == ANNOTATION_DEVICE_SCORING_WEIGHTS
    # rendered only at the edge, as the filter renders it
    assert refusal_message(refused) == (
        'calcScore failed invalid hami.io/device-scoring-weights annotation "slot=x": '
        "expected slot, core, and memory weights for pod a"
    )
    assert state.bookings() == {}


def test_deleted_pod_frees_booking_and_queues_its_lock(state: SchedulerState) -> None:
    lock = f"{START:%Y-%m-%dT%H:%M:%SZ},default,a"
    add_node(state, gpu_node("n1", 1, split=1, annotations={ANNOTATION_NODE_LOCK: lock}))
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    state.bind_succeeded(plan)
    info = add_pod(state, patched(pod, plan, bound=True))
    state.pod_deleted(info)
    assert used_slots(state, "n1") == 0
    assert state.bookings() == {}
    assert state.recovery_due
    assert state.take_lock_releases() == [LockRelease("n1", "default", "a", lock)]


def test_simulation_answers_the_node_object_and_books_nothing(state: SchedulerState) -> None:
    full = gpu_node("full", 1, memory=500)
    roomy = gpu_node("roomy", 2)
    answer = state.filter(
        read_pod(gpu_pod("a")), None, nodes=[full, roomy, {"metadata": {"name": "cpu"}}]
    )
    assert answer.nodes == [roomy]
    assert answer.node_names is None
    assert answer.failed_nodes == {"full": "1/1 CardInsufficientMemory", "cpu": "node unregistered"}
    assert state.bookings() == {}
    assert state.registered_nodes() == []


def test_node_label_selector(clock: ManualClock) -> None:
    state = SchedulerState(
        BookSettings(SchedulerSettings(), node_selector={"gpu": "on"}), clock=clock
    )
    add_node(state, gpu_node("in", labels={"gpu": "on"}))
    add_node(state, gpu_node("out", labels={"gpu": "off"}))
    assert state.registered_nodes() == ["in"]
    add_node(state, gpu_node("in", labels={"gpu": "off"}))
    assert state.registered_nodes() == []


def test_unhealthy_node_loses_its_gpus_and_handshake(
    state: SchedulerState, clock: ManualClock
) -> None:
    add_node(state, gpu_node("n1"))
    assert state.registered_nodes() == ["n1"]
    handshake = state.take_handshakes()["n1"]
    assert handshake is not None and handshake.startswith("Requesting_")
    gone = gpu_node("n1", annotations={ANNOTATION_NODE_HANDSHAKE: handshake})
    gone["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    add_node(state, gone)
    assert state.registered_nodes() == []
    assert state.take_handshakes() == {"n1": None}  # HAMi's NodeCleanUp deletes it


def test_stale_allocations(state: SchedulerState, clock: ManualClock) -> None:
    add_node(state, gpu_node("n1", 1, split=2))
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    state.bind_succeeded(plan)
    add_pod(state, patched(pod, plan, bound=True))
    assert state.stale_allocations(clock.now(), 120) == []
    clock.advance(121)
    stale = state.stale_allocations(clock.now(), 120)
    assert [(s.pod.key, s.node) for s in stale] == [("default/a", "n1")]


# --- in flight ----------------------------------------------------------------------------------


def test_protocol_binds_wait_only_for_confusable_pods(
    state: SchedulerState, clock: ManualClock
) -> None:
    add_node(state, gpu_node("n1", 4, protocol=True))
    one = gpu_pod("one", created="2026-01-01T00:00:00Z")
    two = gpu_pod("two", created="2026-01-01T00:00:00Z")
    pair = gpu_pod("pair", gpus=2, created="2026-01-01T00:00:00Z")
    for pod in (one, two, pair):
        state.filter(read_pod(pod), ["n1"])
    plan_one = bound_plan(state, one, "n1")
    assert plan_one.protocol and not plan_one.needs_lock
    assert state.claim_in_flight(plan_one, clock.monotonic()) is None
    # same count, same creation second: kubelet could take one for the other
    plan_two = bound_plan(state, two, "n1")
    blocker = state.claim_in_flight(plan_two, clock.monotonic())
    assert blocker is not None and "default/one" in blocker
    # another count cannot be confused
    plan_pair = bound_plan(state, pair, "n1")
    assert state.claim_in_flight(plan_pair, clock.monotonic()) is None


def test_waiting_bind_wakes_when_the_blocker_finishes(
    state: SchedulerState, clock: ManualClock
) -> None:
    add_node(state, gpu_node("n1", 4, protocol=True))
    one, two = gpu_pod("one"), gpu_pod("two")
    for pod in (one, two):
        state.filter(read_pod(pod), ["n1"])
    plan_one = bound_plan(state, one, "n1")
    assert state.claim_in_flight(plan_one, clock.monotonic()) is None
    state.bind_succeeded(plan_one)
    plan_two = bound_plan(state, two, "n1")
    result: list[str | None] = []
    waiter = threading.Thread(
        target=lambda: result.append(state.claim_in_flight(plan_two, clock.monotonic() + 30))
    )
    waiter.start()
    shown = patched(one, plan_one, bound=True)
    add_pod(state, shown)  # the watch catches up: still in flight
    assert waiter.is_alive()
    # the device plugin consumed the pod's only entry: finished
    shown["metadata"]["annotations"][ANNOTATION_DEVICES_TO_ALLOCATE] = encode_pod_devices(((),))
    add_pod(state, shown)
    waiter.join(10)
    assert result == [None]
    assert set(state.in_flight("n1")) == {"default/one", "default/two"}


def test_unreadable_in_flight_pod_blocks_its_node(
    state: SchedulerState, clock: ManualClock
) -> None:
    add_node(state, gpu_node("n1", 4, protocol=True))
    broken = gpu_pod(
        "broken",
        gpus=3,
        annotations={
            ANNOTATION_VGPU_NODE: "n1",
            ANNOTATION_BIND_PHASE: "allocating",
            ANNOTATION_BIND_TIME: "1",
            ANNOTATION_DEVICES_TO_ALLOCATE: "x,y:;",
        },
    )
    add_pod(state, broken)
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = bound_plan(state, pod, "n1")
    blocker = state.claim_in_flight(plan, clock.monotonic())
    assert blocker is not None and "no readable booking" in blocker
    state.pod_deleted(read_pod(broken))
    assert state.claim_in_flight(plan, clock.monotonic()) is None


# --- pods re-created under the same name, lost watch events -------------------------------------


def _with_uid(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    return {**pod, "metadata": {**pod["metadata"], "uid": uid}}


def test_a_predecessors_late_events_never_free_its_successors_booking(
    state: SchedulerState,
) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    old = _with_uid(gpu_pod("web-0"), "uid-old")
    add_pod(state, old)
    new = _with_uid(gpu_pod("web-0"), "uid-new")
    # kube-scheduler saw the successor before our watch saw the predecessor go
    assert state.filter(read_pod(new), ["n1"]).node_names == ["n1"]
    plan = bound_plan(state, new, "n1")
    state.bind_succeeded(plan)
    add_pod(state, old)  # a late MODIFIED of the predecessor
    state.pod_deleted(read_pod(old))  # and its DELETED
    assert used_slots(state, "n1") == 1
    assert state.booking_phase("default", "web-0") is BookingPhase.BOUND
    assert state.filter(read_pod(gpu_pod("other")), ["n1"]).node_names is None
    # the successor's own events take over
    add_pod(state, patched(new, plan, bound=True))
    assert state.bookings() == {}
    assert used_slots(state, "n1") == 1


def test_a_seen_pods_booking_goes_when_a_successor_shows_up(state: SchedulerState) -> None:
    add_node(state, gpu_node("n1", 1, split=1))
    old = _with_uid(gpu_pod("web-0"), "uid-old")
    add_pod(state, old)
    assert state.filter(read_pod(old), ["n1"]).node_names == ["n1"]
    add_pod(state, _with_uid(gpu_pod("web-0"), "uid-new"))  # old deleted, DELETED lost
    assert state.bookings() == {}
    assert used_slots(state, "n1") == 0


def test_a_bound_pod_missing_from_a_relist_is_freed_after_the_ttl(
    state: SchedulerState, clock: ManualClock
) -> None:
    add_node(state, gpu_node("n1", 2, split=1))
    gone, late = gpu_pod("gone"), gpu_pod("late")
    for pod in (gone, late):
        state.filter(read_pod(pod), ["n1"])
        state.bind_succeeded(bound_plan(state, pod, "n1"))
    state.pods_relisted()  # neither is in the list
    clock.advance(10)
    add_pod(state, late)  # created after the list was taken: its events arrive
    clock.advance(25)
    state.expire_bookings()
    assert set(state.bookings()) == {"default/late"}
    assert used_slots(state, "n1") == 1
