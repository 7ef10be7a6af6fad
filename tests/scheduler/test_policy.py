"""GPU order: every comparator case of docs/hami-reference.md 3.5.4, plus the NUMA-grouped
switch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hami_plugin.protocol.codec import parse_gpu_policy
from hami_plugin.protocol.model import NodePolicy
from hami_plugin.scheduler.policy import SortKey, gpu_order, prefers_higher_score


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    score: float
    numa: int
    used: int = 0
    index: int = 0


def _sorted(policy: str, numa_bind: bool, gpus: list[Gpu], grouped: bool = False) -> str:
    order = gpu_order(parse_gpu_policy(policy), numa_bind, grouped)
    ordered = sorted(gpus, key=lambda gpu: order.key(gpu.score, gpu.numa, gpu.used, gpu.index))
    return "".join(gpu.name for gpu in ordered)


SCORED = [Gpu("A", 5.0, 1, index=0), Gpu("B", 3.0, 0, index=1), Gpu("C", 5.0, 0, index=2)]


@pytest.mark.parametrize(
    ("policy", "numa_bind", "expected"),
    [
        # no numa-bind: score first, NUMA breaks ties (lower NUMA first)
        ("binpack", False, "BCA"),  # lower score first: A (fullest) is tried first
        ("spread", False, "CAB"),  # higher score first: B (emptiest) is tried first
        ("topology-aware", False, "CAB"),  # sorts as spread
        # numa-bind: NUMA first
        ("binpack", True, "ABC"),  # higher NUMA first, then lower score
        ("spread", True, "CBA"),  # lower NUMA first, then higher score
        ("topology-aware", True, "CBA"),
        # chains: keys in written order, then the device index
        ("binpack,numa", False, "BCA"),
        ("numa,binpack", False, "BCA"),
        ("numa,spread", False, "CBA"),
        ("spread,numa", False, "CAB"),
        ("numa", False, "BCA"),  # numa, then index: B(1) before C(2)
        ("mutex,topology-aware", False, "ACB"),  # no sort key: spread, then index
        ("binpack,spread", False, "BAC"),  # spread never decides after binpack: index
        # numa-bind moves numa to the front of a chain
        ("spread,numa", True, "CBA"),
        ("binpack,mutex", True, "BCA"),
    ],
)
def test_comparator_cases(policy: str, numa_bind: bool, expected: str) -> None:
    assert _sorted(policy, numa_bind, SCORED) == expected


def test_mutex_puts_idle_gpus_last() -> None:
    gpus = [Gpu("D", 9.0, 0, used=2), Gpu("E", 0.0, 1), Gpu("F", 0.0, 0), Gpu("G", 9.0, 1, used=2)]
    # more used slots first, ties by lower NUMA: E (idle, NUMA 1) is tried first
    assert _sorted("mutex", False, gpus) == "DGFE"
    assert _sorted("mutex", True, gpus) == "DGFE"  # mutex wins over numa-bind


def test_equal_keys_keep_the_input_order() -> None:
    gpus = [Gpu("X", 1.0, 0, index=5), Gpu("Y", 1.0, 0, index=1), Gpu("Z", 1.0, 0, index=3)]
    assert _sorted("binpack", False, gpus) == "XYZ"
    assert _sorted("spread", True, gpus) == "XYZ"
    assert _sorted("spread,binpack", False, gpus) == "YZX"  # chains end with the index


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("binpack", "ABC"),  # as with numa-bind
        ("spread", "CBA"),
        ("spread,numa", "CAB"),  # an explicit chain keeps its order
        ("topology-aware", "CAB"),
    ],
)
def test_numa_grouped_order_switch(policy: str, expected: str) -> None:
    assert _sorted(policy, False, SCORED, grouped=True) == expected


def test_design_note_gpu_order() -> None:
    """Design note 6: grouped by NUMA; binpack ascending by score within a NUMA node with the
    higher NUMA id first; spread descending with the lower NUMA id first."""
    gpus = [
        Gpu("a0", 2.0, 0),
        Gpu("b0", 7.0, 0),
        Gpu("a1", 4.0, 1),
        Gpu("b1", 1.0, 1),
    ]
    order = gpu_order(parse_gpu_policy("binpack"), False, numa_grouped_order=True)
    names = [g.name for g in sorted(gpus, key=lambda g: order.key(g.score, g.numa, 0, 0))]
    assert names == ["b1", "a1", "a0", "b0"]
    order = gpu_order(parse_gpu_policy("spread"), False, numa_grouped_order=True)
    names = [g.name for g in sorted(gpus, key=lambda g: order.key(g.score, g.numa, 0, 0))]
    assert names == ["b0", "a0", "a1", "b1"]


def test_order_properties() -> None:
    chain = gpu_order(parse_gpu_policy("spread,numa"), True)
    assert chain.keys == (SortKey.NUMA_ASC, SortKey.SCORE_DESC, SortKey.INDEX_ASC)
    assert chain.numa_first and chain.uses_score
    mutex = gpu_order(parse_gpu_policy("mutex"), True)
    assert not mutex.numa_first and not mutex.uses_score
    # whenever numa-bind is asked and scores are used, NUMA comes first (fit relies on it)
    for text in ("binpack", "spread", "topology-aware", "numa", "binpack,spread", "mutex,spread"):
        order = gpu_order(parse_gpu_policy(text), True)
        assert order.numa_first or not order.uses_score


def test_node_policy() -> None:
    assert prefers_higher_score(NodePolicy.BINPACK)
    assert not prefers_higher_score(NodePolicy.SPREAD)
