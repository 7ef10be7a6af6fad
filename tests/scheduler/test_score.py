"""Scores in float32 as HAMi's Go code computes them (docs/hami-reference.md 3.6,
docs/design.md 10.2 and 10.5)."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.model import ScoringWeights
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest
from hami_plugin.scheduler.score import device_score, float32, node_score


def _c_float(value: float) -> float:
    """An independent float32 rounding (C's double -> float conversion)."""
    return float(ctypes.c_float(value).value)


def _reference(
    slot_ratio: tuple[int, int],
    core_ratio: tuple[int, int],
    memory_ratio: tuple[int, int],
    weights: tuple[int, int, int] = (1, 1, 1),
) -> float:
    """Go: float32(a)/float32(b) per term, float32(w)*term, summed left to right, *10."""
    terms = []
    for (numerator, denominator), weight in zip(
        (slot_ratio, core_ratio, memory_ratio), weights, strict=True
    ):
        ratio = _c_float(_c_float(numerator) / _c_float(denominator))
        terms.append(_c_float(_c_float(weight) * ratio))
    return _c_float(10.0 * _c_float(_c_float(terms[0] + terms[1]) + terms[2]))


def test_float32_rounding() -> None:
    assert float32(0.1) == 0.10000000149011612
    assert float32(1 / 3) == 0.3333333432674408
    assert float32(16777217.0) == 16777216.0  # 2**24 + 1 is not a float32


@pytest.mark.parametrize(
    ("totals", "used", "expected"),
    [
        ((20, 200, 163840), (2, 80, 60000), 8.662109375),  # the fixture's gpu-a100-0
        ((40, 400, 131072), (2, 100, 32768), 5.5),  # gpu-v100-0
        ((3, 100, 100), (1, 0, 0), 3.3333334922790527),  # 10 * float32(1/3), in float32
        ((10, 100, 1000), (10, 100, 1000), 30.0),  # full
        ((10, 100, 1000), (0, 0, 0), 0.0),
        ((0, 100, 1000), (0, 0, 0), 0.0),  # no slots: 0, not a division by zero
        ((10, 0, 1000), (1, 0, 0), 0.0),
        ((10, 100, 0), (1, 0, 0), 0.0),
    ],
)
def test_node_score(
    totals: tuple[int, int, int], used: tuple[int, int, int], expected: float
) -> None:
    assert node_score(*totals, *used) == expected


def test_device_score_includes_the_request() -> None:
    # docs/design.md 10.5: 10 * ((1+2)/10 + (20+30)/100 + (4096+8192)/32768)
    request = ContainerRequest(1, 4096, PERCENTAGE_UNSET, 20)
    score = device_score(10, 100, 32768, 2, 30, 8192, request)
    assert score == _reference((3, 10), (50, 100), (12288, 32768))
    assert score == pytest.approx(11.75)
    # request = the number of GPUs asked (the design note's "devices asked")
    four = ContainerRequest(4, 4096, PERCENTAGE_UNSET, 20)
    assert device_score(10, 100, 32768, 2, 30, 8192, four) == _reference(
        (6, 10), (50, 100), (12288, 32768)
    )
    # without a request only the usage counts
    assert device_score(10, 100, 32768, 2, 30, 8192, None) == _reference(
        (2, 10), (30, 100), (8192, 32768)
    )


def test_device_score_percentage_is_of_this_card() -> None:
    half = ContainerRequest(1, 0, 50, 0)
    assert device_score(10, 100, 32768, 0, 0, 0, half) == _reference(
        (1, 10), (0, 100), (16384, 32768)
    )
    assert device_score(10, 100, 15360, 0, 0, 0, half) == _reference(
        (1, 10), (0, 100), (7680, 15360)
    )
    # HAMi scores a percentage even when MiB were asked too
    both = ContainerRequest(1, 1000, 50, 0)
    assert device_score(10, 100, 32768, 0, 0, 0, both) == _reference(
        (1, 10), (0, 100), (16384, 32768)
    )


def test_device_score_weights() -> None:
    request = ContainerRequest(1, 1000, PERCENTAGE_UNSET, 10)
    weighted = device_score(10, 100, 10000, 3, 20, 2000, request, ScoringWeights(2, 0, 5))
    assert weighted == _reference((4, 10), (30, 100), (3000, 10000), (2, 0, 5))
    assert weighted == pytest.approx(10 * (2 * 0.4 + 5 * 0.3))


def test_device_score_of_an_empty_device_is_zero() -> None:
    request = ContainerRequest(1, 1000, PERCENTAGE_UNSET, 10)
    assert device_score(0, 100, 10000, 0, 0, 0, request) == 0.0
    assert device_score(10, 0, 10000, 0, 0, 0, request) == 0.0
    assert device_score(10, 100, 0, 0, 0, 0, request) == 0.0


_COUNT = st.integers(1, 64)
_USED = st.integers(0, 64)
_BIG = st.integers(1, 2**31 - 1)


@given(
    count=_COUNT,
    cores=st.integers(1, 400),
    memory=_BIG,
    used=_USED,
    used_cores=st.integers(0, 400),
    used_memory=st.integers(0, 2**31 - 1),
    asked=st.integers(1, 16),
    asked_cores=st.integers(0, 100),
    asked_memory=st.integers(0, 2**20),
    weights=st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)),
)
def test_device_score_matches_an_independent_float32_computation(
    count: int,
    cores: int,
    memory: int,
    used: int,
    used_cores: int,
    used_memory: int,
    asked: int,
    asked_cores: int,
    asked_memory: int,
    weights: tuple[int, int, int],
) -> None:
    request = ContainerRequest(asked, asked_memory, PERCENTAGE_UNSET, asked_cores)
    score = device_score(
        count, cores, memory, used, used_cores, used_memory, request, ScoringWeights(*weights)
    )
    assert score == _reference(
        (asked + used, count),
        (asked_cores + used_cores, cores),
        (asked_memory + used_memory, memory),
        weights,
    )


@given(
    totals=st.tuples(_BIG, _BIG, _BIG),
    used=st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)),
)
def test_node_score_matches_an_independent_float32_computation(
    totals: tuple[int, int, int], used: tuple[int, int, int]
) -> None:
    expected = _reference((used[0], totals[0]), (used[1], totals[1]), (used[2], totals[2]))
    assert node_score(*totals, *used) == expected


@given(
    totals=st.tuples(_COUNT, st.integers(1, 800), st.integers(1, 655360)),
    used=st.tuples(_USED, st.integers(0, 800), st.integers(0, 655360)),
    more=st.tuples(st.integers(0, 8), st.integers(0, 100), st.integers(0, 8192)),
)
def test_node_score_grows_with_usage(
    totals: tuple[int, int, int], used: tuple[int, int, int], more: tuple[int, int, int]
) -> None:
    fuller = tuple(a + b for a, b in zip(used, more, strict=True))
    assert node_score(*totals, *fuller) >= node_score(*totals, *used)
