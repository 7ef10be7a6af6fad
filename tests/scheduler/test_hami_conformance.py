"""Rule-by-rule conformance with HAMi v2.10's scheduler (docs/hami-reference.md).

Every test names the reference section it checks. Expected values are HAMi's behaviour, worked
out by hand from the reference (and, where the reference is loose, from HAMi's own code and
tests: see the notes at `NumaNotFit`/`AllocatedCardsInsufficientRequest`, type and UUID
lists, `vgpu-mode`, and the device order kept between app containers). The deliberate
differences (docs/scheduling.md, "Where we differ from HAMi, on purpose") are not tested here
as HAMi's: the device score includes the request, ties between nodes go to the smaller name,
GPUs start in index order, and an unknown policy is an error.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hami_plugin.cli import main
from hami_plugin.protocol.codec import encode_node_devices, parse_gpu_policy, parse_pod_gpu_options
from hami_plugin.protocol.model import (
    ContainerDevice,
    GpuDevice,
    NodePolicy,
    ScoringWeights,
)
from hami_plugin.protocol.objects import ContainerSpec, read_node, read_pod
from hami_plugin.scheduler.filter import assume, decide
from hami_plugin.scheduler.fit import FitContext, FitFailure, fit_container, render_failure
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.pod_fit import PodFit, fit_pod
from hami_plugin.scheduler.requests import (
    ContainerRequest,
    PodRequests,
    container_request,
    pod_requests,
)
from hami_plugin.scheduler.score import device_score, node_score
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage
from hami_plugin.testing.apiserver import make_container
from hami_plugin.testing.apiserver import make_pod as make_pod_object

from .helpers import context, gpu, node

NOW = datetime(2025, 3, 4, 10, 20, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
PCT = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
DEFAULTS = SchedulerSettings()


# --- helpers --------------------------------------------------------------------------------


def request_of(
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    settings: SchedulerSettings = DEFAULTS,
) -> ContainerRequest | None:
    spec = ContainerSpec("c", limits or {}, requests or {})
    return container_request(spec, settings)[0]


def problems_of(limits: dict[str, Any], settings: SchedulerSettings = DEFAULTS) -> list[str]:
    return [str(found) for found in container_request(ContainerSpec("c", limits), settings)[1]]


def mib(count: int, memory: int, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(count, memory, 101, cores)


def reason(target: NodeUsage, request: ContainerRequest, ctx: FitContext | None = None) -> str:
    result = fit_container(target, request, ctx or context())
    assert isinstance(result, FitFailure), f"expected a failure, got {result}"
    return render_failure(result)


def picks(target: NodeUsage, request: ContainerRequest, ctx: FitContext | None = None) -> list[str]:
    result = fit_container(target, request, ctx or context())
    assert not isinstance(result, FitFailure), render_failure(result)
    return [device.uuid for device in result[1]]


def raw_context(annotations: dict[str, str], policy: str = "spread") -> FitContext:
    """The context `decide` builds from the pod's annotations."""
    options = parse_pod_gpu_options(annotations)
    return FitContext.for_pod(options, parse_gpu_policy(policy))


def pod_fit(target: NodeUsage, requests: PodRequests, ctx: FitContext | None = None) -> PodFit:
    result = fit_pod(target, requests, ctx or context())
    assert isinstance(result, PodFit), render_failure(result)
    return result


def f32(value: float) -> float:
    """Round to IEEE float32 (independently of the scheduler's own helper)."""
    return array("f", [value])[0]


def make_pod(
    *containers: dict[str, Any] | None,
    init: tuple[dict[str, Any] | None, ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Pod `ns/p` whose containers (`c0`, ...) and init containers (`i0`, ...) ask these
    limits (None: no resources)."""
    return make_pod_object(
        "p",
        "ns",
        annotations=annotations,
        containers=[make_container(f"c{i}", limits=limits) for i, limits in enumerate(containers)],
        init_containers=[make_container(f"i{i}", limits=limits) for i, limits in enumerate(init)],
    )


def node_object(name: str, devices: list[GpuDevice], **annotations: str) -> dict[str, Any]:
    values = {"hami.io/node-nvidia-register": encode_node_devices(devices), **annotations}
    return {"kind": "Node", "metadata": {"name": name, "annotations": values}}


def pod_object(
    name: str,
    allocated: str,
    *,
    node_name: str = "n1",
    init: int = 0,
    apps: int = 1,
    phase: str = "Running",
    init_done: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    pod = make_pod_object(
        name,
        "ns",
        phase=phase,
        annotations={
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": allocated,
        },
        containers=[make_container(f"c{i}") for i in range(apps)],
        init_containers=[make_container(f"i{i}") for i in range(init)],
    )
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2025-03-04T10:00:00Z"
    if init_done:
        pod["status"]["initContainerStatuses"] = [
            {"state": {"terminated": {"exitCode": 0}}} for _ in range(init)
        ]
    return pod


def usage_of(ledger: Ledger, name: str = "n1") -> tuple[tuple[int, ...], ...]:
    snapshot = ledger.node(name)
    assert snapshot is not None
    return snapshot.used, snapshot.used_memory_mib, snapshot.used_cores


# --- docs/hami-reference.md 2: per-container requests -----------------------------------------


def test_2_1_count_is_read_from_limits_else_requests() -> None:
    assert request_of({GPU: "2"}, {GPU: "1"}) == ContainerRequest(2, 0, 100, 0)
    assert request_of(requests={GPU: "3"}) == ContainerRequest(3, 0, 100, 0)
    # limits win even when they say 0 ("no request"), requests are not consulted
    assert request_of({GPU: "0"}, {GPU: "1"}) is None


def test_2_each_resource_reads_limits_then_requests_on_its_own() -> None:
    request = request_of({MEM: "3000"}, {GPU: "1", CORES: "20", MEM: "9999"})
    assert request == ContainerRequest(1, 3000, 101, 20)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        ("1k", 1000),  # an exact integer: HAMi asks for 1000 GPUs
        ("2Ki", 2048),
        ("1e3", 1000),
        ("1.0", 1),  # the API server hands it over as "1"
        (2, 2),  # YAML int
    ],
)
def test_2_1_count_must_be_an_exact_integer(count: object, expected: int) -> None:
    request = request_of({GPU: count})
    assert request is not None
    assert request.count == expected


@pytest.mark.parametrize("count", ["500m", "1.5", "0.1"])
def test_2_1_a_fractional_count_asks_no_gpu(count: str) -> None:
    assert request_of({GPU: count, MEM: "1000"}) is None
    assert problems_of({GPU: count})[0].endswith("GPU request dropped")


def test_2_1_a_count_of_1k_fails_as_node_insufficient_device() -> None:
    ledger = Ledger()
    ledger.set_node("n1", [gpu("A"), gpu("B", 1)])
    result = decide(ledger, read_pod(make_pod({GPU: "1k"})), None, NOW, DEFAULTS)
    assert {name: render_failure(f) for name, f in result.failed_nodes.items()} == {
        "n1": "NodeInsufficientDevice"
    }


def test_2_1_count_is_kept_in_int32_as_hami_does() -> None:
    # Nums: int32(n). 2**32 + 1 becomes 1; 2**31 becomes negative, so no GPU is asked.
    assert request_of({GPU: str(2**32 + 1)}) == ContainerRequest(1, 0, 100, 0)
    assert "taken as 1" in problems_of({GPU: str(2**32 + 1)})[0]
    assert request_of({GPU: str(2**31)}) is None
    assert request_of({GPU: str(2**32)}) is None  # int32 0


@pytest.mark.parametrize("memory", ["16Gi", "16.0Gi", "1.5", "-1", "2147483648"])
def test_2_2_bad_memory_drops_the_whole_container_request(memory: str) -> None:
    assert request_of({GPU: "1", MEM: memory, CORES: "30"}) is None
    assert problems_of({GPU: "1", MEM: memory})[0].endswith("GPU request dropped")


def test_2_2_memory_bound_and_factor() -> None:
    assert request_of({GPU: "1", MEM: "2147483647"}) == ContainerRequest(1, 2147483647, 101, 0)
    assert request_of({GPU: "1", MEM: "1.5k"}) == ContainerRequest(1, 1500, 101, 0)
    factor = SchedulerSettings(memory_factor=4)
    # bound is 2147483647 / 4 = 536870911 (integer division), value multiplied by the factor
    assert request_of({GPU: "1", MEM: "536870911"}, settings=factor) == ContainerRequest(
        1, 2147483644, 101, 0
    )
    assert request_of({GPU: "1", MEM: "536870912"}, settings=factor) is None
    assert request_of({GPU: "1", MEM: "1000"}, settings=factor) == ContainerRequest(1, 4000, 101, 0)


@pytest.mark.parametrize(
    ("percentage", "expected"),
    [
        ("150", 100),  # > 100 clamped
        ("100", 100),
        ("1", 1),
        ("0", 101),  # <= 0 is unset
        ("-5", 101),
        ("50.5", 101),  # not an integer: unset
        ("9300P", 101),  # 9.3e18 is beyond int64: AsInt64 says no, unset
        ("1E", 100),  # 1e18 fits int64: clamped
    ],
)
def test_2_3_percentage_rules(percentage: str, expected: int) -> None:
    # with MiB given the sentinel stays visible (no default kicks in)
    assert request_of({GPU: "1", MEM: "3000", PCT: percentage}) == ContainerRequest(
        1, 3000, expected, 0
    )


def test_2_4_defaults_when_neither_memory_nor_percentage() -> None:
    assert request_of({GPU: "1"}) == ContainerRequest(1, 0, 100, 0)  # whole card
    assert request_of({GPU: "1", PCT: "0"}) == ContainerRequest(1, 0, 100, 0)
    assert request_of({GPU: "1", MEM: "0"}) == ContainerRequest(1, 0, 100, 0)
    settings = SchedulerSettings(default_memory_mib=2048, memory_factor=4)
    # defaultMemory is taken as is (no factor) and the percentage stays the sentinel
    assert request_of({GPU: "1"}, settings=settings) == ContainerRequest(1, 2048, 101, 0)
    # a percentage means no default memory
    assert request_of({GPU: "1", PCT: "30"}, settings=settings) == ContainerRequest(1, 0, 30, 0)


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        (None, 30),  # default
        ("0", 0),  # given: wins over the default
        ("1.5", 30),  # not an integer: default
        ("250", 250),  # kept; Fit clamps it
        ("-10", -10),  # an exact integer, taken as is (int32)
        (str(2**32 + 40), 40),  # int32(corenums)
    ],
)
def test_2_5_cores(cores: str | None, expected: int) -> None:
    settings = SchedulerSettings(default_cores=30)
    limits = {GPU: "1"} if cores is None else {GPU: "1", CORES: cores}
    request = request_of(limits, settings=settings)
    assert request is not None
    assert request.cores_percent == expected


def test_2_init_containers_come_first() -> None:
    pod = make_pod({GPU: "1", MEM: "10"}, None, init=({GPU: "1", MEM: "20"}, None))
    requests = pod_requests(read_pod(pod), DEFAULTS)
    assert requests.init_count == 2
    assert [r.memory_mib if r else None for r in requests.containers] == [20, None, 10, None]


def test_2_6_memory_booked_per_gpu_is_integer_division_of_each_card() -> None:
    request = ContainerRequest(1, 0, 33, 0)
    assert request.memory_on(15109) == 4985  # 498597 // 100
    assert request.memory_on(32768) == 10813
    assert ContainerRequest(1, 0, 100, 0).memory_on(15109) == 15109
    assert ContainerRequest(1, 700, 33, 0).memory_on(15109) == 700  # MiB win in Fit
    # Totalmem * pct is int32 arithmetic in HAMi (only absurd cards overflow)
    assert ContainerRequest(1, 0, 100, 0).memory_on(30_000_000) == -12949672


# --- docs/hami-reference.md 3.3: usage tracking -----------------------------------------------


@pytest.fixture
def ledger() -> Ledger:
    ledger = Ledger()
    ledger.update_node(read_node(node_object("n1", [gpu("A", 0), gpu("B", 1)])))
    return ledger


ALLOCATED = (
    "A,NVIDIA,1000,10:;"  # init 0
    "A,NVIDIA,3000,20:B,NVIDIA,100,1:;"  # init 1
    "A,NVIDIA,500,5:;"  # app 0
    "A,NVIDIA,700,5:;"  # app 1
)


def test_3_3_collapsed_usage_init_peak_against_app_sum(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", ALLOCATED, init=2, apps=2)))
    # A: slots max(1, 2, 1) = 2, memory max(3000, 1200), cores max(20, 10); B: init only, 1 slot
    assert usage_of(ledger) == ((2, 1), (3000, 100), (20, 1))


def test_3_3_finished_init_containers_shrink_usage_for_good(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", ALLOCATED, init=2, apps=2, init_done=True)))
    assert usage_of(ledger) == ((2, 0), (1200, 0), (10, 0))
    ledger.update_pod(read_pod(pod_object("p", ALLOCATED, init=2, apps=2)))  # statuses gone again
    assert usage_of(ledger) == ((2, 0), (1200, 0), (10, 0))


def test_3_3_failed_and_succeeded_release_terminating_keeps(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p1", "A,NVIDIA,1000,10:;")))
    ledger.update_pod(read_pod(pod_object("p2", "B,NVIDIA,2000,20:;", deleting=True)))
    assert usage_of(ledger) == ((1, 1), (1000, 2000), (10, 20))
    ledger.update_pod(read_pod(pod_object("p1", "A,NVIDIA,1000,10:;", phase="Failed")))
    ledger.update_pod(
        read_pod(pod_object("p2", "B,NVIDIA,2000,20:;", phase="Succeeded", deleting=True))
    )
    assert usage_of(ledger) == ((0, 0), (0, 0), (0, 0))


def test_3_3_a_gpu_not_on_the_node_is_ignored(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", "Z,NVIDIA,1000,10:A,NVIDIA,5,1:;")))
    assert usage_of(ledger) == ((1, 0), (5, 0), (1, 0))


def test_3_3_only_pods_with_a_vgpu_node_are_tracked(ledger: Ledger) -> None:
    pod = pod_object("p", "A,NVIDIA,1000,10:;")
    del pod["metadata"]["annotations"]["hami.io/vgpu-node"]
    ledger.update_pod(read_pod(pod))
    assert usage_of(ledger) == ((0, 0), (0, 0), (0, 0))


# --- docs/hami-reference.md 3.4: the filter ---------------------------------------------------


def test_3_4_1_a_pod_without_gpu_passes_everywhere() -> None:
    ledger = Ledger()
    ledger.set_node("n1", [gpu("A")])
    result = decide(ledger, read_pod(make_pod(None, {"cpu": "1"})), ["n1", "ghost"], NOW, DEFAULTS)
    assert (result.node, dict(result.failed_nodes), dict(result.annotations)) == (None, {}, {})
    assert not result.requests.wants_gpu


def test_3_4_3_unregistered_names_fail_with_a_bare_string() -> None:
    ledger = Ledger()
    ledger.set_node("n1", [gpu("A")])
    result = decide(ledger, read_pod(make_pod({GPU: "2"})), ["n1", "ghost"], NOW, DEFAULTS)
    assert {name: render_failure(f) for name, f in result.failed_nodes.items()} == {
        "ghost": "node unregistered",
        "n1": "NodeInsufficientDevice",
    }


def test_3_4_6_node_policy_uses_the_score_before_the_pod() -> None:
    """binpack takes the highest node score, spread the lowest; the score is the node's usage
    before this pod, so a pod that would make the emptier node fuller does not change it."""
    ledger = Ledger()
    ledger.set_node("big", [gpu("B0", 0, memory=81920), gpu("B1", 1, memory=81920)])
    ledger.set_node("small", [gpu("S0", 0, memory=16384)])
    # big: 1 slot of 20, 10 of 200 cores, 8192 of 163840 MiB; small: empty
    ledger.update_pod(read_pod(pod_object("fill", "B0,NVIDIA,8192,10:;", node_name="big")))
    pod = make_pod({GPU: "1", MEM: "16000", CORES: "90"})
    binpack = decide(
        ledger, read_pod(pod), None, NOW, SchedulerSettings(node_policy=NodePolicy.BINPACK)
    )
    spread = decide(
        ledger, read_pod(pod), None, NOW, SchedulerSettings(node_policy=NodePolicy.SPREAD)
    )
    assert (binpack.node, spread.node) == ("big", "small")
    big = ledger.node("big")
    assert big is not None
    assert binpack.scores == {"big": big.score}
    assert big.score == f32(10 * f32(f32(f32(1 / 20) + f32(10 / 200)) + f32(8192 / 163840)))


def test_3_4_5_every_failure_is_reported_when_no_node_fits() -> None:
    ledger = Ledger()
    ledger.set_node("a", [gpu("A0", 0, healthy=False)])
    ledger.set_node("b", [gpu("B0", 0)], frozenset({"B0"}))
    ledger.set_node("c", [gpu("C0", 0, memory=1000)])
    result = decide(ledger, read_pod(make_pod({GPU: "1", MEM: "2000"})), None, NOW, DEFAULTS)
    assert result.node is None
    assert {name: render_failure(f) for name, f in result.failed_nodes.items()} == {
        "a": "1/1 CardNotHealth",
        "b": "1/1 CardCordoned",
        "c": "1/1 CardInsufficientMemory",
    }


# --- docs/hami-reference.md 3.5.1: candidates and NodeInsufficientDevice ----------------------


def test_3_5_1_b_candidates_contain_the_type_case_insensitively() -> None:
    target = node(
        gpu("A", 0, type="nvidia-geforce rtx 4090", memory=100),
        gpu("X", 1, type="Ascend910"),
    )
    # X is not a candidate: N is 1, and it is never tried
    assert reason(target, mib(1, 200)) == "1/1 CardInsufficientMemory"
    assert reason(target, mib(2, 10)) == "NodeInsufficientDevice"


def test_3_5_1_c_unhealthy_gpus_still_count_as_candidates() -> None:
    target = node(gpu("A", 0), gpu("B", 1, healthy=False))
    assert reason(target, mib(2, 100)) == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth"
    assert reason(target, mib(3, 100)) == "NodeInsufficientDevice"


def test_3_5_1_c_a_mig_request_skips_the_count_check() -> None:
    target = node(gpu("A", 0), gpu("M", 1, mode="mig"))
    # a MIG GPU may host several instances, so HAMi goes on to Fit (this MIG GPU registers no
    # profile, so it has no placement: CardMigTopologyInfeasible)
    assert reason(target, mib(3, 100)) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardMigTopologyInfeasible"
    )
    hami_core = raw_context({"nvidia.com/vgpu-mode": "hami-core"})
    assert reason(target, mib(3, 100), hami_core) == "NodeInsufficientDevice"
    assert reason(target, mib(3, 100), raw_context({"nvidia.com/vgpu-mode": "mig"})) == (
        "1/2 CardMigTopologyInfeasible, 1/2 CardTypeMismatch"
    )


# --- docs/hami-reference.md 3.5.2: per-GPU checks, in HAMi's order ---------------------------


def _one(target_gpu: GpuDevice, used: int = 0, memory: int = 0, cores: int = 0) -> NodeUsage:
    return node(target_gpu, used=[used], memory=[memory], cores=[cores])


@pytest.mark.parametrize(
    ("target", "asked", "ctx", "expected"),
    [
        # 1 health before 2 cordon
        (node(gpu("A", healthy=False), cordoned=["A"]), mib(1, 1), None, "CardNotHealth"),
        # 2 cordon before 3 type
        (
            node(gpu("A"), cordoned=["A"]),
            mib(1, 1),
            context(use_gpu_types=("A100",)),
            "CardCordoned",
        ),
        # 3 type before 5 uuid
        (
            _one(gpu("A")),
            mib(1, 1),
            context(use_gpu_types=("A100",), use_gpu_uuids=("B",)),
            "CardTypeMismatch",
        ),
        # 5 uuid before 6 slots
        (
            _one(gpu("A", count=1), used=1),
            mib(1, 1),
            context(nouse_gpu_uuids=("A",)),
            "CardUuidMismatch",
        ),
        # 6 slots before 7 mutex
        (_one(gpu("A", count=1), used=1), mib(1, 1), context("mutex"), "CardTimeSlicingExhausted"),
        # 7 mutex before 11 memory
        (
            _one(gpu("A"), used=1, memory=32768),
            mib(1, 1),
            context("mutex"),
            "ExclusiveDeviceAllocateConflict",
        ),
        # 11 memory before 12 cores
        (_one(gpu("A"), memory=32768, cores=100), mib(1, 1, 10), None, "CardInsufficientMemory"),
        # 12 cores before 13 exclusive
        (_one(gpu("A"), used=1, cores=10), mib(1, 1, 100), None, "CardInsufficientCore"),
        # 13 exclusive before 15 MIG
        (
            _one(gpu("A", mode="mig"), used=1),
            mib(1, 1, 100),
            None,
            "ExclusiveDeviceAllocateConflict",
        ),
        # 14 compute units before 15 MIG
        (_one(gpu("A", mode="mig"), cores=100), mib(1, 1, 0), None, "CardComputeUnitsExhausted"),
        (_one(gpu("A", mode="mig")), mib(1, 1), None, "CardMigTopologyInfeasible"),
    ],
)
def test_3_5_2_the_first_failing_check_is_counted(
    target: NodeUsage, asked: ContainerRequest, ctx: FitContext | None, expected: str
) -> None:
    assert reason(target, asked, ctx) == f"1/1 {expected}"


def test_3_5_2_numa_not_fit_grows_by_the_gpus_picked_on_the_numa_node_left() -> None:
    """v2.10 `pkg/device/nvidia/device.go` Fit, line 748: `reason[NumaNotFit] +=
    len(tmpDevs[k.Type])`, the GPUs picked on the NUMA node the walk leaves (v2.8/v2.9 added
    `len(tmpDevs)`, the map's size, always 1)."""
    four = node(gpu("A", 0, numa=0), gpu("B", 1, numa=0), gpu("C", 2, numa=1), gpu("D", 3, numa=1))
    # spread + numa-bind walks D, C (2 picks on NUMA 1), then B, A (2 picks): 3 not reached
    assert reason(four, mib(3, 100), context(numa_bind=True)) == (
        "2/4 AllocatedCardsInsufficientRequest, 2/4 NumaNotFit"
    )
    six = node(*(gpu(f"G{i}", i, numa=i // 2) for i in range(6)))
    # NUMA 2 and NUMA 1 are left with 2 picks each, NUMA 0 ends the walk with 2
    assert reason(six, mib(3, 100), context(numa_bind=True)) == (
        "2/6 AllocatedCardsInsufficientRequest, 4/6 NumaNotFit"
    )
    # leaving a NUMA node where nothing was picked adds nothing
    blocked = node(*four.devices, memory=[0, 0, 32768, 32768])
    assert reason(blocked, mib(3, 100), context(numa_bind=True)) == (
        "2/4 AllocatedCardsInsufficientRequest, 2/4 CardInsufficientMemory"
    )
    # one GPU picked on the NUMA node left, two on the last one
    uneven = node(*four.devices, memory=[0, 0, 32768, 0])
    assert reason(uneven, mib(3, 100), context(numa_bind=True)) == (
        "1/4 CardInsufficientMemory, 1/4 NumaNotFit, 2/4 AllocatedCardsInsufficientRequest"
    )


def test_3_5_2_allocated_cards_insufficient_request_counts_the_gpus_picked() -> None:
    """v2.10 device.go:871-872 sets `len(tmpDevs[k.Type])`. v2.10's device_test.go ("fit fail:
    partial allocation AllocatedCardsInsufficientRequest for multiple cards") calls Fit with 3
    GPUs asked of 2 and expects `2/2 AllocatedCardsInsufficientRequest`; the scheduler never
    gets there (fitInDevices answers NodeInsufficientDevice first), so the same count is
    pinned here with a third GPU that is full."""
    hami_case = node(
        gpu("dev-0", 0, count=100, memory=1280),
        gpu("dev-1", 1, count=100, memory=1280),
        gpu("dev-2", 2, count=100, memory=1280),
        memory=[0, 0, 1280],
    )
    assert reason(hami_case, mib(3, 512, 20)) == (
        "1/3 CardInsufficientMemory, 2/3 AllocatedCardsInsufficientRequest"
    )
    target = node(*(gpu(f"G{i}", i, count=1) for i in range(4)), used=[1, 1, 0, 0])
    assert reason(target, mib(3, 100)) == (
        "2/4 AllocatedCardsInsufficientRequest, 2/4 CardTimeSlicingExhausted"
    )


def test_3_5_2_8_cores_are_clamped_to_100_for_every_gpu() -> None:
    # 150 % is treated as 100 %: a GPU with 50 % in use is short of cores ...
    assert reason(_one(gpu("A"), cores=50), mib(1, 1, 150)) == "1/1 CardInsufficientCore"
    # ... and 100 % is exclusive (Totalcore 100, Used > 0)
    assert reason(_one(gpu("A"), used=1), mib(1, 1, 150)) == "1/1 ExclusiveDeviceAllocateConflict"
    result = fit_container(node(gpu("A", 0), gpu("B", 1)), mib(2, 1, 150), context())
    assert not isinstance(result, FitFailure)
    assert [device.used_cores for device in result[1]] == [100, 100]


def test_3_5_2_13_exclusive_use_needs_totalcore_100() -> None:
    assert reason(_one(gpu("A"), used=1), mib(1, 1, 100)) == "1/1 ExclusiveDeviceAllocateConflict"
    assert picks(_one(gpu("A", cores=200), used=1), mib(1, 1, 100)) == ["A"]  # scaled cores
    assert picks(_one(gpu("A"), used=1), mib(1, 1, 99)) == ["A"]


def test_3_5_2_14_compute_units_exhausted_only_at_exactly_full() -> None:
    assert reason(_one(gpu("A"), cores=100), mib(1, 1, 0)) == "1/1 CardComputeUnitsExhausted"
    # more in use than the card has: the core check fails first (100 - 120 < 0)
    assert reason(_one(gpu("A"), cores=120), mib(1, 1, 0)) == "1/1 CardInsufficientCore"
    # a card without cores is never "exhausted"
    assert picks(_one(gpu("A", cores=0)), mib(1, 1, 0)) == ["A"]


def test_3_5_2_3_type_lists_are_trimmed_case_insensitive_substrings() -> None:
    sxm = _one(gpu("A", type="NVIDIA-V100-SXM2"))
    # " V100" is trimmed to "V100" (it would not be a substring of "NVIDIA-V100-SXM2")
    assert picks(sxm, mib(1, 1), raw_context({"nvidia.com/use-gputype": "A100, V100"})) == ["A"]
    assert picks(sxm, mib(1, 1), raw_context({"nvidia.com/use-gputype": "v100"})) == ["A"]
    # blank items are ignored, they do not match everything
    blank = raw_context({"nvidia.com/use-gputype": "A100,, "})
    assert reason(sxm, mib(1, 1), blank) == "1/1 CardTypeMismatch"
    # the same from the parsed options alone (no raw annotations at hand)
    parsed = FitContext.for_pod(
        parse_pod_gpu_options({"nvidia.com/use-gputype": "A100, V100"}), parse_gpu_policy("spread")
    )
    assert picks(sxm, mib(1, 1), parsed) == ["A"]
    nouse = raw_context({"nvidia.com/nouse-gputype": " sxm2"})
    assert reason(sxm, mib(1, 1), nouse) == "1/1 CardTypeMismatch"
    assert picks(sxm, mib(1, 1), raw_context({"nvidia.com/nouse-gputype": ","})) == ["A"]


def test_3_5_2_3_a_set_use_type_list_without_items_admits_no_gpu() -> None:
    sxm = _one(gpu("A", type="NVIDIA-V100-SXM2"))
    assert reason(sxm, mib(1, 1), raw_context({"nvidia.com/use-gputype": ","})) == (
        "1/1 CardTypeMismatch"
    )
    # blank is "no constraint"
    assert picks(sxm, mib(1, 1), raw_context({"nvidia.com/use-gputype": "  "})) == ["A"]


def test_3_5_2_3_vgpu_mode_must_contain_the_gpu_mode() -> None:
    core = _one(gpu("A"))
    assert picks(core, mib(1, 1), raw_context({"nvidia.com/vgpu-mode": "mps,hami-core"})) == ["A"]
    assert reason(core, mib(1, 1), raw_context({"nvidia.com/vgpu-mode": "mig"})) == (
        "1/1 CardTypeMismatch"
    )
    # present but empty: "" does not contain "hami-core"
    assert reason(core, mib(1, 1), raw_context({"nvidia.com/vgpu-mode": ""})) == (
        "1/1 CardTypeMismatch"
    )
    # a GPU registered without a mode passes any vgpu-mode ("x" contains "")
    assert picks(_one(gpu("A", mode="")), mib(1, 1), raw_context({"nvidia.com/vgpu-mode": "mig"}))


def test_3_5_2_5_uuid_lists_are_trimmed_exact_and_both_apply() -> None:
    two = node(gpu("GPU-A", 0), gpu("GPU-AB", 1))
    use = raw_context({"nvidia.com/use-gpuuuid": " GPU-A , GPU-X"})
    assert picks(two, mib(1, 1), use) == ["GPU-A"]  # no substring match on GPU-AB
    assert (
        reason(two, mib(2, 1), use) == "1/2 AllocatedCardsInsufficientRequest, 1/2 CardUuidMismatch"
    )
    both = raw_context(
        {"nvidia.com/use-gpuuuid": "GPU-A,GPU-AB", "nvidia.com/nouse-gpuuuid": " GPU-AB "}
    )
    assert picks(two, mib(1, 1), both) == ["GPU-A"]
    assert reason(two, mib(1, 1), raw_context({"nvidia.com/use-gpuuuid": ","})) == (
        "2/2 CardUuidMismatch"
    )
    assert picks(two, mib(1, 1), raw_context({"nvidia.com/use-gpuuuid": " "})) == ["GPU-AB"]


def test_3_5_2_7_mutex_in_a_chain_still_forbids_used_gpus() -> None:
    target = node(gpu("A", 0), gpu("B", 1), used=[1, 0])
    assert picks(target, mib(1, 1), context("mutex,binpack")) == ["B"]
    assert reason(target, mib(2, 1), context("binpack,mutex")) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 ExclusiveDeviceAllocateConflict"
    )


# --- docs/hami-reference.md 3.5.3: the failure string -------------------------------------------


def test_3_5_3_counts_sorted_as_strings_over_the_candidate_count() -> None:
    gpus = [gpu(f"G{i:02d}", i, healthy=i >= 2) for i in range(12)]
    target = node(*gpus, cordoned=[f"G{i:02d}" for i in range(2, 12)])
    # "10/12 CardCordoned" < "2/12 CardNotHealth" as strings
    assert reason(target, mib(1, 1)) == "10/12 CardCordoned, 2/12 CardNotHealth"
    flipped = node(
        *(gpu(f"G{i:02d}", i, healthy=i < 2) for i in range(12)), cordoned=["G00", "G01"]
    )
    # string order, not reason-name order: "10/12 CardNotHealth" before "2/12 CardCordoned"
    assert reason(flipped, mib(1, 1)) == "10/12 CardNotHealth, 2/12 CardCordoned"


# 8 x A100-80GB, NUMA 0: indexes 0-3, NUMA 1: 4-7; 50,000 MiB in use on GPUs 0, 1, 4, 5, 6
# (the A100 node of tests/fixtures/scheduler/a100-numa.yaml, also run through `hami schedule`).
A100_80GB = "NVIDIA A100-SXM4-80GB"
A100_NODE = node(
    *(gpu(f"GPU-{i}", i, numa=i // 4, type=A100_80GB, memory=81920) for i in range(8)),
    used=[1, 1, 0, 0, 1, 1, 1, 0],
    memory=[50000, 50000, 0, 0, 50000, 50000, 50000, 0],
)
NUMA_BIND = {"nvidia.com/numa-bind": "true"}


def test_3_5_3_gpus_picked_count_in_the_failure_string() -> None:
    """HAMi v2.10 device.go:748 and :872 count `len(tmpDevs[k.Type])`, the GPUs picked."""
    # 4 asked: GPUs 7, 3, 2 picked, the 5 others short of memory
    assert reason(A100_NODE, mib(4, 40000)) == (
        "3/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientMemory"
    )
    # 3 asked with numa-bind; spread walks NUMA 1 first: GPU 7 picked, NUMA 1 left (+1),
    # then GPUs 3 and 2 picked on NUMA 0 where the walk ends
    assert reason(A100_NODE, mib(3, 40000), raw_context(NUMA_BIND)) == (
        "1/8 NumaNotFit, 2/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientMemory"
    )
    # binpack walks NUMA 0 first: GPUs 3 and 2 picked, NUMA 0 left (+2), then GPU 7
    assert reason(A100_NODE, mib(3, 40000), raw_context(NUMA_BIND, "binpack")) == (
        "1/8 AllocatedCardsInsufficientRequest, 2/8 NumaNotFit, 5/8 CardInsufficientMemory"
    )


# --- docs/hami-reference.md 3.5.4: GPU order, shown by a full pick (Fit walks from the end) ---

# A and C on NUMA 1, B and D on NUMA 0; fullness (score) B < C < A < D.
ORDERED = node(
    gpu("A", 0, numa=1),
    gpu("B", 1, numa=0),
    gpu("C", 2, numa=1),
    gpu("D", 3, numa=0),
    memory=[16000, 0, 8000, 24000],
)
# all equally full: only NUMA and index order them
EQUAL = node(gpu("A", 0, numa=1), gpu("B", 1, numa=0), gpu("C", 2, numa=1), gpu("D", 3, numa=0))


@pytest.mark.parametrize(
    ("target", "policy", "numa_bind", "count", "expected"),
    [
        (ORDERED, "spread", False, 4, ["B", "C", "A", "D"]),  # higher score sorts first
        (ORDERED, "binpack", False, 4, ["D", "A", "C", "B"]),  # lower score sorts first
        (ORDERED, "topology-aware", False, 4, ["B", "C", "A", "D"]),  # sorts as spread
        (EQUAL, "spread", False, 4, ["C", "A", "D", "B"]),  # tie: lower NUMA first
        (EQUAL, "binpack", False, 4, ["C", "A", "D", "B"]),
        # numa-bind: spread = lower NUMA first, then higher score; binpack = higher NUMA first
        (ORDERED, "spread", True, 2, ["C", "A"]),
        (ORDERED, "binpack", True, 2, ["D", "B"]),
        # mutex: more used slots first (none here), then lower NUMA first; scores ignored
        (ORDERED, "mutex", False, 4, ["C", "A", "D", "B"]),
        # chains: keys in written order, then the device index
        (ORDERED, "numa", False, 4, ["C", "A", "D", "B"]),
        (ORDERED, "numa,spread", False, 4, ["C", "A", "B", "D"]),
        (ORDERED, "binpack,numa", False, 4, ["D", "A", "C", "B"]),
        (ORDERED, "mutex,topology-aware", False, 4, ["B", "C", "A", "D"]),  # no key: spread
        # a chain has no NUMA tie-break unless it names numa: equal GPUs go by index
        (EQUAL, "spread,", False, 4, ["D", "C", "B", "A"]),
        # a chain with numa-bind moves numa first: lower NUMA first even for binpack
        (ORDERED, "binpack,numa", True, 2, ["A", "C"]),
        (ORDERED, "spread,", True, 2, ["C", "A"]),
    ],
)
def test_3_5_4_gpu_order(
    target: NodeUsage, policy: str, numa_bind: bool, count: int, expected: list[str]
) -> None:
    assert picks(target, mib(count, 100), context(policy, numa_bind=numa_bind)) == expected


POLICY = "hami.io/gpu-scheduler-policy"


def test_3_5_4_the_comparator_reads_the_whole_policy_text() -> None:
    """HAMi compares P itself with "binpack", "mutex" and "numa": a single name with spaces
    around it, or an empty P, sorts as spread; `mutex` still filters (items are trimmed)."""
    spread = ["B", "C", "A", "D"]
    assert picks(ORDERED, mib(4, 100), raw_context({POLICY: "binpack"})) == ["D", "A", "C", "B"]
    assert picks(ORDERED, mib(4, 100), raw_context({POLICY: " binpack"})) == spread
    assert picks(ORDERED, mib(4, 100), raw_context({POLICY: ""}, "binpack")) == spread
    assert picks(ORDERED, mib(4, 100), raw_context({POLICY: "numa "})) == spread
    # " binpack , numa" is a chain: its items are trimmed
    chain = raw_context({POLICY: " binpack , numa"})
    assert picks(ORDERED, mib(4, 100), chain) == ["D", "A", "C", "B"]
    busy = node(*ORDERED.devices, used=[1, 0, 0, 0], memory=ORDERED.used_memory_mib)
    assert reason(busy, mib(4, 100), raw_context({POLICY: "mutex "})) == (
        "1/4 ExclusiveDeviceAllocateConflict, 3/4 AllocatedCardsInsufficientRequest"
    )
    # an empty P is not the default mutex either
    assert len(picks(busy, mib(4, 100), raw_context({POLICY: ""}, "mutex"))) == 4


def test_3_6_node_policy_is_spread_only_for_exactly_spread() -> None:
    ledger = Ledger()
    ledger.set_node("empty", [gpu("E0")])
    ledger.set_node("busy", [gpu("B0")])
    ledger.update_pod(read_pod(pod_object("fill", "B0,NVIDIA,8000,10:;", node_name="busy")))
    spread = SchedulerSettings(node_policy=NodePolicy.SPREAD)
    key = "hami.io/node-scheduler-policy"

    def chosen(annotations: dict[str, str]) -> str | None:
        pod = make_pod({GPU: "1", MEM: "100"}, annotations=annotations)
        return decide(ledger, read_pod(pod), None, NOW, spread).node

    assert chosen({}) == "empty"
    assert chosen({key: "spread"}) == "empty"
    assert chosen({key: " spread"}) == "busy"
    assert chosen({key: ""}) == "busy"
    assert chosen({key: "binpack"}) == "busy"


def test_3_5_4_mutex_puts_busier_gpus_first() -> None:
    target = node(*EQUAL.devices, used=[0, 0, 0, 2])
    # D (used) sorts first, so it is tried last; the rest by NUMA (B before A, C)
    assert picks(target, mib(3, 100), context("mutex")) == ["C", "A", "B"]


# --- docs/hami-reference.md 3.6: scores in float32 --------------------------------------------


def test_3_6_node_score_is_float32_over_all_gpus() -> None:
    target = node(
        gpu("A", 0, count=10, memory=32768),
        gpu("B", 1, count=20, memory=65536, cores=200),
        used=[1, 0],
        memory=[1000, 0],
        cores=[35, 0],
    )
    expected = f32(10 * f32(f32(f32(1 / 30) + f32(35 / 300)) + f32(1000 / 98304)))
    assert target.score == expected
    assert node_score(0, 100, 100, 0, 0, 0) == 0.0  # any zero total: 0


def test_3_6_device_score_terms_and_weights() -> None:
    request = ContainerRequest(1, 700, 33, 20)
    # a percentage counts in the score even next to MiB: 15109 * 33 // 100 = 4985
    expected = f32(10 * f32(f32(f32(3 / 10) + f32(30 / 100)) + f32((4985 + 100) / 15109)))
    assert device_score(10, 100, 15109, 2, 10, 100, request) == expected
    weighted = f32(
        10 * f32(f32(f32(2 * f32(3 / 10)) + f32(0 * f32(30 / 100))) + f32(3 * f32(5085 / 15109)))
    )
    assert device_score(10, 100, 15109, 2, 10, 100, request, ScoringWeights(2, 0, 3)) == weighted
    assert device_score(0, 100, 15109, 0, 0, 0, request) == 0.0


# --- docs/hami-reference.md 3.7: several containers -------------------------------------------

WHOLE = ContainerRequest(1, 0, 100, 100)


def test_3_7_init_containers_each_fit_against_a_fresh_copy() -> None:
    one = node(gpu("A"))
    fitted = pod_fit(one, PodRequests((WHOLE, WHOLE, None), init_count=2))
    assert fitted.devices == (
        (ContainerDevice("A", "NVIDIA", 32768, 100),),
        (ContainerDevice("A", "NVIDIA", 32768, 100),),
        (),
    )
    # app containers run together: the second one sees the first
    failed = fit_pod(one, PodRequests((WHOLE, WHOLE), init_count=0), context())
    assert isinstance(failed, FitFailure)
    assert render_failure(failed) == "1/1 CardInsufficientMemory"
    # an app container does not see the init containers either
    assert pod_fit(one, PodRequests((WHOLE, WHOLE), init_count=1)).devices[1][0].uuid == "A"


def test_3_7_a_failing_init_container_makes_the_node_unfit() -> None:
    failed = fit_pod(node(gpu("A")), PodRequests((mib(2, 1), mib(1, 1)), 1), context())
    assert isinstance(failed, FitFailure)
    assert render_failure(failed) == "NodeInsufficientDevice"


def test_3_7_padding_keeps_container_indexes() -> None:
    fitted = pod_fit(node(gpu("A", 0), gpu("B", 1)), PodRequests((None, mib(1, 5), None), 1))
    assert [[d.uuid for d in entry] for entry in fitted.devices] == [[], ["B"], []]


def test_3_7_app_containers_keep_the_order_the_previous_one_sorted() -> None:
    """HAMi sorts one device list in place for every app container, so GPUs that compare
    equal keep the order the previous container's sort gave them, not index order."""
    target = node(gpu("D", 0), gpu("E", 1), used=[0, 1], memory=[0, 1000], cores=[0, 10])
    request = mib(1, 1000, 10)
    # container 1 (spread): E is fuller, sorts first: [E, D], so D is taken. Now D is exactly
    # as full as E; container 2 sorts [E, D] again (equal, kept) and takes D again.
    fitted = pod_fit(target, PodRequests((request, None, request), 0))
    assert [[d.uuid for d in entry] for entry in fitted.devices] == [["D"], [], ["D"]]
    # a fresh sort for each container (index order) would give E to the second one
    assert picks(
        node(*target.devices, used=[1, 1], memory=[1000] * 2, cores=[10] * 2), request
    ) == ["E"]


def test_3_7_the_decision_writes_the_same_devices() -> None:
    ledger = Ledger()
    ledger.set_node("n1", [gpu("D", 0), gpu("E", 1)])
    ledger.update_pod(read_pod(pod_object("fill", "E,NVIDIA,1000,10:;")))
    limits = {GPU: "1", MEM: "1000", CORES: "10"}
    result = decide(ledger, read_pod(make_pod(limits, limits)), None, NOW, DEFAULTS)
    assert result.annotations["hami.io/vgpu-devices-allocated"] == (
        "D,NVIDIA,1000,10:;D,NVIDIA,1000,10:;"
    )
    assume(ledger, "ns/p", result)
    assert usage_of(ledger) == ((2, 1), (2000, 1000), (20, 10))


# --- `hami schedule`: the same strings end to end --------------------------------------------


def test_hami_schedule_reports_hami_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus4 = [gpu(f"GPU-{i}", i) for i in range(4)]
    items = [
        node_object("n1", gpus4),
        node_object("n2", [gpu("GPU-T4", 0, type="NVIDIA-Tesla T4")]),
        pod_object("fill", "GPU-0,NVIDIA,32768,0:;GPU-1,NVIDIA,32768,0:;", apps=2),
    ]
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    pod = make_pod({GPU: "3", MEM: "1000"}, annotations={"nvidia.com/use-gputype": "V100, A100"})
    pod_path = tmp_path / "pod.yaml"
    pod_path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", **pod}))
    # the pod as HAMi's Filter gets it: no webhook in between
    code = main(["schedule", "--snapshot", str(snapshot), "--pod", str(pod_path), "--no-webhook"])
    output = json.loads(capsys.readouterr().out)
    assert code == 2
    assert output["node"] is None
    assert output["failedNodes"] == {
        "n1": "2/4 AllocatedCardsInsufficientRequest, 2/4 CardInsufficientMemory",
        "n2": "NodeInsufficientDevice",
    }


# --- a literal model of HAMi's procedure (docs/hami-reference.md 3.5.2, 3.5.4, 3.7) ----------


@dataclass
class _Dev:
    """HAMi's DeviceUsage, mutable as in Go."""

    uuid: str
    index: int
    numa: int
    count: int
    total_mem: int
    total_core: int
    healthy: bool
    used: int = 0
    used_mem: int = 0
    used_cores: int = 0
    score: float = 0.0


def _less(policy: str, numa_bind: bool, a: _Dev, b: _Dev) -> bool:
    """DeviceUsageList.Less as docs/hami-reference.md 3.5.4 states it."""
    if "," in policy or policy == "numa":
        keys: list[str] = []
        for item in (part.strip() for part in policy.split(",")):
            if item in ("binpack", "spread", "numa") and item not in keys:
                keys.append(item)
        keys = keys or ["spread"]
        if numa_bind and keys[0] != "numa":
            keys = ["numa", *(key for key in keys if key != "numa")]
        for key in keys:
            if key == "binpack" and a.score != b.score:
                return a.score < b.score
            if key == "spread" and a.score != b.score:
                return a.score > b.score
            if key == "numa" and a.numa != b.numa:
                return a.numa < b.numa
        return a.index < b.index
    if policy == "mutex":
        return a.used > b.used if a.used != b.used else a.numa < b.numa
    if numa_bind:
        if policy == "binpack":
            return a.score < b.score if a.numa == b.numa else a.numa > b.numa
        return a.score > b.score if a.numa == b.numa else a.numa < b.numa
    if policy == "binpack":
        return a.score < b.score if a.score != b.score else a.numa < b.numa
    return a.score > b.score if a.score != b.score else a.numa < b.numa


def _insertion_sort(devices: list[_Dev], policy: str, numa_bind: bool) -> None:
    """Go's sort.Sort on up to 12 elements: insertion sort, in place."""
    for i in range(1, len(devices)):
        j = i
        while j > 0 and _less(policy, numa_bind, devices[j], devices[j - 1]):
            devices[j], devices[j - 1] = devices[j - 1], devices[j]
            j -= 1


def _model_fit(
    devices: list[_Dev],
    request: ContainerRequest,
    numa_bind: bool,
    mutex: bool,
    topology: bool = False,
) -> list[tuple[_Dev, int, int]] | str:
    """NvidiaGPUDevices.Fit (docs/hami-reference.md 3.5.2) on the sorted list; picks or the reason
    string."""
    nums, origin, prevnuma, cores = request.count, request.count, -1, request.cores_percent
    picked: list[tuple[_Dev, int, int]] = []
    reasons: dict[str, int] = {}

    def count(name: str, amount: int = 1) -> None:
        reasons[name] = reasons.get(name, 0) + amount

    for dev in reversed(devices):
        if not dev.healthy:
            count("CardNotHealth")
            continue
        if numa_bind and prevnuma != dev.numa:
            if nums != origin:
                count("NumaNotFit", len(picked))  # v2.10 device.go:748 len(tmpDevs[k.Type])
            nums, prevnuma, picked = origin, dev.numa, []
        if dev.count <= dev.used:
            count("CardTimeSlicingExhausted")
            continue
        if mutex and dev.used > 0:
            count("ExclusiveDeviceAllocateConflict")
            continue
        cores = min(cores, 100)
        memreq = request.memory_mib if request.memory_mib > 0 else 0
        if request.memory_percent != 101 and request.memory_mib == 0:
            memreq = dev.total_mem * request.memory_percent // 100
        if dev.total_mem - dev.used_mem < memreq:
            count("CardInsufficientMemory")
            continue
        if dev.total_core - dev.used_cores < cores:
            count("CardInsufficientCore")
            continue
        if dev.total_core == 100 and cores == 100 and dev.used > 0:
            count("ExclusiveDeviceAllocateConflict")
            continue
        if dev.total_core != 0 and dev.used_cores == dev.total_core and cores == 0:
            count("CardComputeUnitsExhausted")
            continue
        if nums > 0:
            if not topology:
                nums -= 1
            picked.append((dev, memreq, cores))
        if nums == 0 and not topology:
            return picked
    if topology and len(picked) >= origin:
        # device.go:851-868 without pair scores: the worst single card and the best
        # combination are the first ones (every total is 0, the comparisons are strict)
        return picked[:origin]
    if picked:
        reasons["AllocatedCardsInsufficientRequest"] = len(picked)  # device.go:872
    return ", ".join(sorted(f"{n}/{len(devices)} {name}" for name, n in reasons.items() if n))


def _model_pod(
    devices: list[_Dev], requests: PodRequests, policy: str, numa_bind: bool
) -> list[list[str]] | str:
    """scoreNode (docs/hami-reference.md 3.7): init containers on fresh copies, app containers on
    one shared copy whose device list each container re-sorts in place."""
    mutex = "mutex" in (part.strip() for part in policy.split(","))
    topology = "topology-aware" in (part.strip() for part in policy.split(","))

    def fit_on(shared: list[_Dev], request: ContainerRequest) -> list[str] | str:
        for dev in shared:
            dev.score = device_score(
                dev.count,
                dev.total_core,
                dev.total_mem,
                dev.used,
                dev.used_cores,
                dev.used_mem,
                request,
            )
        _insertion_sort(shared, policy, numa_bind)
        if request.count > len(shared):
            return "NodeInsufficientDevice"
        result = _model_fit(shared, request, numa_bind, mutex, topology)
        if isinstance(result, str):
            return result
        for dev, memreq, cores in result:
            dev.used += 1
            dev.used_mem += memreq
            dev.used_cores += cores
        return [dev.uuid for dev, _, _ in result]

    entries: list[list[str]] = []
    for request in requests.init_requests:
        if request is None:
            entries.append([])
            continue
        result = fit_on([replace(dev) for dev in devices], request)
        if isinstance(result, str):
            return result
        entries.append(result)
    shared = [replace(dev) for dev in devices]
    for request in requests.app_requests:
        if request is None:
            entries.append([])
            continue
        result = fit_on(shared, request)
        if isinstance(result, str):
            return result
        entries.append(result)
    return entries


@st.composite
def _model_nodes(draw: st.DrawFn) -> list[_Dev]:
    devices = []
    # few distinct values, so that GPUs often compare equal (ties decide many picks)
    for index in range(draw(st.integers(1, 6))):
        count = draw(st.sampled_from([1, 4, 4]))
        total_mem = draw(st.sampled_from([1000, 4000, 4000]))
        total_core = draw(st.sampled_from([100, 100, 200]))
        devices.append(
            _Dev(
                uuid=f"G{index}",
                index=index,
                numa=draw(st.integers(0, 2)),
                count=count,
                total_mem=total_mem,
                total_core=total_core,
                healthy=draw(st.booleans()) or draw(st.booleans()),
                used=draw(st.sampled_from([0, 0, 1, count])),
                used_mem=draw(st.sampled_from([0, 0, 200, 1000, total_mem])),
                used_cores=draw(st.sampled_from([0, 0, 30, 100, total_core])),
            )
        )
    return devices


_MODEL_REQUEST = st.builds(
    ContainerRequest,
    count=st.integers(1, 3),
    memory_mib=st.sampled_from([0, 200, 200, 1000, 3000]),
    memory_percent=st.sampled_from([101, 30, 100]),
    cores_percent=st.sampled_from([0, 30, 100, 150]),
)


@st.composite
def _model_pods(draw: st.DrawFn) -> PodRequests:
    containers = draw(st.lists(st.none() | _MODEL_REQUEST, min_size=1, max_size=4))
    return PodRequests(tuple(containers), draw(st.integers(0, len(containers))))


_MODEL_POLICIES = [
    "spread",
    "binpack",
    "mutex",
    "topology-aware",
    "numa",
    "binpack,numa",
    "numa,spread",
    "spread,",
    "mutex,binpack",
]


_TWINS = [  # the case of test_3_7_app_containers_keep_the_order_the_previous_one_sorted
    _Dev("D", 0, 0, 10, 32768, 100, True),
    _Dev("E", 1, 0, 10, 32768, 100, True, used=1, used_mem=1000, used_cores=10),
]


@settings(max_examples=300, deadline=None)
@given(_model_nodes(), _model_pods(), st.sampled_from(_MODEL_POLICIES), st.booleans())
@example(_TWINS, PodRequests((mib(1, 1000, 10), mib(1, 1000, 10)), 0), "spread", False)
def test_fit_pod_matches_a_literal_model_of_hami(
    devices: list[_Dev], pod: PodRequests, policy: str, numa_bind: bool
) -> None:
    target = node(
        *(
            gpu(
                dev.uuid,
                dev.index,
                numa=dev.numa,
                count=dev.count,
                memory=dev.total_mem,
                cores=dev.total_core,
                healthy=dev.healthy,
            )
            for dev in devices
        ),
        used=[dev.used for dev in devices],
        memory=[dev.used_mem for dev in devices],
        cores=[dev.used_cores for dev in devices],
    )
    ours = fit_pod(target, pod, context(policy, numa_bind=numa_bind))
    expected = _model_pod(devices, pod, policy, numa_bind)
    if isinstance(ours, FitFailure):
        assert render_failure(ours) == expected
    else:
        assert [[device.uuid for device in entry] for entry in ours.devices] == expected
