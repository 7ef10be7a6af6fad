"""Failover over the wire: only the leader is ready, and a follower takes over in bounded time.

Two `hami scheduler --leader-elect` subprocesses run against the API server double. A client
calls /filter for one GPU pod in a loop through `ServiceRouter`, which does what a Service does
with readiness: it probes GET /readyz of both replicas every `PROBE_SECONDS` and sends each
call to a replica that answered 200. The gap is the time from the last filter the old leader
answered to the first one the new leader answered. The election's timings are shortened here
(`FAST`) so that a test takes seconds; the bounds are stated in them:

* old leader SIGKILLed (no release): no sooner than lease duration - renew deadline (the old
  leader may answer until its renew deadline, the follower may take the lease only a lease
  duration after it saw the last renewal: anything sooner would be two leaders at once), and
  no later than lease duration + retry period (a candidate reads the lease at least every
  retry period and again at its expiry) + the router's probe period + `MARGIN_SECONDS`;
* old leader SIGTERMed (it releases the lease): no later than retry period + probe period +
  `MARGIN_SECONDS`.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami_plugin.extender.leader import (
    DEFAULT_LEASE_NAME,
    DEFAULT_LEASE_NAMESPACE,
    LABEL_SCHEDULER_ROLE,
    ROLE_FOLLOWER,
    ROLE_LEADER,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import LoggedProcess, wait_until

HAMI = str(Path(sys.executable).with_name("hami"))
PROBE_SECONDS = 0.5
"""How often the router probes /readyz (kubelet's probe period, as the manifests set it: 2 s)."""
MARGIN_SECONDS = 1.5
"""Slack for the measurement itself: the client's pace, a call in flight, 2 shared cores."""
NAMESPACE = "hami-system"
PODS = {"a": "hami-scheduler-a", "b": "hami-scheduler-b"}
"""Each replica's pod ($POD_NAME): its holder identity, and the pod it labels with its role."""


@dataclass(frozen=True, slots=True)
class Timings:
    """The election's three timings, passed as `hami scheduler` flags."""

    lease_seconds: int
    renew_seconds: float
    retry_seconds: float

    def flags(self) -> list[str]:
        return [
            f"--leader-elect-lease-duration={self.lease_seconds}s",
            f"--leader-elect-renew-deadline={int(self.renew_seconds * 1000)}ms",
            f"--leader-elect-retry-period={int(self.retry_seconds * 1000)}ms",
        ]


FAST = Timings(lease_seconds=8, renew_seconds=5.0, retry_seconds=0.5)


def _status(url: str) -> tuple[int, str] | None:
    """GET `url`: the status and body, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (OSError, http.client.HTTPException):
        return None


def _post(url: str, document: object) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(document).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        result = json.loads(response.read())
    assert isinstance(result, dict)
    return result


class ServiceRouter:
    """A Service in front of the replicas, as far as readiness goes: every `period` it probes
    each backend's GET /readyz, and it sends a call to a backend whose last probe answered 200
    (None when there is none, or the call fails: kube-scheduler sees an error)."""

    def __init__(self, backends: Mapping[str, str], period: float = PROBE_SECONDS) -> None:
        self._backends = dict(backends)
        self._period = period
        self._lock = threading.Lock()
        self._ready: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="router-probes")

    def __enter__(self) -> ServiceRouter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def ready(self) -> tuple[str, ...]:
        with self._lock:
            return self._ready

    def _probe(self) -> None:
        while not self._stop.is_set():
            ready = tuple(
                name
                for name, url in self._backends.items()
                if (_status(f"{url}/readyz") or (0, ""))[0] == 200
            )
            with self._lock:
                self._ready = ready
            self._stop.wait(self._period)

    def filter(self, document: object) -> tuple[str, dict[str, Any]] | None:
        ready = self.ready()
        if not ready:
            return None
        try:
            return ready[0], _post(f"{self._backends[ready[0]]}/filter", document)
        except (OSError, http.client.HTTPException):
            return None


class FilterLoop:
    """kube-scheduler calling /filter for one pod through the router every 50 ms; `answers`
    holds (monotonic time, backend) for each call answered with the node and no error."""

    def __init__(self, router: ServiceRouter, document: object) -> None:
        self._router = router
        self._document = document
        self._lock = threading.Lock()
        self._answers: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="filter-loop")

    def __enter__(self) -> FilterLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def answers(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self._answers)

    def count(self, backend: str) -> int:
        return sum(1 for _, name in self.answers() if name == backend)

    def _run(self) -> None:
        while not self._stop.is_set():
            routed = self._router.filter(self._document)
            if routed is not None:
                backend, result = routed
                if result["Error"] == "" and result["NodeNames"] == ["n1"]:
                    with self._lock:
                        self._answers.append((time.monotonic(), backend))
            self._stop.wait(0.05)


@dataclass(frozen=True, slots=True)
class Failover:
    """What one failover showed."""

    gap_seconds: float
    answers: list[tuple[float, str]]
    lease: dict[str, Any]


def _scheduler(name: str, kubeconfig: Path, log_dir: Path, timings: Timings) -> LoggedProcess:
    return LoggedProcess(
        name,
        [
            HAMI, "scheduler", "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
            "--metrics-bind-address", "0", "--leader-elect", *timings.flags(),
        ],
        log_dir,
        env={"POD_NAME": PODS[name], "POD_NAMESPACE": NAMESPACE},
    )  # fmt: skip


def _role(apiserver: FakeApiServer, replica: str) -> str | None:
    pod = apiserver.get_pod(NAMESPACE, PODS[replica])
    assert pod is not None
    role = pod["metadata"].get("labels", {}).get(LABEL_SCHEDULER_ROLE)
    return role if isinstance(role, str) else None


def _url(process: LoggedProcess) -> str:
    return process.wait_for_log(r"serving on (http://\S+)", timeout=30).group(1)


def fail_over(
    apiserver: FakeApiServer,
    kubeconfig: Path,
    log_dir: Path,
    end_leader: Callable[[LoggedProcess], None],
    timings: Timings = FAST,
) -> Failover:
    """Start leader `a`, then follower `b`, filter through the router until `a` answers
    steadily, `end_leader(a)`, and wait until `b` answers and the role labels say so."""
    for pod in PODS.values():
        apiserver.add_object(make_pod(pod, NAMESPACE, labels={"app": "hami-scheduler"}))
    apiserver.add_object(gpu_node("n1", 2))
    document = {"Pod": apiserver.add_object(gpu_pod("p")), "NodeNames": ["n1"]}
    a = _scheduler("a", kubeconfig, log_dir, timings)
    b: LoggedProcess | None = None
    try:
        url_a = _url(a)
        wait_until(lambda: (_status(f"{url_a}/readyz") or (0, ""))[0] == 200, "a leads", 30)
        b = _scheduler("b", kubeconfig, log_dir, timings)
        url_b = _url(b)
        wait_until(
            lambda: _status(f"{url_b}/readyz/informer-sync") == (200, "ok\n"), "b synced", 30
        )
        # only the leader is ready; the follower is synced all the same
        assert _status(f"{url_b}/readyz") == (503, "not the leader\n")
        assert _status(f"{url_a}/readyz/informer-sync") == (200, "ok\n")
        wait_until(
            lambda: (_role(apiserver, "a"), _role(apiserver, "b")) == (ROLE_LEADER, ROLE_FOLLOWER),
            "the role labels",
        )
        with (
            ServiceRouter({"a": url_a, "b": url_b}) as router,
            FilterLoop(router, document) as calls,
        ):
            wait_until(lambda: calls.count("a") >= 5, "a answers steadily", 30)
            end_leader(a)
            wait_until(lambda: calls.count("b") >= 3, "b answers", timings.lease_seconds + 20)
            answers = calls.answers()
        # what the extender's Service selects: b's pod only (a killed leader cannot relabel
        # its own pod; the new leader does)
        wait_until(
            lambda: (_role(apiserver, "a"), _role(apiserver, "b")) == (ROLE_FOLLOWER, ROLE_LEADER),
            "the role labels follow the lease",
        )
        lease = apiserver.get_lease(NAMESPACE, DEFAULT_LEASE_NAME)
        assert b.stop() == 0
    finally:
        a.kill()
        if b is not None:
            b.kill()
    first_b = next(i for i, (_, name) in enumerate(answers) if name == "b")
    # never both: once b answers, a never does again
    assert all(name == "b" for _, name in answers[first_b:]), answers
    last_a = max(at for at, name in answers[:first_b] if name == "a")
    assert lease is not None
    return Failover(answers[first_b][0] - last_a, answers, lease)


def _kill(process: LoggedProcess) -> None:
    process.kill()


def _terminate(process: LoggedProcess) -> None:
    assert process.stop() == 0
    assert "released lease" in process.log()


def test_a_killed_leaders_lease_is_taken_within_lease_duration_plus_retry_period(
    apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path
) -> None:
    failover = fail_over(apiserver, kubeconfig_path, tmp_path, _kill)

    gap = failover.gap_seconds
    # no sooner: the old leader may have answered until its renew deadline
    assert gap >= FAST.lease_seconds - FAST.renew_seconds, failover.answers
    # no later than the lease's expiry plus one retry period (and the router's probe)
    assert gap <= FAST.lease_seconds + FAST.retry_seconds + PROBE_SECONDS + MARGIN_SECONDS
    spec = failover.lease["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (PODS["b"], 1)


def test_a_stopped_leader_releases_and_the_follower_serves_within_a_retry_period(
    apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path
) -> None:
    failover = fail_over(apiserver, kubeconfig_path, tmp_path, _terminate)

    # the release, not the expiry: sooner than a killed leader's gap can ever be
    assert failover.gap_seconds <= FAST.retry_seconds + PROBE_SECONDS + MARGIN_SECONDS
    spec = failover.lease["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (PODS["b"], 1)


def test_a_replica_campaigns_only_once_its_lists_are_in(apiserver: FakeApiServer) -> None:
    # A restarted leader would otherwise take its own lease back at once (its identity is its
    # pod's name) and hold it while it cannot answer, the synced follower locked out.
    apiserver.add_object(gpu_node("n1", 2))
    pod = apiserver.add_object(gpu_pod("p"))
    apiserver.inject_fault("GET", "/api/v1/pods", times=None, status=500)
    with running_scheduler(apiserver, wait_ready=False, leader_elect=True) as scheduler:
        wait_until(
            lambda: len(apiserver.requests_matching("GET", "/api/v1/pods")) >= 3,
            "the pod list tried and failed three times",
        )
        assert scheduler.request("GET", "/readyz")[:2] == (
            503,
            b"waiting for the first pod and node lists\n",
        )
        assert scheduler.request("GET", "/readyz/informer-sync")[0] == 503
        assert apiserver.requests_matching(".*", ".*/leases.*") == []  # no campaign yet

        apiserver.clear_faults()
        wait_until(lambda: scheduler.request("GET", "/readyz")[0] == 200, "it leads")
        assert scheduler.filter(pod, ["n1"])["NodeNames"] == ["n1"]
        lease = apiserver.get_lease(DEFAULT_LEASE_NAMESPACE, DEFAULT_LEASE_NAME)
        assert lease is not None and lease["spec"]["holderIdentity"]


def test_a_sigterm_the_kernel_hands_to_another_thread_still_releases_the_lease(
    apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path
) -> None:
    # kubelet signals the process; the kernel may deliver it to any of its threads, and only
    # the main thread runs Python's handlers: it must not sleep in an untimed wait.
    process = _scheduler("a", kubeconfig_path, tmp_path, FAST)
    try:
        process.wait_for_log("this replica leads now")
        threads = [int(t) for t in os.listdir(f"/proc/{process.pid}/task")]
        other = next(t for t in threads if t != process.pid)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(process.pid, other, signal.SIGTERM) == 0, ctypes.get_errno()
        assert process.wait(30) == 0
    finally:
        process.kill()
    assert "released lease" in process.log()
    lease = apiserver.get_lease(NAMESPACE, DEFAULT_LEASE_NAME)
    assert lease is not None and lease["spec"]["holderIdentity"] == ""
