"""Leader election over HTTP: `LeaderElector` -> `KubeClient` -> the API server double's Leases.

The step-by-step tests drive `tick()` on a fake clock (the API calls are real); the last ones
run the election loop in threads with short timings, with bounded waits and no timing
assertions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hami_plugin.extender.leader import (
    LABEL_SCHEDULER_ROLE,
    ROLE_FOLLOWER,
    ROLE_LEADER,
    ElectionConfig,
    LeaderElector,
)
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Retryable
from hami_plugin.kube.records import LeaseRecord
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.helpers import SplitClock
from tests.processes import wait_until

NAMESPACE = "hami-system"
NAME = "hami-scheduler-extender"
LEASE_PATH = rf"/apis/coordination\.k8s\.io/v1/namespaces/{NAMESPACE}/leases(/{NAME})?"
QUICK = RetryPolicy(
    attempts=2, initial_backoff_seconds=0.01, max_backoff_seconds=0.02, timeout_seconds=5.0
)
_EPOCH = datetime(2026, 11, 30, 12, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Replica:
    elector: LeaderElector
    client: KubeClient
    transitions: list[str] = field(default_factory=list)


@pytest.fixture
def replicas(apiserver: FakeApiServer) -> Iterator[Callable[..., Replica]]:
    clients: list[KubeClient] = []

    def make(identity: str, clock: Callable[[], float] | None = None, **config: Any) -> Replica:
        client = KubeClient(apiserver.api_client(), QUICK)
        clients.append(client)
        transitions: list[str] = []
        settings = ElectionConfig(NAMESPACE, NAME, identity, **config)
        extra: dict[str, Any] = {}
        if clock is not None:
            ticks = clock
            extra = {"clock": SplitClock(ticks, lambda: _EPOCH + timedelta(seconds=ticks()))}
        elector = LeaderElector(
            client,
            settings,
            on_started_leading=lambda: transitions.append("started"),
            on_stopped_leading=lambda: transitions.append("stopped"),
            **extra,
        )
        return Replica(elector, client, transitions)

    yield make
    for client in clients:
        client.close()


def _lease(apiserver: FakeApiServer) -> dict[str, Any]:
    lease = apiserver.get_lease(NAMESPACE, NAME)
    assert lease is not None
    return lease


def test_one_of_two_leads_and_the_lease_is_written_as_client_go_writes_it(
    apiserver: FakeApiServer, replicas: Callable[..., Replica]
) -> None:
    clock = FakeClock()
    a = replicas("a", clock)
    b = replicas("b", clock)

    a.elector.tick()
    b.elector.tick()

    assert a.elector.is_leader() and not b.elector.is_leader()
    spec = _lease(apiserver)["spec"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] == "2026-11-30T12:08:20.000000Z"  # MicroTime

    clock.advance(2.0)
    a.elector.tick()
    renewed = _lease(apiserver)["spec"]
    assert renewed["renewTime"] == "2026-11-30T12:08:22.000000Z"
    assert renewed["acquireTime"] == spec["acquireTime"]


def test_the_follower_takes_over_when_the_leader_stops_renewing(
    apiserver: FakeApiServer, replicas: Callable[..., Replica]
) -> None:
    clock = FakeClock()
    a = replicas("a", clock)
    b = replicas("b", clock)
    a.elector.tick()
    b.elector.tick()
    start = clock.now

    while not b.elector.is_leader():  # a is gone: it never ticks again
        clock.advance(1.0)
        b.elector.tick()
        assert clock.now - start <= 15.0, "no takeover within the lease duration"

    spec = _lease(apiserver)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert not a.elector.is_leader()


def test_a_race_for_a_released_lease_is_settled_by_the_resource_version(
    apiserver: FakeApiServer, replicas: Callable[..., Replica]
) -> None:
    clock = FakeClock()
    a = replicas("a", clock)
    b = replicas("b", clock)
    c = replicas("c", clock)
    a.elector.tick()
    assert a.elector.release()
    original = c.client.update_lease

    def update(record: LeaseRecord) -> LeaseRecord:
        b.elector.tick()  # b read the free lease too, and its write lands first
        return original(record)

    c.client.update_lease = update  # type: ignore[method-assign]
    c.elector.tick()  # c's write carries the resourceVersion it read: 409

    assert b.elector.is_leader() and not c.elector.is_leader()
    spec = _lease(apiserver)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    attempts = [
        r.json()["metadata"]["resourceVersion"]
        for r in apiserver.requests_matching("PUT", LEASE_PATH)
        if r.json()["spec"]["holderIdentity"] in ("b", "c")
    ]
    assert len(attempts) == 2 and attempts[0] == attempts[1]  # both from the same read


def test_api_500s_make_the_leader_step_down_before_the_lease_can_change_hands(
    apiserver: FakeApiServer, replicas: Callable[..., Replica]
) -> None:
    clock = FakeClock()
    a = replicas("a", clock)
    b = replicas("b", clock)
    a.elector.tick()
    b.elector.tick()
    fault = apiserver.inject_fault("GET|PUT|POST", LEASE_PATH, times=None, status=500)

    stepped_down = None
    for _ in range(40):  # 20 s of 500s: nobody can hold the lease meanwhile
        clock.advance(0.5)
        a.elector.tick()
        b.elector.tick()
        if stepped_down is None and not a.elector.is_leader():
            stepped_down = clock.now
        assert not b.elector.is_leader()
    assert stepped_down is not None
    assert a.transitions == ["started", "stopped"]
    assert fault.fired > 0

    apiserver.clear_faults()
    for _ in range(10):
        clock.advance(1.0)
        a.elector.tick()
        b.elector.tick()
    leaders = [r for r in (a, b) if r.elector.is_leader()]
    assert len(leaders) == 1
    assert _lease(apiserver)["spec"]["holderIdentity"] == leaders[0].elector.identity


# --- the loop, in threads -------------------------------------------------------------------


@contextlib.contextmanager
def _running(elector: LeaderElector) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), name=f"elect-{elector.identity}")
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


FAST: dict[str, Any] = {
    "lease_duration_seconds": 2,
    "renew_deadline_seconds": 1.0,
    "retry_period_seconds": 0.2,
}


def test_a_clean_stop_releases_the_lease(
    apiserver: FakeApiServer, replicas: Callable[..., Replica]
) -> None:
    a = replicas("a", **FAST)
    with _running(a.elector):
        wait_until(a.elector.is_leader, "a leads", timeout=15.0)
    spec = _lease(apiserver)["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("", 1)
    assert a.transitions == ["started", "stopped"]


class _Severable:
    """A KubeClient whose replica can be cut off the network (every call fails), as a crashed
    or partitioned replica: it neither renews nor relabels anything."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.severed = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name == "deadline" or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.severed:
                raise Retryable(f"{name}: connection refused (severed)")
            return attribute(*args, **kwargs)

        return call


def test_labels_follow_the_role_and_a_lost_leaders_pod_is_relabelled(
    apiserver: FakeApiServer,
) -> None:
    for pod in ("scheduler-a", "scheduler-b"):
        apiserver.add_pod(pod, NAMESPACE)

    def role(pod: str) -> object:
        stored = apiserver.get_pod(NAMESPACE, pod)
        assert stored is not None
        return (stored["metadata"].get("labels") or {}).get(LABEL_SCHEDULER_ROLE)

    clients = [KubeClient(apiserver.api_client(), QUICK) for _ in range(2)]
    a_api = _Severable(clients[0])
    electors = [
        LeaderElector(
            api,
            ElectionConfig(NAMESPACE, NAME, pod, pod_namespace=NAMESPACE, pod_name=pod, **FAST),
        )
        for api, pod in ((a_api, "scheduler-a"), (clients[1], "scheduler-b"))
    ]
    a, b = electors
    try:
        with _running(a):
            wait_until(a.is_leader, "a leads", timeout=15.0)
            with _running(b):
                wait_until(
                    lambda: role("scheduler-a") == ROLE_LEADER,
                    "a's pod is labelled leader",
                    timeout=15.0,
                )
                wait_until(
                    lambda: role("scheduler-b") == ROLE_FOLLOWER, "b's pod: follower", timeout=15.0
                )
                a_api.severed = True  # a can no longer renew, nor fix its own label
                wait_until(
                    b.is_leader, "b takes over once a's lease expired on b's clock", timeout=15.0
                )
                assert not a.is_leader()
                wait_until(
                    lambda: role("scheduler-b") == ROLE_LEADER,
                    "b's pod is labelled leader",
                    timeout=15.0,
                )
                wait_until(
                    lambda: role("scheduler-a") == ROLE_FOLLOWER,
                    "a's stale label is fixed",
                    timeout=15.0,
                )
        assert _lease(apiserver)["spec"]["leaseTransitions"] == 1
    finally:
        for client in clients:
            client.close()
