"""A burst of GPU pods, `hami scheduler` SIGKILLed after a few binds and started again 3 s
later: with the requeue loop every pod is placed within 60 s of the restart; without it the
pods kube-scheduler parked stay parked until its flush.

Each daemon runs in its own process, as in production: the API server double (in this
process), two GPU nodes each with `hami device-plugin --nvml fake`, a test kubelet and its pod
admission (`tests/extender/test_e2e_cluster.py` builds them: `gpu-1` keeps several pods in
flight, `gpu-2` uses HAMi's node lock), `hami scheduler`, and the kube-scheduler stand-in
(`hami_plugin.testing.kubescheduler`: kube-scheduler 1.24's queue, `docs/kube-scheduler.md`),
which calls the scheduler over HTTP. The stand-in is held between two attempts for the kill,
so no bind is cut in half: what is measured is the queue, not a half-done bind's clean-up.

Every scenario ends with every pod bound and admitted, the scheduler booking exactly what the
live pods hold, and no node lock left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_NODE_LOCK
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn
from tests.extender.cluster import FAST_RETRY
from tests.extender.helpers import gpu_pod
from tests.extender.test_e2e_cluster import (
    NAMESPACE,
    NODES,
    Cluster,
    Scheduler,
    running_cluster,
)
from tests.processes import wait_until

logger = logging.getLogger(__name__)

PODS = 12
BOUND_BEFORE_KILL = 4
RESTART_AFTER_SECONDS = 3.0
PLACED_WITHIN_SECONDS = 60.0
SHORT_FLUSH_SECONDS = 15.0
"""The stand-in's `--pod-max-in-unschedulable-pods-duration` when the loop is off (5 min, its
default, when it is on; shortened here so that the scenario ends)."""


@dataclass
class Run:
    cluster: Cluster
    standin: KubeSchedulerStandIn
    parked: set[str]
    ready_after_seconds: float
    """From the restart until the new scheduler answers /readyz 200."""
    placed_after_seconds: float
    """From the restart until every pod is bound."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


def _start_scheduler(cluster: Cluster, name: str, *extra: str) -> Scheduler:
    process = Scheduler(name, cluster.kubeconfig, cluster.log_dir, *extra)
    wait_until(process.ready, f"{name} is ready", 30)
    return process


def _bound(cluster: Cluster) -> set[str]:
    return {key for key, pod in cluster.live_pods().items() if pod["spec"].get("nodeName")}


@contextmanager
def _restart_mid_burst(cluster: Cluster, flush_after_seconds: float, *extra: str) -> Iterator[Run]:
    """Create the burst, kill the scheduler after `BOUND_BEFORE_KILL` binds, restart it
    `RESTART_AFTER_SECONDS` later; yields once every pod is bound, then checks what every
    scenario ends with."""
    first = _start_scheduler(cluster, "scheduler-1", *extra)
    wait_until(lambda: first.registered() == set(NODES), "both nodes are registered")
    kube = KubeClient(cluster.api.api_client(), FAST_RETRY)
    standin = KubeSchedulerStandIn(
        kube, first.url, flush_after_seconds=flush_after_seconds, flush_interval_seconds=1.0
    )
    second: Scheduler | None = None
    try:
        standin.start()
        wait_until(lambda: standin.synced, "the stand-in has its lists")
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for index in range(PODS):
            name = f"burst-{index:02d}"
            pod = gpu_pod(name, uid=f"uid-{name}", created=created, memory=1000)
            pod["spec"]["schedulerName"] = "hami-scheduler"  # as the webhook sets it
            cluster.api.add_object(pod)
        wait_until(lambda: len(_bound(cluster)) >= BOUND_BEFORE_KILL, "the first binds", 60)
        standin.hold()
        first.kill()
        killed_at = time.monotonic()
        standin.release()
        unbound = {f"{NAMESPACE}/burst-{i:02d}" for i in range(PODS)} - _bound(cluster)
        wait_until(lambda: standin.parked() == unbound, "kube-scheduler parks the rest", 30)
        time.sleep(max(0.0, killed_at + RESTART_AFTER_SECONDS - time.monotonic()))
        restarted_at = time.monotonic()
        second = Scheduler("scheduler-2", cluster.kubeconfig, cluster.log_dir, *extra)
        # kube-scheduler reaches it as soon as it listens (before its lists are in, it answers
        # an error: more parked pods)
        standin.extender_url = second.url
        wait_until(second.ready, "scheduler-2 is ready", 30)
        ready_after = time.monotonic() - restarted_at
        yield_now: list[float] = []

        def all_bound() -> bool:
            if len(_bound(cluster)) == PODS:
                yield_now.append(time.monotonic() - restarted_at)
                return True
            return False

        wait_until(all_bound, "every pod is bound", PLACED_WITHIN_SECONDS + SHORT_FLUSH_SECONDS)
        for move in standin.moved():
            logger.debug("+%.2f s %s moved by %s", move.at - restarted_at, move.pod, move.event)
        for attempt in standin.tried():
            if attempt.at >= restarted_at:
                logger.debug(
                    "+%.2f s %s %s %s %s",
                    attempt.at - restarted_at, attempt.pod, attempt.outcome, attempt.node,
                    attempt.message,
                )  # fmt: skip
        yield Run(cluster, standin, unbound, ready_after, yield_now[0])
        wait_until(
            lambda: all(
                cluster.annotations(key.split("/", 1)[1]).get(ANNOTATION_BIND_PHASE) == "success"
                for key in _bound(cluster)
            ),
            "every pod is admitted with its devices",
            30,
        )
        cluster.check_consistent(second)
        for node in NODES:
            assert ANNOTATION_NODE_LOCK not in cluster.node_annotations(node), node
    finally:
        standin.stop()
        kube.close()
        if second is not None:
            assert second.stop() == 0, second.log()[-3000:]


def test_with_the_requeue_loop_every_pod_is_placed_within_a_minute_of_the_restart(
    cluster: Cluster,
) -> None:
    with _restart_mid_burst(cluster, 300.0) as run:
        logger.info(
            "%d parked pods; the scheduler ready %.1f s and all %d pods placed %.1f s after "
            "the restart",
            len(run.parked),
            run.ready_after_seconds,
            PODS,
            run.placed_after_seconds,
        )
        assert run.placed_after_seconds < PLACED_WITHIN_SECONDS
        moved = {move.pod: move.event for move in run.standin.moved()}
        assert set(moved) == run.parked
        assert set(moved.values()) == {"PodUpdate"}, moved


def test_without_it_the_parked_pods_wait_for_kube_schedulers_flush(cluster: Cluster) -> None:
    with _restart_mid_burst(cluster, SHORT_FLUSH_SECONDS, "--requeue-qps", "0") as run:
        moved = {move.pod: move.event for move in run.standin.moved()}
        assert set(moved) == run.parked
        assert set(moved.values()) == {"UnschedulableTimeout"}, moved
