"""Preemption end to end, each daemon in its own process: the API server double (graceful pod
deletion, Priority admission), two GPU nodes each with `hami device-plugin --nvml fake`, a test
kubelet and its pod admission (`tests/extender/test_e2e_cluster.py`), `hami scheduler` on its
default flags, and the kube-scheduler stand-in with kube-scheduler's own PostFilter preemption
and the shipped extender entry's verbs (`preemptVerb: preempt`).

Every GPU (A100 40 GB, split 4) is filled by two low-priority pods of 15,000 MiB; victims keep
terminating (grace period 20 s) until the test says their containers stopped. A monitor
samples the API server throughout: at no moment does a GPU hold more than its capacity among
the containers admitted and not gone (terminating victims included)."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_DEVICES_ALLOCATED
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn
from tests.extender.cluster import FAST_RETRY
from tests.extender.helpers import gpu_pod
from tests.extender.test_e2e_cluster import (
    CAPACITY,
    GPU_MEMORY_MIB,
    NAMESPACE,
    NODES,
    Cluster,
    Scheduler,
    running_cluster,
)
from tests.extender.test_ledger_invariant import held
from tests.processes import wait_until

pytestmark = pytest.mark.leaves_threads("(process_request_thread)")

LOW = 15000
HIGH_PRIORITY = 100000
MID_PRIORITY = 1000


class CapacityMonitor:
    """Samples the pods every few milliseconds: admitted (bind-phase success) and not gone."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._stop = threading.Event()
        self.worst: dict[str, tuple[int, int, int]] = {}
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="capacity-monitor", daemon=True)

    def __enter__(self) -> CapacityMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            running = {
                key: pod
                for key, pod in self._cluster.live_pods().items()
                if (pod["metadata"].get("annotations") or {}).get(ANNOTATION_BIND_PHASE)
                == "success"
            }
            for uuid, numbers in held(running).items():
                worst = self.worst.get(uuid, (0, 0, 0))
                self.worst[uuid] = tuple(max(a, b) for a, b in zip(worst, numbers, strict=True))  # type: ignore[assignment]
            self.samples += 1

    def check(self) -> None:
        assert self.samples > 0
        for uuid, numbers in self.worst.items():
            assert all(n <= c for n, c in zip(numbers, CAPACITY, strict=True)), (uuid, numbers)


def add(cluster: Cluster, name: str, memory: int, priority: int, **spec: Any) -> None:
    pod = gpu_pod(name, uid=f"uid-{name}", memory=memory)
    pod["spec"].update(
        schedulerName="hami-scheduler", priority=priority, terminationGracePeriodSeconds=20
    )
    pod["spec"].update(spec)
    cluster.api.add_object(pod)


def bound(cluster: Cluster, name: str) -> str:
    pod = cluster.api.get_pod(NAMESPACE, name)
    return str((pod or {}).get("spec", {}).get("nodeName", ""))


def terminating(cluster: Cluster) -> set[str]:
    return {
        pod["metadata"]["name"]
        for pod in cluster.api.objects("pods")
        if pod["metadata"].get("deletionTimestamp")
    }


def admitted(cluster: Cluster, name: str) -> bool:
    pod = cluster.api.get_pod(NAMESPACE, name) or {}
    return (pod.get("metadata", {}).get("annotations") or {}).get(
        ANNOTATION_BIND_PHASE
    ) == "success"


Stack = tuple[Cluster, KubeSchedulerStandIn, Scheduler]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_cluster(tmp_path) as cluster:
        scheduler = Scheduler("scheduler", cluster.kubeconfig, cluster.log_dir)
        kube = KubeClient(cluster.api.api_client(), FAST_RETRY)
        standin = KubeSchedulerStandIn(kube, scheduler.url, flush_interval_seconds=1.0)
        try:
            wait_until(scheduler.ready, "the scheduler is ready", 30)
            wait_until(lambda: scheduler.registered() == set(NODES), "both nodes registered")
            standin.start()
            wait_until(lambda: standin.synced, "the stand-in has its lists")
            # fill every GPU: two pods of 15,000 MiB on each (10,960 MiB left per GPU)
            for index in range(8):
                add(cluster, f"low-{index}", LOW, 0)
            names = [f"low-{index}" for index in range(8)]
            wait_until(lambda: all(admitted(cluster, n) for n in names), "the low pods run", 60)
            yield cluster, standin, scheduler
        finally:
            standin.stop()
            kube.close()
            code = scheduler.stop()
            assert code == 0, scheduler.log()[-3000:]


def victims_of(standin: KubeSchedulerStandIn, cluster: Cluster, count: int) -> set[str]:
    wait_until(lambda: len(terminating(cluster)) >= count, f"{count} victim(s) terminating", 30)
    return terminating(cluster)


def metric(scheduler: Scheduler, name: str, **labels: str) -> float:
    """One sample of the scheduler's /metrics (0 when absent)."""
    with urllib.request.urlopen(scheduler.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def preempted_events(cluster: Cluster, victim: str, preemptor: str) -> list[str]:
    """The messages of the victim's `Preempted` Events, checked to name `preemptor`'s UID."""
    stored = cluster.api.get_pod(NAMESPACE, preemptor)
    assert stored is not None
    uid = stored["metadata"]["uid"]
    messages = [
        str(event["message"])
        for event in cluster.api.events_about(NAMESPACE, victim)
        if event["reason"] == "Preempted"
    ]
    assert all(message.startswith(f"Preempted by pod {uid} on node ") for message in messages)
    return messages


def finish(cluster: Cluster, names: set[str]) -> None:
    for name in names:
        assert cluster.api.finish_termination(NAMESPACE, name)


def test_one_victim_held_for_the_preemptor_not_for_a_late_low_pod(stack: Stack) -> None:
    cluster, standin, scheduler = stack
    with CapacityMonitor(cluster) as monitor:
        add(cluster, "high", 20000, HIGH_PRIORITY)
        victims = victims_of(standin, cluster, 1)
        assert len(victims) == 1
        (victim,) = victims
        victim_node = bound(cluster, victim)
        # a low pod created while the victim terminates must not take what it frees
        add(cluster, "late", 12000, 0)
        wait_until(lambda: f"{NAMESPACE}/late" in standin.parked(), "the late pod parked", 30)
        assert bound(cluster, "high") == "" and bound(cluster, "late") == ""
        victim_gpu = cluster.annotations(victim)[ANNOTATION_DEVICES_ALLOCATED].split(",")[0]
        # the victim's containers stop while kube-scheduler is between two attempts: whichever
        # pod it pops first (a real one may pop the low pod first, the preemptor being in
        # backoff), the low pod does not get the memory: the scheduler holds it
        standin.hold()
        finish(cluster, victims)
        # the other low pod (15,000) and the hold (20,000) on the victim's GPU
        wait_until(
            lambda: scheduler.bookings().get(victim_gpu, (0, 0, 0))[1] == LOW + 20000,
            "the victim's memory is free, the hold stands",
        )
        late = cluster.api.get_pod(NAMESPACE, "late")
        assert late is not None
        assert not scheduler.filter(late)["NodeNames"]
        standin.release()
        wait_until(lambda: admitted(cluster, "high"), "the preemptor runs", 60)
        assert bound(cluster, "high") == victim_node
        assert bound(cluster, "late") == ""
        assert terminating(cluster) == set()
        assert len(preempted_events(cluster, victim, "high")) == 1
        # the metrics say so too: one preemption, one victim, one preemptor running
        assert metric(scheduler, "hami_scheduler_preemption_attempts_total", outcome="preempted")
        assert metric(scheduler, "hami_scheduler_preemption_victims_count") == 1
        assert metric(scheduler, "hami_scheduler_preemption_victims_sum") == 1
        wait_until(
            lambda: metric(scheduler, "hami_scheduler_preemptor_seconds_to_running_count") == 1,
            "the preemptor's time to Running observed",
        )
    monitor.check()


def test_whole_gpu_pod_takes_two_pods_of_one_gpu_never_its_peers(
    stack: Stack,
) -> None:
    cluster, standin, _ = stack
    with CapacityMonitor(cluster) as monitor:
        # a pod of its own priority on the cluster is never taken
        add(cluster, "peer", 5000, HIGH_PRIORITY)
        wait_until(lambda: admitted(cluster, "peer"), "the peer runs", 60)
        add(cluster, "whole", GPU_MEMORY_MIB, HIGH_PRIORITY)
        victims = victims_of(standin, cluster, 2)
        assert len(victims) == 2 and "peer" not in victims
        gpus = {
            (cluster.annotations(name).get("hami.io/vgpu-devices-allocated") or "").split(",")[0]
            for name in victims
        }
        assert len(gpus) == 1  # both from one GPU
        finish(cluster, victims)
        wait_until(lambda: admitted(cluster, "whole"), "the whole-GPU pod runs", 60)
        for name in victims:
            assert len(preempted_events(cluster, name, "whole")) == 1
    monitor.check()


def test_never_policy_and_mid_priority(stack: Stack) -> None:
    cluster, standin, scheduler = stack
    add(cluster, "polite", 20000, HIGH_PRIORITY, preemptionPolicy="Never")
    wait_until(lambda: f"{NAMESPACE}/polite" in standin.parked(), "the polite pod parked", 30)
    # the scheduler considered it and took nothing (its decision is made under the filter)
    wait_until(
        lambda: metric(scheduler, "hami_scheduler_preemption_attempts_total", outcome="never"),
        "the Never outcome counted",
    )
    polite = cluster.api.get_pod(NAMESPACE, "polite") or {}
    assert not polite.get("status", {}).get("nominatedNodeName")
    assert not [
        e for e in cluster.api.events_about(NAMESPACE, "polite") if e["reason"] == "Preempting"
    ]
    assert metric(scheduler, "hami_scheduler_preemption_attempts_total", outcome="preempted") == 0
    assert terminating(cluster) == set()
    cluster.api.delete_pod(NAMESPACE, "polite")
    # a mid-priority pod: the low ones are taken, never another mid one
    add(cluster, "mid-a", 20000, MID_PRIORITY)
    (first,) = victims_of(standin, cluster, 1)
    assert first.startswith("low-")
    finish(cluster, {first})
    wait_until(lambda: admitted(cluster, "mid-a"), "mid-a runs", 60)
    add(cluster, "high", 20000, HIGH_PRIORITY)
    wait_until(lambda: len(terminating(cluster)) >= 1, "a victim of high terminating", 30)
    assert all(name.startswith("low-") for name in terminating(cluster))
