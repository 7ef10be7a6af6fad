"""The API server double itself: it must behave like the API server where our code relies on it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, json_patch, make_pod, merge_patch
from tests.fakes.pytest_fixtures import apiserver  # noqa: F401 - fixture


@pytest.fixture
def http() -> Iterator[urllib3.PoolManager]:
    pool = urllib3.PoolManager(retries=False, timeout=5.0)
    yield pool
    pool.clear()


@pytest.fixture
def core(apiserver: FakeApiServer) -> Iterator[k8s.CoreV1Api]:  # noqa: F811
    api_client = apiserver.api_client()
    yield k8s.CoreV1Api(api_client)
    api_client.rest_client.close()


def _call(
    http: urllib3.PoolManager,
    server: FakeApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    payload = None if body is None else json.dumps(body).encode()
    response = http.request(
        method, server.url + path, body=payload, headers={"Content-Type": content_type}
    )
    return response.status, json.loads(response.data)


# --- patch algorithms -------------------------------------------------------------------------


def test_merge_patch_follows_rfc7386_examples() -> None:
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


@given(
    st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.none(), max_size=6),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=6),
)
def test_merge_patch_on_string_maps(patch: dict[str, str | None], target: dict[str, str]) -> None:
    result = merge_patch(target, patch)

    for key, value in patch.items():
        assert result.get(key) == value
    for key in target.keys() - patch.keys():
        assert result[key] == target[key]


def test_json_patch_operations() -> None:
    doc = {"metadata": {"annotations": {"a/b": "1"}}, "items": [1, 2]}
    ops = [
        {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/c", "value": "2"},
        {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "3"},
        {"op": "remove", "path": "/items/0"},
        {"op": "add", "path": "/items/-", "value": 9},
        {"op": "copy", "from": "/items", "path": "/copied"},
        {"op": "move", "from": "/copied", "path": "/moved"},
    ]

    assert json_patch(doc, ops) == {
        "metadata": {"annotations": {"a/b": "3", "c": "2"}},
        "items": [2, 9],
        "moved": [2, 9],
    }
    assert doc["items"] == [1, 2]  # the input is left alone


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/a", "value": "other"}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "frobnicate", "path": "/a"}],
        {"op": "add"},
    ],
)
def test_json_patch_failures_raise(ops: Any) -> None:
    with pytest.raises(ValueError):
        json_patch({"a": "b"}, ops)


# --- through the real client ------------------------------------------------------------------


def test_default_strategic_merge_patch_from_the_client_is_applied(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_node("n", annotations={"a": "1", "b": "2"})

    core.patch_node("n", {"metadata": {"annotations": {"a": None, "c": "3"}}})

    node = apiserver.get_node("n")
    assert node is not None
    assert node["metadata"]["annotations"] == {"b": "2", "c": "3"}
    assert apiserver.requests[-1].content_type == "application/strategic-merge-patch+json"


def test_json_patch_from_the_client_is_applied(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod("p", annotations={"a": "1"})

    core.patch_namespaced_pod(
        "p", "default", [{"op": "replace", "path": "/metadata/annotations/a", "value": "2"}]
    )

    pod = apiserver.get_pod("default", "p")
    assert pod is not None
    assert pod["metadata"]["annotations"] == {"a": "2"}
    assert apiserver.requests[-1].content_type == "application/json-patch+json"


def test_failed_json_patch_test_is_422_and_changes_nothing(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    stored = apiserver.add_pod("p")

    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]
        )

    assert e.value.status == 422
    assert apiserver.get_pod("default", "p") == stored


def test_binding_sets_node_once(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod("p")
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name="p"),
        target=k8s.V1ObjectReference(kind="Node", name="gpu-1"),
    )

    core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)

    pod = apiserver.get_pod("default", "p")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "gpu-1"
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert e.value.status == 409
    assert 'already assigned to node "gpu-1"' in json.loads(str(e.value.body))["message"]


def test_label_selector(
    apiserver: FakeApiServer,  # noqa: F811
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


def test_pod_list_is_typed_for_the_client(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod(make_pod("a", node_name="n1"))
    apiserver.add_pod(make_pod("b", "kube-system", node_name="n1"))

    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1,status.phase=Pending")

    assert pods.kind == "PodList"
    assert pods.metadata is not None
    assert pods.metadata.resource_version == str(apiserver.resource_version)
    assert sorted(str(p.metadata and p.metadata.name) for p in pods.items) == ["a", "b"]


# --- raw HTTP: status bodies, versions, faults ------------------------------------------------


def test_not_found_is_a_status_body(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    status, body = _call(http, apiserver, "GET", "/api/v1/namespaces/default/pods/ghost")

    assert status == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "ghost" not found',
        "reason": "NotFound",
        "details": {"name": "ghost", "kind": "pods"},
        "code": 404,
    }


def test_every_write_bumps_the_resource_version(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    created = apiserver.add_node("n")
    first = int(created["metadata"]["resourceVersion"])
    patch = {"metadata": {"annotations": {"a": "1"}}}

    _, patched = _call(
        http, apiserver, "PATCH", "/api/v1/nodes/n", patch, "application/merge-patch+json"
    )
    _, pod = _call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))
    _, deleted = _call(http, apiserver, "DELETE", "/api/v1/namespaces/default/pods/p")

    assert int(patched["metadata"]["resourceVersion"]) == first + 1
    assert int(pod["metadata"]["resourceVersion"]) == first + 2
    assert apiserver.resource_version == first + 3
    assert deleted["metadata"]["name"] == "p"
    assert apiserver.get_pod("default", "p") is None


def test_put_with_stale_version_is_conflict(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    node = apiserver.add_node("n")
    apiserver.update_object("nodes", "", "n", lambda n: n["metadata"]["labels"].update(x="y"))

    status, body = _call(http, apiserver, "PUT", "/api/v1/nodes/n", node)

    assert status == 409
    assert body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


def test_create_twice_is_already_exists_and_generate_name_works(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    path = "/api/v1/namespaces/default/events"
    event = {"metadata": {"name": "e1"}, "reason": "R", "involvedObject": {"name": "p"}}

    assert _call(http, apiserver, "POST", path, event)[0] == 201
    status, body = _call(http, apiserver, "POST", path, event)
    generated = _call(http, apiserver, "POST", path, {"metadata": {"generateName": "p."}})[1]

    assert (status, body["reason"]) == (409, "AlreadyExists")
    assert generated["metadata"]["name"].startswith("p.")
    assert len(apiserver.events("default")) == 2


def test_unsupported_field_selector_and_patch_type_are_rejected(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_node("n")

    status, body = _call(http, apiserver, "GET", "/api/v1/pods?fieldSelector=spec.bogus%3Dx")
    assert status == 400
    assert "field label not supported: spec.bogus" in body["message"]

    status, _ = _call(http, apiserver, "PATCH", "/api/v1/nodes/n", {}, "application/yaml")
    assert status == 415


def test_watch_is_a_clear_not_implemented(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    status, body = _call(http, apiserver, "GET", "/api/v1/pods?watch=true")

    assert status == 501
    assert "watch" in body["message"]


def test_faults_fire_the_given_number_of_times(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_node("n")
    fault = apiserver.inject_fault("GET", r"/api/v1/nodes/.*", status=503, times=2)

    statuses = [_call(http, apiserver, "GET", "/api/v1/nodes/n")[0] for _ in range(3)]
    other = _call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))[0]

    assert statuses == [503, 503, 200]
    assert other == 201
    assert fault.fired == 2
    assert [r.method for r in apiserver.requests] == ["GET", "GET", "GET", "POST"]
    assert apiserver.requests_matching("POST")[0].json()["metadata"]["name"] == "p"


def test_stop_wakes_hung_requests_and_leaks_no_threads() -> None:
    before = set(threading.enumerate())
    server = FakeApiServer().start()
    server.inject_fault(hang_seconds=60, times=None)
    pool = urllib3.PoolManager(retries=False, timeout=30.0)
    outcome: list[object] = []

    def hang() -> None:
        try:
            outcome.append(pool.request("GET", server.url + "/api/v1/nodes/n").status)
        except urllib3.exceptions.HTTPError as exc:
            outcome.append(exc)

    client = threading.Thread(target=hang)
    client.start()
    while not server.requests:
        time.sleep(0.01)
    started = time.monotonic()
    server.stop()
    client.join(timeout=10)

    assert time.monotonic() - started < 5
    assert not client.is_alive()
    assert len(outcome) == 1
    pool.clear()
    assert set(threading.enumerate()) <= before
