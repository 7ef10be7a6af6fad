"""hami_plugin.kube.fake: the in-memory cluster keeps the API server rules its users rely on."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import UTC, datetime

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.kube.errors import Conflict, NotFound, Retryable
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.fake import FakeKube
from hami_plugin.kube.informer import Informer
from hami_plugin.kube.records import LeaseRecord, ObjectRef
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.testing.apiserver import make_container, make_node, make_pod


def test_patches_merge_delete_and_check_the_version() -> None:
    kube = FakeKube(nodes=[make_node("gpu-1", annotations={"keep": "1", "drop": "2"})])
    node = kube.get_node("gpu-1")

    patched = kube.patch_node_annotations(
        "gpu-1", {"drop": None, "new": "3"}, resource_version=node.resource_version
    )

    assert patched.annotations == {"keep": "1", "new": "3"}
    assert patched.resource_version != node.resource_version
    with pytest.raises(Conflict):
        kube.patch_node_annotations("gpu-1", {"x": "y"}, resource_version=node.resource_version)
    with pytest.raises(NotFound):
        kube.get_node("ghost")


def test_pods_are_read_by_the_one_model_and_listed_by_node() -> None:
    kube = FakeKube(
        pods=[
            make_pod("a", node_name="gpu-1", containers=[make_container("c", env={"K": "V"})]),
            make_pod("b", "ml", node_name="gpu-2"),
        ]
    )

    [pod] = kube.list_pods_on_node("gpu-1")
    assert pod.key == "default/a"
    assert pod.containers[0].env == {"K": "V"}
    patched = kube.patch_pod_metadata("ml", "b", {"a": "1"}, labels={"l": "v"})
    assert (patched.annotations, patched.labels["l"]) == ({"a": "1"}, "v")
    with pytest.raises(NotFound):
        kube.patch_pod_metadata("ml", "ghost", {})


def test_bind_sets_the_node_once() -> None:
    kube = FakeKube(pods=[make_pod("p", uid="u-1")])

    kube.bind_pod("default", "p", "u-1", "gpu-1")
    kube.bind_pod("default", "p", "u-1", "gpu-1")  # a retry that had landed counts as done

    assert kube.get_pod("default", "p").node_name == "gpu-1"
    with pytest.raises(Conflict):
        kube.bind_pod("default", "p", "u-1", "gpu-2")
    with pytest.raises(Conflict):
        kube.bind_pod("default", "p", "another-uid", "gpu-1")


def test_list_objects_applies_equality_selectors() -> None:
    kube = FakeKube(
        nodes=[make_node("n1")],
        pods=[
            make_pod("a", labels={"role": "leader"}),
            make_pod("b", "ml", labels={"role": "follower"}),
        ],
    )

    assert [o["metadata"]["name"] for o in kube.list_objects("/api/v1/nodes").items] == ["n1"]
    leaders = kube.list_objects("/api/v1/pods", label_selector="role=leader").items
    assert [o["metadata"]["name"] for o in leaders] == ["a"]
    by_name = kube.list_objects("/api/v1/namespaces/ml/pods", field_selector="metadata.name=b")
    assert [o["metadata"]["name"] for o in by_name.items] == ["b"]
    assert kube.list_objects("/api/v1/namespaces/ml/pods", label_selector="role").items
    with pytest.raises(ValueError, match="cannot list"):
        kube.list_objects("/api/v1/secrets")


def test_leases_keep_the_create_and_update_rules() -> None:
    kube = FakeKube()
    record = LeaseRecord("ns", "l", "me", 15, None, None, 0)

    created = kube.create_lease(record)

    with pytest.raises(Conflict):
        kube.create_lease(record)
    updated = kube.update_lease(created)
    with pytest.raises(Conflict):
        kube.update_lease(created)  # stale now
    assert kube.get_lease("ns", "l") == updated
    assert kube.writes == 2
    with pytest.raises(NotFound):
        kube.get_lease("ns", "ghost")


def test_events_are_kept_as_the_client_writes_them() -> None:
    kube = FakeKube(clock=ManualClock(datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)))
    pod = kube.put_pod(make_pod("p", uid="u-1"))

    kube.create_pod_event(PodEvent.of_pod(pod, "AllocateFailed", "no GPU", "Warning"))
    kube.create_event(ObjectRef("Node", "", "gpu-1"), "R", "m")

    first, second = kube.events
    assert first["involvedObject"]["uid"] == "u-1" and first["type"] == "Warning"
    assert first["source"] == {"component": "hami-device-plugin"}
    assert second["metadata"]["namespace"] == "default"
    assert first["firstTimestamp"] == second["lastTimestamp"] == "2026-05-06T07:08:09Z"


def test_injected_failures() -> None:
    kube = FakeKube(nodes=[make_node("n1")])
    kube.fail("get_node", Retryable("down"), times=2)

    for _ in range(2):
        with pytest.raises(Retryable):
            kube.get_node("n1")
    assert kube.get_node("n1").name == "n1"
    kube.fail("get_node", RuntimeError("boom"), times=None)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            kube.get_node("n1")
    kube.heal("get_node")
    assert kube.get_node("n1").name == "n1"
    assert kube.calls.count("get_node") == 7


# --- the watch the informers use ----------------------------------------------------------------


def test_the_watch_streams_the_writes_after_the_listed_version() -> None:
    kube = FakeKube(
        nodes=[make_node("gpu-1")],
        pods=[make_pod("a", node_name="gpu-1"), make_pod("b", labels={"gpu": "on"})],
    )
    on_node = "spec.nodeName=gpu-1"
    (page,) = kube.list_pages("/api/v1/pods", field_selector=on_node)
    assert [pod["metadata"]["name"] for pod in page.items] == ["a"]

    kube.bind_pod("default", "b", "", "gpu-1")  # now it matches: ADDED
    kube.patch_pod_metadata("default", "a", {"hami.io/bind-phase": "success"})
    kube.patch_node_annotations("gpu-1", {"x": "1"})  # another collection
    kube.patch_pod_metadata("default", "b", {}, labels={"gpu": None})

    events = kube.watch_objects("/api/v1/pods", page.resource_version, field_selector=on_node)
    seen = [(e.type, e.object["metadata"]["name"]) for e in itertools.islice(events, 3)]
    assert seen == [("ADDED", "b"), ("MODIFIED", "a"), ("MODIFIED", "b")]
    selected = kube.watch_objects("/api/v1/pods", page.resource_version, label_selector="gpu=on")
    assert [(e.type, e.resource_version) for e in itertools.islice(selected, 2)] == [
        ("MODIFIED", str(int(page.resource_version) + 1)),
        ("DELETED", kube.get_pod("default", "b").resource_version),  # stopped matching
    ]


def test_a_watch_ends_when_stopped_and_an_informer_keeps_its_store_from_it() -> None:
    kube = FakeKube(pods=[make_pod("a", node_name="gpu-1")])
    stop = threading.Event()
    informer: Informer[PodInfo] = Informer(
        kube, "/api/v1/pods", read_pod, lambda pod: pod.key, _Ignore(), name="pods"
    )
    thread = threading.Thread(target=informer.run, args=(stop,))
    thread.start()
    try:
        assert informer.synced.wait(5)
        kube.put_pod(make_pod("b", node_name="gpu-1"))
        deadline = time.monotonic() + 5
        while informer.get("default/b") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {pod.key for pod in informer.items()} == {"default/a", "default/b"}
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


class _Ignore:
    def on_upsert(self, new: object, old: object) -> None:
        return None

    def on_delete(self, old: object) -> None:
        return None

    def on_synced(self) -> None:
        return None
