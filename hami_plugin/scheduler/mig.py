"""Dynamic MIG placement: which profile and which placement a MIG-mode GPU gives a request,
as HAMi v2.10 decides it (`pkg/device/nvidia/mig_topology.go` and `selectMigCandidate` in
`device.go:621-639`).

A MIG-mode GPU registers its profiles with the placements NVML reports for each
(`MigProfile.placements`: start slice and size). A request of `m` MiB gets the profile with the
least memory of at least `m` (ties: fewer slices) that still has a placement overlapping no
occupied one; a placement is searched from the highest start for `1g.` and `3g.` profiles and
from the lowest for the others (HAMi's `preferHighMigPlacement`, which keeps the low slices
free for the large profiles). The fit checks a MIG-mode GPU with `has_mig_placement` against
the placements in use during the pod's fit (`MigView`). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from hami_plugin.protocol.model import GpuDevice, MigPlacement, MigProfile
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "MigView",
    "can_place_mig_profiles",
    "has_mig_placement",
    "ordered_placements",
    "placements_overlap",
    "select_mig_candidate",
    "select_mig_placement",
]


def _prefer_high(profile: str) -> bool:
    """HAMi's `preferHighMigPlacement` (mig_topology.go:24-26)."""
    return profile.startswith("1g.") or profile.startswith("3g.")


def ordered_placements(profile: str, placements: Sequence[MigPlacement]) -> list[MigPlacement]:
    """HAMi's `orderedMigPlacements` (mig_topology.go:28-37): a stable sort by start,
    descending for `1g.`/`3g.` profiles."""
    if _prefer_high(profile):
        return sorted(placements, key=lambda placement: -placement.start)
    return sorted(placements, key=lambda placement: placement.start)


def placements_overlap(a: MigPlacement, b: MigPlacement) -> bool:
    """HAMi's `migPlacementsOverlap` (mig_topology.go:77-79)."""
    return a.start < b.start + b.size and b.start < a.start + a.size


def _find_profile(profiles: Sequence[MigProfile], name: str) -> MigProfile | None:
    for profile in profiles:
        if profile.name == name:
            return profile
    return None


def _free(candidate: MigPlacement, occupied: Sequence[MigPlacement]) -> bool:
    return not any(placements_overlap(candidate, existing) for existing in occupied)


def select_mig_placement(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], name: str
) -> MigPlacement | None:
    """HAMi's `selectMigPlacement` (mig_topology.go:56-75): the first placement of profile
    `name`, in `ordered_placements` order, that overlaps nothing occupied (the first profile
    of that name, as HAMi's `findMigProfile`)."""
    profile = _find_profile(profiles, name)
    if profile is None:
        return None
    for candidate in ordered_placements(name, profile.placements):
        if _free(candidate, occupied):
            return candidate
    return None


def select_mig_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memory_mib: int
) -> tuple[MigProfile, MigPlacement] | None:
    """HAMi's `selectMigCandidate` (device.go:621-639): profiles by memory, then slices
    (stable), the first with at least `memory_mib` and a free placement."""
    candidates = sorted(profiles, key=lambda profile: (profile.memory_mib, profile.slice_count))
    for profile in candidates:
        if profile.memory_mib < memory_mib:
            continue
        placement = select_mig_placement(profiles, occupied, profile.name)
        if placement is not None:
            return profile, placement
    return None


def can_place_mig_profiles(
    capabilities: Sequence[MigProfile],
    occupied: Sequence[MigPlacement],
    requested: Sequence[str],
) -> bool:
    """HAMi's `canPlaceMigProfiles` (mig_topology.go:84-132): whether every requested profile
    gets a placement overlapping neither the occupied ones nor each other, searched with
    backtracking, the most constrained profiles (fewest placements, then the largest) first.
    A profile named twice in `capabilities` keeps its last placements, as HAMi's map does."""
    if not requested:
        return True
    placements = {profile.name: profile.placements for profile in capabilities}

    def constraint(name: str) -> tuple[int, int]:
        own = placements.get(name, ())
        return (len(own), -own[0].size if own else 0)

    ordered = sorted(requested, key=constraint)
    used = list(occupied)

    def place(index: int) -> bool:
        if index == len(ordered):
            return True
        name = ordered[index]
        for candidate in ordered_placements(name, placements.get(name, ())):
            if not _free(candidate, used):
                continue
            used.append(candidate)
            if place(index + 1):
                return True
            used.pop()
        return False

    return place(0)


class MigView:
    """The MIG placements in use during one phase of a pod's fit (HAMi's node copy's
    `MigAllocationsInUse`): the node's, plus what the phase's earlier containers booked."""

    __slots__ = ("_extra", "_node")

    def __init__(self, node: NodeUsage) -> None:
        self._node = node
        self._extra: dict[int, list[MigPlacement]] = {}

    def occupied(self, position: int) -> list[MigPlacement]:
        """The placements in use on the GPU at `position` (a new list)."""
        return [*self._node.occupied(position), *self._extra.get(position, ())]

    def add(self, position: int, placement: MigPlacement) -> None:
        self._extra.setdefault(position, []).append(placement)


def has_mig_placement(
    device: GpuDevice,
    occupied: list[MigPlacement],
    devices: Sequence[GpuDevice],
    passed: Sequence[int],
    passed_memory_mib: Sequence[int],
    memory_mib: int,
) -> bool:
    """HAMi's `CustomFilterRule` for a MIG-mode GPU (device.go:602-619): the container's GPUs
    passed so far on the same GPU replayed, each with its own memory, onto the placements in
    use (`occupied`, extended in place), and still a profile with a free placement for
    `memory_mib`."""
    profiles = device.mig_profiles
    for position, mib in zip(passed, passed_memory_mib, strict=True):
        if devices[position].uuid != device.uuid:
            continue
        candidate = select_mig_candidate(profiles, occupied, mib)
        if candidate is None:
            return False
        occupied.append(candidate[1])
    return select_mig_candidate(profiles, occupied, memory_mib) is not None
