"""GPU order and node order as values, built once from the parsed policies
(docs/hami-reference.md 3.5.4).

HAMi sorts a node's GPUs with a comparator that re-reads the policy string on every call;
here a `GpuOrder` is a tuple of sort keys decided once per pod. Fit walks the sorted list from
the end, so whatever sorts last is tried first.

| policy (pod annotation or default)   | numa-bind | keys, first decides                   |
|--------------------------------------|-----------|---------------------------------------|
| chain (`a,b`, or exactly `numa`)     | no        | chain keys in written order, index    |
| chain                                | yes       | numa first, then the other chain keys |
| `mutex`                              | any       | more used slots first, lower NUMA     |
| `binpack`                            | yes       | higher NUMA first, lower score        |
| `spread` / other                     | yes       | lower NUMA first, higher score        |
| `binpack`                            | no        | lower score first, lower NUMA         |
| `spread` / other                     | no        | higher score first, lower NUMA        |

Chain keys: `binpack` = lower score first, `spread` = higher score first, `numa` = lower NUMA
first; a chain naming none of them sorts as `spread`; every chain ends with "lower device
index first". `mutex` and `topology-aware` in a chain are filters, not keys.
With `numa_grouped_order` (the design note's order, docs/design.md 9.4) the numa-bind rows apply to
single `binpack`/`spread` policies even without numa-bind.
Equal keys keep the input order (Python's sort is stable, as Go's is for up to 12 GPUs).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.protocol.model import GpuPolicy, GpuPolicyName, NodePolicy

__all__ = ["GpuOrder", "SortKey", "gpu_order", "prefers_higher_score", "topology_choice"]


class SortKey(enum.Enum):
    """One comparison of the GPU order; "ASC" puts smaller values first (tried last)."""

    SCORE_ASC = "score ascending"
    SCORE_DESC = "score descending"
    NUMA_ASC = "numa ascending"
    NUMA_DESC = "numa descending"
    USED_DESC = "used slots descending"
    INDEX_ASC = "index ascending"


@dataclass(frozen=True, slots=True)
class GpuOrder:
    """How one pod orders a node's GPUs. `key(...)` builds the tuple Python sorts by."""

    keys: tuple[SortKey, ...]

    @property
    def numa_first(self) -> bool:
        """GPUs of one NUMA node are contiguous in this order."""
        return self.keys[0] in (SortKey.NUMA_ASC, SortKey.NUMA_DESC)

    @property
    def uses_score(self) -> bool:
        """Some key compares GPU scores, so they must be computed before sorting."""
        return SortKey.SCORE_ASC in self.keys or SortKey.SCORE_DESC in self.keys

    def key(self, score: float, numa: int, used: int, index: int) -> tuple[float | int, ...]:
        """The sort key of one GPU; sort ascending, then walk from the end."""
        values: list[float | int] = []
        for sort_key in self.keys:
            if sort_key is SortKey.SCORE_ASC:
                values.append(score)
            elif sort_key is SortKey.SCORE_DESC:
                values.append(-score)
            elif sort_key is SortKey.NUMA_ASC:
                values.append(numa)
            elif sort_key is SortKey.NUMA_DESC:
                values.append(-numa)
            elif sort_key is SortKey.USED_DESC:
                values.append(-used)
            else:
                values.append(index)
        return tuple(values)


_CHAIN_KEYS = {
    GpuPolicyName.BINPACK: SortKey.SCORE_ASC,
    GpuPolicyName.SPREAD: SortKey.SCORE_DESC,
    GpuPolicyName.NUMA: SortKey.NUMA_ASC,
}


def gpu_order(policy: GpuPolicy, numa_bind: bool, numa_grouped_order: bool = False) -> GpuOrder:
    """The GPU order for a pod with this policy and `nvidia.com/numa-bind` setting."""
    if policy.chain:
        keys = [_CHAIN_KEYS[name] for name in policy.names if name in _CHAIN_KEYS]
        if not keys:
            keys = [SortKey.SCORE_DESC]
        if numa_bind and keys[0] is not SortKey.NUMA_ASC:
            keys = [SortKey.NUMA_ASC, *(key for key in keys if key is not SortKey.NUMA_ASC)]
        return GpuOrder((*keys, SortKey.INDEX_ASC))
    # Outside chains HAMi compares the whole policy text: a blank text, or a name with blanks
    # around it, matches nothing and sorts as spread.
    name = policy.names[0] if policy.exact and policy.names else GpuPolicyName.SPREAD
    if name is GpuPolicyName.MUTEX:
        return GpuOrder((SortKey.USED_DESC, SortKey.NUMA_ASC))
    binpack = name is GpuPolicyName.BINPACK
    single = name in (GpuPolicyName.BINPACK, GpuPolicyName.SPREAD)
    if numa_bind or (numa_grouped_order and single):
        if binpack:
            return GpuOrder((SortKey.NUMA_DESC, SortKey.SCORE_ASC))
        return GpuOrder((SortKey.NUMA_ASC, SortKey.SCORE_DESC))
    if binpack:
        return GpuOrder((SortKey.SCORE_ASC, SortKey.NUMA_ASC))
    return GpuOrder((SortKey.SCORE_DESC, SortKey.NUMA_ASC))


def prefers_higher_score(policy: NodePolicy) -> bool:
    """Binpack takes the fullest node (highest score), spread the emptiest (lowest)."""
    return policy is NodePolicy.BINPACK


def topology_choice(
    uuids: Sequence[str], count: int, pair_scores: Mapping[str, Mapping[str, int]]
) -> tuple[int, ...]:
    """The `topology-aware` pick among the GPUs the walk passed (`uuids`, in walk order):
    positions into `uuids`, in that order. HAMi v2.10 `pkg/device/nvidia/device.go` Fit,
    lines 851-868.

    As many passed as asked: all of them. One GPU asked: `computeWorstSingleCard`
    (device.go:927-951), the GPU whose scores towards the other passed GPUs sum lowest, so
    the well-connected ones stay free for multi-GPU pods; the first such GPU on a tie.
    Several: `computeBestCombination` (device.go:953-978) over `generateCombinations`
    (device.go:887-915, lexicographic in walk order), the set whose pair scores sum highest;
    the first such set on a tie. A missing score counts 0, so a node without
    `hami.io/node-nvidia-score` gets the first GPU / the first `count` GPUs the walk passed,
    the plain walk's choice.
    """
    if len(uuids) == count:
        return tuple(range(count))
    if count == 1:
        worst, worst_total = 0, 0
        for i, first in enumerate(uuids):
            peers = pair_scores.get(first, {})
            total = sum(peers.get(second, 0) for second in uuids if second != first)
            if i == 0 or total < worst_total:
                worst, worst_total = i, total
        return (worst,)
    best: tuple[int, ...] = ()
    best_total = -1
    for combination in itertools.combinations(range(len(uuids)), count):
        total = 0
        for at, i in enumerate(combination[:-1]):
            peers = pair_scores.get(uuids[i], {})
            total += sum(peers.get(uuids[j], 0) for j in combination[at + 1 :])
        if not best or total > best_total:
            best, best_total = combination, total
    return best
