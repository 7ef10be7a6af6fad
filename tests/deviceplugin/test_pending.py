"""Which pod a kubelet call is for: the node lock, the pending pods, the in-flight bookings."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.pending import select_pending_pod
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ANNOTATION_DEVICES_ALLOCATED, ContainerDevice
from hami_plugin.protocol.objects import PodInfo
from tests.deviceplugin.records import GPU_A, GPU_B, GPU_C, NODE, make_pod


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(1_767_225_600 + seconds, UTC)


def in_flight(
    name: str, *entries: int, created: int = 0, consumed: int = 0, bind_time: str = "100"
) -> PodInfo:
    """A pod whose booking has one entry per count (GPU A, B, ...), the first `consumed` gone."""
    booked = tuple(
        tuple(ContainerDevice(gpu, "NVIDIA", 1000, 10) for gpu in (GPU_A, GPU_B, GPU_C)[:count])
        for count in entries
    )
    left = tuple(() if index < consumed else entry for index, entry in enumerate(booked))
    pod = make_pod(
        codec.encode_pod_devices(left),
        name=name,
        containers=[f"c{i}" for i in range(len(entries))],
        bind_time=bind_time,
    )
    annotations = {
        **pod.annotations,
        ANNOTATION_DEVICES_ALLOCATED: codec.encode_pod_devices(booked),
    }
    return dataclasses.replace(pod, annotations=annotations, creation_timestamp=at(created))


def test_one_candidate_is_chosen_whatever_the_count() -> None:
    # HAMi's behaviour: the count check in decide_allocation then fails it.
    pod = in_flight("only", 2)
    choice = select_pending_pod(NODE, None, [pod], 1)
    assert choice.pod is pod
    assert not choice.via_lock


def test_several_candidates_are_told_apart_by_count_then_creation() -> None:
    newest = in_flight("newest", 1, created=9, bind_time="1")
    two = in_flight("two", 2, created=5)
    oldest = in_flight("oldest", 1, created=3, bind_time="900")
    pods = [newest, two, oldest]
    assert select_pending_pod(NODE, None, pods, 1).pod is oldest
    assert select_pending_pod(NODE, None, pods, 2).pod is two


def test_a_started_pod_keeps_kubelets_next_calls() -> None:
    started = in_flight("started", 1, 1, created=8, consumed=1)
    older = in_flight("older", 1, created=2)
    assert select_pending_pod(NODE, None, [older, started], 1).pod is started
    # A count the started pod does not ask next is the next pod's.
    assert select_pending_pod(NODE, None, [older, in_flight("s", 2, 3, consumed=1)], 1).pod is older


@pytest.mark.parametrize(
    ("pods", "count", "detail"),
    [
        ([in_flight("a", 1), in_flight("b", 2, created=1)], 3, "no pod in flight asks 3"),
        ([in_flight("a", 1, created=4), in_flight("b", 1, created=4)], 1, "same second"),
        (
            [in_flight("a", 1, 1, consumed=1), in_flight("b", 2, 1, consumed=1)],
            1,
            "several started pods",
        ),
    ],
)
def test_candidates_that_cannot_be_told_apart_fail_without_a_pod(
    pods: list[PodInfo], count: int, detail: str
) -> None:
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, pods, count)
    assert caught.value.reason is FailureReason.NO_MATCHING_POD
    assert not caught.value.pod_known
    message = str(caught.value)
    assert f"allocation of {count} device(s)" in message
    assert detail in message
    assert "default/a" in message


def test_a_candidate_without_a_usable_booking_is_taken_when_it_could_be_the_one() -> None:
    broken = dataclasses.replace(
        make_pod("GPU-x,NVIDIA,notanumber,0:;", name="broken"), creation_timestamp=at(5)
    )
    older = in_flight("older", 1, created=4)
    newer = in_flight("newer", 1, created=6)
    # kubelet admits `older` first: it is the one.
    assert select_pending_pod(NODE, None, [broken, older], 1).pod is older
    # `broken` could come before `newer`, or match a count nobody else asks: it fails instead.
    assert select_pending_pod(NODE, None, [broken, newer], 1).pod is broken
    assert select_pending_pod(NODE, None, [broken, older], 3).pod is broken
    started = in_flight("started", 1, 1, created=9, consumed=1)
    assert select_pending_pod(NODE, None, [broken, started], 1).pod is started


def test_the_lock_still_names_the_pod_among_several() -> None:
    older = in_flight("older", 1, created=1)
    locked = in_flight("locked", 2, created=9)
    choice = select_pending_pod(NODE, "2024-05-10T08:01:02Z,default,locked", [older, locked], 1)
    assert choice.pod is locked
    assert choice.via_lock


@pytest.mark.parametrize(
    "pod",
    [
        make_pod("", phase="Running"),
        make_pod("", bind_phase="success"),
        make_pod("", bind_phase="failed"),
        make_pod("", bind_phase=None),
        make_pod("", bind_time=None),
        make_pod("", vgpu_node="node-2"),
        make_pod("", vgpu_node=None),
        dataclasses.replace(make_pod(""), node_name="node-2"),
    ],
)
def test_pods_not_waiting_on_this_node_are_skipped(pod: PodInfo) -> None:
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, [pod], 1)
    assert caught.value.reason is FailureReason.NO_PENDING_POD
    assert str(caught.value) == f"no binding pod found on node {NODE}"
    assert not caught.value.pod_known


def test_the_node_lock_names_the_pod() -> None:
    older = make_pod("", name="older", bind_time="1")
    locked = make_pod("", name="locked", namespace="team", bind_time="5", bind_phase=None)
    choice = select_pending_pod(NODE, "2024-05-10T08:01:02Z,team,locked", [older, locked], 1)
    assert choice.pod is locked
    assert choice.via_lock


@pytest.mark.parametrize(
    ("lock", "warned"),
    [
        ("2024-05-10T08:01:02Z", False),  # legacy lock, no owner
        ("2024-05-10T08:01:02Z,default,elsewhere", False),  # owner not on this node
        ("2024-05-10T08:01:02Z,default", True),  # malformed
    ],
)
def test_an_unusable_lock_falls_back_to_the_annotations(lock: str, warned: bool) -> None:
    pod = make_pod("", name="pending")
    choice = select_pending_pod(NODE, lock, [pod], 1)
    assert choice.pod is pod
    assert not choice.via_lock
    assert (choice.lock_warning is not None) is warned


def test_lock_owner_that_is_no_longer_pending_is_not_chosen() -> None:
    running = make_pod("", name="done", phase="Running")
    pending = make_pod("", name="pending")
    choice = select_pending_pod(NODE, "2024-05-10T08:01:02Z,default,done", [running, pending], 1)
    assert choice.pod is pending
