"""The pure Allocate decision: env, mounts, entry and container (docs/hami-reference.md 4.4)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    AllocateFailure,
    FailureReason,
    MountSpec,
    decide_allocation,
    to_allocate_problem,
    with_entries_consumed,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ContainerDevice,
    PodDevices,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from tests.deviceplugin.records import GPU_A, GPU_B, GPU_C, make_pod

CONFIG = AllocateConfig(hook_path="/usr/local")


def fixed_cache_id() -> str:
    return "11111111-2222-4333-8444-555555555555"


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
    ("value", "skips"),
    [("true", True), ("1", True), ("True", True), ("false", False), ("yes", False), ("", False)],
)
def test_cuda_disable_control_drops_the_preload_only_in_a_gpu_admin_namespace(
    value: str, skips: bool
) -> None:
    """HAMi leaves the preload out for `CUDA_DISABLE_CONTROL=true` (server.go 866-883), so any
    pod author turns HAMi-core off; ours only in a namespace labelled gpu-admin."""
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;", env={"CUDA_DISABLE_CONTROL": value})
    asked: list[str] = []

    def admin(namespace: str) -> bool:
        asked.append(namespace)
        return namespace == pod.namespace

    for config, preload in (
        (CONFIG, True),  # no namespace reader: nobody may
        (dataclasses.replace(CONFIG, gpu_admin_namespace=admin), not skips),
        (dataclasses.replace(CONFIG, gpu_admin_namespace=lambda _: False), True),
    ):
        answer = decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id)
        paths = [m.container_path for m in answer.containers[0].mounts]
        assert ("/etc/ld.so.preload" in paths) is preload
    assert asked == ([pod.namespace] if skips else [])  # asked only when the variable is set


LIBRARY_MISSING = "node gpu-1: HAMi-core is not installed: /usr/local/vgpu/libvgpu.so is missing"
PRELOAD_MISSING = "node gpu-1: HAMi-core is not set up: /usr/local/vgpu/ld.so.preload is missing"


@pytest.mark.parametrize("disable_control", [None, "true", "false"])
def test_without_the_library_no_container_is_served(disable_control: str | None) -> None:
    # HAMi mounts libvgpu.so whatever CUDA_DISABLE_CONTROL says (server.go Allocate).
    env = {} if disable_control is None else {"CUDA_DISABLE_CONTROL": disable_control}
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;", env=env)
    config = dataclasses.replace(CONFIG, library_problem=LIBRARY_MISSING)
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id)
    assert caught.value.reason is FailureReason.HAMI_CORE_MISSING
    assert str(caught.value) == LIBRARY_MISSING
    assert caught.value.pod_known


@pytest.mark.parametrize(
    ("disable_control", "admin", "served"),
    [("true", True, True), ("true", False, False), ("0", True, False), (None, True, False)],
)
def test_without_the_preload_only_containers_that_may_skip_it_are_served(
    disable_control: str | None, admin: bool, served: bool
) -> None:
    env = {} if disable_control is None else {"CUDA_DISABLE_CONTROL": disable_control}
    pod = make_pod(f"{GPU_A},NVIDIA,3000,30:;", env=env)
    config = dataclasses.replace(
        CONFIG, preload_problem=PRELOAD_MISSING, gpu_admin_namespace=lambda _: admin
    )
    if served:
        decision = decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id)
        paths = [m.container_path for m in decision.containers[0].mounts]
        assert "/etc/ld.so.preload" not in paths
        return
    with pytest.raises(AllocateFailure, match=r"ld\.so\.preload is missing") as caught:
        decide_allocation(pod, [kubelet_ids(GPU_A)], config, fixed_cache_id)
    assert caught.value.reason is FailureReason.HAMI_CORE_MISSING


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


# --- to-allocate against the signed booking -----------------------------------------------------

BOOKED = f"{GPU_A},NVIDIA,3000,30:;{GPU_B},NVIDIA,1000,10:{GPU_C},NVIDIA,1000,10:;"


def booked_pod(to_allocate: str | None, booked: str = BOOKED) -> PodInfo:
    pod = make_pod(to_allocate, containers=("a", "b"))
    annotations = {**pod.annotations, ANNOTATION_DEVICES_ALLOCATED: booked}
    return dataclasses.replace(pod, annotations=annotations)


def problem_of(pod: PodInfo) -> str | None:
    assert pod.booking is not None
    return to_allocate_problem(pod.booking)


@pytest.mark.parametrize(
    "to_allocate",
    [
        BOOKED,
        f";{GPU_B},NVIDIA,1000,10:{GPU_C},NVIDIA,1000,10:;",  # the first entry consumed
        ";;;",  # everything consumed, with the trailing entry our write adds
        BOOKED + ";",
        f"{GPU_A},NVIDIA,3000,30:",  # trailing entries dropped: nothing more to serve
        None,  # nothing to serve: decide_allocation says so
        f"{GPU_A},NVIDIA,notanumber,30:;",  # unreadable: decide_allocation says so
    ],
)
def test_a_to_allocate_within_the_booking_is_no_problem(to_allocate: str | None) -> None:
    assert problem_of(booked_pod(to_allocate)) is None


@pytest.mark.parametrize(
    ("to_allocate", "detail"),
    [
        (f"{GPU_C},NVIDIA,3000,30:;;", f"entry 0 is {GPU_C},NVIDIA,3000,30:, booked {GPU_A}"),
        (f"{GPU_A},NVIDIA,81920,30:;;", "entry 0 is"),  # more memory on the booked GPU
        (f"{GPU_A},NVIDIA,3000,100:;;", "entry 0 is"),  # more cores
        (f";{GPU_C},NVIDIA,1000,10:{GPU_B},NVIDIA,1000,10:;", "entry 1 is"),  # reordered
        (f";{GPU_B},NVIDIA,1000,10:;", "entry 1 is"),  # a device dropped
        (f";;{GPU_A},NVIDIA,3000,30:;", "entry 2 is"),  # an entry the booking lacks
        (f"{GPU_A},NVIDIA,3000,30:{GPU_A},NVIDIA,3000,30:;;", "entry 0 is"),
    ],
)
def test_a_to_allocate_beyond_the_booking_is_named(to_allocate: str, detail: str) -> None:
    problem = problem_of(booked_pod(to_allocate))
    assert problem is not None
    assert problem.startswith(
        f"{ANNOTATION_DEVICES_TO_ALLOCATE} does not match the signed booking "
        f"({ANNOTATION_DEVICES_ALLOCATED}): "
    )
    assert detail in problem


def test_an_unreadable_signed_booking_is_a_problem() -> None:
    problem = problem_of(booked_pod(BOOKED, booked="GPU-x,NVIDIA,1:;"))
    assert problem is not None
    assert "to-allocate does not match the signed booking: the booking does not decode" in problem


# --- entries already served --------------------------------------------------------------------


def test_served_entries_read_as_consumed_whatever_the_annotation_says() -> None:
    # The author wrote entry 0 back after it was served: it equals the booking again.
    restored = booked_pod(BOOKED)
    assert problem_of(restored) is None
    read = with_entries_consumed(restored, {0})
    assert read.booking is not None
    assert codec.encode_pod_devices(read.booking.to_allocate or ()) == (
        f";{GPU_B},NVIDIA,1000,10:{GPU_C},NVIDIA,1000,10:;;"
    )
    assert read.booking.allocated_text == BOOKED  # the booking is kept
    assert problem_of(read) is None
    # The next container gets entry 1, not entry 0 a second time.
    decision = decide_allocation(read, [kubelet_ids(GPU_B, GPU_C)], CONFIG, fixed_cache_id)
    assert [c.entry_index for c in decision.containers] == [1]
    assert decision.complete
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(
            with_entries_consumed(restored, {0, 1}), [kubelet_ids(GPU_A)], CONFIG, fixed_cache_id
        )
    assert caught.value.reason is FailureReason.NO_PENDING_ENTRY


@pytest.mark.parametrize(
    ("to_allocate", "served"),
    [
        (f";{GPU_B},NVIDIA,1000,10:{GPU_C},NVIDIA,1000,10:;;", {0}),  # as our patch left it
        (BOOKED, set()),
        (BOOKED, {7}),  # beyond the annotation's entries
        (None, {0}),
        ("GPU-x,NVIDIA,1:;", {0}),  # unreadable: nothing is served from it anyway
    ],
    ids=["consumed", "nothing-served", "out-of-range", "missing", "unreadable"],
)
def test_a_pod_offering_no_served_entry_is_read_as_it_is(
    to_allocate: str | None, served: set[int]
) -> None:
    pod = booked_pod(to_allocate)
    assert with_entries_consumed(pod, served) is pod


# --- properties -------------------------------------------------------------------------------

_GPUS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(4)]


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
    value = booked = codec.encode_pod_devices(pod_devices)
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
        # What our own Allocate writes is always the booking with entries consumed.
        assert problem_of(booked_pod(value, booked)) is None
    assert seen == wanted
    assert complete
    with pytest.raises(AllocateFailure):
        decide_allocation(make_pod(value, containers=names), [["x"]], CONFIG, fixed_cache_id)


@given(
    counts=st.lists(st.integers(0, 2), min_size=1, max_size=5),
    served_before=st.sets(st.integers(0, 6)),
)
def test_a_served_entry_is_never_served_again(counts: list[int], served_before: set[int]) -> None:
    """The author writes the whole signed booking back before every call: read with what was
    served consumed, each entry not served before goes out once, in order, then nothing."""
    booked = tuple(
        tuple(ContainerDevice(_GPUS[i], "NVIDIA", 100, 1) for i in range(count)) for count in counts
    )
    value = codec.encode_pod_devices(booked)
    restored = dataclasses.replace(
        booked_pod(value, value),
        containers=tuple(ContainerSpec(f"c{i}") for i in range(len(counts))),
    )
    served = set(served_before)
    expected = [i for i, entry in enumerate(booked) if entry and i not in served_before]
    for index in expected:
        read = with_entries_consumed(restored, served)
        assert problem_of(read) is None
        request = [f"{device.uuid}-0" for device in booked[index]]
        (container,) = decide_allocation(read, [request], CONFIG, fixed_cache_id).containers
        assert container.entry_index == index
        served.add(container.entry_index)
    with pytest.raises(AllocateFailure) as caught:
        decide_allocation(
            with_entries_consumed(restored, served), [[f"{_GPUS[0]}-0"]], CONFIG, fixed_cache_id
        )
    assert caught.value.reason is FailureReason.NO_PENDING_ENTRY
