"""The store: versions, creation, list bodies and list pages."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.testing.apiserver.wire import call


def test_every_write_bumps_the_resource_version(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    created = apiserver.add_node("n")
    first = int(created["metadata"]["resourceVersion"])
    patch = {"metadata": {"annotations": {"a": "1"}}}

    _, patched = call(
        http, apiserver, "PATCH", "/api/v1/nodes/n", patch, "application/merge-patch+json"
    )
    _, pod = call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))
    _, deleted = call(http, apiserver, "DELETE", "/api/v1/namespaces/default/pods/p")

    assert int(patched["metadata"]["resourceVersion"]) == first + 1
    assert int(pod["metadata"]["resourceVersion"]) == first + 2
    # The pod DELETE is two writes: its deletionTimestamp, then its removal.
    assert apiserver.resource_version == first + 4
    assert deleted["metadata"]["name"] == "p"
    assert apiserver.get_pod("default", "p") is None


def test_create_twice_is_already_exists_and_generate_name_works(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    path = "/api/v1/namespaces/default/events"
    event = {"metadata": {"name": "e1"}, "reason": "R", "involvedObject": {"name": "p"}}

    assert call(http, apiserver, "POST", path, event)[0] == 201
    status, body = call(http, apiserver, "POST", path, event)
    generated = call(http, apiserver, "POST", path, {"metadata": {"generateName": "p."}})[1]

    assert (status, body["reason"]) == (409, "AlreadyExists")
    assert generated["metadata"]["name"].startswith("p.")
    assert len(apiserver.events("default")) == 2


def test_pod_list_is_typed_for_the_client(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod(make_pod("a", node_name="n1"))
    apiserver.add_pod(make_pod("b", "kube-system", node_name="n1"))

    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1,status.phase=Pending")

    assert pods.kind == "PodList"
    assert pods.metadata is not None
    assert pods.metadata.resource_version == str(apiserver.resource_version)
    assert sorted(str(p.metadata and p.metadata.name) for p in pods.items) == ["a", "b"]


def test_list_pages_are_a_consistent_snapshot(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    for name in "abcde":
        apiserver.add_pod(name)

    version = str(apiserver.resource_version)
    first = core.list_namespaced_pod("default", limit=2)
    apiserver.add_pod("f")
    apiserver.delete_pod("default", "e")
    assert first.metadata is not None
    second = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert second.metadata is not None
    third = core.list_namespaced_pod("default", limit=2, _continue=second.metadata._continue)
    assert third.metadata is not None

    pages = [
        [str(p.metadata and p.metadata.name) for p in page.items] for page in (first, second, third)
    ]
    assert pages == [["a", "b"], ["c", "d"], ["e"]]
    assert first.metadata.remaining_item_count == 3
    assert third.metadata._continue is None
    assert {first.metadata.resource_version, third.metadata.resource_version} == {version}


def test_expired_continue_token_is_410(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    for name in "abc":
        apiserver.add_node(name)
    first = core.list_node(limit=1)
    assert first.metadata is not None
    apiserver.expire_history()

    with pytest.raises(ApiException) as e:
        core.list_node(limit=1, _continue=first.metadata._continue)

    assert e.value.status == 410
    body = json.loads(str(e.value.body))
    assert body["reason"] == "Expired"
    assert "continue parameter is too old" in body["message"]
