"""The scheduler's state with a booking key: only signed bookings fill nodes or block binds.

Attacks a pod author can mount by writing HAMi's annotations by hand (issue: ledger poisoning
and a forged allocation blocking a node), each checked against the state with a key (nothing
counted) and without one (counted, as HAMi does); then the property that whatever annotations
any pods carry, the state books exactly what the signed bookings alone give.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.clock import ManualClock
from hami_plugin.extender.state import SchedulerState
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
)
from hami_plugin.protocol.objects import PodInfo, read_node, read_pod
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingFields,
    BookingKeys,
)
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.book.bookings import BindPlan
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.testing.apiserver import make_container, make_pod
from tests.bookings import verify_pod
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import KEYS, OTHER_KEYS, booking, signed

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
EVERY_GPU = [("GPU-n1-0", 32768, 100), ("GPU-n1-1", 32768, 100)]


def keyed(clock: ManualClock, keys: Callable[[], BookingKeys] = lambda: KEYS) -> SchedulerState:
    return SchedulerState(BookSettings(SchedulerSettings()), clock=clock, booking_keys=keys)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def state(clock: ManualClock) -> SchedulerState:
    return keyed(clock)


def add_pod(state: SchedulerState, pod: dict[str, Any]) -> PodInfo:
    info = read_pod(pod)
    state.pod_upserted(info)
    return info


def used(state: SchedulerState, node: str = "n1") -> tuple[int, int]:
    """Slots and MiB booked on the node."""
    usage = state.node_usage(node)
    assert usage is not None
    return sum(usage.used), sum(usage.used_memory_mib)


def whole_node_pod(name: str = "big") -> dict[str, Any]:
    """A real pod that needs both GPUs of n1 in full."""
    return gpu_pod(name, gpus=2, memory=32768)


def with_spec(pod: dict[str, Any], node_name: str = "", phase: str = "Pending") -> dict[str, Any]:
    pod["spec"]["nodeName"] = node_name
    pod["status"] = {"phase": phase}
    return pod


def hog() -> dict[str, Any]:
    """The ledger-poisoning pod: asks for no GPU, bound nowhere, books every GPU of n1."""
    return make_pod("hog", annotations=booking("n1", EVERY_GPU, phase="success"), uid="uid-hog")


def forged_pods() -> list[dict[str, Any]]:
    """Pods whose booking of every GPU of n1 must not count with a key."""
    real = signed(gpu_pod("real", annotations=booking("n1", EVERY_GPU[:1])))
    real_signature = real["metadata"]["annotations"][ANNOTATION_BOOKING_SIGNATURE]
    copied = gpu_pod(
        "copier",
        annotations={**booking("n1", EVERY_GPU), ANNOTATION_BOOKING_SIGNATURE: real_signature},
    )
    return [
        hog(),
        # a GPU pod bound to n1 by its author (spec.nodeName), no signature
        with_spec(gpu_pod("unsigned", gpus=2, annotations=booking("n1", EVERY_GPU)), "n1"),
        # signed with a key the scheduler does not hold
        signed(
            with_spec(gpu_pod("foreign", annotations=booking("n1", EVERY_GPU)), "n1"), OTHER_KEYS
        ),
        # a signature made for another pod (the UID differs)
        signed(
            with_spec(gpu_pod("other-uid", annotations=booking("n1", EVERY_GPU)), "n1"),
            uid="uid-default-victim",
        ),
        # a signature copied from a real booking, with its own devices
        with_spec(copied, "n1"),
        # a real booking for n1 on a pod bound to another node
        signed(with_spec(gpu_pod("elsewhere", annotations=booking("n1", EVERY_GPU)), "n2")),
        # signed, but the pod asks for no GPU
        signed(make_pod("cpu", annotations=booking("n1", EVERY_GPU), uid="uid-cpu")),
    ]


# --- ledger poisoning ---------------------------------------------------------------------------


@pytest.mark.parametrize("pod", forged_pods(), ids=lambda pod: pod["metadata"]["name"])
def test_a_forged_booking_changes_no_free_capacity(
    state: SchedulerState, pod: dict[str, Any]
) -> None:
    state.node_upserted(read_node(gpu_node("n1", 2)))
    state.node_upserted(read_node(gpu_node("n2", 2)))
    add_pod(state, pod)
    assert used(state) == (0, 0)
    assert state.filter(read_pod(whole_node_pod()), ["n1"]).node_names == ["n1"]


def test_without_a_key_the_hog_fills_the_node_as_hami(clock: ManualClock) -> None:
    state = SchedulerState(BookSettings(SchedulerSettings()), clock=clock)
    state.node_upserted(read_node(gpu_node("n1", 2)))
    add_pod(state, hog())
    assert used(state) == (2, 65536)
    answer = state.filter(read_pod(whole_node_pod()), ["n1"])
    assert answer.node_names is None
    assert answer.failed_nodes is not None and "n1" in answer.failed_nodes


def test_a_signed_pod_bound_by_a_previous_leader_counts(state: SchedulerState) -> None:
    state.node_upserted(read_node(gpu_node("n1", 2)))
    pod = signed(
        with_spec(gpu_pod("trainer", annotations=booking("n1", EVERY_GPU)), "n1", "Running")
    )
    add_pod(state, pod)
    assert used(state) == (2, 65536)
    assert state.filter(read_pod(gpu_pod("next", memory=1000)), ["n1"]).node_names is None


def test_a_signed_pod_not_bound_yet_counts(state: SchedulerState) -> None:
    """A follower (or the next leader) sees the leader's patch before its Binding."""
    state.node_upserted(read_node(gpu_node("n1", 2)))
    add_pod(state, signed(with_spec(gpu_pod("trainer", annotations=booking("n1", EVERY_GPU)))))
    assert used(state) == (2, 65536)


def test_a_copied_signature_does_not_count_and_the_original_still_does(
    state: SchedulerState,
) -> None:
    state.node_upserted(read_node(gpu_node("n1", 2)))
    original = signed(
        with_spec(gpu_pod("original", annotations=booking("n1", EVERY_GPU[:1])), "n1", "Running")
    )
    add_pod(state, original)
    copy = gpu_pod("copy", annotations=original["metadata"]["annotations"])
    add_pod(state, with_spec(copy, "n1", "Running"))  # every annotation, the signature too
    assert used(state) == (1, 32768)
    assert state.tracked("default/copy") is None


# --- a forged allocation blocking the node ----------------------------------------------------


def forged_allocation() -> dict[str, Any]:
    return gpu_pod(
        "broken",
        gpus=3,
        annotations={
            ANNOTATION_VGPU_NODE: "n1",
            ANNOTATION_BIND_PHASE: "allocating",
            ANNOTATION_BIND_TIME: "1",
            ANNOTATION_DEVICES_TO_ALLOCATE: "x,y:;",
        },
    )


def test_a_forged_allocation_does_not_block_binds(
    state: SchedulerState, clock: ManualClock
) -> None:
    state.node_upserted(read_node(gpu_node("n1", 4, protocol=True)))
    add_pod(state, forged_allocation())
    assert state.in_flight("n1") == {}
    pod = gpu_pod("a")
    state.filter(read_pod(pod), ["n1"])
    plan = state.plan_bind(read_pod(pod), "n1")
    assert isinstance(plan, BindPlan)
    assert state.claim_in_flight(plan, clock.monotonic()) is None
    # nor is it an allocation the recovery loop would time out
    clock.advance(3600)
    assert [s.pod.key for s in state.stale_allocations(clock.now(), 120)] == []


def test_without_a_key_a_forged_allocation_blocks_as_hami(clock: ManualClock) -> None:
    state = SchedulerState(BookSettings(SchedulerSettings()), clock=clock)
    state.node_upserted(read_node(gpu_node("n1", 4, protocol=True)))
    add_pod(state, forged_allocation())
    assert state.in_flight("n1") == {"default/broken": None}


def test_a_signed_allocation_still_blocks_a_pod_kubelet_could_confuse(
    state: SchedulerState, clock: ManualClock
) -> None:
    state.node_upserted(read_node(gpu_node("n1", 4, protocol=True)))
    earlier = signed(
        with_spec(gpu_pod("earlier", annotations=booking("n1", [("GPU-n1-0", 1000, 0)])), "n1")
    )
    add_pod(state, earlier)
    assert set(state.in_flight("n1")) == {"default/earlier"}
    twin = gpu_pod("twin")  # same creation second, same GPU count
    state.filter(read_pod(twin), ["n1"])
    plan = state.plan_bind(read_pod(twin), "n1")
    assert isinstance(plan, BindPlan)
    blocker = state.claim_in_flight(plan, clock.monotonic())
    assert blocker is not None and "default/earlier" in blocker


# --- this process's own binds -------------------------------------------------------------------


def patched(pod: dict[str, Any], plan: BindPlan, *, bound: bool = False) -> dict[str, Any]:
    pod = {**pod, "metadata": dict(pod["metadata"]), "spec": dict(pod["spec"])}
    pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], **plan.annotations}
    pod["metadata"]["resourceVersion"] = "2"
    if bound:
        pod["spec"]["nodeName"] = plan.node
    return pod


def test_a_bind_signs_its_booking_and_the_pod_counts_throughout(clock: ManualClock) -> None:
    current = [KEYS]
    state = keyed(clock, lambda: current[0])
    state.node_upserted(read_node(gpu_node("n1", 1, split=2)))
    pod = gpu_pod("a")
    add_pod(state, pod)
    state.filter(read_pod(pod), ["n1"])
    plan = state.plan_bind(read_pod(pod), "n1")
    assert isinstance(plan, BindPlan)
    signature = plan.annotations[ANNOTATION_BOOKING_SIGNATURE]
    assert verify_pod(KEYS, pod["metadata"]["uid"], plan.annotations)
    assert signature.startswith("v2:")
    # the patch reaches the watch before the Binding: still counted, the booking retired
    add_pod(state, patched(pod, plan))
    assert state.bookings() == {}
    assert used(state) == (1, 1000)
    state.bind_succeeded(plan)
    add_pod(state, patched(pod, plan, bound=True))
    assert used(state) == (1, 1000)
    # the key is rotated out: a booking this process signed keeps counting
    current[0] = OTHER_KEYS
    shown = patched(pod, plan, bound=True)
    shown["status"] = {"phase": "Running"}
    add_pod(state, shown)
    assert used(state) == (1, 1000)
    # a change by the pod's author does not verify: the booking is no longer counted
    shown["metadata"]["annotations"][ANNOTATION_DEVICES_ALLOCATED] = "GPU-n1-0,NVIDIA,1,0:;"
    add_pod(state, shown)
    assert used(state) == (0, 0)


def test_a_forged_event_during_the_bind_does_not_retire_its_booking(
    state: SchedulerState,
) -> None:
    """An author who writes the bind's node and bind-time with other devices before the bind
    patch lands: the booking stands until the watch shows the bind's own devices."""
    state.node_upserted(read_node(gpu_node("n1", 1, split=2)))
    pod = gpu_pod("a")
    add_pod(state, pod)
    state.filter(read_pod(pod), ["n1"])
    plan = state.plan_bind(read_pod(pod), "n1")
    assert isinstance(plan, BindPlan)
    other_devices = patched(pod, plan)
    other_devices["metadata"]["annotations"][ANNOTATION_DEVICES_ALLOCATED] = "GPU-n1-0,NVIDIA,1,0:;"
    unsigned = patched(pod, plan)  # the bind's very booking, without its signature
    del unsigned["metadata"]["annotations"][ANNOTATION_BOOKING_SIGNATURE]
    for forged in (other_devices, unsigned):
        add_pod(state, forged)
        assert state.bookings() != {}
        assert used(state) == (1, 1000)
    add_pod(state, patched(pod, plan))  # the patch lands
    assert state.bookings() == {}
    assert used(state) == (1, 1000)


def test_a_failed_bind_forgets_its_signature(state: SchedulerState) -> None:
    state.node_upserted(read_node(gpu_node("n1", 1, split=2)))
    pod = gpu_pod("a")
    add_pod(state, pod)
    state.filter(read_pod(pod), ["n1"])
    plan = state.plan_bind(read_pod(pod), "n1")
    assert isinstance(plan, BindPlan)
    state.bind_failed(plan)
    assert used(state) == (0, 0)
    # the patch that was reverted shows up late: still signed by this scheduler, verified
    add_pod(state, patched(pod, plan))
    assert used(state) == (1, 1000)


# --- logging ------------------------------------------------------------------------------------


def test_an_ignored_pod_is_logged_once_per_uid(
    state: SchedulerState, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami_plugin.scheduler.book.trust")
    state.node_upserted(read_node(gpu_node("n1", 2)))
    first = hog()
    for phase in ("Pending", "Running", "Running"):
        first["status"] = {"phase": phase}
        add_pod(state, first)
    state.filter(read_pod(whole_node_pod()), ["n1"])  # a filter judges nothing again
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "pod default/hog: its GPU booking is ignored (counted as no booking): it asks for no "
        "nvidia.com/gpu; nor is it counted as admitted: it is not bound to node n1 its booking "
        "names"
    ]
    state.pod_deleted(read_pod(first))
    again = make_pod("hog", annotations=booking("n1", EVERY_GPU), uid="uid-hog-2")
    add_pod(state, again)
    add_pod(state, again)
    assert len(caplog.records) == 2
    state.pod_deleted(read_pod(again))
    # what was remembered of the pods goes with them
    trust = state._book._trust  # the book's memory of each pod's booking
    assert (trust._ignored, trust._counted_views, trust._sealed) == ({}, {}, {})


# --- the property ---------------------------------------------------------------------------------

NODES = ("node-a", "node-b")
GPUS = {node: [f"GPU-{node}-{i}" for i in range(2)] for node in NODES}
JUNK_DEVICES = ("junk,;", ";", "", "GPU-node-a-0,NVIDIA,x,1:;")


def _pod(
    name: str, *, gpu: bool, annotations: dict[str, str], node_name: str, phase: str
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"} if gpu else {"cpu": "1"}
    pod = make_pod(
        name,
        annotations=annotations,
        containers=[make_container("main", limits=limits)],
        node_name=node_name,
        phase=phase,
        uid=f"uid-{name}",
        creation_timestamp="2026-01-01T00:00:00Z",
        resource_version="1",
    )
    return pod


@st.composite
def legit_pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Pods bound by this scheduler (now or by an earlier leader): signed, asking a GPU."""
    pods = []
    for index in range(draw(st.integers(0, 4))):
        node = draw(st.sampled_from(NODES))
        gpus = draw(st.lists(st.sampled_from(GPUS[node]), min_size=1, max_size=2, unique=True))
        memory = draw(st.sampled_from((1000, 3000)))
        notes = booking(node, [(uuid, memory, 10) for uuid in gpus])
        notes[ANNOTATION_BIND_PHASE] = draw(st.sampled_from(("allocating", "success")))
        bound = draw(st.booleans())
        phase = draw(st.sampled_from(("Pending", "Running"))) if bound else "Pending"
        pod = _pod(
            f"legit-{index}",
            gpu=True,
            annotations=notes,
            node_name=node if bound else "",
            phase=phase,
        )
        signed_pod = signed(pod)
        if draw(st.booleans()):  # the device plugin consumed the to-allocate entry since
            signed_pod["metadata"]["annotations"][ANNOTATION_DEVICES_TO_ALLOCATE] = ";"
        pods.append(signed_pod)
    return pods


def attacker_values(legit: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, str]]:
    """What a pod author may write into HAMi's annotations: real-looking and junk values,
    signatures of other keys or copied from the signed pods, or a signed pod's whole set."""
    copies = [dict(pod["metadata"]["annotations"]) for pod in legit]
    devices = st.one_of(
        st.sampled_from(JUNK_DEVICES),
        st.builds(
            lambda node, memory: booking(node, [(g, memory, 100) for g in GPUS[node]])[
                ANNOTATION_DEVICES_ALLOCATED
            ],
            st.sampled_from(NODES),
            st.sampled_from((1000, 8000)),
        ),
    )
    signatures: list[st.SearchStrategy[str]] = [
        st.sampled_from(("v1:junk", "v2:" + "A" * 44, "", "v1:" + "A" * 43 + "=")),
        st.builds(
            lambda node: OTHER_KEYS.sign(BookingFields("uid-x", node, "", "1")),
            st.sampled_from(NODES),
        ),
    ]
    if copies:
        signatures.append(st.sampled_from([c[ANNOTATION_BOOKING_SIGNATURE] for c in copies]))
    fields = st.fixed_dictionaries(
        {},
        optional={
            ANNOTATION_VGPU_NODE: st.sampled_from((*NODES, "", "node-zzz")),
            ANNOTATION_DEVICES_ALLOCATED: devices,
            ANNOTATION_DEVICES_TO_ALLOCATE: devices,
            ANNOTATION_BIND_PHASE: st.sampled_from(("allocating", "success", "failed", "x")),
            ANNOTATION_BIND_TIME: st.sampled_from(("1767268800", "1", "junk", "")),
            ANNOTATION_BOOKING_SIGNATURE: st.one_of(*signatures),
        },
    )
    if not copies:
        return fields
    return st.one_of(fields, st.sampled_from(copies))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(signed pods, every pod event in delivery order)."""
    legit = draw(legit_pods())
    events = list(legit)
    for index in range(draw(st.integers(0, 5))):
        for _ in range(draw(st.integers(1, 2))):  # created, then maybe changed by its author
            events.append(
                _pod(
                    f"evil-{index}",
                    gpu=draw(st.booleans()),
                    annotations=draw(attacker_values(legit)),
                    node_name=draw(st.sampled_from(("", *NODES))),
                    phase=draw(st.sampled_from(("Pending", "Running"))),
                )
            )
    order = draw(st.permutations(range(len(events))))
    # each pod's own events stay in order (the watch delivers one object's events in order)
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_pod.setdefault(event["metadata"]["name"], []).append(event)
    delivered = []
    for position in order:
        name = events[position]["metadata"]["name"]
        delivered.append(by_pod[name].pop(0))
    return legit, delivered


def _view(state: SchedulerState, now: datetime) -> Any:
    usages = [(u.name, u.used, u.used_memory_mib, u.used_cores) for u in state.usage_snapshot()[0]]
    in_flight = {node: state.in_flight(node) for node in NODES}
    stale = sorted(s.pod.key for s in state.stale_allocations(now, 120))
    return usages, in_flight, stale


@given(clusters())
def test_property_free_capacity_reflects_only_signed_bookings(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    legit, delivered = cluster
    clock = ManualClock(START)
    everything, only_signed = keyed(clock), keyed(clock)
    for state in (everything, only_signed):
        for node in NODES:
            state.node_upserted(read_node(gpu_node(node, 2, split=4, memory=8000, protocol=True)))
    for pod in delivered:
        everything.pod_upserted(read_pod(pod))
    for pod in legit:
        only_signed.pod_upserted(read_pod(pod))
    clock.advance(3600)
    assert _view(everything, clock.now()) == _view(only_signed, clock.now())
    # and the signed pods are counted, not merely both states empty
    booked = sum(sum(u.used) for u in only_signed.usage_snapshot()[0])
    assert booked == sum(
        len(p["metadata"]["annotations"][ANNOTATION_DEVICES_ALLOCATED].split(":")) - 1
        for p in legit
    )
