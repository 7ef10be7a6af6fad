"""The write-behind queue against the API server double, over real HTTP (`KubeClient`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest

from hami_plugin.deviceplugin.writebehind import WriteBehind, WriteQueueFullError
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import NotFound
from hami_plugin.kube.events import EventSink, PodEvent
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
)
from hami_plugin.protocol.objects import NodeInfo, PodInfo
from hami_plugin.testing.apiserver import FakeApiServer
from tests.deviceplugin.pods import NODE, add_pending_pod, dev, node_annotations, pod_annotations
from tests.processes import wait_until

LOCK = "2026-01-01T00:00:00Z,default,p"


@pytest.fixture
def writes(kube: KubeClient) -> Iterator[WriteBehind]:
    """A write-behind queue with quick retries; its worker is started by the test."""
    queue = WriteBehind(kube, initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
    try:
        yield queue
    finally:
        queue.stop()


def pod_info(kube: KubeClient, name: str) -> PodInfo:
    return kube.get_pod("default", name)


def locked_node(apiserver: FakeApiServer, kube: KubeClient) -> NodeInfo:
    apiserver.add_node(NODE, annotations={ANNOTATION_NODE_LOCK: LOCK})
    return kube.get_node(NODE)


def test_a_write_the_api_server_takes_is_written_at_once(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    pod = pod_info(kube, "p")
    assert writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "success"}) is True
    assert writes.backlog == 0
    assert pod_annotations(apiserver, "p")[ANNOTATION_BIND_PHASE] == "success"


def test_writes_the_api_server_does_not_take_are_applied_in_order_once_it_answers(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")], [dev("GPU-b")]], lock=None)
    node = locked_node(apiserver, kube)
    pod = pod_info(kube, "p")
    apiserver.inject_fault(disconnect=True, times=None)
    assert writes.patch_pod(pod, {ANNOTATION_DEVICES_TO_ALLOCATE: "first"}) is False
    assert writes.patch_pod(pod, {ANNOTATION_DEVICES_TO_ALLOCATE: "second"}) is False
    writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "success"})
    writes.release_lock(node, "default", "p")
    events: EventSink = writes  # the device plugin's event sink
    events.record(PodEvent.of_pod(pod, "Served", "served while the API server was away", "Normal"))
    assert writes.backlog == 5
    assert pod_annotations(apiserver, "p")[ANNOTATION_BIND_PHASE] == "allocating"

    apiserver.clear_faults()
    since = len(apiserver.requests)
    writes.start()  # after the outage, so that the log below holds only what it applied
    wait_until(lambda: writes.backlog == 0, "the queue drained")
    sent = [
        (r.method, r.path, r.body and r.json().get("metadata", {}).get("annotations"))
        for r in apiserver.requests[since:]
    ]
    pod_path = "/api/v1/namespaces/default/pods/p"
    node_path = f"/api/v1/nodes/{NODE}"
    assert [(method, path) for method, path, _ in sent] == [
        ("PATCH", pod_path),
        ("PATCH", pod_path),
        ("PATCH", pod_path),
        ("GET", node_path),
        ("PATCH", node_path),
        ("POST", "/api/v1/namespaces/default/events"),
    ]
    assert [body for _, _, body in sent[:3]] == [
        {ANNOTATION_DEVICES_TO_ALLOCATE: "first"},
        {ANNOTATION_DEVICES_TO_ALLOCATE: "second"},
        {ANNOTATION_BIND_PHASE: "success"},
    ]
    assert pod_annotations(apiserver, "p")[ANNOTATION_DEVICES_TO_ALLOCATE] == "second"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)
    assert [e["reason"] for e in apiserver.events("default")] == ["Served"]
    assert writes.applied_from_queue == 5


def test_while_writes_wait_a_new_one_queues_behind_them_even_if_the_api_answers(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    pod = pod_info(kube, "p")
    apiserver.inject_fault("PATCH", disconnect=True, times=2)  # both attempts of one call
    assert writes.patch_pod(pod, {ANNOTATION_DEVICES_TO_ALLOCATE: "first"}) is False
    # The API server answers now, but the first write has not landed: the second waits too.
    assert writes.patch_pod(pod, {ANNOTATION_DEVICES_TO_ALLOCATE: "second"}) is False
    assert ANNOTATION_DEVICES_TO_ALLOCATE in pod_annotations(apiserver, "p")
    assert pod_annotations(apiserver, "p")[ANNOTATION_DEVICES_TO_ALLOCATE] not in (
        "first",
        "second",
    )
    writes.start()
    wait_until(lambda: writes.backlog == 0, "the queue drained")
    assert pod_annotations(apiserver, "p")[ANNOTATION_DEVICES_TO_ALLOCATE] == "second"


def test_a_caller_that_knows_the_api_server_is_away_queues_without_asking(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    pod = pod_info(kube, "p")
    apiserver.clear_requests()
    assert writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "success"}, queue=True) is False
    assert apiserver.requests == []
    assert writes.backlog == 1


def test_the_writes_of_a_pod_that_is_gone_are_dropped_and_the_others_applied(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "gone", [[dev("GPU-a")]], lock=None)
    add_pending_pod(apiserver, "kept", [[dev("GPU-b")]], lock=None)
    gone, kept = pod_info(kube, "gone"), pod_info(kube, "kept")
    for pod in (gone, kept, gone):
        writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "success"}, queue=True)
    writes.record(PodEvent.of_pod(gone, "Served", "gone", "Normal"), queue=True)
    apiserver.delete_pod("default", "gone")
    with pytest.raises(NotFound):
        kube.get_pod("default", "gone")
    since = len(apiserver.requests)
    writes.start()
    wait_until(lambda: writes.backlog == 0, "the queue drained")
    assert pod_annotations(apiserver, "kept")[ANNOTATION_BIND_PHASE] == "success"
    # One attempt at the gone pod: its later patch and its event went with it.
    paths = [r.path for r in apiserver.requests[since:]]
    assert paths == [
        "/api/v1/namespaces/default/pods/gone",
        "/api/v1/namespaces/default/pods/kept",
    ]
    assert apiserver.events("default") == []


def test_the_queue_is_bounded(apiserver: FakeApiServer, kube: KubeClient) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    pod = pod_info(kube, "p")
    writes = WriteBehind(kube, max_writes=2)
    writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "a"}, queue=True)
    writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "b"}, queue=True)
    with pytest.raises(WriteQueueFullError, match="2 writes are already waiting"):
        writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "c"}, queue=True)
    assert writes.backlog == 2


def test_reads_show_what_was_queued_and_written_until_the_pod_is_gone(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    add_pending_pod(apiserver, "q", [[dev("GPU-b")]], lock=None)
    p, q = pod_info(kube, "p"), pod_info(kube, "q")
    writes.patch_pod(p, {ANNOTATION_BIND_PHASE: "success"})  # written
    writes.patch_pod(q, {ANNOTATION_DEVICES_TO_ALLOCATE: ";", "extra": None}, queue=True)
    stale = [
        dataclasses.replace(pod, annotations={**pod.annotations, "extra": "x"}) for pod in (p, q)
    ]

    queued = {pod.name: pod.annotations for pod in writes.applied(stale, queued=True)}
    assert queued["p"] == stale[0].annotations  # nothing queued for p
    assert queued["q"][ANNOTATION_DEVICES_TO_ALLOCATE] == ";"
    assert "extra" not in queued["q"]
    written = {pod.name: pod.annotations for pod in writes.applied(stale, queued=False)}
    assert written["p"][ANNOTATION_BIND_PHASE] == "success"
    assert written["q"] == stale[1].annotations  # q's patch is not written yet
    # A listing without p forgets it: its pod and UID are gone for good.
    assert writes.applied([stale[1]], queued=False) == [stale[1]]
    assert writes.applied(stale[:1], queued=False) == stale[:1]


def test_a_released_lock_reads_as_gone_until_another_is_taken(
    apiserver: FakeApiServer, kube: KubeClient, writes: WriteBehind
) -> None:
    node = locked_node(apiserver, kube)
    writes.release_lock(node, "default", "p", queue=True)
    assert ANNOTATION_NODE_LOCK not in writes.node_applied(node).annotations
    other = dataclasses.replace(
        node, annotations={ANNOTATION_NODE_LOCK: "2026-01-01T00:00:09Z,default,q"}
    )
    assert writes.node_applied(other) == other
    # Another pod's lock is not released (HAMi's rule), so not remembered either.
    writes.release_lock(other, "default", "p", queue=True)
    assert writes.backlog == 1


def test_stopping_says_which_writes_are_lost(
    apiserver: FakeApiServer,
    kube: KubeClient,
    writes: WriteBehind,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_pending_pod(apiserver, "p", [[dev("GPU-a")]], lock=None)
    pod = pod_info(kube, "p")
    apiserver.inject_fault(disconnect=True, times=None)
    writes.start()
    writes.patch_pod(pod, {ANNOTATION_BIND_PHASE: "success"}, queue=True)
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.writebehind"):
        writes.stop()
    assert "stopping with 1 write(s) the API server never took, lost: patch pod default/p" in (
        caplog.text
    )
