"""HAMi's priority feedback decision (`cmd/vGPUmonitor/feedback.go` `Observe`, v2.10), pure.

HAMi-core sets `recentKernel` when a container launches kernels and waits while it is negative;
`utilizationSwitch` tells it that others use the GPU too. Every 5 s the monitor:

1. decrements each positive `recentKernel` (feedback.go:79-81,100);
2. counts, per GPU and priority, the containers still active after the decrement
   (`recentKernel > 0`) with priority >= 0, over every valid UUID slot (feedback.go:82-98);
3. blocks (`recentKernel = -1`) a container that is not blocked yet when an active container of
   a higher priority (a lower number) shares one of its GPUs, and unblocks (`0`) a blocked one
   otherwise (CheckBlocking, feedback.go:40-53,107-119);
4. sets `utilizationSwitch` to 1 when that holds or another active container of the same
   priority shares one of its GPUs, else to 0 (CheckPriority, feedback.go:56-72,120-132).

A container counts itself in step 2, so "another of the same priority" is a count above 1.
Negative priorities are never counted, blocked nor switched (feedback.go:90-92; the loops over
`min(p, len)` run zero times). HAMi grows a list to index `priority`; counts are kept in a dict
here so a hostile priority of 2**31-1 costs nothing.

Deliberate difference: a GPU listed twice in one region counts once (HAMi counts every slot, so
such a container, even alone, turned its own `utilizationSwitch` on).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

BLOCKED = -1
"""`recentKernel` value that makes HAMi-core hold the container's kernels."""

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class ContainerActivity:
    """What the decision reads from one container's region."""

    gpus: tuple[str, ...]
    """Identities of the container's GPUs (`Region.gpu_keys`)."""
    priority: int
    recent_kernel: int
    utilization_switch: int


@dataclass(frozen=True, slots=True)
class FeedbackDecision:
    """The values the region should hold after this round."""

    recent_kernel: int
    utilization_switch: int

    @property
    def blocked(self) -> bool:
        return self.recent_kernel < 0


def _decremented(recent_kernel: int) -> int:
    return recent_kernel - 1 if recent_kernel > 0 else recent_kernel


def active_counts(containers: Iterable[ContainerActivity]) -> dict[str, dict[int, int]]:
    """GPU -> priority -> number of containers active after this round's decrement."""
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for container in containers:
        if _decremented(container.recent_kernel) > 0 and container.priority >= 0:
            for gpu in set(container.gpus):
                counts[gpu][container.priority] += 1
    return {gpu: dict(per_priority) for gpu, per_priority in counts.items()}


def decide_feedback(containers: Mapping[K, ContainerActivity]) -> dict[K, FeedbackDecision]:
    """One feedback round over all regions on the node; keys are the caller's (e.g. paths).

    Deterministic and independent of the mapping's order.
    """
    counts = active_counts(containers.values())
    decisions: dict[K, FeedbackDecision] = {}
    for key, container in containers.items():
        recent_kernel = _decremented(container.recent_kernel)
        priority = container.priority
        higher_active = False
        same_active = False
        for gpu in container.gpus:
            per_priority = counts.get(gpu)
            if per_priority is None:
                continue
            if any(other < priority for other in per_priority):
                higher_active = True
            if per_priority.get(priority, 0) > 1:
                same_active = True
        if higher_active:
            recent_kernel = BLOCKED if recent_kernel >= 0 else recent_kernel
        elif recent_kernel < 0:
            recent_kernel = 0
        decisions[key] = FeedbackDecision(
            recent_kernel=recent_kernel,
            utilization_switch=1 if higher_active or same_active else 0,
        )
    return decisions
