"""Bind against the API server double over HTTP with the real client: the steps, the node
lock, in-flight binds on protocol nodes, and the rollback of every failure."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
)
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.scheduler.book.bookings import BookingPhase
from hami_plugin.testing.apiserver import FakeApiServer
from tests.bookings import verify_pod
from tests.extender.cluster import Scheduler, running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import KEYS, write_key_file
from tests.processes import wait_until

POD_PATH = "/api/v1/namespaces/default/pods/{}"
BINDING_PATH = "/api/v1/namespaces/default/pods/{}/binding"
BOOKING_KEYS = (
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_BIND_TIME,
)


def pod_annotations(api: FakeApiServer, name: str) -> dict[str, str]:
    pod = api.get_pod("default", name)
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


def node_lock(api: FakeApiServer, node: str) -> str | None:
    stored = api.get_node(node)
    assert stored is not None
    value = stored["metadata"].get("annotations", {}).get(ANNOTATION_NODE_LOCK)
    return value if isinstance(value, str) else None


def events(api: FakeApiServer, reason: str) -> list[str]:
    return [str(e["message"]) for e in api.events() if e["reason"] == reason]


def used_slots(scheduler: Scheduler, node: str) -> int:
    usage = scheduler.state.node_usage(node)
    return sum(usage.used) if usage is not None else 0


def stored_pod(api: FakeApiServer, name: str, **kwargs: Any) -> dict[str, Any]:
    return api.add_object(gpu_pod(name, **kwargs))


def test_bind_writes_one_patch_then_the_binding_under_hamis_lock(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 2))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.sees_pod("default", "a", lambda p: True)
        assert scheduler.filter(pod, ["n1"])["NodeNames"] == ["n1"]
        apiserver.clear_requests()
        assert scheduler.bind(pod, "n1") == ""
        patches = apiserver.requests_matching("PATCH", POD_PATH.format("a"))
        assert len(patches) == 1
        metadata = patches[0].json()["metadata"]
        assert set(metadata["annotations"]) == {*BOOKING_KEYS, ANNOTATION_BIND_PHASE}
        assert metadata["annotations"][ANNOTATION_BIND_PHASE] == "allocating"
        assert metadata["labels"] == {LABEL_VGPU_NODE: "n1"}
        assert metadata["resourceVersion"]  # the precondition
        order = [
            (r.method, r.path)
            for r in apiserver.requests
            if r.path in (POD_PATH.format("a"), BINDING_PATH.format("a"))
        ]
        assert order == [("PATCH", POD_PATH.format("a")), ("POST", BINDING_PATH.format("a"))]
        stored = apiserver.get_pod("default", "a")
        assert stored is not None and stored["spec"]["nodeName"] == "n1"
        lock = node_lock(apiserver, "n1")
        assert lock is not None and lock.endswith(",default,a")
        wait_until(lambda: events(apiserver, "BindingSucceed"), what="the event")
        assert events(apiserver, "BindingSucceed") == [
            "Successfully binding node [n1] to default/a"
        ]
        assert scheduler.observer.named("bind_done") == [True]


def test_protocol_node_takes_no_lock(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 2, protocol=True))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        assert apiserver.requests_matching("PATCH", "/api/v1/nodes/n1") == []
        assert node_lock(apiserver, "n1") is None
        assert pod_annotations(apiserver, "a")[ANNOTATION_BIND_PHASE] == "allocating"


def test_binding_failure_rolls_everything_back(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 1, split=1))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.filter(pod, ["n1"])
        apiserver.inject_fault("POST", BINDING_PATH.format("a"), times=None, status=500)
        error = scheduler.bind(pod, "n1")
        assert "HTTP 500" in error
        kept = pod_annotations(apiserver, "a")
        assert not set(BOOKING_KEYS) & set(kept)
        assert kept[ANNOTATION_BIND_PHASE] == "failed"
        stored = apiserver.get_pod("default", "a")
        assert stored is not None and LABEL_VGPU_NODE not in stored["metadata"]["labels"]
        assert node_lock(apiserver, "n1") is None
        assert scheduler.state.bookings() == {}
        # the ledger follows the watch: a late event of the bind patch may count the pod until
        # the revert's event arrives, never longer
        wait_until(lambda: used_slots(scheduler, "n1") == 0, what="the GPU free again")
        wait_until(lambda: events(apiserver, "BindingFailed"), what="the event")
        assert "HTTP 500" in events(apiserver, "BindingFailed")[0]
        assert scheduler.observer.named("bind_done") == [False]
        # kube-scheduler tries again: the node is free for it
        apiserver.clear_faults()
        assert scheduler.schedule(pod, ["n1"]) == "n1"


def test_an_unexpected_error_in_a_bind_frees_its_booking(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.add_object(gpu_node("n1", 1, split=1))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.filter(pod, ["n1"])

        def broken(*args: object) -> None:
            raise RuntimeError("a bug in the bind path")

        monkeypatch.setattr(KubeClient, "bind_pod", broken)
        status, _ = scheduler.post(
            "/bind",
            {
                "PodName": "a",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "n1",
            },
        )
        assert status == 500  # logged with its traceback, answered as a server error
        assert scheduler.state.bookings() == {}  # not left claimed for ever
        assert used_slots(scheduler, "n1") == 0
        assert not set(BOOKING_KEYS) & set(pod_annotations(apiserver, "a"))
        monkeypatch.undo()
        assert scheduler.schedule(pod, ["n1"]) == "n1"


def test_patch_failure_releases_the_lock(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 1))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.filter(pod, ["n1"])
        apiserver.inject_fault("PATCH", POD_PATH.format("a"), times=None, status=500)
        assert "HTTP 500" in scheduler.bind(pod, "n1")
        assert node_lock(apiserver, "n1") is None
        assert ANNOTATION_VGPU_NODE not in pod_annotations(apiserver, "a")
        assert scheduler.state.bookings() == {}
        assert apiserver.requests_matching("POST", BINDING_PATH.format("a")) == []


def test_pod_patch_conflict_is_read_again_and_retried(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 1))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.sees_pod("default", "a", lambda p: True)
        scheduler.filter(pod, ["n1"])
        # another client changes the pod after the watch showed it
        apiserver.update_object(
            "pods", "default", "a", lambda p: p["metadata"]["labels"].update({"app": "x"})
        )
        assert scheduler.bind(pod, "n1") == ""
        stored = apiserver.get_pod("default", "a")
        assert stored is not None and stored["metadata"]["labels"]["app"] == "x"
        assert stored["spec"]["nodeName"] == "n1"


def test_a_binding_whose_answer_is_lost_counts_as_done(apiserver: FakeApiServer) -> None:
    """The first Binding attempt hangs past the client's timeout but is applied: the retry
    gets 409 from a pod bound to that very node, which is success."""
    apiserver.add_object(gpu_node("n1", 1))
    pod = stored_pod(apiserver, "a")
    retry = RetryPolicy(attempts=3, initial_backoff_seconds=0.01, timeout_seconds=1.0)
    with running_scheduler(apiserver, retry=retry) as scheduler:
        scheduler.filter(pod, ["n1"])
        apiserver.inject_fault("POST", BINDING_PATH.format("a"), hang_seconds=2.0)
        assert scheduler.bind(pod, "n1") == ""
        assert pod_annotations(apiserver, "a")[ANNOTATION_BIND_PHASE] == "allocating"


def test_unknown_pod_recreated_pod_and_retried_bind(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 2))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        ghost = gpu_pod("ghost")
        assert scheduler.bind(ghost, "n1") == 'pods "ghost" not found'
        stale = {**pod, "metadata": {**pod["metadata"], "uid": "an-older-uid"}}
        assert "recreated" in scheduler.bind(stale, "n1")
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        assert scheduler.bind(pod, "n1") == ""  # kube-scheduler retrying a bind that worked
        assert len(apiserver.requests_matching("POST", BINDING_PATH.format("a"))) == 1


def test_two_pods_race_for_the_last_gpu(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 1, split=1))
    first = stored_pod(apiserver, "first")
    second = stored_pod(apiserver, "second")
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.filter(first, ["n1"])["NodeNames"] == ["n1"]
        refused = scheduler.filter(second, ["n1"])
        assert refused["FailedNodes"] == {"n1": "1/1 CardTimeSlicingExhausted"}
        # a bind without a filter booking (kube-scheduler's cache raced ours) decides again
        errors: dict[str, str] = {}
        threads = [
            threading.Thread(
                target=lambda p=p: errors.update({p["metadata"]["name"]: scheduler.bind(p, "n1")})
            )
            for p in (first, second)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors["first"] == ""
        assert "does not fit on node n1" in errors["second"]
        bound = [
            p["metadata"]["name"]
            for p in apiserver.objects("pods")
            if p["spec"].get("nodeName") == "n1"
        ]
        assert bound == ["first"]
        assert used_slots(scheduler, "n1") == 1


def test_lock_held_by_a_live_pod_is_waited_for(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 2))
    first = stored_pod(apiserver, "first")
    second = stored_pod(apiserver, "second")
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.schedule(first, ["n1"]) == "n1"
        assert node_lock(apiserver, "n1") is not None
        assert scheduler.filter(second, ["n1"])["NodeNames"] == ["n1"]
        result: list[str] = []
        waiter = threading.Thread(target=lambda: result.append(scheduler.bind(second, "n1")))
        waiter.start()
        wait_until(
            # the first bind's read, then the second's (it reads again only on a change)
            lambda: len(apiserver.requests_matching("GET", "/api/v1/nodes/n1")) >= 2,
            what="the second bind to find the lock held",
        )
        assert waiter.is_alive()
        assert apiserver.requests_matching("POST", BINDING_PATH.format("second")) == []
        # the device plugin finishes the first pod's Allocate and releases the lock
        apiserver.update_object(
            "nodes", "", "n1", lambda n: n["metadata"]["annotations"].pop(ANNOTATION_NODE_LOCK)
        )
        waiter.join(30)
        assert result == [""]
        assert scheduler.observer.named("bind_waited")
        lock = node_lock(apiserver, "n1")
        assert lock is not None and lock.endswith(",default,second")
        assert scheduler.observer.named("bind_waited")


def test_lock_contention_ends_with_hamis_message(apiserver: FakeApiServer) -> None:
    lock = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ},default,holder"
    apiserver.add_object(gpu_node("n1", 2, annotations={ANNOTATION_NODE_LOCK: lock}))
    apiserver.add_object(gpu_pod("holder"))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver, node_lock_retry_timeout_seconds=0.5) as scheduler:
        scheduler.sees_pod("default", "holder", lambda p: True)
        scheduler.filter(pod, ["n1"])
        error = scheduler.bind(pod, "n1")
        assert error == "node n1 has been locked within 5m0s: node lock contention"
        assert node_lock(apiserver, "n1") == lock  # never someone else's to release
        assert scheduler.state.bookings() == {}


def test_stale_locks_are_taken_over(apiserver: FakeApiServer) -> None:
    old = datetime.now(UTC) - timedelta(minutes=6)
    apiserver.add_object(
        gpu_node("n1", 2, annotations={ANNOTATION_NODE_LOCK: f"{old:%Y-%m-%dT%H:%M:%SZ},x,y"})
    )
    fresh = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ},default,deleted"
    apiserver.add_object(gpu_node("n2", 2, annotations={ANNOTATION_NODE_LOCK: fresh}))
    a = stored_pod(apiserver, "a")
    b = stored_pod(apiserver, "b")
    with running_scheduler(apiserver, allocation_timeout_seconds=3600) as scheduler:
        assert scheduler.filter(a, ["n1"])["NodeNames"] == ["n1"]
        assert scheduler.bind(a, "n1") == ""  # expired
        assert scheduler.filter(b, ["n2"])["NodeNames"] == ["n2"]
        assert scheduler.bind(b, "n2") == ""  # owner gone
        assert str(node_lock(apiserver, "n1")).endswith(",default,a")
        assert str(node_lock(apiserver, "n2")).endswith(",default,b")


def test_hami_lock_mode_serialises_a_burst(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 4))
    pods = [stored_pod(apiserver, f"p{i}") for i in range(3)]
    with running_scheduler(apiserver) as scheduler:
        for pod in pods:
            scheduler.sees_pod("default", pod["metadata"]["name"], lambda p: True)
            assert scheduler.filter(pod, ["n1"])["NodeNames"] == ["n1"]
        results: dict[str, str] = {}
        threads = [
            threading.Thread(
                target=lambda p=p: results.update({p["metadata"]["name"]: scheduler.bind(p, "n1")})
            )
            for p in pods
        ]
        for thread in threads:
            thread.start()
        bound: list[str] = []
        for _ in pods:
            # exactly one pod holds the lock and is bound; the others wait for it
            wait_until(lambda: len(bound_pods(apiserver)) == len(bound) + 1, what="one more bind")
            newly = sorted(set(bound_pods(apiserver)) - set(bound))
            assert len(newly) == 1
            bound.append(newly[0])
            lock = node_lock(apiserver, "n1")
            assert lock is not None and lock.endswith(f",default,{newly[0]}")
            time.sleep(0.2)  # give a wrongly unserialised bind the chance to show up
            assert len(bound_pods(apiserver)) == len(bound)
            apiserver.update_object(
                "nodes", "", "n1", lambda n: n["metadata"]["annotations"].pop(ANNOTATION_NODE_LOCK)
            )
        for thread in threads:
            thread.join(30)
        assert results == {p["metadata"]["name"]: "" for p in pods}


def bound_pods(api: FakeApiServer) -> list[str]:
    return [p["metadata"]["name"] for p in api.objects("pods") if p["spec"].get("nodeName")]


def test_protocol_burst_keeps_several_pods_in_flight(apiserver: FakeApiServer) -> None:
    """Pods created in successive seconds, bound in that order, cannot be confused by
    kubelet's Allocate: they all go in flight on one node at once, nobody waits."""
    apiserver.add_object(gpu_node("n1", 8, protocol=True))
    pods = [stored_pod(apiserver, f"p{i}", created=f"2026-01-01T00:00:0{i}Z") for i in range(6)]
    with running_scheduler(apiserver, node_lock_retry_timeout_seconds=20) as scheduler:
        for pod in pods:
            assert scheduler.schedule(pod, ["n1"]) == "n1"
        assert scheduler.observer.named("bind_waited") == []
        assert len(scheduler.state.in_flight("n1")) == 6
        assert node_lock(apiserver, "n1") is None
        assert used_slots(scheduler, "n1") == 6
        # a pod kubelet could confuse with the youngest (same second, same count) waits
        twin = stored_pod(apiserver, "twin", created="2026-01-01T00:00:05Z")
        scheduler.filter(twin, ["n1"])
        result: list[str] = []
        waiter = threading.Thread(target=lambda: result.append(scheduler.bind(twin, "n1")))
        waiter.start()
        wait_until(
            lambda: scheduler.state.booking_phase("default", "twin") is BookingPhase.BINDING,
            what="the bind to start",
        )
        time.sleep(0.3)
        assert waiter.is_alive()
        assert apiserver.requests_matching("PATCH", POD_PATH.format("twin")) == []
        # the device plugin allocates p5 (its only entry consumed)
        apiserver.update_object(
            "pods",
            "default",
            "p5",
            lambda p: p["metadata"]["annotations"].update({ANNOTATION_DEVICES_TO_ALLOCATE: ";"}),
        )
        waiter.join(30)
        assert result == [""]
        assert scheduler.observer.named("bind_waited")


# --- the arguments, checked before any API call -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"PodNamespace": "a/b"}, 'invalid PodNamespace "a/b": must be a DNS-1123 label'),
        ({"PodNamespace": "../kube-system"}, 'invalid PodNamespace "../kube-system": must be'),
        (
            {"PodNamespace": "a" * 64},
            f'invalid PodNamespace "{"a" * 64}": must be a DNS-1123 label of no more than 63 '
            "characters",
        ),
        ({"PodNamespace": ""}, 'invalid PodNamespace "": must be a DNS-1123 label'),
        ({"PodName": "a/binding"}, 'invalid PodName "a/binding": must be a DNS-1123 subdomain'),
        ({"PodName": "A"}, 'invalid PodName "A": must be a DNS-1123 subdomain'),
        ({"PodName": "a?watch=1"}, 'invalid PodName "a?watch=1"'),
        ({"Node": "n1/status"}, 'invalid Node "n1/status": must be a DNS-1123 subdomain'),
        ({"Node": ""}, 'invalid Node "": must be a DNS-1123 subdomain'),
        ({"PodUID": ""}, "invalid PodUID: required"),
    ],
)
def test_bind_arguments_are_checked_before_any_api_call(
    apiserver: FakeApiServer, args: dict[str, str], error: str
) -> None:
    apiserver.add_object(gpu_node("n1", 1))
    pod = stored_pod(apiserver, "a")
    with running_scheduler(apiserver) as scheduler:
        scheduler.sees_pod("default", "a", lambda p: True)
        apiserver.clear_requests()
        body = {
            "PodName": "a",
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": "n1",
            **args,
        }
        status, result = scheduler.post("/bind", body)
        assert status == 200
        assert result["Error"].startswith(error)
        assert scheduler.observer.named("bind_done") == [False]
        # no pod read, patch, Binding or event: nothing under a namespace was asked for
        assert apiserver.requests_matching(path="/api/v1/namespaces/.*") == []
        assert scheduler.state.bookings() == {}
        # the same call with good arguments binds
        assert scheduler.bind(pod, "n1") == ""


def test_a_signed_bind_that_fails_removes_its_signature(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.add_object(gpu_node("n1", 1, split=1))
    pod = stored_pod(apiserver, "a")
    key_file = str(write_key_file(tmp_path / "keys"))
    with running_scheduler(apiserver, booking_key_file=key_file) as scheduler:
        scheduler.filter(pod, ["n1"])
        apiserver.inject_fault("POST", BINDING_PATH.format("a"), times=None, status=500)
        assert "HTTP 500" in scheduler.bind(pod, "n1")
        patch = apiserver.requests_matching("PATCH", POD_PATH.format("a"))[0].json()
        assert ANNOTATION_BOOKING_SIGNATURE in patch["metadata"]["annotations"]
        kept = pod_annotations(apiserver, "a")
        assert ANNOTATION_BOOKING_SIGNATURE not in kept
        assert not set(BOOKING_KEYS) & set(kept)
        apiserver.clear_faults()
        assert scheduler.schedule(pod, ["n1"]) == "n1"
        assert verify_pod(KEYS, pod["metadata"]["uid"], pod_annotations(apiserver, "a"))
