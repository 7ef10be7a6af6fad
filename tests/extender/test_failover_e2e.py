"""A burst of GPU pods and a leader change in the middle of it: two `hami scheduler
--leader-elect` replicas behind a Service, the leader SIGKILLed after a few binds; every pod is
placed within lease duration + 60 s of the kill.

The stack is `tests/extender/test_requeue_e2e.py`'s (the API server double, two GPU nodes with
`hami device-plugin --nvml fake`, a test kubelet and its pod admission, the kube-scheduler
stand-in), with two replicas in place of one. The stand-in calls `ServiceProxy`, which forwards
each call to a replica whose last /readyz probe answered 200 (`ServiceRouter` of
`tests/extender/test_failover.py`: only the leader is ready), and answers 503 when none is, as
a Service with no ready endpoint leaves kube-scheduler with an error. The election's timings
are `test_failover.py`'s `FAST` (8 s lease). The stand-in is held between two attempts for the
kill, so no bind is cut in half (`test_outage_e2e.py` cuts them).

The scenario ends with every pod bound, admitted with its own booking and bind-phase success,
the new leader booking exactly what the live pods hold, no GPU over-committed and no node lock.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_NODE_LOCK
from hami_plugin.testing.apiserver import make_pod
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn
from tests.extender.cluster import FAST_RETRY
from tests.extender.helpers import gpu_pod
from tests.extender.test_e2e_cluster import NAMESPACE, NODES, Cluster, Scheduler, running_cluster
from tests.extender.test_failover import FAST, PODS, ServiceRouter
from tests.extender.test_failover import NAMESPACE as SCHEDULER_NAMESPACE
from tests.processes import wait_until

logger = logging.getLogger(__name__)

BURST = 12
BOUND_BEFORE_KILL = 4
PLACED_WITHIN_SECONDS = 60.0
"""After the extender is back (issue 15): here after the lease a killed leader held expires."""
MEMORY_MIB = 1000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


class ServiceProxy:
    """The extender's Service: an HTTP listener on a loopback port that sends each POST to a
    replica the router sees ready, 503 when there is none and 502 when the replica does not
    answer (kube-scheduler sees an error either way). `start()`/`stop()` run and join its
    threads."""

    def __init__(self, router: ServiceRouter, backends: dict[str, str]) -> None:
        self._router = router
        self._backends = backends
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, body = proxy.forward(self.path, self.rfile.read(length))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                logger.debug("proxy: " + format, *args)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = False  # joined by server_close()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="proxy")

    def forward(self, path: str, body: bytes) -> tuple[int, bytes]:
        ready = self._router.ready()
        if not ready:
            return 503, b'{"message": "no ready endpoints"}'
        parts = urllib.parse.urlsplit(self._backends[ready[0]])
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            return 502, f'{{"message": "{type(error).__name__}"}}'.encode()
        finally:
            connection.close()

    def start(self) -> ServiceProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def burst_keys() -> set[str]:
    return {f"{NAMESPACE}/burst-{index:02d}" for index in range(BURST)}


def create_burst(cluster: Cluster) -> None:
    """`BURST` one-GPU pods of `MEMORY_MIB`, created in the same second, for kube-scheduler's
    queue (schedulerName set as the webhook sets it)."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for index in range(BURST):
        name = f"burst-{index:02d}"
        pod = gpu_pod(name, uid=f"uid-{name}", created=created, memory=MEMORY_MIB)
        pod["spec"]["schedulerName"] = "hami-scheduler"
        cluster.api.add_object(pod)


def bound(cluster: Cluster) -> set[str]:
    return {key for key, pod in cluster.live_pods().items() if pod["spec"].get("nodeName")}


def outcomes(cluster: Cluster) -> dict[str, str]:
    """Each burst pod: "placed" (bound, admitted Running, bind-phase success), "failed:
    <reason>: <message>" (its phase Failed), or "pending"."""
    result = {}
    for key, pod in cluster.live_pods().items():
        if key not in burst_keys():
            continue
        status = pod.get("status") or {}
        phase = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_BIND_PHASE)
        if status.get("phase") == "Failed":
            result[key] = f"failed: {status.get('reason')}: {status.get('message')}"
        elif (
            pod["spec"].get("nodeName")
            and status.get("phase") == "Running"
            and (phase == "success")
        ):
            result[key] = "placed"
        else:
            result[key] = "pending"
    return result


def settled(cluster: Cluster) -> bool:
    """Every burst pod placed or failed with a reason."""
    found = outcomes(cluster)
    return set(found) == burst_keys() and "pending" not in found.values()


def check_end_state(cluster: Cluster, scheduler: Scheduler) -> None:
    """What each scenario ends with: every pod placed (admitted on its node with the devices
    its booking names), the scheduler booking exactly what the live pods hold, no GPU
    over-committed, no node lock."""
    found = outcomes(cluster)
    assert set(found.values()) == {"placed"}, {k: v for k, v in found.items() if v != "placed"}
    for key, pod in cluster.live_pods().items():
        if key in burst_keys():
            cluster.allocated(pod["metadata"]["name"], pod["spec"]["nodeName"], MEMORY_MIB)
    cluster.check_consistent(scheduler)
    for node in NODES:
        assert ANNOTATION_NODE_LOCK not in cluster.node_annotations(node), node


def _replica(cluster: Cluster, replica: str) -> Scheduler:
    return Scheduler(
        f"scheduler-{replica}", cluster.kubeconfig, cluster.log_dir, "--leader-elect",
        *FAST.flags(), env={"POD_NAME": PODS[replica], "POD_NAMESPACE": SCHEDULER_NAMESPACE},
    )  # fmt: skip


def _synced(scheduler: Scheduler) -> bool:
    try:
        with urllib.request.urlopen(scheduler.url + "/readyz/informer-sync", timeout=5) as answer:
            return bool(answer.status == 200)
    except (OSError, http.client.HTTPException):
        return False


@contextmanager
def _replicas(cluster: Cluster) -> Iterator[tuple[Scheduler, Scheduler]]:
    """Leader `a` (ready, both nodes registered), then follower `b` (synced, not ready)."""
    for pod in PODS.values():
        cluster.api.add_object(make_pod(pod, SCHEDULER_NAMESPACE, labels={"app": "hami-scheduler"}))
    a = _replica(cluster, "a")
    b: Scheduler | None = None
    try:
        wait_until(a.ready, "a leads", 30)
        wait_until(lambda: a.registered() == set(NODES), "both nodes are registered")
        b = _replica(cluster, "b")
        wait_until(lambda: _synced(b), "b has its lists", 30)
        assert not b.ready()  # a follower is not behind the Service
        yield a, b
    finally:
        a.kill()
        if b is not None:
            assert b.stop() == 0, b.log()[-3000:]


def test_leader_failover_mid_burst(cluster: Cluster) -> None:
    kube = KubeClient(cluster.api.api_client(), FAST_RETRY)
    with _replicas(cluster) as (a, b):
        backends = {"a": a.url, "b": b.url}
        with ServiceRouter(backends) as router:
            proxy = ServiceProxy(router, backends).start()
            standin = KubeSchedulerStandIn(kube, proxy.url)
            try:
                standin.start()
                wait_until(lambda: standin.synced, "the stand-in has its lists")
                create_burst(cluster)
                wait_until(lambda: len(bound(cluster)) >= BOUND_BEFORE_KILL, "the first binds")
                standin.hold()
                a.kill()
                killed_at = time.monotonic()
                standin.release()
                deadline = FAST.lease_seconds + PLACED_WITHIN_SECONDS
                wait_until(lambda: settled(cluster), "every pod is placed", deadline)
                placed_after = time.monotonic() - killed_at
                check_end_state(cluster, b)
                moved = {move.pod: move.event for move in standin.moved()}
                parked_while_leaderless = {
                    attempt.pod for attempt in standin.tried() if attempt.outcome == "error"
                }
            finally:
                standin.stop()
                proxy.stop()
                kube.close()
    logger.info(
        "%d pods parked while no replica was ready; all %d placed %.1f s after the kill",
        len(parked_while_leaderless), BURST, placed_after,
    )  # fmt: skip
    assert placed_after < deadline
    assert b.log().count("this replica leads now") == 1
    # the pods kube-scheduler parked while no replica answered were moved back by the new
    # leader's requeue patch, not by kube-scheduler's 5-minute flush
    assert moved and set(moved) <= parked_while_leaderless, (moved, parked_while_leaderless)
    assert set(moved.values()) == {"PodUpdate"}, moved
