"""The pure Allocate / GetPreferredAllocation decisions (reference 4.4, 4.5)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    AllocateFailure,
    FailureReason,
    MountSpec,
    PreferredRequest,
    decide_allocation,
    decide_preferred,
    select_pending_pod,
)
from hami_plugin.kube.client import ContainerSpec, PodRecord
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    PodDevices,
)

GPU_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
GPU_B = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
GPU_C = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"
NODE = "node-1"
CONFIG = AllocateConfig(hook_path="/usr/local")


def fixed_cache_id() -> str:
    return "11111111-2222-4333-8444-555555555555"


def make_pod(
    to_allocate: str | None,
    *,
    name: str = "gpu-pod",
    namespace: str = "default",
    containers: Sequence[str] = ("main",),
    init_containers: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    phase: str = "Pending",
    bind_phase: str | None = "allocating",
    bind_time: str | None = "1705054796",
    vgpu_node: str | None = NODE,
) -> PodRecord:
    annotations: dict[str, str] = {}
    if to_allocate is not None:
        annotations[ANNOTATION_DEVICES_TO_ALLOCATE] = to_allocate
    if bind_phase is not None:
        annotations[ANNOTATION_BIND_PHASE] = bind_phase
    if bind_time is not None:
        annotations[ANNOTATION_BIND_TIME] = bind_time
    if vgpu_node is not None:
        annotations[ANNOTATION_VGPU_NODE] = vgpu_node
    return PodRecord(
        namespace=namespace,
        name=name,
        uid="uid-" + name,
        phase=phase,
        node_name=NODE,
        annotations=annotations,
        labels={},
        init_containers=tuple(ContainerSpec(n, {}) for n in init_containers),
        containers=tuple(ContainerSpec(n, dict(env or {})) for n in containers),
        resource_version="1",
        creation_timestamp=None,
    )


def kubelet_ids(*gpus: str) -> list[str]:
    return [f"{gpu}-{slot}" for slot, gpu in enumerate(gpus)]


# --- Allocate: environment and mounts ---------------------------------------------------------


def test_one_gpu_gets_hami_core_environment_and_mounts() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;")
    decision = decide_allocation(pod, [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id)

    (container,) = decision.containers
    assert container.container_name == "main"
    assert dict(container.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPU_A,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{fixed_cache_id()}.cache",
    }
    assert container.host_dir == "/usr/local/vgpu/containers/uid-gpu-pod_main"
    assert container.mounts == (
        MountSpec("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        MountSpec("/usr/local/vgpu", "/usr/local/vgpu/containers/uid-gpu-pod_main", False),
        MountSpec("/tmp/vgpulock", "/tmp/vgpulock", False),
        MountSpec("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
    )
    assert decision.remaining_to_allocate == ";;"
    assert decision.complete


def test_two_gpus_list_every_memory_limit_and_the_first_sm_limit() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,4096,50:{GPU_B},NVIDIA,2048,20:;")
    decision = decide_allocation(pod, [kubelet_ids(GPU_A, GPU_B)], CONFIG, fixed_cache_id)
    envs = decision.containers[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2048m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"


def test_visible_devices_are_deduplicated_in_order() -> None:
    pod = make_pod(f"{GPU_B},NVIDIA,100,0:{GPU_A},NVIDIA,100,0:{GPU_B},NVIDIA,100,0:;")
    config = dataclasses.replace(CONFIG, enable_preferred_allocation=False)
    decision = decide_allocation(pod, [["x-0", "x-1", "x-2"]], config, fixed_cache_id)
    assert decision.containers[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_B},{GPU_A}"
    assert decision.containers[0].envs["CUDA_DEVICE_MEMORY_LIMIT_2"] == "100m"


def test_optional_environment_follows_the_settings() -> None:
    config = dataclasses.replace(
        CONFIG,
        memory_scaling=1.5,
        libcuda_log_level="3",
        disable_core_limit=True,
        hook_path="/opt/hami/",
    )
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;")
    envs = decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id).containers[0].envs
    assert envs["CUDA_OVERSUBSCRIBE"] == "true"
    assert envs["LIBCUDA_LOG_LEVEL"] == "3"
    assert envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/opt/hami/vgpu/")


@pytest.mark.parametrize("scaling", [1.0, 0.5])
def test_no_oversubscribe_without_memory_scaling_above_one(scaling: float) -> None:
    config = dataclasses.replace(CONFIG, memory_scaling=scaling)
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;")
    envs = decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id).containers[0].envs
    assert "CUDA_OVERSUBSCRIBE" not in envs
    assert "LIBCUDA_LOG_LEVEL" not in envs
    assert "GPU_CORE_UTILIZATION_POLICY" not in envs


def test_every_container_gets_its_own_cache_file() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,1,0:;{GPU_B},NVIDIA,1,0:;", containers=("a", "b"))
    counter = itertools.count()
    decision = decide_allocation(
        pod,
        [kubelet_ids(GPU_A), kubelet_ids(GPU_B)],
        CONFIG,
        lambda: f"id{next(counter)}",
    )
    caches = [c.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] for c in decision.containers]
    assert caches == ["/usr/local/vgpu/id0.cache", "/usr/local/vgpu/id1.cache"]


@pytest.mark.parametrize(
    ("value", "preload"),
    [("true", False), ("1", False), ("True", False), ("false", True), ("yes", True), ("", True)],
)
def test_cuda_disable_control_drops_the_preload_mount(value: str, preload: bool) -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;", env={"CUDA_DISABLE_CONTROL": value})
    mounts = decide_allocation(pod, [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id).containers[0]
    paths = [m.container_path for m in mounts.mounts]
    assert ("/etc/ld.so.preload" in paths) is preload


def test_versioned_libvgpu_licence_and_lock_path_come_from_the_edge() -> None:
    config = dataclasses.replace(
        CONFIG,
        libvgpu_host_path="/usr/local/vgpu/libvgpu.so.2.10.0",
        license_present=True,
        vgpulock_host_path="/run/test/vgpulock",
    )
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;")
    mounts = decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id).containers[0]
    assert mounts.mounts[0] == MountSpec(
        "/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so.2.10.0", True
    )
    assert mounts.mounts[2] == MountSpec("/tmp/vgpulock", "/run/test/vgpulock", False)
    assert mounts.mounts[-2:] == (
        MountSpec("/tmp/license", "/usr/local/vgpu/license", True),
        MountSpec("/usr/bin/vgpuvalidator", "/usr/local/vgpu/vgpuvalidator", True),
    )


# --- Allocate: which entry, which container ----------------------------------------------------


def test_entries_are_consumed_in_order_across_calls() -> None:
    first = make_pod(f"{GPU_A},NVIDIA,3000,0:;{GPU_B},NVIDIA,5000,0:;", containers=("a", "b"))
    decision = decide_allocation(first, [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id)
    assert decision.containers[0].container_name == "a"
    assert decision.remaining_to_allocate == f";{GPU_B},NVIDIA,5000,0:;;"
    assert not decision.complete

    second = make_pod(decision.remaining_to_allocate, containers=("a", "b"))
    decision = decide_allocation(second, [kubelet_ids(GPU_B)], CONFIG, fixed_cache_id)
    assert decision.containers[0].container_name == "b"
    assert decision.containers[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
    assert decision.complete
    assert not any(codec.decode_pod_devices(decision.remaining_to_allocate))


def test_several_requests_in_one_call_take_successive_entries() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,1,0:;{GPU_B},NVIDIA,2,0:;", containers=("a", "b"))
    decision = decide_allocation(
        pod, [kubelet_ids(GPU_A), kubelet_ids(GPU_B)], CONFIG, fixed_cache_id
    )
    assert [c.container_name for c in decision.containers] == ["a", "b"]
    assert [c.entry_index for c in decision.containers] == [0, 1]
    assert decision.complete


def test_init_containers_come_first_in_the_index() -> None:
    pod = make_pod(f";{GPU_A},NVIDIA,1000,30:;", init_containers=("setup",), containers=("app",))
    decision = decide_allocation(pod, [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id)
    assert decision.containers[0].container_name == "app"
    assert decision.containers[0].entry_index == 1
    assert decision.containers[0].host_dir.endswith("/uid-gpu-pod_app")


def test_an_entry_without_a_container_is_malformed() -> None:
    pod = make_pod(f";{GPU_A},NVIDIA,1000,30:;", containers=("only",))
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(pod, [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id)
    assert caught.value.reason is FailureReason.MALFORMED_ANNOTATION
    assert "entry 1 has no matching container" in str(caught.value)


def test_device_count_must_match_kubelet() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;")
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(pod, [kubelet_ids(GPU_A, GPU_B)], CONFIG, fixed_cache_id)
    assert caught.value.reason is FailureReason.DEVICE_COUNT_MISMATCH
    assert "device number not matched" in str(caught.value)
    assert "has 1 device(s), kubelet asked for 2" in str(caught.value)
    assert caught.value.pod_known


@pytest.mark.parametrize("value", [None, "", ";;", ";"])
def test_nothing_left_to_allocate(value: str | None) -> None:
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(make_pod(value), [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id)
    assert caught.value.reason is FailureReason.NO_PENDING_ENTRY
    assert "no pending device allocation found" in str(caught.value)


def test_malformed_annotation_names_the_key() -> None:
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(
            make_pod(f"{GPU_A},NVIDIA,3000:;"), [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id
        )
    assert caught.value.reason is FailureReason.MALFORMED_ANNOTATION
    assert ANNOTATION_DEVICES_TO_ALLOCATE in str(caught.value)


def test_empty_request_is_invalid() -> None:
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(make_pod(f"{GPU_A},NVIDIA,1,1:;"), [], CONFIG, fixed_cache_id)
    assert caught.value.reason is FailureReason.INVALID_REQUEST


def test_preferred_allocation_aligns_gpus_with_kubelet_ids() -> None:
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:{GPU_B},NVIDIA,3000,30:;")
    request = [f"{GPU_C}-4", f"{GPU_B}-1"]
    aligned = decide_allocation(pod, [request], CONFIG, fixed_cache_id).containers[0]
    assert aligned.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_C},{GPU_B}"
    assert [d.uuid for d in aligned.devices] == [GPU_C, GPU_B]

    off = dataclasses.replace(CONFIG, enable_preferred_allocation=False)
    kept = decide_allocation(pod, [request], off, fixed_cache_id).containers[0]
    assert kept.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"


def test_a_booked_gpu_on_this_node_wins_over_kubelets_id() -> None:
    # Kubelet reuses an init container's device for the app container without asking
    # GetPreferredAllocation: the container still runs where the scheduler booked it.
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:{GPU_B},NVIDIA,3000,30:;")
    request = [f"{GPU_C}-4", f"{GPU_B}-1"]
    advertised = [f"{gpu}-{slot}" for gpu in (GPU_A, GPU_B, GPU_C) for slot in range(5)]
    answer = decide_allocation(pod, [request], CONFIG, fixed_cache_id, advertised).containers[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert [d.uuid for d in answer.devices] == [GPU_A, GPU_B]
    assert answer.kubelet_ids_not_used == (f"{GPU_C}-4",)


# --- which pod ----------------------------------------------------------------------------------


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(1_767_225_600 + seconds, UTC)


def in_flight(
    name: str, *entries: int, created: int = 0, consumed: int = 0, bind_time: str = "100"
) -> PodRecord:
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
    pods: list[PodRecord], count: int, detail: str
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
def test_pods_not_waiting_on_this_node_are_skipped(pod: PodRecord) -> None:
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


# --- GetPreferredAllocation ----------------------------------------------------------------------


def slots(gpu: str, count: int = 3) -> list[str]:
    return [f"{gpu}-{i}" for i in range(count)]


def test_preferred_follows_the_scheduler_choice() -> None:
    pod = make_pod(f"{GPU_C},NVIDIA,1,0:{GPU_B},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B) + slots(GPU_C)
    (answer,) = decide_preferred(pod, [PreferredRequest(available, (), 2)])
    assert answer.device_ids == (f"{GPU_C}-0", f"{GPU_B}-0")
    assert answer.fallback_note is None


def test_preferred_keeps_must_include_and_counts_it() -> None:
    pod = make_pod(f"{GPU_B},NVIDIA,1,0:{GPU_C},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B) + slots(GPU_C)
    (answer,) = decide_preferred(pod, [PreferredRequest(available, [f"{GPU_B}-2"], 2)])
    assert answer.device_ids == (f"{GPU_B}-2", f"{GPU_C}-0")


def test_preferred_falls_back_when_a_chosen_gpu_is_gone() -> None:
    pod = make_pod(f"{GPU_C},NVIDIA,1,0:{GPU_B},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B)  # GPU_C died: kubelet offers none of it
    (answer,) = decide_preferred(pod, [PreferredRequest(available, (), 2)])
    assert answer.device_ids == (f"{GPU_B}-0", f"{GPU_A}-0")
    assert answer.fallback_note is not None and GPU_C in answer.fallback_note


def test_preferred_without_a_pod_picks_distinct_gpus_first() -> None:
    available = slots(GPU_A, 2) + slots(GPU_B, 2)
    (answer,) = decide_preferred(None, [PreferredRequest(available, (), 3)])
    assert answer.device_ids == (f"{GPU_A}-0", f"{GPU_B}-0", f"{GPU_A}-1")


def test_preferred_with_an_unreadable_annotation_still_answers() -> None:
    pod = make_pod("garbage-without-fields:;")
    (answer,) = decide_preferred(pod, [PreferredRequest(slots(GPU_A), (), 1)])
    assert answer.device_ids == (f"{GPU_A}-0",)


# --- properties -------------------------------------------------------------------------------

_GPUS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(4)]


@st.composite
def preferred_cases(draw: st.DrawFn) -> tuple[PodRecord | None, PreferredRequest]:
    available = draw(
        st.lists(
            st.sampled_from([f"{g}-{s}" for g in _GPUS for s in range(3)]),
            unique=True,
            max_size=12,
        )
    )
    must = draw(st.lists(st.sampled_from(available), unique=True)) if available else []
    size = draw(st.integers(min_value=len(must), max_value=len(available) + 1))
    wanted = draw(st.lists(st.sampled_from(_GPUS), max_size=4))
    pod = None
    if draw(st.booleans()):
        entry = tuple(ContainerDevice(g, "NVIDIA", 1, 0) for g in wanted)
        pod = make_pod(codec.encode_pod_devices((entry,)))
    return pod, PreferredRequest(available, must, size)


@given(preferred_cases())
def test_preferred_is_always_a_valid_answer(
    case: tuple[PodRecord | None, PreferredRequest],
) -> None:
    pod, request = case
    (answer,) = decide_preferred(pod, [request])
    ids = answer.device_ids
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(request.available)
    assert set(request.must_include) <= set(ids)
    assert len(ids) == min(request.size, len(request.available))


@given(
    st.lists(
        st.lists(
            st.builds(
                ContainerDevice,
                uuid=st.sampled_from(_GPUS),
                type=st.just("NVIDIA"),
                used_mem_mib=st.integers(0, 81920),
                used_cores=st.integers(0, 100),
            ),
            max_size=3,
        ).map(tuple),
        min_size=1,
        max_size=5,
    ).map(tuple)
)
def test_every_entry_is_allocated_once_then_complete(pod_devices: PodDevices) -> None:
    names = [f"c{i}" for i in range(len(pod_devices))]
    value = codec.encode_pod_devices(pod_devices)
    wanted = [entry for entry in pod_devices if entry]
    seen = []
    complete = not wanted
    for entry in wanted:
        pod = make_pod(value, containers=names)
        request = [f"{d.uuid}-{i}" for i, d in enumerate(entry)]
        decision = decide_allocation(pod, [request], CONFIG, fixed_cache_id)
        (container,) = decision.containers
        seen.append(container.devices)
        limits = [container.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(len(entry))]
        assert limits == [f"{d.used_mem_mib}m" for d in entry]
        value = decision.remaining_to_allocate
        complete = decision.complete
    assert seen == wanted
    assert complete
    with pytest.raises(AllocateFailure):
        decide_allocation(make_pod(value, containers=names), [["x"]], CONFIG, fixed_cache_id)
