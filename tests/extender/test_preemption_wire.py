"""Preemption over the wire: `hami scheduler` against the API server double (graceful pod
deletion, Events, status patches), `/filter` and `/preempt` called over HTTP as kube-scheduler
calls them.

The issue's node: 2 x A100 80 GB, four low-priority pods of 30,000 MiB (60,000 booked per GPU),
victims with a 20 s grace period that end only when the test says their containers stopped."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hami_plugin.protocol.booking import booking_annotations
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ContainerDevice
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import Scheduler, running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

A100 = 81920
HIGH = 100000
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)
NODE = "gpu-0"


def low_pod(name: str, gpu: int, started: int, priority: int = 0) -> dict[str, Any]:
    """A running pod of `priority` holding 30,000 MiB of GPU `gpu` on the node."""
    devices = ((ContainerDevice(f"GPU-{NODE}-{gpu}", "NVIDIA", 30000, 0),),)
    annotations = booking_annotations(NODE, devices, (), T0)
    annotations[ANNOTATION_BIND_PHASE] = "success"
    pod = gpu_pod(name, memory=30000, annotations=annotations)
    pod["spec"].update(nodeName=NODE, priority=priority, terminationGracePeriodSeconds=20)
    start = (T0 + timedelta(seconds=started)).isoformat().replace("+00:00", "Z")
    pod["status"] = {"phase": "Running", "startTime": start}
    return pod


def pending(name: str, memory: int, priority: int, policy: str = "") -> dict[str, Any]:
    pod = gpu_pod(name, memory=memory)
    pod["spec"]["priority"] = priority
    pod["spec"]["schedulerName"] = "hami-scheduler"
    if policy:
        pod["spec"]["preemptionPolicy"] = policy
    return pod


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as api:
        api.add_object(gpu_node(NODE, 2, split=10, memory=A100))
        for i in range(4):
            api.add_object(low_pod(f"low-{i}", i // 2, started=i))
        yield api


@pytest.fixture
def scheduler(api: FakeApiServer) -> Iterator[Scheduler]:
    with running_scheduler(api) as scheduler:
        for i in range(4):
            scheduler.sees_pod("default", f"low-{i}", lambda pod: pod.node_name == NODE)
        yield scheduler


def deleting(api: FakeApiServer) -> list[str]:
    return sorted(
        pod["metadata"]["name"]
        for pod in api.objects("pods")
        if pod["metadata"].get("deletionTimestamp")
    )


def stored(api: FakeApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    api.add_object(copy.deepcopy(pod))
    found = api.get_pod("default", pod["metadata"]["name"])
    assert found is not None
    return found


def test_fragmented_node_one_victim_then_the_preemptor_binds(
    api: FakeApiServer, scheduler: Scheduler
) -> None:
    high = stored(api, pending("high", 40000, HIGH))
    scheduler.sees_pod("default", "high", lambda pod: pod.priority == HIGH)

    result = scheduler.filter(high, [NODE])
    assert not result["NodeNames"]
    assert "CardInsufficientMemory" in result["FailedNodes"][NODE]

    # exactly one victim, evicted as kube-scheduler evicts: DisruptionTarget, a graceful
    # DELETE (20 s: it keeps terminating), a Preempted event; the preemptor is nominated
    wait_until(lambda: deleting(api) == ["low-3"], what="low-3 terminating")
    victim = api.get_pod("default", "low-3")
    assert victim is not None and victim["metadata"]["deletionGracePeriodSeconds"] == 20
    conditions = {c["type"]: c for c in victim["status"].get("conditions", [])}
    assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    wait_until(
        lambda: any(e["reason"] == "Preempted" for e in api.events_about("default", "low-3")),
        what="the victim's Preempted event",
    )
    (event,) = [e for e in api.events_about("default", "low-3") if e["reason"] == "Preempted"]
    assert event["message"] == f"Preempted by pod {high['metadata']['uid']} on node {NODE}"
    wait_until(
        lambda: (
            (api.get_pod("default", "high") or {}).get("status", {}).get("nominatedNodeName")
            == NODE
        ),
        what="the preemptor nominated",
    )
    wait_until(
        lambda: any(e["reason"] == "Preempting" for e in api.events_about("default", "high")),
        what="the preemptor's Preempting event",
    )
    (told,) = [e for e in api.events_about("default", "high") if e["reason"] == "Preempting"]
    assert "default/low-3" in told["message"] and f"GPU-{NODE}-1 30000 MiB" in told["message"]

    # while the victim terminates: no second eviction, and a low pod created meanwhile does
    # not get the memory it frees
    scheduler.sees_pod("default", "low-3", lambda pod: pod.deleting)
    scheduler.sees_pod("default", "high", lambda pod: pod.nominated_node_name == NODE)
    assert not scheduler.filter(high, [NODE])["NodeNames"]
    late = stored(api, pending("late", 25000, 0))
    scheduler.sees_pod("default", "late", lambda pod: True)
    assert not scheduler.filter(late, [NODE])["NodeNames"]

    # the victim's containers stopped: kubelet deletes it; the memory is still held
    assert api.finish_termination("default", "low-3")
    wait_until(lambda: scheduler.state.pod("default", "low-3") is None, what="victim gone")
    assert not scheduler.filter(late, [NODE])["NodeNames"]
    # and the preemptor gets it, on the GPU its victim freed
    assert scheduler.schedule(high, [NODE]) == NODE
    assert deleting(api) == []
    names = [pod["metadata"]["name"] for pod in api.objects("pods")]
    assert [name for name in names if name.startswith("low")] == ["low-0", "low-1", "low-2"]
    assert scheduler.observer.named("preemption_victims") == [1]
    assert "preempted" in scheduler.observer.named("preemption_attempted")
    assert "waiting" in scheduler.observer.named("preemption_attempted")


def test_whole_gpu_takes_the_two_pods_of_one_gpu(api: FakeApiServer, scheduler: Scheduler) -> None:
    whole = stored(api, pending("whole", A100, HIGH))
    scheduler.sees_pod("default", "whole", lambda pod: True)
    assert not scheduler.filter(whole, [NODE])["NodeNames"]
    wait_until(lambda: deleting(api) == ["low-2", "low-3"], what="GPU 1's pods terminating")


def test_never_policy_takes_nothing(api: FakeApiServer, scheduler: Scheduler) -> None:
    polite = stored(api, pending("polite", 40000, HIGH, policy="Never"))
    scheduler.sees_pod("default", "polite", lambda pod: True)
    assert not scheduler.filter(polite, [NODE])["NodeNames"]
    wait_until(lambda: "never" in scheduler.observer.named("preemption_attempted"), what="attempt")
    assert deleting(api) == []


def meta(uids: list[str]) -> dict[str, Any]:
    return {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}


def uid(api: FakeApiServer, name: str) -> str:
    pod = api.get_pod("default", name)
    assert pod is not None
    return str(pod["metadata"]["uid"])


def test_preempt_verb_adds_the_victims_the_gpus_need(
    api: FakeApiServer, scheduler: Scheduler
) -> None:
    # kube-scheduler's dry run (CPU, say) chose low-0; the whole-GPU pod also needs GPU 1's pods
    whole = stored(api, pending("whole", A100, HIGH))
    low = [uid(api, f"low-{i}") for i in range(4)]
    status, answer = scheduler.post(
        "/preempt", {"Pod": whole, "NodeNameToMetaVictims": {NODE: meta([low[0]])}}
    )
    assert status == 200, answer
    uids = {pod["UID"] for pod in answer["NodeNameToMetaVictims"][NODE]["Pods"]}
    assert uids == {low[0], low[2], low[3]}

    # a 40,000 MiB pod needs nothing more than low-0 (GPU 0 then has 51,920 MiB free)
    small = pending("small", 40000, HIGH)
    status, answer = scheduler.post(
        "/preempt", {"Pod": small, "NodeNameToMetaVictims": {NODE: meta([low[0]])}}
    )
    assert answer == {
        "NodeNameToMetaVictims": {NODE: {"Pods": [{"UID": low[0]}], "NumPDBViolations": 0}}
    }

    # a pod of equal priority gets no GPU back: the node is left out
    peer = pending("peer", A100, 0)
    status, answer = scheduler.post(
        "/preempt", {"Pod": peer, "NodeNameToMetaVictims": {NODE: meta([low[0]])}}
    )
    assert answer == {"NodeNameToMetaVictims": {}}
    assert deleting(api) == []  # the verb only answers; kube-scheduler evicts


def test_preempt_verb_for_a_pod_without_gpu_keeps_the_candidates(scheduler: Scheduler) -> None:
    cpu = pending("cpu", 0, HIGH)
    cpu["spec"]["containers"][0]["resources"] = {}
    candidates = {NODE: meta(["uid-default-low-1"])}
    status, answer = scheduler.post("/preempt", {"Pod": cpu, "NodeNameToMetaVictims": candidates})
    assert status == 200
    assert answer == {"NodeNameToMetaVictims": candidates}


def test_preempt_verb_malformed_body_is_a_400(scheduler: Scheduler) -> None:
    status, answer = scheduler.post("/preempt", b'{"NodeNameToMetaVictims": {}}')
    assert status == 400 and "extender args missing pod" in answer
    status, answer = scheduler.post("/preempt", b'{"Pod": {}, "NodeNameToMetaVictims": 3}')
    assert status == 400 and "cannot unmarshal number" in answer


@pytest.mark.parametrize("victim_gone", [False, True], ids=["terminating", "gone"])
def test_a_restart_mid_preemption_keeps_the_hold_and_evicts_nothing_twice(
    api: FakeApiServer, victim_gone: bool
) -> None:
    """The scheduler preempts, then is replaced (a restart, or the standby taking over) while
    the victim terminates, or once it is gone: the new one rebuilds the hold from the
    preemptor's `nominatedNodeName` (and the victim still terminating), a late low pod does not
    get the memory, the preemptor does, and the victim was DELETEd once."""
    high = stored(api, pending("high", 40000, HIGH))
    with running_scheduler(api) as first:
        for i in range(4):
            first.sees_pod("default", f"low-{i}", lambda pod: pod.node_name == NODE)
        first.sees_pod("default", "high", lambda pod: pod.priority == HIGH)
        assert not first.filter(high, [NODE])["NodeNames"]
        wait_until(lambda: deleting(api) == ["low-3"], what="low-3 terminating")
        wait_until(
            lambda: (
                (api.get_pod("default", "high") or {}).get("status", {}).get("nominatedNodeName")
                == NODE
            ),
            what="the preemptor nominated",
        )
    if victim_gone:
        assert api.finish_termination("default", "low-3")
    late = stored(api, pending("late", 25000, 0))
    with running_scheduler(api) as second:
        second.sees_pod("default", "late", lambda pod: True)
        second.sees_pod("default", "high", lambda pod: pod.nominated_node_name == NODE)
        if not victim_gone:
            second.sees_pod("default", "low-3", lambda pod: pod.deleting)
            # the preemptor retries while its victim terminates: no second eviction
            assert not second.filter(high, [NODE])["NodeNames"]
            assert "waiting" in second.observer.named("preemption_attempted")
        assert not second.filter(late, [NODE])["NodeNames"]
        if not victim_gone:
            assert api.finish_termination("default", "low-3")
            wait_until(lambda: second.state.pod("default", "low-3") is None, what="victim gone")
            assert not second.filter(late, [NODE])["NodeNames"]
        assert second.schedule(high, [NODE]) == NODE
        assert second.observer.named("preemption_victims") == []
    deletes = api.requests_matching("DELETE", r".*/pods/low-3$")
    assert len(deletes) == 1
    assert deleting(api) == []
