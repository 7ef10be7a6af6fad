"""MIG profile and placement choice, ported from HAMi v2.10 pkg/device/nvidia
mig_topology_test.go, plus properties of the search."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.model import MigPlacement, MigProfile
from hami_plugin.scheduler.mig import (
    can_place_mig_profiles,
    placements_overlap,
    select_mig_candidate,
    select_mig_placement,
)


def _p(start: int, size: int) -> MigPlacement:
    return MigPlacement(start, size)


# TestCanPlaceMigProfilesA100 / TestSelectMigPlacementUsesBalancedPacking: their `allowed`.
A100_TEST = (
    MigProfile("1g.5gb", 4864, 14, 1, tuple(_p(i, 1) for i in range(7))),
    MigProfile("2g.10gb", 9984, 28, 2, (_p(0, 2), _p(2, 2), _p(4, 2))),
    MigProfile("3g.20gb", 19968, 42, 3, (_p(0, 4), _p(4, 4))),
)


def test_can_place_a100() -> None:
    assert can_place_mig_profiles(A100_TEST, (), ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    assert can_place_mig_profiles(A100_TEST, [_p(4, 4)], ["2g.10gb", "1g.5gb", "1g.5gb"])
    assert not can_place_mig_profiles(A100_TEST, [_p(0, 4), _p(4, 4)], ["1g.5gb"])
    assert not can_place_mig_profiles(A100_TEST, [_p(0, 2), _p(2, 2), _p(4, 2)], ["2g.10gb"])
    assert can_place_mig_profiles(A100_TEST, [_p(0, 4), _p(4, 4)], [])


def test_select_placement_uses_balanced_packing() -> None:
    occupied: list[MigPlacement] = []
    for profile, start in [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 3), ("1g.5gb", 2)]:
        placement = select_mig_placement(A100_TEST, occupied, profile)
        assert placement is not None and placement.start == start, profile
        occupied.append(placement)
    assert select_mig_placement(A100_TEST, occupied, "1g.5gb") is None
    assert select_mig_placement(A100_TEST, (), "7g.40gb") is None


def test_candidate_is_the_smallest_fitting_profile_with_room() -> None:
    assert select_mig_candidate(A100_TEST, (), 4000) == (A100_TEST[0], _p(6, 1))
    assert select_mig_candidate(A100_TEST, (), 5000) == (A100_TEST[1], _p(0, 2))
    # Every 1g slot taken: a 1g-sized request moves up to a free larger profile, or fails.
    full_1g = [_p(i, 1) for i in range(7)]
    assert select_mig_candidate(A100_TEST, full_1g, 100) is None
    assert select_mig_candidate(A100_TEST, [_p(4, 4)], 100) == (A100_TEST[0], _p(3, 1))
    assert select_mig_candidate(A100_TEST, (), 30000) is None
    # Zero memory gets the smallest profile.
    assert select_mig_candidate(A100_TEST, (), 0) == (A100_TEST[0], _p(6, 1))


@given(
    st.lists(st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb"]), max_size=8),
    st.lists(st.integers(0, 30000), max_size=10),
)
def test_chosen_placements_never_overlap(requested: list[str], memories: list[int]) -> None:
    occupied: list[MigPlacement] = []
    for memory in memories:
        chosen = select_mig_candidate(A100_TEST, occupied, memory)
        if chosen is None:
            # Nothing fits: no profile with enough memory has a free placement.
            for profile in A100_TEST:
                if profile.memory_mib >= memory:
                    assert select_mig_placement(A100_TEST, occupied, profile.name) is None
            continue
        profile, placement = chosen
        assert profile.memory_mib >= memory
        assert placement in profile.placements
        assert not any(placements_overlap(placement, other) for other in occupied)
        occupied.append(placement)
    # The backtracking search agrees with brute force on what still fits.
    assert can_place_mig_profiles(A100_TEST, occupied, requested) == _brute(occupied, requested)


def _brute(occupied: list[MigPlacement], requested: list[str]) -> bool:
    if not requested:
        return True
    by_name = {profile.name: profile.placements for profile in A100_TEST}
    first, rest = requested[0], requested[1:]
    for candidate in by_name[first]:
        free = not any(placements_overlap(candidate, other) for other in occupied)
        if free and _brute([*occupied, candidate], rest):
            return True
    return False
