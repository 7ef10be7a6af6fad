"""The decision: node choice by policy (docs/design.md 10.2-10.4), annotations, failures,
properties."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.codec import parse_pod_gpu_options
from hami_plugin.protocol.model import NodePolicy
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.filter import FilterResult, assume, decide
from hami_plugin.scheduler.fit import FitContext, FitFailure, render_failure
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.pod_fit import fit_pod
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.testing.apiserver import make_container
from hami_plugin.testing.apiserver import make_pod as make_pod_object

from .helpers import gpu

NOW = datetime(2025, 3, 4, 10, 20, 0, tzinfo=UTC)
BINPACK = SchedulerSettings(node_policy=NodePolicy.BINPACK)
SPREAD = SchedulerSettings(node_policy=NodePolicy.SPREAD)


def make_pod(
    *containers: dict[str, Any] | None, annotations: dict[str, str] | None = None, name: str = "p"
) -> PodInfo:
    """A pod as the decision takes it: read from its API object, whose containers ask
    `containers` (limits; None: no resources)."""
    entries = [make_container(f"c{i}", limits=limits) for i, limits in enumerate(containers)]
    return read_pod(make_pod_object(name, "ns", annotations=annotations, containers=entries))


def gpus(count: int, memory: int = 8000, cores: int = 10) -> dict[str, Any]:
    return {
        "nvidia.com/gpu": str(count),
        "nvidia.com/gpumem": str(memory),
        "nvidia.com/gpucores": str(cores),
    }


def cluster(fill: dict[str, int], gpus_per_node: int = 2) -> Ledger:
    """Nodes whose GPUs each carry `fill[node]` MiB and slots/cores in proportion."""
    ledger = Ledger()
    for name, memory in fill.items():
        ledger.set_node(name, [gpu(f"{name}-{i}", i) for i in range(gpus_per_node)])
        if memory:
            tallies = tuple(
                DeviceTally(f"{name}-{i}", memory // 8192 + 1, memory, memory * 100 // 32768)
                for i in range(gpus_per_node)
            )
            ledger.track(f"ns/fill-{name}", name, tallies)
    return ledger


def failures(result: FilterResult) -> dict[str, str]:
    return {name: render_failure(failure) for name, failure in result.failed_nodes.items()}


# --- docs/design.md 10.3: binpack takes the fullest node, spread the emptiest --------------


def test_binpack_and_spread_choose_opposite_nodes() -> None:
    ledger = cluster({"empty": 0, "half": 16384, "busy": 24576})
    pod = make_pod(gpus(1))
    assert decide(ledger, pod, None, NOW, BINPACK).node == "busy"
    assert decide(ledger, pod, None, NOW, SPREAD).node == "empty"


def test_the_pod_annotation_overrides_the_node_policy() -> None:
    ledger = cluster({"empty": 0, "busy": 24576})
    spread_pod = make_pod(gpus(1), annotations={"hami.io/node-scheduler-policy": "spread"})
    result = decide(ledger, spread_pod, None, NOW, BINPACK)
    assert result.node == "empty"
    assert result.node_policy is NodePolicy.SPREAD


def test_nodes_that_cannot_host_are_passed_over() -> None:
    """Design note 4: filtering before scoring. The fullest node lacks memory."""
    ledger = cluster({"empty": 0, "half": 16384, "busy": 30000})
    result = decide(ledger, make_pod(gpus(1, memory=8000)), None, NOW, BINPACK, exhaustive=True)
    assert result.node == "half"
    assert failures(result) == {"busy": "2/2 CardInsufficientMemory"}
    assert set(result.scores) == {"empty", "half"}
    assert result.scores["half"] > result.scores["empty"]
    # two GPUs asked of a two-GPU node, one GPU short on memory
    ledger.track("ns/x", "half", (DeviceTally("half-1", 1, 16000, 1),))
    result = decide(ledger, make_pod(gpus(2, memory=8000)), None, NOW, BINPACK, exhaustive=True)
    assert result.node == "empty"
    assert failures(result)["half"] == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory"
    )


def test_equal_scores_break_ties_by_node_name() -> None:
    ledger = cluster({"node-b": 8192, "node-c": 8192, "node-a": 8192})
    assert decide(ledger, make_pod(gpus(1)), None, NOW, BINPACK).node == "node-a"
    assert decide(ledger, make_pod(gpus(1)), None, NOW, SPREAD).node == "node-a"
    assert decide(ledger, make_pod(gpus(1)), ["node-c", "node-b"], NOW, SPREAD).node == "node-b"


# --- what comes back ---------------------------------------------------------------------


def test_annotations_to_write() -> None:
    ledger = Ledger()
    ledger.set_node("n1", [gpu("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448")])
    result = decide(ledger, make_pod(gpus(1, memory=3000, cores=30)), ["n1"], NOW, BINPACK)
    value = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,30:;"
    assert result.node == "n1"
    assert result.annotations == {
        "hami.io/vgpu-node": "n1",
        "hami.io/vgpu-time": "1741083600",
        "hami.io/vgpu-devices-to-allocate": value,
        "hami.io/vgpu-devices-allocated": value,
    }
    assert result.scores == {"n1": 0.0}
    assert result.error is None


def test_pods_without_gpu_pass_everywhere() -> None:
    ledger = cluster({"n1": 0})
    result = decide(ledger, make_pod(None), ["n1", "unknown"], NOW, BINPACK)
    assert result.node is None
    assert not result.requests.wants_gpu
    assert result.annotations == {} and result.failed_nodes == {}
    # a dropped request (bad quantity) is reported and the pod passes like HAMi's
    bad = make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16Gi"})
    result = decide(ledger, bad, None, NOW, BINPACK)
    assert not result.requests.wants_gpu
    assert "nvidia.com/gpumem=16Gi" in str(result.requests.problems[0])


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"hami.io/device-scoring-weights": "slot=1"}, "expected slot, core, and memory weights"),
        ({"hami.io/gpu-scheduler-policy": "packbin"}, "unknown GPU scheduler policy"),
        ({"hami.io/node-scheduler-policy": "fill"}, "unknown node scheduler policy"),
    ],
)
def test_invalid_annotations_are_an_error_for_the_pod(
    annotations: dict[str, str], message: str
) -> None:
    result = decide(
        cluster({"n1": 0}), make_pod(gpus(1), annotations=annotations), None, NOW, BINPACK
    )
    assert result.node is None
    # the reason stays data: the annotation's key and what is wrong with its value
    assert result.error is not None and result.error.key in annotations
    assert message in result.error.detail


def test_unregistered_and_unfit_nodes() -> None:
    ledger = cluster({"n1": 30000})
    result = decide(ledger, make_pod(gpus(1)), ["n1", "cpu-0", "n1"], NOW, BINPACK)
    assert result.node is None
    assert failures(result) == {
        "n1": "2/2 CardInsufficientMemory",
        "cpu-0": "node unregistered",
    }
    too_many = decide(ledger, make_pod(gpus(3)), None, NOW, BINPACK)
    assert failures(too_many) == {"n1": "NodeInsufficientDevice"}


def test_early_stop_and_exhaustive_agree() -> None:
    ledger = cluster({"a": 0, "b": 30000, "c": 16384, "d": 31000, "e": 8192})
    pod = make_pod(gpus(1, memory=4000))
    fast = decide(ledger, pod, None, NOW, BINPACK)
    full = decide(ledger, pod, None, NOW, BINPACK, exhaustive=True)
    assert fast.node == full.node == "c"
    # the hot path reports the nodes tried before the winner, with the same reasons
    assert failures(fast) == {"d": "2/2 CardInsufficientMemory", "b": "2/2 CardInsufficientMemory"}
    assert failures(full) == failures(fast)
    assert fast.scores == {"c": full.scores["c"]}
    assert set(full.scores) == {"a", "c", "e"} == set(full.placements)
    assert fast.fitted == 3 and full.fitted == 5


def test_assume_books_the_decision() -> None:
    ledger = cluster({"a": 0, "b": 0})
    pod = make_pod(gpus(1, memory=20000), name="first")
    result = decide(ledger, pod, None, NOW, BINPACK)
    assert result.node == "a"
    assume(ledger, "ns/first", result)
    snapshot = ledger.node("a")
    assert snapshot is not None and sum(snapshot.used_memory_mib) == 20000
    # binpack now prefers the node that just got fuller; a second big pod goes elsewhere
    second = decide(ledger, make_pod(gpus(2, memory=20000), name="second"), None, NOW, BINPACK)
    assert second.node == "b"
    assume(ledger, "ns/x", decide(ledger, make_pod(None), None, NOW, BINPACK))  # no-op
    assert ledger.pod_count == 1


def test_init_containers_in_the_annotation_order() -> None:
    ledger = Ledger()
    ledger.set_node("n", [gpu("G")])
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [
                {"name": "i0"},
                {"name": "i1", "resources": {"limits": gpus(1, 500)}},
            ],
            "containers": [{"name": "c0", "resources": {"limits": gpus(1, 700)}}, {"name": "c1"}],
        },
    }
    result = decide(ledger, read_pod(pod), None, NOW, BINPACK)
    assert result.annotations["hami.io/vgpu-devices-allocated"] == (
        ";G,NVIDIA,500,10:;G,NVIDIA,700,10:;;"
    )
    assume(ledger, "default/p", result)
    snapshot = ledger.node("n")
    assert snapshot is not None
    assert (snapshot.used, snapshot.used_memory_mib) == ((1,), (700,))  # init peak 500 < 700


# --- properties ------------------------------------------------------------------------------

NAMES = ["n0", "n1", "n2", "n3", "n4", "n5"]


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    ledger = Ledger()
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1)):
        size = draw(st.integers(1, 4))
        ledger.set_node(
            name,
            [
                gpu(f"{name}-{i}", i, numa=i // 2, count=draw(st.sampled_from([2, 10])))
                for i in range(size)
            ],
        )
        for i in range(size):
            slots = draw(st.integers(0, 2))
            if slots:
                memory = draw(st.sampled_from([1000, 8000, 30000]))
                cores = draw(st.sampled_from([0, 20, 60]))
                ledger.track(
                    f"ns/{name}-{i}", name, (DeviceTally(f"{name}-{i}", slots, memory, cores),)
                )
    return ledger


pod_specs = st.builds(
    lambda count, memory, cores, policy, numa, second: make_pod(
        {
            "nvidia.com/gpu": str(count),
            "nvidia.com/gpumem": str(memory),
            "nvidia.com/gpucores": str(cores),
        },
        second,
        annotations={"hami.io/gpu-scheduler-policy": policy, "nvidia.com/numa-bind": numa},
    ),
    st.integers(1, 3),
    st.sampled_from([1000, 4000, 16000]),
    st.sampled_from([0, 10, 50, 100]),
    st.sampled_from(["binpack", "spread", "mutex", "numa,binpack"]),
    st.sampled_from(["true", "false"]),
    st.none() | st.just({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}),
)
candidate_lists = st.none() | st.lists(st.sampled_from([*NAMES, "gone"]), max_size=8)


def _fitting(ledger: Ledger, info: PodInfo, names: list[str] | None) -> dict[str, float]:
    """Every fitting candidate and its score, by plain HAMi fitting of each node."""
    requests = pod_requests(info, BINPACK)
    options = parse_pod_gpu_options(info.annotations)
    context = FitContext.for_pod(options, BINPACK.gpu_policy)
    result = {}
    for name in ledger.node_names() if names is None else set(names):
        usage = ledger.node(name)
        if usage is not None and not isinstance(
            fit_pod(usage, requests, context, screen=False), FitFailure
        ):
            result[name] = usage.score
    return result


@given(ledgers(), pod_specs, candidate_lists, st.sampled_from([BINPACK, SPREAD]))
def test_the_chosen_node_is_the_best_fitting_one(
    ledger: Ledger, pod: PodInfo, names: list[str] | None, settings: SchedulerSettings
) -> None:
    result = decide(ledger, pod, names, NOW, settings)
    fitting = _fitting(ledger, pod, names)
    if not fitting:
        assert result.node is None
        # every candidate is accounted for
        expected = set(ledger.node_names() if names is None else names)
        assert set(result.failed_nodes) == expected
        return
    assert result.node in fitting
    best = max(fitting.values()) if settings is BINPACK else min(fitting.values())
    assert fitting[result.node] == best  # binpack: no fitting node scores higher (spread: lower)
    assert result.node == min(name for name, score in fitting.items() if score == best)


@given(ledgers(), pod_specs, candidate_lists, st.sampled_from([BINPACK, SPREAD]))
def test_decisions_are_deterministic(
    ledger: Ledger, pod: PodInfo, names: list[str] | None, settings: SchedulerSettings
) -> None:
    first = decide(ledger, pod, names, NOW, settings)
    again = decide(ledger, pod, names, NOW, settings)
    reordered = decide(ledger, pod, None if names is None else names[::-1], NOW, settings)
    full = decide(ledger, pod, names, NOW, settings, exhaustive=True)
    assert first == again
    assert (reordered.node, reordered.annotations) == (first.node, first.annotations)
    assert (full.node, full.annotations) == (first.node, first.annotations)
    for name, failure in first.failed_nodes.items():
        assert full.failed_nodes[name] == failure


# --- the fit cache ---------------------------------------------------------------------------


def test_fit_cache_refits_only_changed_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from hami_plugin.scheduler import filter as filter_module

    calls: list[str] = []
    real_fit_pod = fit_pod

    def counting(usage: Any, *args: Any) -> Any:
        calls.append(usage.name)
        return real_fit_pod(usage, *args)

    monkeypatch.setattr(filter_module, "fit_pod", counting)
    ledger = cluster({"a": 30000, "b": 30000, "c": 30000})
    cache = filter_module.FitCache()
    huge = make_pod(gpus(1, memory=8000), name="one")
    first = decide(ledger, huge, None, NOW, BINPACK, cache=cache)
    assert first.node is None and sorted(calls) == ["a", "b", "c"]
    calls.clear()
    second = decide(
        ledger, make_pod(gpus(1, memory=8000), name="two"), None, NOW, BINPACK, cache=cache
    )
    assert calls == [] and second.failed_nodes == first.failed_nodes  # same shape: all cached
    ledger.untrack("ns/fill-b")  # b changes: only b is fitted again, and now fits
    third = decide(ledger, huge, None, NOW, BINPACK, cache=cache)
    assert calls == ["b"] and third.node == "b"
    calls.clear()
    decide(ledger, make_pod(gpus(1, memory=9000)), None, NOW, BINPACK, cache=cache)
    assert sorted(calls) == ["a", "b", "c"]  # another request: nothing cached applies
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0


@given(
    ledgers(),
    st.lists(
        st.tuples(
            pod_specs,
            st.booleans(),
            st.sampled_from([BINPACK, SPREAD]),
            candidate_lists,
            st.none() | st.sampled_from(NAMES),
        ),
        max_size=6,
    ),
)
def test_the_fit_cache_never_changes_a_decision(
    ledger: Ledger,
    stream: list[tuple[PodInfo, bool, SchedulerSettings, list[str] | None, str | None]],
) -> None:
    from hami_plugin.scheduler.filter import FitCache

    cache = FitCache()
    for number, (pod, book, settings, names, leaving) in enumerate(stream):
        if leaving is not None:
            # a node unregisters: the cached resolution of the candidate names must not stay
            ledger.remove_node(leaving)
        cached = decide(ledger, pod, names, NOW, settings, cache=cache)
        assert cached == decide(ledger, pod, names, NOW, settings)
        if book:
            assume(ledger, f"ns/stream-{number}", cached)
