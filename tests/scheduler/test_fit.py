"""Fit: every check of docs/hami-reference.md 3.5.2 in order, failure strings, multi-container
pods."""

from __future__ import annotations

from typing import Any

import pytest

from hami_plugin.protocol.codec import encode_pod_devices
from hami_plugin.protocol.model import ContainerDevice, ContainerDevices
from hami_plugin.scheduler.fit import (
    FitContext,
    FitFailure,
    FitReason,
    fit_container,
    render_failure,
)
from hami_plugin.scheduler.pod_fit import PodFit, fit_pod
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest, PodRequests
from hami_plugin.scheduler.usage import NodeUsage

from .helpers import context, gpu, node


def mib(count: int, memory: int, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(count, memory, PERCENTAGE_UNSET, cores)


def reason(target: NodeUsage, request: ContainerRequest, ctx: FitContext | None = None) -> str:
    result = fit_container(target, request, ctx or context())
    assert isinstance(result, FitFailure), result
    return render_failure(result)


def picked(
    target: NodeUsage, request: ContainerRequest, ctx: FitContext | None = None
) -> ContainerDevices:
    result = fit_container(target, request, ctx or context())
    assert not isinstance(result, FitFailure), render_failure(result)
    return result[1]


def uuids(devices: ContainerDevices) -> list[str]:
    return [device.uuid for device in devices]


# --- single checks, with the exact strings -----------------------------------------------


def test_insufficient_memory() -> None:
    assert reason(node(gpu("A"), memory=[30000]), mib(1, 3000)) == "1/1 CardInsufficientMemory"


def test_cordoned() -> None:
    target = node(gpu("A"), gpu("B", 1), cordoned=["A", "B"])
    assert reason(target, mib(1, 100)) == "2/2 CardCordoned"


def test_not_healthy() -> None:
    assert reason(node(gpu("A", healthy=False)), mib(1, 100)) == "1/1 CardNotHealth"


@pytest.mark.parametrize(
    ("options", "card"),
    [
        ({"use_gpu_types": ("A100",)}, "NVIDIA-Tesla V100-PCIE-32GB"),
        ({"nouse_gpu_types": ("v100",)}, "NVIDIA-Tesla V100-PCIE-32GB"),  # case-insensitive
        ({"use_gpu_types": ("A100", "H100")}, "NVIDIA-Tesla V100-PCIE-32GB"),
        ({"vgpu_mode": "mig"}, "NVIDIA-Tesla V100-PCIE-32GB"),
    ],
)
def test_type_mismatch(options: dict[str, Any], card: str) -> None:
    assert reason(node(gpu("A", type=card)), mib(1, 100), context(**options)) == (
        "1/1 CardTypeMismatch"
    )


def test_type_filters_that_pass() -> None:
    target = node(gpu("A", type="NVIDIA A100-SXM4-80GB", memory=81920))
    assert uuids(picked(target, mib(1, 100), context(use_gpu_types=("a100",)))) == ["A"]
    assert uuids(picked(target, mib(1, 100), context(nouse_gpu_types=("V100",)))) == ["A"]
    assert uuids(picked(target, mib(1, 100), context(vgpu_mode="hami-core,mps"))) == ["A"]


def test_uuid_mismatch() -> None:
    target = node(gpu("A"), gpu("B", 1), gpu("C", 2))
    only_b = context(use_gpu_uuids=("B",))
    assert uuids(picked(target, mib(1, 100), only_b)) == ["B"]
    assert reason(target, mib(2, 100), only_b) == (
        "1/3 AllocatedCardsInsufficientRequest, 2/3 CardUuidMismatch"
    )
    not_c = context(nouse_gpu_uuids=("C",))
    assert uuids(picked(target, mib(1, 100), not_c)) == ["B"]  # spread, equal: walk from the end


def test_time_slicing_exhausted() -> None:
    target = node(gpu("A", count=4), used=[4])
    assert reason(target, mib(1, 100)) == "1/1 CardTimeSlicingExhausted"


def test_mutex_wants_an_idle_gpu() -> None:
    target = node(gpu("A"), gpu("B", 1), used=[1, 0])
    assert uuids(picked(target, mib(1, 100), context("mutex"))) == ["B"]
    busy = node(gpu("A"), used=[1])
    assert reason(busy, mib(1, 100), context("mutex")) == "1/1 ExclusiveDeviceAllocateConflict"
    assert reason(busy, mib(1, 100), context("binpack,mutex")) == (
        "1/1 ExclusiveDeviceAllocateConflict"
    )
    assert uuids(picked(busy, mib(1, 100), context("binpack"))) == ["A"]


def test_insufficient_core() -> None:
    target = node(gpu("A"), cores=[80])
    assert reason(target, mib(1, 100, cores=30)) == "1/1 CardInsufficientCore"


def test_exclusive_request_needs_an_unused_gpu() -> None:
    target = node(gpu("A"), used=[1])
    assert reason(target, mib(1, 100, cores=100)) == "1/1 ExclusiveDeviceAllocateConflict"
    # cores above 100 are clamped to 100 and so ask the GPU exclusively too
    assert reason(target, mib(1, 100, cores=150)) == "1/1 ExclusiveDeviceAllocateConflict"
    free = node(gpu("A"))
    (device,) = picked(free, mib(1, 100, cores=150))
    assert device.used_cores == 100


def test_compute_units_exhausted() -> None:
    target = node(gpu("A"), used=[2], cores=[100])
    assert reason(target, mib(1, 100)) == "1/1 CardComputeUnitsExhausted"


def test_a_mig_gpu_without_profiles_is_not_picked() -> None:
    target = node(gpu("A", mode="mig"))
    assert reason(target, mib(1, 100)) == "1/1 CardMigTopologyInfeasible"


def test_node_insufficient_device_is_a_bare_reason() -> None:
    target = node(gpu("A"), gpu("B", 1))
    assert reason(target, mib(3, 100)) == "NodeInsufficientDevice"
    # only GPUs whose type names NVIDIA are candidates
    other = node(gpu("A"), gpu("B", 1, type="Ascend910"))
    assert reason(other, mib(2, 100)) == "NodeInsufficientDevice"


def test_first_failing_check_wins() -> None:
    # unhealthy and cordoned and exhausted: only CardNotHealth counts
    target = node(gpu("A", healthy=False, count=1), used=[1], cordoned=["A"])
    assert reason(target, mib(1, 100)) == "1/1 CardNotHealth"
    # exhausted slots and memory: slots are checked first
    target = node(gpu("A", count=1), used=[1], memory=[32768])
    assert reason(target, mib(1, 100)) == "1/1 CardTimeSlicingExhausted"
    # memory before cores
    target = node(gpu("A"), memory=[32768], cores=[100])
    assert reason(target, mib(1, 100, cores=10)) == "1/1 CardInsufficientMemory"


def test_counts_over_many_gpus_sort_as_strings() -> None:
    gpus = [gpu(f"G{i}", i) for i in range(10)]
    used = [10] * 4 + [0] * 6
    target = node(*gpus, used=used)
    ctx = context(nouse_gpu_uuids=("G4", "G5", "G6"))
    # 3 GPUs were picked: HAMi v2.10 counts AllocatedCardsInsufficientRequest as the GPUs
    # picked (len(tmpDevs[k.Type]), device.go:872), so the counts add up to 10
    assert reason(target, mib(4, 100), ctx) == (
        "3/10 AllocatedCardsInsufficientRequest, 3/10 CardUuidMismatch, "
        "4/10 CardTimeSlicingExhausted"
    )
    # lexicographic, as HAMi sorts the strings: "10/10 ..." before "2/10 ..."
    failure = FitFailure(
        ((FitReason.CARD_NOT_HEALTH, 2), (FitReason.CARD_CORDONED, 10)), candidates=10
    )
    assert render_failure(failure) == "10/10 CardCordoned, 2/10 CardNotHealth"


# --- memory per GPU ---------------------------------------------------------------------


def test_percentage_is_of_each_gpu() -> None:
    target = node(gpu("A", memory=15360), gpu("B", 1, memory=32768, numa=1))
    devices = picked(target, ContainerRequest(2, 0, 50, 10))
    assert {(d.uuid, d.used_mem_mib) for d in devices} == {("A", 7680), ("B", 16384)}
    whole = picked(node(gpu("A")), ContainerRequest(1, 0, 100, 0))
    assert whole[0].used_mem_mib == 32768


# --- NUMA binding ------------------------------------------------------------------------


def test_numa_bind_needs_one_numa_node() -> None:
    split = node(gpu("A", 0, numa=0), gpu("B", 1, numa=1))
    assert reason(split, mib(2, 100), context(numa_bind=True)) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"
    )
    assert len(picked(split, mib(2, 100), context())) == 2  # without numa-bind it fits
    four = node(gpu("A", 0, numa=0), gpu("B", 1, numa=0), gpu("C", 2, numa=1), gpu("D", 3, numa=1))
    # spread + numa-bind: lower NUMA sorts first, so the walk tries NUMA 1 first
    assert uuids(picked(four, mib(2, 100), context(numa_bind=True))) == ["D", "C"]
    # binpack + numa-bind: higher NUMA sorts first, NUMA 0 is tried first
    assert uuids(picked(four, mib(2, 100), context("binpack", numa_bind=True))) == ["B", "A"]


def test_numa_bind_skips_a_numa_node_without_room() -> None:
    four = node(
        gpu("A", 0, numa=0),
        gpu("B", 1, numa=0),
        gpu("C", 2, numa=1),
        gpu("D", 3, numa=1),
        memory=[0, 0, 32768, 0],
    )
    assert uuids(picked(four, mib(2, 100), context(numa_bind=True))) == ["B", "A"]
    # the picks on NUMA 1 (D) are counted as NumaNotFit when the walk moves on and fails
    full = node(
        gpu("A", 0, numa=0),
        gpu("B", 1, numa=0),
        gpu("C", 2, numa=1),
        gpu("D", 3, numa=1),
        memory=[0, 32768, 32768, 0],
    )
    assert reason(full, mib(2, 100), context(numa_bind=True)) == (
        "1/4 AllocatedCardsInsufficientRequest, 1/4 NumaNotFit, 2/4 CardInsufficientMemory"
    )


# --- which GPUs: policies ------------------------------------------------------------------


def test_gpu_binpack_and_spread_outcomes() -> None:
    """Design note 6-7: binpack takes the fullest GPU, spread the emptiest."""
    target = node(gpu("A", 0), gpu("B", 1), gpu("C", 2), memory=[8000, 16000, 0], used=[1, 2, 0])
    assert uuids(picked(target, mib(1, 1000), context("binpack"))) == ["B"]
    assert uuids(picked(target, mib(1, 1000), context("spread"))) == ["C"]
    assert uuids(picked(target, mib(2, 1000), context("binpack"))) == ["B", "A"]
    assert uuids(picked(target, mib(2, 1000), context("spread"))) == ["C", "A"]


def test_binpack_skips_a_full_gpu() -> None:
    target = node(gpu("A", 0), gpu("B", 1), memory=[0, 32000])
    assert uuids(picked(target, mib(1, 1000), context("binpack"))) == ["A"]


# --- whole pods -----------------------------------------------------------------------------


def pod(*containers: ContainerRequest | None, init: int = 0) -> PodRequests:
    return PodRequests(tuple(containers), init)


def failure_of(result: PodFit | FitFailure) -> str:
    assert isinstance(result, FitFailure), result
    return render_failure(result)


def devices_of(result: PodFit | FitFailure) -> str:
    assert isinstance(result, PodFit), result
    return encode_pod_devices(result.devices)


def test_two_containers_share_a_card_sequentially() -> None:
    """docs/hami-reference.md 1.4.3 example 2: one card, 3000 MiB and 5000 MiB."""
    target = node(gpu("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"))
    result = fit_pod(target, pod(mib(1, 3000), mib(1, 5000)), context())
    assert devices_of(result) == (
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;"
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,5000,0:;"
    )


def test_later_app_containers_see_earlier_ones() -> None:
    target = node(gpu("A", memory=10000))
    assert failure_of(fit_pod(target, pod(mib(1, 6000), mib(1, 6000)), context())) == (
        "1/1 CardInsufficientMemory"
    )
    # slots too: a 1-slot GPU cannot take two containers
    single = node(gpu("A", count=1))
    assert failure_of(fit_pod(single, pod(mib(1, 10), mib(1, 10)), context())) == (
        "1/1 CardTimeSlicingExhausted"
    )


def test_init_containers_fit_against_fresh_usage() -> None:
    """Init containers run one after another: each sees the node as it is, and the app
    containers do not see them."""
    target = node(gpu("A", memory=10000))
    result = fit_pod(target, pod(mib(1, 8000), mib(1, 8000), mib(1, 8000), init=2), context())
    assert devices_of(result) == "A,NVIDIA,8000,0:;A,NVIDIA,8000,0:;A,NVIDIA,8000,0:;"
    failing_init = fit_pod(target, pod(mib(1, 20000), mib(1, 10), init=1), context())
    assert failure_of(failing_init) == "1/1 CardInsufficientMemory"


def test_containers_without_gpu_are_padded() -> None:
    """docs/hami-reference.md 1.4.3 example 4 and HAMi's 'middle container uses one device'."""
    target = node(gpu("GPU-aaa"))
    assert devices_of(fit_pod(target, pod(None, mib(1, 1000, 30)), context())) == (
        ";GPU-aaa,NVIDIA,1000,30:;"
    )
    assert devices_of(fit_pod(target, pod(None, mib(1, 1000), None), context())) == (
        ";GPU-aaa,NVIDIA,1000,0:;;"
    )
    # two init containers, the first without GPU (HAMi issue #1667): indexes line up
    assert (
        devices_of(fit_pod(target, pod(None, mib(1, 500), None, mib(1, 700), init=2), context()))
        == ";GPU-aaa,NVIDIA,500,0:;;GPU-aaa,NVIDIA,700,0:;"
    )


def test_multi_gpu_container_devices_in_pick_order() -> None:
    """docs/hami-reference.md 1.4.3 example 3: one container, two GPUs."""
    target = node(gpu("GPU-aaa", 0), gpu("GPU-bbb", 1))
    result = fit_pod(target, pod(ContainerRequest(2, 4096, PERCENTAGE_UNSET, 50)), context())
    assert devices_of(result) == "GPU-bbb,NVIDIA,4096,50:GPU-aaa,NVIDIA,4096,50:;"


def test_fit_does_not_touch_the_node() -> None:
    target = node(gpu("A"), gpu("B", 1))
    before = (target.used, target.used_memory_mib, target.used_cores)
    fit_pod(target, pod(mib(1, 100), mib(2, 100)), context())
    assert (target.used, target.used_memory_mib, target.used_cores) == before


def test_scoring_weights_change_the_gpu() -> None:
    """`hami.io/device-scoring-weights`: weight memory only vs slots only."""
    from hami_plugin.protocol.model import ScoringWeights

    # A: many slots used, little memory; B: few slots, much memory
    target = node(gpu("A", 0), gpu("B", 1), used=[6, 1], memory=[1000, 20000])
    by_slots = context("binpack", weights=ScoringWeights(1, 0, 0))
    by_memory = context("binpack", weights=ScoringWeights(0, 0, 1))
    assert uuids(picked(target, mib(1, 100), by_slots)) == ["A"]
    assert uuids(picked(target, mib(1, 100), by_memory)) == ["B"]


def test_picked_device_type_is_nvidia() -> None:
    target = node(gpu("A", type="NVIDIA A100-SXM4-80GB"))
    assert picked(target, mib(1, 10)) == (ContainerDevice("A", "NVIDIA", 10, 0),)
