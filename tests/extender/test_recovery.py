"""Nothing stays stuck: allocation timeouts, stale and orphaned locks, deleted pods, handshakes."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from hami_plugin.clock import ManualClock
from hami_plugin.extender.daemon import Elector
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_LOCK,
)
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until


def lock_of(api: FakeApiServer, node: str) -> str | None:
    stored = api.get_node(node)
    assert stored is not None
    value = stored["metadata"].get("annotations", {}).get(ANNOTATION_NODE_LOCK)
    return value if isinstance(value, str) else None


def phase_of(api: FakeApiServer, name: str) -> str | None:
    pod = api.get_pod("default", name)
    assert pod is not None
    value = pod["metadata"].get("annotations", {}).get(ANNOTATION_BIND_PHASE)
    return value if isinstance(value, str) else None


def used_slots(scheduler: object, node: str) -> int:
    usage = scheduler.state.node_usage(node)  # type: ignore[attr-defined]
    return sum(usage.used) if usage is not None else 0


def test_allocation_timeout_marks_failed_and_frees_everything(apiserver: FakeApiServer) -> None:
    clock = ManualClock(datetime.now(UTC))
    apiserver.add_object(gpu_node("n1", 1, split=1))
    pod = apiserver.add_object(gpu_pod("stuck"))
    with running_scheduler(apiserver, clock=clock, allocation_timeout_seconds=120) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        assert lock_of(apiserver, "n1") is not None
        scheduler.sees_pod("default", "stuck", lambda p: p.node_name == "n1")
        clock.advance(119)
        assert scheduler.state.stale_allocations(clock.now(), 120) == []
        clock.advance(2)
        wait_until(lambda: phase_of(apiserver, "stuck") == "failed", what="bind-phase failed")
        wait_until(lambda: lock_of(apiserver, "n1") is None, what="the lock released")
        wait_until(lambda: used_slots(scheduler, "n1") == 0, what="the GPU freed")

        def messages() -> list[str]:
            events = apiserver.events()
            return [e["message"] for e in events if e["reason"] == "AllocationTimeout"]

        # events go out through a queue, the count right after the patch: wait for both
        wait_until(lambda: messages(), what="the AllocationTimeout event")
        assert len(messages()) == 1 and "did not happen within 2m0s" in messages()[0]
        wait_until(lambda: scheduler.observer.named("pod_recovered"), what="the count")
        assert scheduler.observer.named("pod_recovered") == ["allocation_timeout"]
        # the freed GPU is schedulable again
        other = apiserver.add_object(gpu_pod("next"))
        assert scheduler.filter(other, ["n1"])["NodeNames"] == ["n1"]


def test_no_allocation_timeout_within_the_grace_after_a_pod_watch_failure(
    apiserver: FakeApiServer,
) -> None:
    """After an API server outage the device plugins write what they served meanwhile from
    their queues: an allocation that timed out during the outage is failed only once the pod
    watch has been healthy for the grace (30 s), not as soon as the API answers."""
    clock = ManualClock(datetime.now(UTC))
    apiserver.add_object(gpu_node("n1", 1, split=1))
    pod = apiserver.add_object(gpu_pod("served-in-outage"))
    with running_scheduler(apiserver, clock=clock, allocation_timeout_seconds=120) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        scheduler.sees_pod("default", "served-in-outage", lambda p: p.node_name == "n1")
        # the outage: the pod watch and its relists fail until the fault is cleared
        apiserver.inject_fault("GET", "/api/v1/pods", times=None, status=503)
        informer = scheduler.daemon.pod_informer
        assert informer is not None
        wait_until(lambda: informer.last_failure is not None, what="the pod watch to fail")
        first_failure = informer.last_failure
        clock.advance(121)  # the outage outlasts the allocation timeout
        wait_until(
            lambda: (informer.last_failure or 0) > (first_failure or 0),
            what="the pod watch to fail again, at the end of the outage",
        )
        apiserver.clear_faults()
        time.sleep(1.0)  # several recovery passes (every 0.2 s): none may fail the pod
        assert phase_of(apiserver, "served-in-outage") == "allocating"
        assert used_slots(scheduler, "n1") == 1
        # the grace counts from the last failure; past it the timeout applies again
        clock.advance(30)
        wait_until(
            lambda: phase_of(apiserver, "served-in-outage") == "failed", what="bind-phase failed"
        )
        wait_until(lambda: used_slots(scheduler, "n1") == 0, what="the GPU freed")


def test_deleting_a_pod_releases_its_lock_at_once(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 1))
    pod = apiserver.add_object(gpu_pod("gone"))
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        scheduler.sees_pod("default", "gone", lambda p: p.node_name == "n1")
        wait_until(lambda: scheduler.state.node("n1").annotations.get(ANNOTATION_NODE_LOCK))
        apiserver.delete_pod("default", "gone")
        wait_until(lambda: lock_of(apiserver, "n1") is None, what="the lock released")
        assert used_slots(scheduler, "n1") == 0
        assert scheduler.state.bookings() == {}


def test_stale_and_orphaned_locks_are_released(apiserver: FakeApiServer) -> None:
    now = datetime.now(UTC)
    old = f"{now - timedelta(minutes=10):%Y-%m-%dT%H:%M:%SZ},default,old-owner"
    orphan = f"{now:%Y-%m-%dT%H:%M:%SZ},default,never-existed"
    live = f"{now:%Y-%m-%dT%H:%M:%SZ},default,alive"
    apiserver.add_object(gpu_pod("old-owner"))
    apiserver.add_object(gpu_pod("alive"))
    apiserver.add_object(gpu_node("expired", annotations={ANNOTATION_NODE_LOCK: old}))
    apiserver.add_object(gpu_node("orphaned", annotations={ANNOTATION_NODE_LOCK: orphan}))
    apiserver.add_object(gpu_node("held", annotations={ANNOTATION_NODE_LOCK: live}))
    with running_scheduler(apiserver) as scheduler:
        wait_until(lambda: lock_of(apiserver, "expired") is None, what="the expired lock")
        wait_until(lambda: lock_of(apiserver, "orphaned") is None, what="the orphaned lock")
        # counted right after the release patch returns, which the test may see first
        wait_until(
            lambda: (
                sorted(scheduler.observer.named("pod_recovered")) == ["lock_expired", "owner_gone"]
            ),
            what="both recoveries counted",
        )
        assert lock_of(apiserver, "held") == live


class _Never:
    def is_leader(self) -> bool:
        return False

    def run(self, stop: threading.Event) -> None:
        stop.wait()


def test_handshakes_are_written_by_the_leader_only(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1"))
    orphan = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ},default,never-existed"
    apiserver.add_object(gpu_node("n2", annotations={ANNOTATION_NODE_LOCK: orphan}))

    def follower(client: object, started: object, stopped: object) -> Elector:
        return _Never()

    with running_scheduler(apiserver, elector_factory=follower, leader_elect=True) as scheduler:
        assert scheduler.state.registered_nodes() == ["n1", "n2"]
        scheduler.daemon.state.request_recovery()
        time.sleep(1.5)  # several recovery passes: a follower must write nothing in any
        assert apiserver.requests_matching("PATCH", "/api/v1/nodes/.*") == []
    with running_scheduler(apiserver):

        def handshake() -> str:
            node = apiserver.get_node("n1")
            assert node is not None
            return str(node["metadata"]["annotations"].get(ANNOTATION_NODE_HANDSHAKE, ""))

        wait_until(lambda: handshake().startswith("Requesting_"), what="the handshake")
        wait_until(lambda: lock_of(apiserver, "n2") is None, what="the orphaned lock")
