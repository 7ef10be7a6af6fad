"""Label and field selectors on lists (the watch tests cover them on watches)."""

from __future__ import annotations

import urllib3
from kubernetes import client as k8s

from hami_plugin.testing.apiserver import FakeApiServer
from tests.testing.apiserver.wire import call


def test_the_node_name_field_selector_follows_binds_and_deletes(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    # Served from an index of pods by node: it must move with every write.
    apiserver.add_pod("on-1", node_name="gpu-1")
    apiserver.add_pod("on-2", node_name="gpu-2")
    apiserver.add_pod("pending")
    apiserver.add_pod("other-ns", "team", node_name="gpu-1")

    def on(node: str) -> list[str]:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return sorted(str(p.metadata and p.metadata.name) for p in pods.items)

    assert on("gpu-1") == ["on-1", "other-ns"]
    assert on("") == ["pending"]  # kube-scheduler's query for unscheduled pods
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name="pending"),
        target=k8s.V1ObjectReference(kind="Node", name="gpu-1"),
    )
    core.create_namespaced_pod_binding("pending", "default", binding, _preload_content=False)
    assert on("gpu-1") == ["on-1", "other-ns", "pending"]
    assert on("") == []
    apiserver.delete_pod("default", "on-1")
    core.patch_namespaced_pod("pending", "default", {"metadata": {"labels": {"a": "b"}}})
    assert on("gpu-1") == ["other-ns", "pending"]
    assert on("gpu-2") == ["on-2"]
    names = core.list_namespaced_pod("team", field_selector="spec.nodeName!=gpu-2").items
    assert [p.metadata and p.metadata.name for p in names] == ["other-ns"]


def test_label_selector(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod("a", labels={"app": "x", "tier": "gpu"})
    apiserver.add_pod("b", labels={"app": "y"})
    apiserver.add_pod("c")

    def names(selector: str) -> list[str]:
        pods = core.list_namespaced_pod("default", label_selector=selector)
        return sorted(str(p.metadata and p.metadata.name) for p in pods.items)

    assert names("app=x") == ["a"]
    assert names("app!=x") == ["b", "c"]
    assert names("app") == ["a", "b"]
    assert names("!app") == ["c"]
    assert names("app==x,tier=gpu") == ["a"]


def test_events_are_listed_by_involved_object(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    for name, kind in (("e1", "Pod"), ("e2", "Node"), ("e3", "Pod")):
        target = "p" if name != "e3" else "q"
        apiserver.add_object(
            {
                "kind": "Event",
                "metadata": {"name": name, "namespace": "default"},
                "involvedObject": {"kind": kind, "name": target},
                "reason": "R",
            }
        )

    events = core.list_namespaced_event(
        "default", field_selector="involvedObject.kind=Pod,involvedObject.name=p"
    )

    assert [str(e.metadata and e.metadata.name) for e in events.items] == ["e1"]


def test_unsupported_field_selector_and_patch_type_are_rejected(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_node("n")

    status, body = call(http, apiserver, "GET", "/api/v1/pods?fieldSelector=spec.bogus%3Dx")
    assert status == 400
    assert "field label not supported: spec.bogus" in body["message"]

    status, _ = call(http, apiserver, "PATCH", "/api/v1/nodes/n", {}, "application/yaml")
    assert status == 415
