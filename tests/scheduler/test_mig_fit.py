"""Dynamic MIG in the scheduler: HAMi v2.10's Fit walk on MIG-mode GPUs, AddResourceUsage, the
usage rules of getNodesUsage, and the `hami.io/vgpu-mig-allocations` a decision writes.

Tables ported from HAMi v2.10: pkg/scheduler/mig_allocation_test.go,
pkg/device/nvidia/mig_capability_test.go and the MIG cases of pkg/device/nvidia/device_test.go
(each test names its HAMi test); then properties over random clusters and pod sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.protocol.codec import encode_node_devices
from hami_plugin.protocol.mig import MigAllocation, decode_mig_allocations
from hami_plugin.protocol.model import (
    ContainerDevice,
    GpuDevice,
    MigPlacement,
    MigProfile,
)
from hami_plugin.protocol.objects import read_node, read_pod
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.scheduler.book.trust import untrusted_booking, without_booking
from hami_plugin.scheduler.filter import assume, decide
from hami_plugin.scheduler.fit import (
    FitContext,
    FitFailure,
    fit_container,
    render_failure,
    sorted_candidates,
    walk_gpus,
)
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.mig import MigView, has_mig_placement
from hami_plugin.scheduler.pod_fit import PodFit, fit_pod
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest, PodRequests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage, make_node_usage
from hami_plugin.testing.apiserver import make_container, make_pod
from tests.bookings import keys_from, signed_fields

from .helpers import context, gpu, node

A100 = "NVIDIA-A100-SXM4-40GB"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _p(start: int, size: int) -> MigPlacement:
    return MigPlacement(start, size)


def a100_profiles() -> tuple[MigProfile, ...]:
    """HAMi mig_capability_test.go `a100MigProfiles`."""
    return (
        MigProfile("1g.5gb", 5120, 14, 1, tuple(_p(i, 1) for i in range(7))),
        MigProfile("2g.10gb", 10240, 28, 2, (_p(0, 2), _p(2, 2), _p(4, 2))),
        MigProfile("3g.20gb", 20480, 42, 3, (_p(0, 4), _p(4, 4))),
    )


def one_g(*placements: MigPlacement) -> tuple[MigProfile, ...]:
    """mig_allocation_test.go `singleNvidiaGPUNode`: one 1g.5gb profile."""
    return (MigProfile("1g.5gb", 5120, 14, 0, placements),)


def mig_gpu(
    uuid: str,
    index: int = 0,
    profiles: tuple[MigProfile, ...] | None = None,
    *,
    memory: int = 40960,
    count: int = 7,
    numa: int = 0,
    healthy: bool = True,
) -> GpuDevice:
    return GpuDevice(
        uuid,
        index,
        count,
        memory,
        100,
        A100,
        numa,
        "mig",
        healthy,
        a100_profiles() if profiles is None else profiles,
    )


def mig_node(
    *devices: GpuDevice,
    used: Sequence[int] | None = None,
    memory: Sequence[int] | None = None,
    cores: Sequence[int] | None = None,
    in_use: Sequence[Sequence[MigAllocation]] | None = None,
    name: str = "node",
) -> NodeUsage:
    size = len(devices)
    return make_node_usage(
        name,
        tuple(devices),
        tuple(used or [0] * size),
        tuple(memory or [0] * size),
        tuple(cores or [0] * size),
        mig_in_use=tuple(tuple(a) for a in in_use) if in_use is not None else (),
    )


def reserved(uuid: str, profile: str, *placements: MigPlacement) -> list[MigAllocation]:
    return [MigAllocation(0, i, uuid, profile, placement) for i, placement in enumerate(placements)]


def mib(count: int, memory: int, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(count, memory, PERCENTAGE_UNSET, cores)


def pod(*containers: ContainerRequest | None, init: int = 0) -> PodRequests:
    return PodRequests(tuple(containers), init)


def mig_context(**options: Any) -> FitContext:
    return context(vgpu_mode="mig", **options)


def failure(result: object) -> str:
    assert isinstance(result, FitFailure), result
    return render_failure(result)


def fitted(result: PodFit | FitFailure) -> PodFit:
    assert isinstance(result, PodFit), render_failure(result)
    return result


# --- mig_allocation_test.go: isMIGRequest and fitInDevices ------------------------------------


@pytest.mark.parametrize(
    ("mode", "devices_mode", "want"),
    [
        ("hami-core", "mig", False),  # explicit HAMi-core mode
        (None, "mig", True),  # MIG mode without a mode annotation ("without Pod")
        ("mig", "mig", True),  # MIG mode annotation
        ("mig", "hami-core", False),  # no MIG device
    ],
)
def test_is_mig_request(mode: str | None, devices_mode: str, want: bool) -> None:
    """TestIsMIGRequest (its non-NVIDIA case has no counterpart: requests here are NVIDIA)."""
    device = mig_gpu("GPU-a") if devices_mode == "mig" else gpu("GPU-a")
    assert context(vgpu_mode=mode).mig_request(node(device)) is want


def test_multiple_mig_placements_on_a_single_gpu() -> None:
    """TestFitInDevicesAllowsMultipleMigPlacementsOnSingleGPU: 2 x 4000 MiB on one GPU with
    seven 1g placements gets two distinct placements (1g searches from the top: 6, then 5)."""
    target = mig_node(mig_gpu("GPU-a", profiles=one_g(*(_p(i, 1) for i in range(7)))))
    direct = fit_container(target, mib(2, 4000), mig_context())
    assert not isinstance(direct, FitFailure)
    assert direct[1] == (ContainerDevice("GPU-a", "NVIDIA", 4000, 0),) * 2
    result = fitted(fit_pod(target, pod(mib(2, 4000)), mig_context()))
    assert result.devices == ((ContainerDevice("GPU-a", "NVIDIA", 5120, 14),) * 2,)
    assert result.mig == (
        MigAllocation(0, 0, "GPU-a", "1g.5gb", _p(6, 1)),
        MigAllocation(0, 1, "GPU-a", "1g.5gb", _p(5, 1)),
    )


def test_insufficient_mig_placements_on_a_single_gpu() -> None:
    """TestFitInDevicesRejectsInsufficientMigPlacementsOnSingleGPU: one placement, two asked;
    Fit and fitInDevices give the same reason."""
    target = mig_node(mig_gpu("GPU-a", profiles=one_g(_p(6, 1))))
    want = "1/1 AllocatedCardsInsufficientRequest, 1/1 CardMigTopologyInfeasible"
    assert failure(fit_container(target, mib(2, 4000), mig_context())) == want
    assert failure(fit_pod(target, pod(mib(2, 4000)), mig_context())) == want


def test_non_mig_gpu_keeps_the_physical_count_check() -> None:
    """TestFitInDevicesRetainsPhysicalCountCheckForNonMigGPU."""
    target = node(gpu("GPU-a", memory=40960))
    ctx = context(vgpu_mode="hami-core")
    assert failure(fit_pod(target, pod(mib(2, 4000)), ctx)) == "NodeInsufficientDevice"
    # a MIG node, but the pod asks hami-core: not a MIG request, and the MIG GPU mismatches
    assert failure(fit_pod(mig_node(mig_gpu("GPU-a")), pod(mib(2, 4000)), ctx)) == (
        "NodeInsufficientDevice"
    )
    assert failure(fit_pod(mig_node(mig_gpu("GPU-a")), pod(mib(1, 4000)), ctx)) == (
        "1/1 CardTypeMismatch"
    )


# --- mig_capability_test.go -------------------------------------------------------------------


def test_add_resource_usage_uses_reported_profile_and_placement() -> None:
    """TestAddResourceUsageUsesReportedProfileAndPlacement: 10000 MiB books 2g.10gb at {0,2}
    with the profile's memory and cores, on the physical GPU."""
    result = fitted(fit_pod(mig_node(mig_gpu("GPU-a")), pod(mib(1, 10000)), mig_context()))
    assert result.devices == ((ContainerDevice("GPU-a", "NVIDIA", 10240, 28),),)
    assert result.mig == (MigAllocation(0, 0, "GPU-a", "2g.10gb", _p(0, 2)),)


def test_custom_filter_uses_reported_placement_capacity() -> None:
    """TestCustomFilterUsesReportedPlacementCapacity: three 2g in use leave only slice 6."""
    in_use = [reserved("GPU-a", "2g.10gb", _p(0, 2), _p(2, 2), _p(4, 2))]
    target = mig_node(mig_gpu("GPU-a"), in_use=in_use)
    assert failure(fit_pod(target, pod(mib(1, 10000)), mig_context())) == (
        "1/1 CardMigTopologyInfeasible"
    )
    result = fitted(fit_pod(target, pod(mib(1, 5000)), mig_context()))
    assert result.mig == (MigAllocation(0, 0, "GPU-a", "1g.5gb", _p(6, 1)),)


def test_custom_filter_ignores_queued_allocations_for_other_gpus() -> None:
    """TestCustomFilterIgnoresQueuedAllocationsForOtherGPUs (CustomFilterRule directly)."""
    a = mig_gpu("GPU-a", 0)
    b = mig_gpu("GPU-b", 1)
    occupied = [_p(0, 2), _p(2, 2), _p(4, 2)]
    devices = (a, b)
    assert has_mig_placement(a, list(occupied), devices, [1], [5000], 5000)  # queued on GPU-b
    assert not has_mig_placement(a, list(occupied), devices, [0], [5000], 5000)  # on GPU-a


def test_fit_uses_effective_percentage_memory_for_mig_placement() -> None:
    """TestFitUsesEffectivePercentageMemoryForMigPlacement: 25% of 40960 is 10240 MiB, and
    only a 1g placement is left."""
    in_use = [reserved("GPU-a", "2g.10gb", _p(0, 2), _p(2, 2), _p(4, 2))]
    target = mig_node(mig_gpu("GPU-a"), used=[3], memory=[30720], in_use=in_use)
    request = ContainerRequest(1, 0, 25, 0)
    assert failure(fit_container(target, request, context())) == "1/1 CardMigTopologyInfeasible"


def test_percentage_request_rejects_undersized_profile() -> None:
    """device_test.go TestFit_MigPercentageRequestRejectsUndersizedTemplate: 50% of 8192 MiB
    does not fit the only profile (1024 MiB)."""
    profile = (MigProfile("1g.5gb", 1024, 14, 1, (_p(0, 1),)),)
    target = mig_node(mig_gpu("dev-0", profiles=profile, memory=8192, count=1))
    request = ContainerRequest(1, 0, 50, 10)
    assert failure(fit_container(target, request, context())) == "1/1 CardMigTopologyInfeasible"


def test_custom_filter_rule_non_mig() -> None:
    """device_test.go TestCustomFilterRule_NonMig: on a node with a MIG GPU, a hami-core GPU
    passes the custom rule and is booked as asked, once per container (no revisit)."""
    target = mig_node(gpu("GPU-h", 0, memory=40960), mig_gpu("GPU-m", 1, profiles=one_g()))
    result = fitted(fit_pod(target, pod(mib(1, 4000)), context()))
    assert result.devices == ((ContainerDevice("GPU-h", "NVIDIA", 4000, 0),),)
    assert result.mig == ()
    # two asked: the MIG GPU has no placement, the hami-core GPU gives one
    assert failure(fit_pod(target, pod(mib(2, 4000)), context())) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardMigTopologyInfeasible"
    )


# --- the walk in detail -----------------------------------------------------------------------


def test_walk_revisits_the_gpu_then_moves_on() -> None:
    """device.go:846: after a pick the same MIG GPU is tried again; when it is full the walk
    goes to the next GPU (spread order walks GPU-b first: both empty, index order, from the
    end)."""
    two = one_g(_p(5, 1), _p(6, 1))
    target = mig_node(mig_gpu("GPU-a", 0, two), mig_gpu("GPU-b", 1, two))
    result = fitted(fit_pod(target, pod(mib(3, 4000)), mig_context()))
    assert [(m.gpu_uuid, m.placement.start, m.device_index) for m in result.mig] == [
        ("GPU-b", 6, 0),
        ("GPU-b", 5, 1),
        ("GPU-a", 6, 2),
    ]
    assert failure(fit_pod(target, pod(mib(5, 4000)), mig_context())) == (
        "2/2 CardMigTopologyInfeasible, 4/2 AllocatedCardsInsufficientRequest"
    )


def test_later_containers_see_earlier_placements_init_containers_do_not() -> None:
    """score.go: app containers share one node copy (AddResourceUsage books each placement),
    every init container gets its own copy; indexes count every container, init first."""
    target = mig_node(mig_gpu("GPU-a"))
    result = fitted(fit_pod(target, pod(mib(1, 5000), mib(1, 5000), mib(1, 5000)), context()))
    assert [(m.container_index, m.placement) for m in result.mig] == [
        (0, _p(6, 1)),
        (1, _p(5, 1)),
        (2, _p(4, 1)),
    ]
    with_init = fitted(
        fit_pod(target, pod(mib(1, 5000), mib(1, 5000), None, mib(1, 5000), init=2), context())
    )
    assert [(m.container_index, m.placement) for m in with_init.mig] == [
        (0, _p(6, 1)),
        (1, _p(6, 1)),
        (3, _p(6, 1)),
    ]
    assert with_init.devices[2] == ()


def test_memory_check_reads_profile_memory_in_use() -> None:
    """The GPU's memory in use is what AddResourceUsage booked (the profiles' memory): a
    3g.20gb and a 2g.10gb leave 10240 MiB, so 12000 MiB is CardInsufficientMemory before the
    placement is looked at."""
    in_use = [[*reserved("GPU-a", "3g.20gb", _p(0, 4)), *reserved("GPU-a", "2g.10gb", _p(4, 2))]]
    target = mig_node(mig_gpu("GPU-a"), used=[2], memory=[30720], cores=[70], in_use=in_use)
    assert failure(fit_pod(target, pod(mib(1, 12000)), context())) == ("1/1 CardInsufficientMemory")


def test_vgpu_mode_hami_core_skips_mig_gpus() -> None:
    """checkType (device.go:493-503): `nvidia.com/vgpu-mode` must contain the GPU's mode."""
    target = mig_node(gpu("GPU-h", 0), mig_gpu("GPU-m", 1))
    only_mig = fitted(fit_pod(target, pod(mib(1, 4000)), mig_context()))
    assert only_mig.mig == (MigAllocation(0, 0, "GPU-m", "1g.5gb", _p(6, 1)),)
    only_core = fitted(fit_pod(target, pod(mib(1, 4000)), context(vgpu_mode="hami-core")))
    assert only_core.devices == ((ContainerDevice("GPU-h", "NVIDIA", 4000, 0),),)


# --- getNodesUsage: the ledger ------------------------------------------------------------------


def node_object(name: str, devices: Sequence[GpuDevice]) -> dict[str, Any]:
    values = {"hami.io/node-nvidia-register": encode_node_devices(devices)}
    return {"kind": "Node", "metadata": {"name": name, "annotations": values}}


def pod_object(
    name: str, node_name: str, allocated: str, mig: str | None = None, uid: str = ""
) -> dict[str, Any]:
    annotations = {"hami.io/vgpu-node": node_name, "hami.io/vgpu-devices-allocated": allocated}
    if mig is not None:
        annotations["hami.io/vgpu-mig-allocations"] = mig
    return make_pod(
        name,
        "default",
        phase="Running",
        annotations=annotations,
        containers=[make_container("c", limits={"nvidia.com/gpu": "1"})],
        uid=uid or f"uid-{name}",
    )


def ledger_with(devices: Sequence[GpuDevice], *pods: dict[str, Any]) -> Ledger:
    ledger = Ledger()
    ledger.update_node(read_node(node_object("node1", devices)))
    for item in pods:
        ledger.update_pod(read_pod(item))
    return ledger


def snapshot(ledger: Ledger) -> NodeUsage:
    usage = ledger.node("node1")
    assert usage is not None
    return usage


def test_ledger_restores_mig_allocation_by_profile_and_placement() -> None:
    """TestGetNodesUsageRestoresMigAllocationByProfileAndPlacement."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1},"migUUID":"MIG-a","gpuInstanceID":7,'
        '"computeInstanceID":0}]'
    )
    ledger = ledger_with(
        [mig_gpu("GPU-a", profiles=one_g(_p(6, 1)))],
        pod_object("pod-1", "node1", "GPU-a,NVIDIA,5120,14:;", raw),
    )
    usage = snapshot(ledger)
    (allocation,) = usage.mig_in_use[0]
    assert allocation == MigAllocation(0, 0, "GPU-a", "1g.5gb", _p(6, 1), "MIG-a", 7, 0)
    assert allocation.runtime_ready
    assert usage.devices[0].healthy
    assert usage.occupied(0) == (_p(6, 1),)


def test_ledger_fails_closed_without_mig_allocation() -> None:
    """TestGetNodesUsageFailsClosedWithoutMigAllocation; and healthy again once the pod goes."""
    ledger = ledger_with(
        [mig_gpu("GPU-a", profiles=one_g(_p(6, 1)))],
        pod_object("pod-1", "node1", "GPU-a,NVIDIA,5120,14:;"),
    )
    assert not snapshot(ledger).devices[0].healthy
    assert failure(fit_pod(snapshot(ledger), pod(mib(1, 100)), context())) == ("1/1 CardNotHealth")
    ledger.delete_pod("default/pod-1")
    assert snapshot(ledger).devices[0].healthy


def test_ledger_restores_unconsumed_mig_reservations() -> None:
    """TestGetNodesUsageRestoresUnconsumedMigReservations: two reservations, one collapsed
    device entry; both in use, the GPU healthy."""
    raw = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":1,'
        '"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}]'
    )
    ledger = ledger_with(
        [mig_gpu("GPU-a", profiles=one_g(_p(5, 1), _p(6, 1)))],
        pod_object("pod-1", "node1", "GPU-a,NVIDIA,5120,14:;", raw),
    )
    usage = snapshot(ledger)
    assert usage.devices[0].healthy
    assert usage.occupied(0) == (_p(6, 1), _p(5, 1))
    ledger.delete_pod("default/pod-1")
    assert snapshot(ledger).occupied(0) == ()


def _one(uuid: str, start: int = 6) -> str:
    return (
        f'[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{uuid}","profile":"1g.5gb",'
        f'"placement":{{"start":{start},"size":1}}}}]'
    )


@pytest.mark.parametrize(
    ("allocated", "mig", "healthy"),
    [
        # "found a mig task running on a hami-core GPU"
        ("GPU-h,NVIDIA,5120,14:;", _one("GPU-h"), [False, True]),
        # the reservation matches the MIG GPU's device entry: all healthy
        ("GPU-m,NVIDIA,5120,14:;", _one("GPU-m"), [True, True]),
        # "unconsumed MIG reservations reference a non-MIG device"
        ("", _one("GPU-h"), [False, True]),
        # "unconsumed MIG reservations reference an unknown device": every MIG GPU
        ("GPU-m,NVIDIA,5120,14:;", _one("GPU-m")[:-1] + "," + _one("GPU-x")[1:], [True, False]),
        # an annotation that does not decode is ignored: the MIG GPU lacks its reservation
        ("GPU-m,NVIDIA,5120,14:;", "[{", [True, False]),
        ("GPU-m,NVIDIA,5120,14:;", _one("GPU-m").replace('"size":1', '"size":0'), [True, False]),
    ],
)
def test_ledger_health_rules(allocated: str, mig: str, healthy: list[bool]) -> None:
    """scheduler.go:737-830: reservations and devices that disagree mark GPUs unhealthy."""
    ledger = ledger_with(
        [gpu("GPU-h", 0, memory=40960), mig_gpu("GPU-m", 1)],
        pod_object("pod-1", "node1", allocated, mig),
    )
    assert [device.healthy for device in snapshot(ledger).devices] == healthy


# --- the decision and its annotation ----------------------------------------------------------


def gpu_pod(name: str, memory: str, count: str = "1", mode: str | None = "mig") -> Any:
    annotations = {} if mode is None else {"nvidia.com/vgpu-mode": mode}
    return read_pod(
        make_pod(
            name,
            "default",
            annotations=annotations,
            containers=[
                make_container("c", limits={"nvidia.com/gpu": count, "nvidia.com/gpumem": memory})
            ],
            uid=f"uid-{name}",
        )
    )


def test_decide_writes_hami_encoding_and_assume_occupies() -> None:
    """PatchAnnotations (device.go:505-517): `hami.io/vgpu-mig-allocations` is HAMi's
    EncodeMigAllocations; `assume` books the placement, so the next pod gets the next one."""
    ledger = ledger_with([mig_gpu("GPU-a")])
    result = decide(ledger, gpu_pod("p1", "8000"), None, NOW, SchedulerSettings())
    assert result.node == "node1"
    assert result.annotations["hami.io/vgpu-mig-allocations"] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2}}]'
    )
    assert result.annotations["hami.io/vgpu-devices-allocated"] == "GPU-a,NVIDIA,10240,28:;"
    assume(ledger, "default/p1", result)
    second = decide(ledger, gpu_pod("p2", "8000"), None, NOW, SchedulerSettings())
    assert decode_mig_allocations(second.annotations["hami.io/vgpu-mig-allocations"]) == (
        MigAllocation(0, 0, "GPU-a", "2g.10gb", _p(2, 2)),
    )
    # a non-MIG node: no MIG annotation at all
    plain = ledger_with([gpu("GPU-h", memory=40960)])
    other = decide(plain, gpu_pod("p3", "8000", mode=None), None, NOW, SchedulerSettings())
    assert other.node == "node1"
    assert "hami.io/vgpu-mig-allocations" not in other.annotations


# --- properties -------------------------------------------------------------------------------

_PROFILE_SETS = st.sampled_from([a100_profiles(), one_g(*(_p(i, 1) for i in range(7)))])


@st.composite
def mig_clusters(draw: st.DrawFn) -> list[GpuDevice]:
    devices: list[GpuDevice] = []
    for index in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            devices.append(
                mig_gpu(f"GPU-{index}", index, draw(_PROFILE_SETS), numa=draw(st.integers(0, 1)))
            )
        else:
            devices.append(gpu(f"GPU-{index}", index, memory=40960, numa=draw(st.integers(0, 1))))
    return devices


_REQUESTS = st.tuples(
    st.integers(1, 3), st.sampled_from([1000, 5000, 5120, 9000, 12000, 20000, 30000])
)


@settings(max_examples=60, deadline=None)
@given(
    devices=mig_clusters(), pods=st.lists(st.lists(_REQUESTS, min_size=1, max_size=2), max_size=8)
)
def test_placements_never_overlap_across_fitted_pods(
    devices: list[GpuDevice], pods: list[list[tuple[int, int]]]
) -> None:
    """Any sequence of pods decided and assumed: on every MIG GPU the reservations in use are
    placements its profiles report, and no two overlap; memory never exceeds the card."""
    ledger = ledger_with(devices)
    for number, containers in enumerate(pods):
        limits = [
            make_container(f"c{i}", limits={"nvidia.com/gpu": str(n), "nvidia.com/gpumem": str(m)})
            for i, (n, m) in enumerate(containers)
        ]
        info = read_pod(make_pod(f"p{number}", "default", containers=limits, uid=f"u{number}"))
        result = decide(ledger, info, None, NOW, SchedulerSettings())
        assume(ledger, info.key, result)
    usage = snapshot(ledger)
    for position, device in enumerate(usage.devices):
        assert usage.used_memory_mib[position] <= device.memory_mib
        placements = usage.occupied(position)
        if device.mode != "mig":
            assert placements == ()
            continue
        allowed = {p for profile in device.mig_profiles for p in profile.placements}
        assert set(placements) <= allowed
        for i, first in enumerate(placements):
            for second in placements[i + 1 :]:
                assert first.start + first.size <= second.start or (
                    second.start + second.size <= first.start
                ), placements


@settings(max_examples=80, deadline=None)
@given(
    devices=mig_clusters(),
    requests=st.lists(_REQUESTS, min_size=1, max_size=3),
    numa_bind=st.booleans(),
    policy=st.sampled_from(["spread", "binpack"]),
)
def test_screening_gives_the_literal_walk_answer_on_mig_nodes(
    devices: list[GpuDevice], requests: list[tuple[int, int]], numa_bind: bool, policy: str
) -> None:
    """The score-free screening never changes a MIG node's answer (picks, reservations or
    failure string)."""
    target = mig_node(*devices)
    ctx = context(policy, numa_bind=numa_bind)
    wanted = pod(*(mib(n, m) for n, m in requests))
    assert fit_pod(target, wanted, ctx) == fit_pod(target, wanted, ctx, screen=False)


@settings(max_examples=80, deadline=None)
@given(
    count=st.integers(1, 4),
    memory=st.lists(st.integers(0, 40000), min_size=1, max_size=4),
    request=_REQUESTS,
    numa_bind=st.booleans(),
    mutex=st.booleans(),
)
def test_mig_walk_is_the_plain_walk_without_mig_gpus(
    count: int, memory: list[int], request: tuple[int, int], numa_bind: bool, mutex: bool
) -> None:
    """Non-MIG behaviour unchanged: on GPUs none of which is in MIG mode the walk with a MIG
    view (HAMi's MIG rules on) and without one agree exactly."""
    devices = [gpu(f"G{i}", i, numa=i % 2, memory=40960) for i in range(count)]
    used = [1 if m else 0 for m in memory[:count]] + [0] * (count - len(memory))
    mem = (memory + [0] * count)[:count]
    target = node(*devices, used=used, memory=mem)
    assert not target.has_mig
    ctx = context("spread,mutex" if mutex else "spread", numa_bind=numa_bind)
    req = mib(*request)
    order = sorted_candidates(target, req, ctx)
    for stop_at in (req.count, None):  # HAMi's first fit, and topology-aware's every GPU
        plain = walk_gpus(target, order, req, ctx, stop_at)
        assert walk_gpus(target, order, req, ctx, stop_at, (), MigView(target)) == plain


# --- trust: only signed reservations count ----------------------------------------------------


def test_an_untrusted_reservation_counts_nowhere() -> None:
    """With a booking key a pod's reservation counts only with its signed booking: a
    placement moved after signing fails the signature, and the pod then counts without its
    booking, the reservation included (`trust.without_booking`)."""
    keys = keys_from(b"k" * 32)
    raw = _one("GPU-m")
    notes = {
        "hami.io/vgpu-node": "node1",
        "hami.io/vgpu-devices-allocated": "GPU-m,NVIDIA,5120,14:;",
        "hami.io/bind-time": "1767268800",
        "hami.io/vgpu-mig-allocations": raw,
    }
    item = pod_object("pod-1", "node1", notes["hami.io/vgpu-devices-allocated"], raw)
    fields = signed_fields("uid-pod-1", notes)
    assert fields is not None
    item["metadata"]["annotations"].update(
        {"hami.io/bind-time": "1767268800", ANNOTATION_BOOKING_SIGNATURE: keys.sign(fields)}
    )
    info = read_pod(item)
    assert untrusted_booking(info, keys, SchedulerSettings()) is None
    moved = dict(info.annotations)
    moved["hami.io/vgpu-mig-allocations"] = _one("GPU-m", start=5)
    tampered = replace(info, annotations=moved)
    assert "does not verify" in (untrusted_booking(tampered, keys, SchedulerSettings()) or "")
    stripped = without_booking(tampered)
    assert "hami.io/vgpu-mig-allocations" not in stripped.annotations
    ledger = ledger_with([gpu("GPU-h", 0, memory=40960), mig_gpu("GPU-m", 1)])
    ledger.update_pod(stripped)
    usage = snapshot(ledger)
    assert usage.occupied(1) == () and all(device.healthy for device in usage.devices)
