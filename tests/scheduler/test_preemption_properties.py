"""Properties of preemption (hypothesis): the victims are minimal, never of equal or higher
priority, the preemptor fits once they are gone; the node is kube-scheduler's pick; and at no
moment while victims terminate does a GPU hold more than its capacity among running pods."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.filter import node_fitter
from hami_plugin.scheduler.fit import FitFailure
from hami_plugin.scheduler.pod_fit import PodFit
from hami_plugin.scheduler.preemption import (
    Fit,
    NodeVictims,
    PodDisruptionBudget,
    Victim,
    pick_one_node,
    victims_on_node,
    without,
)
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage, make_node_usage
from tests.scheduler.preemption_cluster import T0, Cluster, gpus, node_info, pod, running

MEMORY = 10000
SETTINGS = SchedulerSettings()


@st.composite
def node_and_pods(draw: st.DrawFn) -> tuple[NodeUsage, list[Victim]]:
    count = draw(st.integers(1, 3))
    devices = gpus("n", count, MEMORY)
    victims = []
    used = [0] * count
    for index in range(draw(st.integers(0, 8))):
        position = draw(st.integers(0, count - 1))
        memory = draw(st.sampled_from([1000, 2500, 4000, 6000]))
        if used[position] + memory > MEMORY:
            continue
        used[position] += memory
        victims.append(
            Victim(
                key=f"default/p{index}",
                uid=f"u{index}",
                namespace="default",
                priority=draw(st.integers(0, 3)),
                start_time=T0 + timedelta(seconds=draw(st.integers(0, 5))),
                labels={"app": draw(st.sampled_from(["a", "b"]))},
                tallies=(DeviceTally(devices[position].uuid, 1, memory, 0),),
            )
        )
    empty = make_node_usage("n", devices, (0,) * count, (0,) * count, (0,) * count)
    return without(empty, [replace(v, tallies=_negated(v.tallies)) for v in victims]), victims


def _negated(tallies: tuple[DeviceTally, ...]) -> tuple[DeviceTally, ...]:
    return tuple(DeviceTally(t.uuid, -t.slots, -t.memory_mib, -t.cores) for t in tallies)


def fit_for(preemptor: PodInfo) -> Fit:
    fitter = node_fitter(preemptor, pod_requests(preemptor, SETTINGS), SETTINGS)
    assert fitter is not None

    def fit(usage: NodeUsage, removed: object) -> PodFit | FitFailure:
        return fitter(usage, None)

    return fit


budgets_strategy = st.lists(
    st.builds(
        PodDisruptionBudget,
        namespace=st.just("default"),
        name=st.sampled_from(["x", "y"]),
        match_labels=st.fixed_dictionaries({"app": st.sampled_from(["a", "b"])}),
        disruptions_allowed=st.integers(0, 1),
    ),
    max_size=2,
)


@settings(max_examples=300, deadline=None)
@given(
    node_and_pods(),
    st.integers(1, 4),
    st.sampled_from([2000, 5000, 8000, 10000]),
    st.integers(1, 2),
    budgets_strategy,
)
def test_victims_are_minimal_lower_priority_and_make_room(
    shape: tuple[NodeUsage, list[Victim]],
    priority: int,
    memory: int,
    count: int,
    budgets: list[PodDisruptionBudget],
) -> None:
    usage, pods = shape
    preemptor = pod("preemptor", memory, priority=priority, count=count)
    fit = fit_for(preemptor)
    outcome = victims_on_node(usage, pods, priority, fit, budgets)
    lower = [p for p in pods if p.priority < priority]
    if outcome is None:
        # nothing to do: it fits as is, or not even with every lower pod gone
        fits_now = not isinstance(fit(usage, ()), FitFailure)
        fits_emptied = not isinstance(fit(without(usage, lower), lower), FitFailure)
        assert fits_now or not fits_emptied
        return
    victims = list(outcome.victims)
    assert victims and all(v.priority < priority for v in victims)
    assert isinstance(fit(usage, ()), FitFailure)  # it needed someone
    assert not isinstance(fit(without(usage, victims), victims), FitFailure)
    for victim in victims:  # minimal: every victim is needed
        others = [v for v in victims if v is not victim]
        assert isinstance(fit(without(usage, others), others), FitFailure), victim.key
    # most important first, as kube-scheduler sorts them
    keys = [(-v.priority, v.start_time) for v in victims]
    assert keys == sorted(keys)
    if budgets:
        return
    # lower first: no victim could be spared by taking a kept pod of lower priority instead
    kept = [p for p in lower if p not in victims]
    for victim in victims:
        for spare in (p for p in kept if p.priority < victim.priority):
            swapped = [*(v for v in victims if v is not victim), spare]
            assert isinstance(fit(without(usage, swapped), swapped), FitFailure), (victim, spare)


def _candidate(node: str, priorities: list[int], starts: list[int], pdb: int) -> NodeVictims:
    victims = tuple(
        sorted(
            (
                Victim(f"ns/{node}-{i}", f"{node}-{i}", "ns", p, T0 + timedelta(seconds=s))
                for i, (p, s) in enumerate(zip(priorities, starts, strict=True))
            ),
            key=lambda v: (-v.priority, v.start_time),
        )
    )
    return NodeVictims(node, victims, pdb, PodFit(()))


@st.composite
def candidates(draw: st.DrawFn) -> list[NodeVictims]:
    result = []
    for index in range(draw(st.integers(1, 5))):
        size = draw(st.integers(1, 3))
        priorities = draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
        starts = draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))
        result.append(_candidate(f"n{index}", priorities, starts, draw(st.integers(0, 1))))
    return result


@settings(max_examples=300, deadline=None)
@given(candidates())
def test_pick_follows_kube_schedulers_order(found: list[NodeVictims]) -> None:
    chosen = pick_one_node(found)
    assert chosen is not None
    # kube-scheduler's pickOneNodeForPreemption: each criterion narrows the field in turn
    field = list(found)
    for criterion in (
        lambda c: c.pdb_violations,
        lambda c: c.victims[0].priority,
        lambda c: sum(v.priority + 2**31 for v in c.victims),
        lambda c: len(c.victims),
        lambda c: (
            -min(
                v.start_time.timestamp()
                for v in c.victims
                if v.priority == c.victims[0].priority and v.start_time is not None
            )
        ),
    ):
        best = min(criterion(c) for c in field)
        field = [c for c in field if criterion(c) == best]
    assert chosen is field[0]


# --- the book over time -------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("low"), st.sampled_from([1000, 10000, 20000, 30000, 45000])),
        st.tuples(st.just("high"), st.sampled_from([20000, 40000, 81920])),
        st.tuples(st.just("victims_end"), st.just(0)),
        st.tuples(st.just("retry"), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_no_gpu_over_capacity_among_running_pods_while_victims_terminate(
    plan: list[tuple[str, int]],
) -> None:
    """Every GPU starts full (two low pods of 40,000 MiB on each of 2 x 2 GPUs) and the first
    step is a preemptor, so each example preempts. Pods are placed where the book says and run
    at once; preemptions terminate their victims, which run on until `victims_end`. After
    every step: no GPU holds more than its capacity among the running pods (terminating ones
    included)."""
    cluster = Cluster(node_info("gpu-0"), node_info("gpu-1"))
    alive: dict[str, PodInfo] = {}
    waiting: dict[str, PodInfo] = {}  # pending preemptors
    for node in ("gpu-0", "gpu-1"):
        for gpu in range(2):
            for half in range(2):
                full = running(
                    pod(f"full-{node}-{gpu}-{half}", 40000), node, (f"GPU-{node}-{gpu}",)
                )
                alive[full.key] = cluster.add(full)
    plan = [("high", 40000), *plan]

    def place(info: PodInfo) -> None:
        result, change = cluster.filter(info)
        if result.node is not None:
            uuids = tuple(device.uuid for device in result.devices[0])
            alive[info.key] = cluster.add(running(info, result.node, uuids))
            waiting.pop(info.key, None)
            return
        if change.preemption is not None:
            for victim in change.preemption.victims:
                alive[victim.key] = cluster.terminate(alive[victim.key])
        if info.priority:
            waiting[info.key] = info

    for index, (kind, memory) in enumerate(plan):
        if kind == "low":
            place(pod(f"low-{index}", memory))
        elif kind == "high":
            place(pod(f"high-{index}", memory, priority=100))
        elif kind == "victims_end":
            for key, info in list(alive.items()):
                if info.deleting:
                    cluster.gone(info)
                    del alive[key]
        else:
            for info in list(waiting.values()):
                place(info)
        _check_capacity(alive)


def _check_capacity(alive: dict[str, PodInfo]) -> None:
    held: dict[str, int] = {}
    for info in alive.values():
        assert info.booking is not None
        for container in info.booking.allocated or ():
            for device in container:
                held[device.uuid] = held.get(device.uuid, 0) + device.used_mem_mib
    assert all(memory <= 81920 for memory in held.values()), held
