"""HAMi's priority feedback decision (cmd/vGPUmonitor/feedback.go, v2.10)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.deviceplugin.monitor.feedback import (
    BLOCKED,
    ContainerActivity,
    FeedbackDecision,
    decide_feedback,
)


def activity(
    gpus: tuple[str, ...], priority: int, recent_kernel: int, switch: int = 0
) -> ContainerActivity:
    return ContainerActivity(
        gpus=gpus, priority=priority, recent_kernel=recent_kernel, utilization_switch=switch
    )


def hami_observe(containers: dict[str, ContainerActivity]) -> dict[str, tuple[int, int]]:
    """feedback.go Observe/CheckBlocking/CheckPriority transliterated line by line (lists that
    grow to index `priority`), on mutable copies of the two fields."""
    state = {key: [c.recent_kernel, c.utilization_switch] for key, c in containers.items()}
    switch_on: dict[str, list[int]] = {}
    for key, c in containers.items():  # feedback.go:78-102
        recent = state[key][0]
        if recent > 0:
            recent -= 1
            if recent > 0:
                for uuid in c.gpus:
                    p = c.priority
                    if p < 0:
                        continue
                    counts = switch_on.setdefault(uuid, [])
                    while p >= len(counts):
                        counts.append(0)
                    counts[p] += 1
            state[key][0] = recent

    def check_blocking(p: int, c: ContainerActivity) -> bool:  # feedback.go:40-53
        for uuid in c.gpus:
            if uuid in switch_on:
                for i in range(min(p, len(switch_on[uuid]))):
                    if switch_on[uuid][i] > 0:
                        return True
        return False

    def check_priority(p: int, c: ContainerActivity) -> bool:  # feedback.go:56-72
        for uuid in c.gpus:
            if uuid in switch_on:
                for i in range(min(p, len(switch_on[uuid]))):
                    if switch_on[uuid][i] > 0:
                        return True
                if 0 <= p < len(switch_on[uuid]) and switch_on[uuid][p] > 1:
                    return True
        return False

    for key, c in containers.items():  # feedback.go:103-133
        recent, switch = state[key]
        if check_blocking(c.priority, c):
            if recent >= 0:
                state[key][0] = -1
        elif recent < 0:
            state[key][0] = 0
        if check_priority(c.priority, c):
            if switch != 1:
                state[key][1] = 1
        elif switch != 0:
            state[key][1] = 0
    return {key: (value[0], value[1]) for key, value in state.items()}


GPUS = ["GPU-a", "GPU-b", "GPU-c"]
containers_strategy = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=3),
    st.builds(
        activity,
        st.lists(st.sampled_from(GPUS), max_size=3, unique=True).map(tuple),
        st.integers(min_value=-2, max_value=4),
        st.integers(min_value=-3, max_value=4),
        st.integers(min_value=-1, max_value=2),
    ),
    max_size=8,
)


def test_higher_priority_blocks_lower_on_a_shared_gpu() -> None:
    decisions = decide_feedback(
        {"high": activity(("GPU-a",), 0, 3), "low": activity(("GPU-a",), 1, 3)}
    )
    assert decisions["high"] == FeedbackDecision(recent_kernel=2, utilization_switch=0)
    assert decisions["low"] == FeedbackDecision(recent_kernel=BLOCKED, utilization_switch=1)
    assert decisions["low"].blocked


def test_same_priority_both_switched_none_blocked() -> None:
    decisions = decide_feedback({"a": activity(("GPU-a",), 1, 3), "b": activity(("GPU-a",), 1, 2)})
    assert decisions == {
        "a": FeedbackDecision(2, 1),
        "b": FeedbackDecision(1, 1),
    }


def test_other_gpus_do_not_interact() -> None:
    decisions = decide_feedback({"a": activity(("GPU-a",), 0, 3), "b": activity(("GPU-b",), 1, 3)})
    assert decisions == {"a": FeedbackDecision(2, 0), "b": FeedbackDecision(2, 0)}


def test_one_after_decrement_is_not_active() -> None:
    # recentKernel 1 decrements to 0: not counted (feedback.go:80-82)
    decisions = decide_feedback({"a": activity(("GPU-a",), 0, 1), "b": activity(("GPU-a",), 1, 3)})
    assert decisions == {"a": FeedbackDecision(0, 0), "b": FeedbackDecision(2, 0)}


def test_blocked_container_is_released_when_the_higher_one_stops() -> None:
    decisions = decide_feedback(
        {"a": activity(("GPU-a",), 0, 0), "b": activity(("GPU-a",), 1, BLOCKED, 1)}
    )
    assert decisions["b"] == FeedbackDecision(0, 0)


def test_already_negative_stays_as_it_is_while_blocked() -> None:
    decisions = decide_feedback({"a": activity(("GPU-a",), 0, 5), "b": activity(("GPU-a",), 2, -7)})
    assert decisions["b"] == FeedbackDecision(-7, 1)


def test_negative_priority_is_never_counted_or_blocked() -> None:
    decisions = decide_feedback(
        {"a": activity(("GPU-a",), -1, 5), "b": activity(("GPU-a",), 0, 5, 1)}
    )
    assert decisions == {"a": FeedbackDecision(4, 0), "b": FeedbackDecision(4, 0)}


def test_hostile_priority_costs_nothing() -> None:
    decisions = decide_feedback(
        {"a": activity(("GPU-a",), (1 << 31) - 1, 5), "b": activity(("GPU-a",), 0, 5)}
    )
    assert decisions["a"].blocked


def test_a_gpu_listed_twice_counts_once() -> None:
    # deliberate difference: HAMi would count it twice and switch a lone container on
    decisions = decide_feedback({"a": activity(("GPU-a", "GPU-a"), 0, 5)})
    assert decisions["a"] == FeedbackDecision(4, 0)


@settings(max_examples=400, deadline=None)
@given(containers_strategy)
def test_matches_hami_observe(containers: dict[str, ContainerActivity]) -> None:
    decisions = decide_feedback(containers)
    expected = hami_observe(containers)
    assert {
        key: (d.recent_kernel, d.utilization_switch) for key, d in decisions.items()
    } == expected


@settings(max_examples=200, deadline=None)
@given(containers_strategy, st.randoms(use_true_random=False))
def test_independent_of_input_order(
    containers: dict[str, ContainerActivity], rng: random.Random
) -> None:
    items = list(containers.items())
    rng.shuffle(items)
    assert decide_feedback(dict(items)) == decide_feedback(containers)
    assert decide_feedback(containers) == decide_feedback(containers)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(GPUS), max_size=3).map(tuple),
    st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    st.integers(min_value=-1, max_value=2),
)
def test_a_lone_container_is_never_blocked(
    gpus: tuple[str, ...], priority: int, recent_kernel: int, switch: int
) -> None:
    decision = decide_feedback({"only": activity(gpus, priority, recent_kernel, switch)})["only"]
    assert not decision.blocked
    assert decision.utilization_switch == 0
    assert decision.recent_kernel == max(recent_kernel - 1, 0)


@settings(max_examples=300, deadline=None)
@given(containers_strategy)
def test_the_highest_priority_active_task_is_never_blocked(
    containers: dict[str, ContainerActivity],
) -> None:
    decisions = decide_feedback(containers)
    active = {
        key: c
        for key, c in containers.items()
        if c.recent_kernel > 1 and c.priority >= 0  # still > 0 after the decrement
    }
    for key, c in active.items():
        sharing = [o.priority for o in active.values() if set(o.gpus) & set(c.gpus)]
        if c.priority <= min(sharing, default=c.priority):
            assert not decisions[key].blocked, key
        else:
            assert decisions[key].blocked, key


@settings(max_examples=200, deadline=None)
@given(containers_strategy)
def test_values_written_are_hamis_values(containers: dict[str, ContainerActivity]) -> None:
    for key, decision in decide_feedback(containers).items():
        before = containers[key].recent_kernel
        assert decision.utilization_switch in (0, 1)
        assert decision.recent_kernel in {max(before - 1, 0), BLOCKED, before, 0}
