"""The `topology-aware` GPU policy: HAMi v2.10 `pkg/device/nvidia/device.go` Fit (lines 724,
830-868), `computeWorstSingleCard`, `computeBestCombination`, `generateCombinations`.

Tables ported from HAMi v2.10 `pkg/device/nvidia/device_test.go`: `TestGenerateCombinations`,
`TestComputeWorstSingleCard`, `TestComputeBestCombination`, `TestGetDevicePairScoreMap`.
"""

from __future__ import annotations

from dataclasses import replace
from math import comb

import pytest

from hami_plugin.protocol.codec import encode_node_devices
from hami_plugin.protocol.model import ANNOTATION_NODE_REGISTER
from hami_plugin.protocol.objects import NodeInfo
from hami_plugin.protocol.topology import NODE_NVIDIA_SCORE_ANNOTATION
from hami_plugin.scheduler.fit import FitFailure, fit_container, render_failure
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.policy import topology_choice
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest
from hami_plugin.scheduler.usage import NodeUsage

from .helpers import context, gpu, node

HAMI_SCORES = {
    "gpu0": {"gpu1": 100, "gpu2": 200},
    "gpu1": {"gpu0": 100, "gpu2": 150},
    "gpu2": {"gpu0": 200, "gpu1": 150},
}


def test_hami_compute_worst_single_card() -> None:
    """gpu0 total=300, gpu1 total=250, gpu2 total=350 — worst is gpu1."""
    assert topology_choice(["gpu0", "gpu1", "gpu2"], 1, HAMI_SCORES) == (1,)


def test_hami_compute_best_combination() -> None:
    """[gpu0,gpu1]=100, [gpu0,gpu2]=200, [gpu1,gpu2]=150 — best is [gpu0,gpu2]."""
    assert topology_choice(["gpu0", "gpu1", "gpu2"], 2, HAMI_SCORES) == (0, 2)


@pytest.mark.parametrize("count", [2, 3])
def test_hami_generate_combinations_first_best_wins(count: int) -> None:
    """TestGenerateCombinations: C(4,k) sets in lexicographic order; with no scores every set
    totals 0 and the first, (0..k-1), is kept (`totalScore > bestScore` is strict)."""
    assert comb(4, count) in (6, 4)
    assert topology_choice(["a", "b", "c", "d"], count, {}) == tuple(range(count))


def test_single_card_tie_keeps_the_first() -> None:
    scores = {"a": {"b": 10}, "b": {"a": 10}, "c": {}, "d": {}}
    assert topology_choice(["a", "b", "c", "d"], 1, scores) == (2,)
    assert topology_choice(["a", "b"], 2, scores) == (0, 1)


# The 4-GPU PCIe server with NVLink bridges 0-1 and 2-3 (the fake NVML preset's scores).
def pcie_scores(names: str = "ABCD") -> dict[str, dict[str, int]]:
    bridged = {frozenset("AB"), frozenset("CD")}
    return {
        a: {b: (1220 if frozenset((a, b)) in bridged else 10) for b in names if b != a}
        for a in names
    }


def pcie_node(**usage: list[int]) -> NodeUsage:
    base = node(*(gpu(name, i) for i, name in enumerate("ABCD")), **usage)  # type: ignore[arg-type]
    return replace(base, pair_scores=pcie_scores())


def ask(count: int) -> ContainerRequest:
    return ContainerRequest(count, 1000, PERCENTAGE_UNSET, 0)


def chosen(target: NodeUsage, count: int, policy: str, *, numa_bind: bool = False) -> list[str]:
    result = fit_container(target, ask(count), context(policy, numa_bind=numa_bind))
    assert not isinstance(result, FitFailure), render_failure(result)
    return [device.uuid for device in result[1]]


def test_two_gpus_go_to_a_bridged_pair() -> None:
    # binpack tries the busiest GPU first: B (busy) then C, an unbridged pair for the plain walk.
    target = pcie_node(memory=[0, 8000, 4000, 0])
    assert chosen(target, 2, "binpack") == ["B", "C"]
    assert sorted(chosen(target, 2, "binpack,topology-aware")) == ["A", "B"]
    assert chosen(target, 2, "topology-aware") in (["D", "C"], ["C", "D"], ["B", "A"], ["A", "B"])


def test_one_gpu_goes_to_the_worst_connected() -> None:
    scores = pcie_scores()
    scores["A"]["B"] = scores["B"]["A"] = 10  # bridge 0-1 missing: A and B total 30
    target = replace(pcie_node(memory=[0, 0, 0, 8000]), pair_scores=scores)
    assert chosen(target, 1, "binpack") == ["D"]
    # walk order (binpack, from the end): D, C, B, A; B and A tie at 30, B is met first.
    assert chosen(target, 1, "binpack,topology-aware") == ["B"]


def test_four_gpus_take_the_node() -> None:
    assert sorted(chosen(pcie_node(), 4, "topology-aware")) == list("ABCD")


def test_without_scores_the_plain_walk_choice() -> None:
    plain = node(*(gpu(name, i) for i, name in enumerate("ABCD")), memory=[0, 8000, 4000, 0])
    for count in (1, 2, 3):
        assert chosen(plain, count, "binpack,topology-aware") == chosen(plain, count, "binpack")


def test_too_few_gpus_fail_as_hami_counts() -> None:
    target = pcie_node(memory=[32768, 32768, 32768, 0])
    result = fit_container(target, ask(2), context("topology-aware"))
    assert isinstance(result, FitFailure)
    assert render_failure(result) == (
        "1/4 AllocatedCardsInsufficientRequest, 3/4 CardInsufficientMemory"
    )


def test_numa_bind_keeps_the_last_numa_node_and_counts_no_numa_not_fit() -> None:
    """With topology-aware `k.Nums` never moves, so `NumaNotFit` (k.Nums != originReq) is
    never counted, and the walk's last NUMA node is what is left to choose from."""
    split = node(gpu("A", 0, numa=0), gpu("B", 1, numa=1))
    plain = fit_container(split, ask(2), context(numa_bind=True))
    aware = fit_container(split, ask(2), context("topology-aware", numa_bind=True))
    assert isinstance(plain, FitFailure) and isinstance(aware, FitFailure)
    assert render_failure(plain) == "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"
    assert render_failure(aware) == "1/2 AllocatedCardsInsufficientRequest"
    four = node(gpu("A", 0, numa=0), gpu("B", 1, numa=0), gpu("C", 2, numa=1), gpu("D", 3, numa=1))
    # spread + numa-bind walks NUMA 1 first; the plain walk stops there, topology-aware goes on
    assert chosen(four, 2, "spread", numa_bind=True) == ["D", "C"]
    assert chosen(four, 2, "topology-aware", numa_bind=True) == ["B", "A"]


def node_info(annotations: dict[str, str]) -> NodeInfo:
    return NodeInfo(name="n1", annotations=annotations)


def test_the_ledger_reads_the_score_annotation() -> None:
    """TestGetDevicePairScoreMap / GetNodeDevices: scores attach to the node's GPUs by UUID."""
    register = encode_node_devices([gpu("gpu0", 0), gpu("gpu1", 1)])
    scores = '[{"uuid":"gpu0","score":{"gpu1":100}},{"uuid":"gpu1","score":{"gpu0":100}}]'
    ledger = Ledger()
    ledger.update_node(
        node_info({ANNOTATION_NODE_REGISTER: register, NODE_NVIDIA_SCORE_ANNOTATION: scores})
    )
    usage = ledger.node("n1")
    assert usage is not None
    assert usage.pair_scores == {"gpu0": {"gpu1": 100}, "gpu1": {"gpu0": 100}}
    ledger.update_node(node_info({ANNOTATION_NODE_REGISTER: register}))
    usage = ledger.node("n1")
    assert usage is not None and usage.pair_scores == {}
    # A score annotation that does not decode fails the node (GetNodeDevices returns the error).
    ledger.update_node(
        node_info({ANNOTATION_NODE_REGISTER: register, NODE_NVIDIA_SCORE_ANNOTATION: "{"})
    )
    assert ledger.node("n1") is None
