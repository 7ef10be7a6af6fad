"""Per-container requests: every rule of docs/hami-reference.md 2."""

from __future__ import annotations

from typing import Any

import pytest

from hami_plugin.protocol.objects import ContainerSpec, read_pod
from hami_plugin.scheduler.requests import (
    PERCENTAGE_UNSET,
    ContainerRequest,
    ProblemEffect,
    container_request,
    pod_requests,
)
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings

DEFAULTS = SchedulerSettings()


def _request(
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    settings: SchedulerSettings = DEFAULTS,
) -> ContainerRequest | None:
    spec = ContainerSpec("c", limits=limits or {}, requests=requests or {})
    return container_request(spec, settings)[0]


def _problems(limits: dict[str, Any], settings: SchedulerSettings = DEFAULTS) -> list[str]:
    return [str(p) for p in container_request(ContainerSpec("c", limits=limits), settings)[1]]


GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # gpu alone: whole card memory (percentage 100), no cores
        ({GPU: "1"}, ContainerRequest(1, 0, 100, 0)),
        ({GPU: 2, MEM: "3000", CORES: "30"}, ContainerRequest(2, 3000, PERCENTAGE_UNSET, 30)),
        ({GPU: "1", PCT: "50"}, ContainerRequest(1, 0, 50, 0)),
        ({GPU: "1", PCT: "250"}, ContainerRequest(1, 0, 100, 0)),  # clamped to 100
        ({GPU: "1", PCT: "101"}, ContainerRequest(1, 0, 100, 0)),  # 101 never means "unset"
        ({GPU: "1", PCT: "0"}, ContainerRequest(1, 0, 100, 0)),  # <= 0 is unset -> 100
        ({GPU: "1", PCT: "-5", MEM: "2000"}, ContainerRequest(1, 2000, PERCENTAGE_UNSET, 0)),
        ({GPU: "1", MEM: "2000", PCT: "30"}, ContainerRequest(1, 2000, 30, 0)),
        ({GPU: "1", CORES: "150"}, ContainerRequest(1, 0, 100, 150)),  # Fit clamps cores
        # quantities in any serialisation
        ({GPU: "1k"}, ContainerRequest(1000, 0, 100, 0)),
        ({GPU: "2000m", MEM: "1Ki"}, ContainerRequest(2, 1024, PERCENTAGE_UNSET, 0)),
        ({GPU: "1e0", MEM: "4e3"}, ContainerRequest(1, 4000, PERCENTAGE_UNSET, 0)),
        ({GPU: "1", MEM: "0"}, ContainerRequest(1, 0, 100, 0)),
        ({GPU: "1", MEM: "2147483647"}, ContainerRequest(1, 2147483647, PERCENTAGE_UNSET, 0)),
    ],
)
def test_container_requests(limits: dict[str, Any], expected: ContainerRequest) -> None:
    assert _request(limits) == expected


@pytest.mark.parametrize(
    "limits",
    [
        {},  # no GPU asked
        {MEM: "3000"},  # memory alone is not a request (the webhook adds the count)
        {GPU: "0"},
        {GPU: "0", MEM: "100"},
    ],
)
def test_no_request_and_no_problem(limits: dict[str, Any]) -> None:
    assert _request(limits) is None
    assert _problems(limits) == []


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({GPU: "500m"}, "nvidia.com/gpu=500m: not a whole number; write 1 ("),
        ({GPU: "one"}, "nvidia.com/gpu=one: not a Kubernetes quantity; write a whole number"),
        ({GPU: "-1"}, "nvidia.com/gpu=-1: as int32 it is -1, not positive; write a whole"),
        # HAMi keeps a count in int32: 3Gi becomes -1073741824, so no GPU is asked
        ({GPU: "3Gi"}, "nvidia.com/gpu=3Gi: as int32 it is -1073741824, not positive"),
        ({GPU: "1e30"}, "nvidia.com/gpu=1e30: beyond the int64 range"),
        ({GPU: "1", MEM: "16Gi"}, "nvidia.com/gpumem=16Gi: out of range 0..2147483647 (MiB)"),
        ({GPU: "1", MEM: "16.0Gi"}, "nvidia.com/gpumem=16.0Gi: out of range"),
        ({GPU: "1", MEM: "1.5"}, "nvidia.com/gpumem=1.5: not a whole number; write 1 or 2 ("),
        ({GPU: "1", MEM: "-1"}, "nvidia.com/gpumem=-1: out of range"),
        ({GPU: True}, "nvidia.com/gpu=True: not a Kubernetes quantity"),
    ],
)
def test_bad_count_or_memory_drops_the_request(limits: dict[str, Any], problem: str) -> None:
    assert _request(limits) is None
    (found,) = _problems(limits)
    assert found.startswith("container 'c': ")
    assert problem in found
    assert found.endswith("GPU request dropped")


# The user tools and the webhook show these messages as they are: each names the resource and
# the value, says what to write instead and what the scheduler does with it.
@pytest.mark.parametrize(
    ("limits", "message", "wrong_answer"),
    [
        ({GPU: "1", MEM: "16Gi"},
         "nvidia.com/gpumem=16Gi: out of range 0..2147483647 (MiB); write 16384: "
         "nvidia.com/gpumem counts MiB, and 16Gi is 16384 MiB; GPU request dropped", True),
        ({GPU: "1", MEM: "16G"},
         "nvidia.com/gpumem=16G: out of range 0..2147483647 (MiB); write 15259: "
         "nvidia.com/gpumem counts MiB, and 16G bytes are 15259 MiB rounded up; "
         "GPU request dropped", True),
        ({GPU: "1.5"},
         "nvidia.com/gpu=1.5: not a whole number; write 1 or 2 (a whole number of GPUs from 1 "
         "to 2147483647); GPU request dropped", True),
        ({GPU: "-1"},
         "nvidia.com/gpu=-1: as int32 it is -1, not positive; write a whole number of GPUs "
         "from 1 to 2147483647; GPU request dropped", True),
        # HAMi's Nums: int32(n) keeps the low 32 bits: 99999999999 asks 1215752191 GPUs
        ({GPU: "99999999999"},
         "nvidia.com/gpu=99999999999: larger than int32; write a whole number of GPUs from 1 "
         "to 2147483647; taken as 1215752191", True),
        ({GPU: "1", MEM: "99999999999"},
         "nvidia.com/gpumem=99999999999: out of range 0..2147483647 (MiB); write a whole "
         "number of MiB from 0 to 2147483647; GPU request dropped", True),
        # within the range, so HAMi asks 1073741824 MiB per GPU: no GPU has that
        ({GPU: "1", MEM: "1Gi"},
         "nvidia.com/gpumem=1Gi: a byte unit on a count of MiB; write 1024: nvidia.com/gpumem "
         "counts MiB, and 1Gi is 1024 MiB; taken as 1073741824 MiB", True),
        ({GPU: "1", PCT: "50.5"},
         "nvidia.com/gpumem-percentage=50.5: not a whole number; write 50 or 51 (a whole "
         "percent from 1 to 100); value ignored", True),
        ({GPU: "1", CORES: str(2**32 + 40)},
         "nvidia.com/gpucores=4294967336: outside int32; write a whole percent of the GPU's "
         "cores from 0 to 100; taken as 40", True),
        # HAMi clamps a percentage above 100: the whole card, all it can mean
        ({GPU: "1", PCT: "150"},
         "nvidia.com/gpumem-percentage=150: above 100; write at most 100; taken as 100", False),
    ],
)  # fmt: skip
def test_problem_messages_say_what_to_write(
    limits: dict[str, Any], message: str, wrong_answer: bool
) -> None:
    (problem,) = container_request(ContainerSpec("c", limits=limits), DEFAULTS)[1]
    assert str(problem) == f"container 'c': {message}"
    assert problem.wrong_answer is wrong_answer


@pytest.mark.parametrize(
    "limits",
    [
        {GPU: "1", MEM: "8Ki"},  # 8192 MiB: a Ki value reads as a sane MiB count
        {GPU: "1", MEM: "3k"},  # the API server writes a plain 3000 as 3k
        {GPU: "1", PCT: "0"},  # unset, as documented
        {GPU: "1", CORES: "150"},  # Fit clamps cores
        {GPU: "2000m"},  # exactly 2
    ],
)
def test_values_read_as_written_are_no_problem(limits: dict[str, Any]) -> None:
    assert _request(limits) is not None
    assert _problems(limits) == []


def test_the_webhook_wording_says_what_the_scheduler_would_do() -> None:
    dropped, truncated, ignored = (
        container_request(ContainerSpec("c", limits=limits), DEFAULTS)[1][0]
        for limits in ({GPU: "1", MEM: "16Gi"}, {GPU: "99999999999"}, {GPU: "1", CORES: "2.5"})
    )
    assert dropped.render(would=True).endswith("; the scheduler would drop the GPU request")
    assert dropped.dropped and not truncated.dropped
    assert truncated.render(would=True).endswith("; the scheduler would take it as 1215752191")
    assert ignored.render(would=True).endswith("; the scheduler would ignore the value")
    assert (truncated.effect, truncated.taken_as) == (ProblemEffect.TRUNCATED, 1215752191)


def test_memory_factor_in_the_advice() -> None:
    settings = SchedulerSettings(memory_factor=4)
    (problem,) = _problems({GPU: "1", MEM: "16Gi"}, settings)
    assert "out of range 0..536870911 (units of 4 MiB); write 4096: " in problem
    assert "nvidia.com/gpumem counts units of 4 MiB, and 16Gi is 4096 units of 4 MiB" in problem


def test_limits_win_over_requests_per_resource() -> None:
    request = _request(
        limits={GPU: "2", CORES: "40"},
        requests={GPU: "1", MEM: "5000", CORES: "10"},
    )
    # count and cores from limits, memory only in requests
    assert request == ContainerRequest(2, 5000, PERCENTAGE_UNSET, 40)


def test_requests_alone_are_read() -> None:
    assert _request(requests={GPU: "1", MEM: "1000"}) == ContainerRequest(
        1, 1000, PERCENTAGE_UNSET, 0
    )


def test_default_memory_and_cores() -> None:
    settings = SchedulerSettings(default_memory_mib=4096, default_cores=20)
    assert _request({GPU: "1"}, settings=settings) == ContainerRequest(
        1, 4096, PERCENTAGE_UNSET, 20
    )
    # a percentage wins over the default memory; given cores win over the default
    assert _request({GPU: "1", PCT: "25", CORES: "0"}, settings=settings) == ContainerRequest(
        1, 0, 25, 0
    )


def test_memory_factor_scales_and_bounds_memory() -> None:
    settings = SchedulerSettings(memory_factor=4)
    assert _request({GPU: "1", MEM: "1000"}, settings=settings) == ContainerRequest(
        1, 4000, PERCENTAGE_UNSET, 0
    )
    assert _request({GPU: "1", MEM: "536870911"}, settings=settings) == ContainerRequest(
        1, 2147483644, PERCENTAGE_UNSET, 0
    )
    assert _request({GPU: "1", MEM: "536870912"}, settings=settings) is None
    # the default memory is not multiplied
    assert _request(
        {GPU: "1"}, settings=SchedulerSettings(memory_factor=4, default_memory_mib=10)
    ) == ContainerRequest(1, 10, PERCENTAGE_UNSET, 0)


def test_resource_names_are_configurable() -> None:
    names = ResourceNames("hami.io/gpu", "hami.io/gpumem", "hami.io/gpumem-percentage", "x/c")
    settings = SchedulerSettings(resources=names)
    assert _request({GPU: "1"}, settings=settings) is None
    assert _request({"hami.io/gpu": "1", "hami.io/gpumem": "10"}, settings=settings) == (
        ContainerRequest(1, 10, PERCENTAGE_UNSET, 0)
    )


def test_memory_on_a_card() -> None:
    assert ContainerRequest(1, 0, 50, 0).memory_on(32768) == 16384
    assert ContainerRequest(1, 0, 33, 0).memory_on(15360) == 5068  # integer division
    assert ContainerRequest(1, 2000, 30, 0).memory_on(32768) == 2000  # MiB win in Fit
    assert ContainerRequest(1, 2000, PERCENTAGE_UNSET, 0).memory_on(32768) == 2000


def test_memory_on_wraps_below_int32_too() -> None:
    # HAMi's int32 product wraps both ways; a register annotation may carry a negative devmem.
    # int32(-30_000_000 * 100) = 1294967296, then / 100.
    assert ContainerRequest(1, 0, 100, 0).memory_on(-30_000_000) == 12949672
    assert ContainerRequest(1, 0, 50, 0).memory_on(-100) == -50


POD_YAML: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
    "spec": {
        "initContainers": [
            {"name": "init-a", "resources": {"limits": {GPU: "1", MEM: "100"}}},
            {"name": "init-b"},
        ],
        "containers": [
            {"name": "app-a"},
            {"name": "app-b", "resources": {"limits": {GPU: "2", PCT: "10"}}},
        ],
    },
}


def test_pod_requests_init_containers_first() -> None:
    requests = pod_requests(read_pod(POD_YAML), DEFAULTS)
    assert requests.init_count == 2
    assert requests.containers == (
        ContainerRequest(1, 100, PERCENTAGE_UNSET, 0),
        None,
        None,
        ContainerRequest(2, 0, 10, 0),
    )
    assert requests.wants_gpu
    assert requests.init_requests == requests.containers[:2]
    assert requests.app_requests == requests.containers[2:]


def test_problems_name_the_container() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: "1.5"}}}]},
    }
    requests = pod_requests(read_pod(pod), DEFAULTS)
    assert not requests.wants_gpu
    assert [str(p) for p in requests.problems] == [
        "container 'main': nvidia.com/gpu=1.5: not a whole number; write 1 or 2 (a whole number "
        "of GPUs from 1 to 2147483647); GPU request dropped"
    ]
    assert requests.wrong_answers == requests.problems
