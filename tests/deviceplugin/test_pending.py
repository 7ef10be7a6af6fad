"""Which pod a kubelet call is for: the node lock, the pending pods, the in-flight bookings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.pending import (
    BOOKING_NOT_SIGNED,
    NOT_CONFIRMED,
    KubeletPods,
    PendingPodChoice,
    admission_doubt,
    booking_refusal,
    requests_resource,
    select_pending_pod,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    RESOURCE_GPU,
    ContainerDevice,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from tests.bookings import keys_from
from tests.deviceplugin.records import GPU_A, GPU_B, GPU_C, KEYS, NODE, make_pod, signed


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(1_767_225_600 + seconds, UTC)


def in_flight(
    name: str,
    *entries: int,
    created: int = 0,
    consumed: int = 0,
    bind_time: str = "100",
    asks_gpu: bool = True,
) -> PodInfo:
    """A pod whose booking has one entry per count (GPU A, B, ...), the first `consumed` gone;
    each container asks for its entry's count of nvidia.com/gpu unless not `asks_gpu`."""
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
    containers = tuple(
        ContainerSpec(f"c{i}", limits={RESOURCE_GPU: str(count)} if asks_gpu else {})
        for i, count in enumerate(entries)
    )
    return dataclasses.replace(
        pod, annotations=annotations, containers=containers, creation_timestamp=at(created)
    )


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


# --- with a booking key: only signed bookings are served ------------------------------------------

LOCK_ON_FORGED = "2024-05-10T08:01:02Z,default,forged"


def with_annotations(pod: PodInfo, **changes: str) -> PodInfo:
    """`pod` with some annotations replaced, named by their `_KEYS` names."""
    annotations = dict(pod.annotations)
    for key, value in changes.items():
        annotations[_KEYS[key]] = value
    return dataclasses.replace(pod, annotations=annotations)


_KEYS = {
    "to_allocate": ANNOTATION_DEVICES_TO_ALLOCATE,
    "allocated": ANNOTATION_DEVICES_ALLOCATED,
    "bind_time": ANNOTATION_BIND_TIME,
    "signature": ANNOTATION_BOOKING_SIGNATURE,
}


def refused(choice: PendingPodChoice) -> str:
    assert choice.refusal is not None, f"{choice.pod.name} was not refused"
    return choice.refusal


def test_with_a_key_an_unsigned_pod_is_never_chosen_for_a_signed_pods_call() -> None:
    # A forged pod that looks started and asks the count: without a key it takes the call of
    # the older signed pod (kubelet finishes a started pod first).
    older = signed(in_flight("older", 1, created=1))
    forged = in_flight("forged", 1, 1, created=2, consumed=1)
    assert select_pending_pod(NODE, None, [older, forged], 1).pod is forged
    for pods in ([older, forged], [forged, older]):
        choice = select_pending_pod(NODE, None, pods, 1, KEYS)
        assert choice.pod is older
        assert choice.refusal is None

    # A started signed pod keeps kubelet's next call, even against an older forged pod.
    started = signed(in_flight("started", 2, 1, created=8, consumed=1))
    old_forged = in_flight("forged", 1, created=0)
    choice = select_pending_pod(NODE, None, [old_forged, started], 1, KEYS)
    assert choice.pod is started
    assert choice.refusal is None


def test_with_a_key_an_unsigned_pod_takes_the_refusal_where_kubelet_could_be_admitting_it() -> None:
    tenant = signed(in_flight("tenant", 1, created=5))
    forged = in_flight("forged", 3, created=5)  # created no later than the signed match
    older_forged = in_flight("forged", 1, created=3)
    cases = [
        ([forged, tenant], 1),  # the signed match is not started and created no earlier
        ([older_forged, tenant], 1),
        ([forged, tenant], 3),  # no signed pod asks 3
        ([forged], 1),  # the one candidate, whatever the count
    ]
    for pods, count in cases:
        choice = select_pending_pod(NODE, None, pods, count, KEYS)
        assert choice.pod.name == "forged"
        assert refused(choice) == (
            f"{BOOKING_NOT_SIGNED}: the pod has no {ANNOTATION_BOOKING_SIGNATURE}"
        )
    # The signed tenant alone is served as before, whatever the count (HAMi's one candidate).
    assert select_pending_pod(NODE, None, [tenant], 3, KEYS).refusal is None


def test_with_a_key_the_pod_a_node_lock_names_is_refused_unless_signed() -> None:
    tenant = signed(in_flight("tenant", 1, created=1))
    forged = in_flight("forged", 1, created=9)
    choice = select_pending_pod(NODE, LOCK_ON_FORGED, [tenant, forged], 1, KEYS)
    assert choice.pod is forged
    assert choice.via_lock
    assert refused(choice).startswith(BOOKING_NOT_SIGNED)
    lock_on_tenant = "2024-05-10T08:01:02Z,default,tenant"
    choice = select_pending_pod(NODE, lock_on_tenant, [tenant, forged], 1, KEYS)
    assert choice.pod is tenant
    assert choice.via_lock
    assert choice.refusal is None
    # Without a key the lock's pod is served, signed or not (HAMi).
    assert select_pending_pod(NODE, LOCK_ON_FORGED, [tenant, forged], 1).refusal is None


OTHER_KEYS = keys_from(b"a-key-the-node-does-not-have-0123")


@pytest.mark.parametrize(
    "forge",
    [
        # The signature of one pod copied to another with the same annotations (another UID).
        lambda pod: dataclasses.replace(pod, name="copy", uid="uid-copy"),
        lambda pod: with_annotations(pod, bind_time="1705054797"),
        lambda pod: with_annotations(
            pod,
            allocated=f"{GPU_A},NVIDIA,81920,100:;",
            to_allocate=f"{GPU_A},NVIDIA,81920,100:;",
        ),
        lambda pod: signed(pod, OTHER_KEYS),
        lambda pod: with_annotations(pod, signature="v1:not-base64!"),
        lambda pod: with_annotations(pod, signature="v2:" + pod.annotations[_KEYS["signature"]]),
    ],
    ids=["copied-to-another-uid", "bind-time", "booking", "other-key", "garbage", "version"],
)
def test_with_a_key_a_signature_that_does_not_verify_is_refused(
    forge: Callable[[PodInfo], PodInfo],
) -> None:
    genuine = signed(in_flight("tenant", 1))
    forged = forge(genuine)
    assert booking_refusal(genuine, KEYS) is None
    message = booking_refusal(forged, KEYS)
    assert message is not None
    assert message.startswith(
        f"{BOOKING_NOT_SIGNED}: {ANNOTATION_BOOKING_SIGNATURE} does not verify"
    )
    choice = select_pending_pod(NODE, None, [forged], 1, KEYS)
    assert choice.refusal == message
    assert booking_refusal(forged, None) is None


def test_a_key_rotated_in_verifies_with_any_of_the_keys() -> None:
    old_signature = signed(in_flight("tenant", 1), OTHER_KEYS)
    rotating = keys_from(b"device-plugin-test-key-0123456789", b"a-key-the-node-does-not-have-0123")
    assert booking_refusal(old_signature, rotating) is None
    assert booking_refusal(old_signature, KEYS) is not None


def test_with_a_key_a_signed_pods_tampered_to_allocate_is_refused() -> None:
    genuine = signed(in_flight("tenant", 1, 2, created=1))
    other_gpus = f"{GPU_C},NVIDIA,81920,100:;{GPU_C},NVIDIA,81920,100:{GPU_B},NVIDIA,1000,10:;"
    tampered = with_annotations(genuine, to_allocate=other_gpus)
    message = booking_refusal(tampered, KEYS)
    assert message is not None
    assert "to-allocate does not match the signed booking" in message
    assert "entry 0" in message
    # It is never chosen for the signed pod's call, and takes the refusal where it could be the
    # one (here: created first, so kubelet may be admitting it).
    tenant = signed(in_flight("other", 1, created=5))
    choice = select_pending_pod(NODE, None, [tampered, tenant], 1, KEYS)
    assert choice.pod is tampered
    assert choice.refusal == message
    # Consumed entries, and the trailing empty entry our own write adds, are not tampering.
    consumed = signed(in_flight("consumed", 1, 2, consumed=1))
    assert booking_refusal(consumed, KEYS) is None
    padded = with_annotations(
        consumed, to_allocate=consumed.annotations[_KEYS["to_allocate"]] + ";"
    )
    assert booking_refusal(padded, KEYS) is None


def test_without_a_key_nothing_is_refused_and_the_choice_is_unchanged() -> None:
    tenant = signed(in_flight("tenant", 1, created=5))
    forged = in_flight("forged", 1, created=3)
    tampered = with_annotations(tenant, to_allocate=f"{GPU_C},NVIDIA,81920,100:;")
    for pod in (tenant, forged, tampered):
        assert booking_refusal(pod, None) is None
    choice = select_pending_pod(NODE, None, [forged, tenant], 1)
    assert choice.pod is forged
    assert choice.refusal is None


_COUNTS = st.lists(st.integers(1, 3), min_size=1, max_size=3)


@given(
    signed_pods=st.lists(st.tuples(_COUNTS, st.integers(0, 3), st.integers(0, 2)), max_size=3),
    forged_pods=st.lists(st.tuples(_COUNTS, st.integers(0, 3), st.integers(0, 2)), max_size=3),
    device_count=st.integers(1, 3),
)
def test_unsigned_pods_never_change_which_signed_pod_is_served(
    signed_pods: list[tuple[list[int], int, int]],
    forged_pods: list[tuple[list[int], int, int]],
    device_count: int,
) -> None:
    """Adding unsigned pods can only turn an answer into a refusal of one of them: a signed pod
    is served for a call only if it is the one chosen among the signed pods alone."""

    def build(prefix: str, specs: list[tuple[list[int], int, int]]) -> list[PodInfo]:
        return [
            in_flight(f"{prefix}{i}", *counts, created=created, consumed=min(consumed, len(counts)))
            for i, (counts, created, consumed) in enumerate(specs)
        ]

    good = [signed(pod) for pod in build("signed-", signed_pods)]
    bad = build("forged-", forged_pods)
    try:
        alone: PodInfo | None = select_pending_pod(NODE, None, good, device_count, KEYS).pod
    except AllocateFailure:
        alone = None
    try:
        choice = select_pending_pod(NODE, None, [*bad, *good], device_count, KEYS)
    except AllocateFailure as error:
        assert not bad, f"an unsigned pod is always a possible answer: {error}"
        return
    if choice.pod in good:
        assert choice.refusal is None
        assert choice.pod is alone
    else:
        assert choice.pod in bad
        assert refused(choice).startswith(BOOKING_NOT_SIGNED)


# --- with a booking key: an unsigned pod that asks for no GPU is no candidate ---------------------


@pytest.mark.parametrize(
    ("init", "app", "asks"),
    [
        ((), (ContainerSpec("main"),), False),
        ((), (ContainerSpec("main", limits={"cpu": "1", "nvidia.com/gpumem": "3000"}),), False),
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: "0"}),), False),
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: 0}),), False),
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: "1"}),), True),
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: 2}),), True),
        ((), (ContainerSpec("main", requests={RESOURCE_GPU: "1"}),), True),
        ((ContainerSpec("init", limits={RESOURCE_GPU: "1"}),), (ContainerSpec("main"),), True),
        ((), (ContainerSpec("idle"), ContainerSpec("cuda", limits={RESOURCE_GPU: "1"})), True),
        # Not what an API server stores: read as asking, so that such a pod keeps its place.
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: "one"}),), True),
        ((), (ContainerSpec("main", limits={RESOURCE_GPU: ["1"]}),), True),
    ],
)
def test_requests_resource_reads_every_container_as_kubelet_would(
    init: tuple[ContainerSpec, ...], app: tuple[ContainerSpec, ...], asks: bool
) -> None:
    pod = dataclasses.replace(make_pod(""), init_containers=init, containers=app)
    assert requests_resource(pod, RESOURCE_GPU) is asks
    assert requests_resource(pod, "example.com/vgpu") is False


def test_with_a_key_an_unsigned_pod_asking_for_no_gpu_never_takes_a_call() -> None:
    # The denial of service this closes: created earlier, the forged pod would be the in-flight
    # wildcard and take the tenant's Allocate (the tenant is then rejected by kubelet).
    tenant = signed(in_flight("tenant", 1, created=5))
    idle_forged = in_flight("forged", 1, created=3, asks_gpu=False)
    for pods in ([idle_forged, tenant], [tenant, idle_forged]):
        choice = select_pending_pod(NODE, None, pods, 1, KEYS)
        assert choice.pod is tenant
        assert choice.refusal is None
        # The one candidate left is the tenant: served whatever the count, as before.
        assert select_pending_pod(NODE, None, pods, 3, KEYS).pod is tenant
    # Alone it is no pod at all: nothing is patched on it (kubelet's call is not for it).
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, [idle_forged], 1, KEYS)
    assert caught.value.reason is FailureReason.NO_PENDING_POD
    assert not caught.value.pod_known

    # What is left: a forged pod that does ask for the GPU, created no later than the tenant,
    # still takes the refusal for the tenant's call (kubelet could be admitting it).
    asking_forged = in_flight("forged", 1, created=3)
    choice = select_pending_pod(NODE, None, [asking_forged, tenant], 1, KEYS)
    assert choice.pod is asking_forged
    assert refused(choice).startswith(BOOKING_NOT_SIGNED)

    # Without a key nothing changes: the older pod takes the call, as in HAMi.
    assert select_pending_pod(NODE, None, [idle_forged, tenant], 1).pod is idle_forged


def test_with_a_key_the_plugins_own_resource_name_decides() -> None:
    tenant = signed(in_flight("tenant", 1, created=5))
    forged = in_flight("forged", 1, created=3)  # asks for nvidia.com/gpu
    choice = select_pending_pod(
        NODE, None, [forged, tenant], 1, KEYS, resource_name="example.com/vgpu"
    )
    assert choice.pod is tenant  # the forged pod asks for another plugin's resource
    choice = select_pending_pod(NODE, None, [forged, tenant], 1, KEYS, resource_name=RESOURCE_GPU)
    assert choice.pod is forged


def test_with_a_key_a_node_lock_on_an_unsigned_pod_asking_for_no_gpu_is_ignored() -> None:
    tenant = signed(in_flight("tenant", 1, created=5))
    idle_forged = in_flight("forged", 1, created=3, asks_gpu=False)
    choice = select_pending_pod(NODE, LOCK_ON_FORGED, [idle_forged, tenant], 1, KEYS)
    assert choice.pod is tenant
    assert not choice.via_lock
    assert choice.refusal is None
    assert choice.lock_warning is not None
    assert choice.lock_warning.startswith(
        f"ignoring the node lock of pod default/forged: it asks for no {RESOURCE_GPU}"
    )
    # A signed lock owner asking for no GPU keeps the lock, as without a key (HAMi).
    idle_tenant = signed(in_flight("forged", 1, created=3, asks_gpu=False))
    choice = select_pending_pod(NODE, LOCK_ON_FORGED, [idle_tenant, tenant], 1, KEYS)
    assert choice.pod is idle_tenant
    assert choice.via_lock


_POD_SPECS = st.lists(st.tuples(_COUNTS, st.integers(0, 3), st.integers(0, 2)), max_size=3)


@given(
    signed_pods=_POD_SPECS,
    forged_pods=_POD_SPECS,
    idle_pods=_POD_SPECS.filter(bool),
    device_count=st.integers(1, 3),
)
def test_unsigned_pods_asking_for_no_gpu_change_no_answer(
    signed_pods: list[tuple[list[int], int, int]],
    forged_pods: list[tuple[list[int], int, int]],
    idle_pods: list[tuple[list[int], int, int]],
    device_count: int,
) -> None:
    """With a key, adding unsigned pods that ask for no GPU (any booking, any age) changes
    nothing: the same pod with the same refusal, or the same failure."""

    def build(
        prefix: str, specs: list[tuple[list[int], int, int]], *, asks_gpu: bool = True
    ) -> list[PodInfo]:
        return [
            in_flight(
                f"{prefix}{i}",
                *counts,
                created=created,
                consumed=min(consumed, len(counts)),
                asks_gpu=asks_gpu,
            )
            for i, (counts, created, consumed) in enumerate(specs)
        ]

    pods = [signed(pod) for pod in build("signed-", signed_pods)] + build("forged-", forged_pods)
    idle = build("idle-", idle_pods, asks_gpu=False)

    def outcome(candidates: list[PodInfo]) -> tuple[str, str | None] | FailureReason:
        try:
            choice = select_pending_pod(NODE, None, candidates, device_count, KEYS)
        except AllocateFailure as error:
            return error.reason
        return choice.pod.name, choice.refusal

    assert outcome([*idle, *pods]) == outcome(pods)
    assert outcome([*pods, *idle]) == outcome(pods)


# --- from the node's watch while the API server is away: the count must match ---------------------


def test_from_the_watch_one_candidate_is_chosen_only_when_it_asks_the_count() -> None:
    """kubelet may be admitting a pod the watch never delivered: a lone candidate asking
    another count is not it (without the rule it would be chosen, and failed)."""
    pod = in_flight("only", 2)
    assert select_pending_pod(NODE, None, [pod], 2, count_must_match=True).pod is pod
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, [pod], 1, count_must_match=True)
    assert caught.value.reason is FailureReason.NO_MATCHING_POD
    assert not caught.value.pod_known
    assert "no pod in flight asks 1 device(s) next" in str(caught.value)


def test_from_the_watch_the_pod_the_lock_names_must_ask_the_count() -> None:
    locked = in_flight("locked", 1, 2, consumed=1)  # its next entry asks 2
    lock = "2024-05-10T08:01:02Z,default,locked"
    choice = select_pending_pod(NODE, lock, [locked], 2, count_must_match=True)
    assert choice.pod is locked and choice.via_lock
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, lock, [locked], 1, count_must_match=True)
    assert caught.value.reason is FailureReason.NO_MATCHING_POD
    assert not caught.value.pod_known
    assert str(caught.value) == (
        f"node {NODE}: pod default/locked, which the node lock names, does not ask 1 device(s) next"
    )


def test_from_the_watch_a_broken_booking_is_still_the_one_that_fails() -> None:
    broken = dataclasses.replace(make_pod("GPU-x,NVIDIA,notanumber,0:;", name="broken"))
    assert select_pending_pod(NODE, None, [broken], 1, count_must_match=True).pod is broken


# --- in-flight/v2: kubelet's PodResources list (`admitting`) ------------------------------------


def listed(*pods: PodInfo) -> frozenset[tuple[str, str]]:
    """Kubelet's PodResources list, the pods it shows without a device of the resource."""
    return frozenset((pod.namespace, pod.name) for pod in pods)


def test_kubelets_list_tells_same_second_pods_apart() -> None:
    first, second = in_flight("first", 1, created=4), in_flight("second", 1, created=4)
    pods = [first, second]
    assert select_pending_pod(NODE, None, pods, 1, admitting=listed(second)).pod is second
    assert select_pending_pod(NODE, None, pods, 1, admitting=listed(first)).pod is first
    # an older pod kubelet does not list is not the one, whatever its age
    older = in_flight("older", 1, created=1)
    assert (
        select_pending_pod(NODE, None, [older, second], 1, admitting=listed(second)).pod is second
    )


@pytest.mark.parametrize("shown", [(), ("elsewhere",)])
def test_kubelets_list_naming_none_of_the_pods_fails_the_call(shown: tuple[str, ...]) -> None:
    pods = [in_flight("a", 1, created=4), in_flight("b", 1, created=5)]
    admitting = frozenset(("default", name) for name in shown)
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, pods, 1, admitting=admitting)
    assert caught.value.reason is FailureReason.NO_MATCHING_POD
    assert not caught.value.pod_known
    assert "kubelet is admitting none of them" in str(caught.value)
    assert "default/a" in str(caught.value) and "default/b" in str(caught.value)


def test_kubelets_list_leaves_started_pods_and_the_one_candidate_alone() -> None:
    started = in_flight("started", 1, 1, created=8, consumed=1)
    fresh = [in_flight("a", 1, created=4), in_flight("b", 1, created=4)]
    for admitting in (listed(), listed(*fresh), listed(started)):
        assert select_pending_pod(NODE, None, [*fresh, started], 1, admitting=admitting).pod is (
            started
        )
    only = in_flight("only", 2)
    assert select_pending_pod(NODE, None, [only], 1, admitting=listed()).pod is only


def test_kubelets_list_decides_whether_a_broken_booking_is_the_wildcard() -> None:
    broken = dataclasses.replace(
        make_pod("GPU-x,NVIDIA,notanumber,0:;", name="broken"), creation_timestamp=at(1)
    )
    twins = [in_flight("a", 1, created=4), in_flight("b", 1, created=4)]
    pods = [broken, *twins]
    # without the list the broken pod, created first, could be the one: it takes the call
    assert select_pending_pod(NODE, None, pods, 1).pod is broken
    # kubelet lists `a` and not `broken`: `broken` is not being admitted
    assert select_pending_pod(NODE, None, pods, 1, admitting=listed(twins[0])).pod is twins[0]
    # listed without devices, `broken` could be the one (or was rejected): it still fails
    assert select_pending_pod(NODE, None, pods, 1, admitting=listed(broken)).pod is broken
    assert select_pending_pod(NODE, None, pods, 1, admitting=listed(broken, twins[1])).pod is (
        broken
    )
    # nothing else matches: a broken booking kubelet does not list takes no call either
    with pytest.raises(AllocateFailure) as caught:
        select_pending_pod(NODE, None, pods, 3, admitting=listed(*twins))
    assert caught.value.reason is FailureReason.NO_MATCHING_POD


def test_with_a_key_kubelets_list_keeps_a_forged_pod_it_does_not_show_from_any_call() -> None:
    # The forged pod asks the count and is created first: without the list it takes the call
    # of the signed pods (that admission fails); with it, only if kubelet lists it.
    forged = in_flight("forged", 1, created=0)
    tenants = [signed(in_flight("t1", 1, created=5)), signed(in_flight("t2", 1, created=5))]
    pods = [forged, *tenants]
    assert select_pending_pod(NODE, None, pods, 1, KEYS).pod is forged
    choice = select_pending_pod(NODE, None, pods, 1, KEYS, admitting=listed(tenants[1]))
    assert choice.pod is tenants[1]
    assert choice.refusal is None
    choice = select_pending_pod(NODE, None, pods, 1, KEYS, admitting=listed(forged))
    assert choice.pod is forged
    assert refused(choice) == f"{BOOKING_NOT_SIGNED}: the pod has no {ANNOTATION_BOOKING_SIGNATURE}"


# --- with a key: kubelet's list must confirm the chosen pod (issue 25) ---------------------------


def kubelet_pods(
    without: tuple[PodInfo, ...] = (), with_devices: tuple[PodInfo, ...] = ()
) -> KubeletPods:
    return KubeletPods(listed(*without, *with_devices), listed(*without))


def test_a_not_started_pod_is_confirmed_only_while_kubelet_lists_it_without_devices() -> None:
    victim, thief = signed(in_flight("victim", 1, created=5)), in_flight("thief", 1, created=0)
    assert admission_doubt(victim, kubelet_pods(without=(victim,))) is None
    # kubelet admits the thief first: the victim is not in its pod manager yet
    doubt = admission_doubt(victim, kubelet_pods(without=(thief,)))
    assert doubt is not None and doubt.startswith(NOT_CONFIRMED)
    assert "does not show it yet" in doubt
    # listed with devices: kubelet admitted it already, this call is someone else's
    doubt = admission_doubt(victim, kubelet_pods(with_devices=(victim,)))
    assert doubt is not None and "with devices already" in doubt


def test_a_started_pod_is_confirmed_while_kubelet_lists_it_with_or_without_devices() -> None:
    started = signed(in_flight("started", 1, 1, consumed=1))
    assert admission_doubt(started, kubelet_pods(with_devices=(started,))) is None
    assert admission_doubt(started, kubelet_pods(without=(started,))) is None
    doubt = admission_doubt(started, kubelet_pods())
    assert doubt is not None and doubt.startswith(NOT_CONFIRMED)


def test_an_unknown_list_confirms_nothing() -> None:
    pod = signed(in_flight("victim", 1))
    doubt = admission_doubt(pod, None, "kubelet's PodResources API on /x.sock is unavailable")
    assert doubt is not None and "is unavailable" in doubt
