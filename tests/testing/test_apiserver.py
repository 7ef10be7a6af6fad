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


def test_the_node_name_field_selector_follows_binds_and_deletes(
    apiserver: FakeApiServer,  # noqa: F811
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


# --- watch: the wire ---------------------------------------------------------------------------

MERGE = "application/merge-patch+json"


def _open_watch(
    http: urllib3.PoolManager, server: FakeApiServer, path_and_query: str
) -> urllib3.BaseHTTPResponse:
    return http.request(
        "GET",
        server.url + path_and_query,
        preload_content=False,
        timeout=urllib3.Timeout(connect=5.0, read=30.0),
    )


class _Stream:
    """Reads a raw watch response event by event (one JSON object per line)."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self.response = response
        self._chunks = response.read_chunked()
        self._buffer = b""

    def next_event(self) -> dict[str, Any] | None:
        """The next event, or None when the stream ended cleanly (the terminating chunk)."""
        while b"\n" not in self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                assert self._buffer == b""
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        event: dict[str, Any] = json.loads(line)
        return event

    def close(self) -> None:
        """Give up on an unfinished stream: its connection must not go back to the pool."""
        self.response.close()
        self.response.release_conn()

    def take(self, count: int) -> list[dict[str, Any]]:
        events = []
        for _ in range(count):
            event = self.next_event()
            assert event is not None, f"stream ended after {events}"
            events.append(event)
        return events

    def rest(self) -> list[dict[str, Any]]:
        """Every event up to the clean end of the stream."""
        events = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (
            e["type"],
            e["object"]["metadata"].get("name", ""),
            e["object"]["metadata"]["resourceVersion"],
        )
        for e in events
    ]


def test_watch_streams_every_write_as_chunked_json_lines_at_its_version(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    start = apiserver.resource_version
    response = _open_watch(http, apiserver, f"/api/v1/pods?watch=true&resourceVersion={start}")
    stream = _Stream(response)

    assert response.status == 200
    assert response.headers["Transfer-Encoding"] == "chunked"
    assert response.headers["Content-Type"] == "application/json"
    created = _call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))[1]
    patched = _call(
        http,
        apiserver,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        {"metadata": {"labels": {"a": "b"}}},
        MERGE,
    )[1]
    apiserver.update_object("pods", "default", "p", lambda p: p["metadata"]["labels"].clear())
    deleted = _call(http, apiserver, "DELETE", "/api/v1/namespaces/default/pods/p")[1]
    events = stream.take(4)
    stream.close()

    assert _summary(events) == [
        ("ADDED", "p", created["metadata"]["resourceVersion"]),
        ("MODIFIED", "p", patched["metadata"]["resourceVersion"]),
        ("MODIFIED", "p", str(start + 3)),
        ("DELETED", "p", deleted["metadata"]["resourceVersion"]),
    ]
    assert [int(rv) for _, _, rv in _summary(events)] == [
        start + 1,
        start + 2,
        start + 3,
        start + 4,
    ]
    assert events[0]["object"]["kind"] == "Pod"
    assert events[0]["object"]["apiVersion"] == "v1"
    assert events[1]["object"]["metadata"]["labels"] == {"a": "b"}
    # DELETED carries the last state, at the deletion's version.
    assert events[3]["object"]["metadata"]["labels"] == {}


def test_watch_from_an_older_version_replays_the_history(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    first = apiserver.add_node("a")
    apiserver.add_node("b")
    apiserver.update_object("nodes", "", "a", lambda n: n["metadata"]["labels"].update(x="1"))

    version = first["metadata"]["resourceVersion"]
    path = f"/api/v1/nodes?watch=true&timeoutSeconds=1&resourceVersion={version}"
    events = _Stream(_open_watch(http, apiserver, path)).rest()

    assert [(t, n) for t, n, _ in _summary(events)] == [("ADDED", "b"), ("MODIFIED", "a")]


def test_watch_without_version_sends_the_current_objects_first(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("a")
    apiserver.add_pod("b", "other")
    apiserver.add_pod("c")
    apiserver.delete_pod("default", "c")

    for version in ("", "&resourceVersion=0"):
        events = _Stream(
            _open_watch(http, apiserver, f"/api/v1/pods?watch=true&timeoutSeconds=1{version}")
        ).rest()
        assert sorted((t, n) for t, n, _ in _summary(events)) == [("ADDED", "a"), ("ADDED", "b")]


def test_namespaced_watch_sees_only_its_namespace(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    start = apiserver.resource_version
    apiserver.add_pod("a", "ml")
    apiserver.add_pod("b", "default")
    apiserver.add_pod("c", "ml")

    path = f"/api/v1/namespaces/ml/pods?watch=true&timeoutSeconds=1&resourceVersion={start}"
    events = _Stream(_open_watch(http, apiserver, path)).rest()

    assert [n for _, n, _ in _summary(events)] == ["a", "c"]


def test_watch_timeout_ends_the_stream_cleanly_and_keeps_the_connection(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    response = _open_watch(http, apiserver, "/api/v1/nodes?watch=true&timeoutSeconds=1")

    assert _Stream(response).rest() == []
    response.release_conn()
    # The connection went back to the pool and serves the next request.
    assert _call(http, apiserver, "GET", "/api/v1/nodes")[0] == 200


def test_selector_watch_sends_added_and_deleted_as_objects_start_and_stop_matching(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("p", labels={"gpu": "yes"})
    apiserver.add_pod("other")
    start = apiserver.resource_version
    path = f"/api/v1/pods?watch=true&labelSelector=gpu%3Dyes&resourceVersion={start}"
    stream = _Stream(_open_watch(http, apiserver, path))

    def relabel(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return _call(
            http,
            apiserver,
            "PATCH",
            f"/api/v1/namespaces/default/pods/{name}",
            {"metadata": {"labels": labels}},
            MERGE,
        )[1]

    out = relabel("p", {"gpu": "no"})
    relabel("other", {"unrelated": "x"})
    back = relabel("p", {"gpu": "yes"})
    events = stream.take(2)
    stream.close()

    assert _summary(events) == [
        ("DELETED", "p", out["metadata"]["resourceVersion"]),
        ("ADDED", "p", back["metadata"]["resourceVersion"]),
    ]
    # The DELETED object is the last state that matched, at the event's version.
    assert events[0]["object"]["metadata"]["labels"] == {"gpu": "yes"}


def test_field_selector_watch_sees_a_pod_bound_to_its_node(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    pod = apiserver.add_pod("p")
    start = apiserver.resource_version
    path = f"/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dgpu-1&resourceVersion={start}"
    stream = _Stream(_open_watch(http, apiserver, path))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "uid": pod["metadata"]["uid"]},
        "target": {"kind": "Node", "name": "gpu-1"},
    }

    status, _ = _call(http, apiserver, "POST", "/api/v1/namespaces/default/pods/p/binding", binding)
    [event] = stream.take(1)
    stream.close()

    assert status == 201
    assert (event["type"], event["object"]["spec"]["nodeName"]) == ("ADDED", "gpu-1")
    assert event["object"]["metadata"]["resourceVersion"] == str(start + 1)
    assert {"type": "PodScheduled", "status": "True"} in event["object"]["status"]["conditions"]


def test_bookmarks_only_when_allowed(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.bookmark_interval_seconds = 0.05
    apiserver.add_pod("p")
    version = str(apiserver.resource_version)

    with_bookmarks = _Stream(
        _open_watch(
            http,
            apiserver,
            f"/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion={version}",
        )
    )
    bookmark = with_bookmarks.take(1)[0]
    with_bookmarks.close()
    without = _Stream(
        _open_watch(
            http, apiserver, f"/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion={version}"
        )
    ).rest()

    assert bookmark == {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": version}},
    }
    assert without == []


def test_too_old_version_is_an_expired_error_event(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("p")
    apiserver.add_pod("q")
    apiserver.expire_history()
    current = apiserver.resource_version

    response = _open_watch(http, apiserver, "/api/v1/pods?watch=true&resourceVersion=1")
    events = _Stream(response).rest()
    fresh = _open_watch(
        http, apiserver, f"/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion={current}"
    )

    assert response.status == 200  # as the watch cache answers: the error is an event
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: 1 ({current})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    assert _Stream(fresh).rest() == []


def test_history_is_a_ring_buffer(http: urllib3.PoolManager) -> None:
    with FakeApiServer(history_size=3) as server:
        versions = [server.add_node(name)["metadata"]["resourceVersion"] for name in "abcde"]

        def first_event(version: str) -> dict[str, Any]:
            path = f"/api/v1/nodes?watch=true&timeoutSeconds=1&resourceVersion={version}"
            return _Stream(_open_watch(http, server, path)).take(1)[0]

        # The history keeps the last 3 writes (c, d, e): from a's version, b's is missing.
        assert first_event(versions[0])["type"] == "ERROR"
        assert first_event(versions[1])["object"]["metadata"]["name"] == "c"


def test_drop_watches_cuts_the_stream_without_its_end(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    stream = _Stream(_open_watch(http, apiserver, "/api/v1/pods?watch=true&resourceVersion=0"))
    while apiserver.watch_count == 0:
        time.sleep(0.01)

    apiserver.drop_watches()

    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream.next_event()
    deadline = time.monotonic() + 30
    while apiserver.watch_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert apiserver.watch_count == 0


def test_faults_apply_to_watches(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    fault = apiserver.inject_fault("GET", "/api/v1/pods", query=".*watch=true.*", status=500)

    status, body = _call(http, apiserver, "GET", "/api/v1/pods?watch=true")
    listed = _call(http, apiserver, "GET", "/api/v1/pods")[0]

    assert (status, body["reason"], fault.fired) == (500, "InternalError", 1)
    assert listed == 200


def test_bad_watch_requests_are_rejected_before_streaming(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    assert _call(http, apiserver, "GET", "/api/v1/pods?watch=true&resourceVersion=x")[0] == 400
    assert _call(http, apiserver, "GET", "/api/v1/pods?watch=true&labelSelector=a%20b")[0] == 400
    assert _call(http, apiserver, "GET", "/api/v1/pods?watch=true&fieldSelector=x%3Dy")[0] == 400
    assert _call(http, apiserver, "GET", "/api/v1/gadgets?watch=true")[0] == 404


# --- watch: the real client ----------------------------------------------------------------------


def test_real_client_watch_gets_typed_events_and_bookmarks(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.bookmark_interval_seconds = 0.05
    apiserver.add_node("n")  # a list at version 0 would mean "from the current objects"
    listed = core.list_namespaced_pod("default")
    assert listed.metadata is not None
    apiserver.add_pod("p", labels={"app": "x"})
    apiserver.update_object("pods", "default", "p", lambda p: p["spec"].update(nodeName="n"))
    apiserver.delete_pod("default", "p")
    seen: list[tuple[str, str]] = []

    for event in k8s_watch().stream(
        core.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        obj = event["object"]
        if event["type"] == "BOOKMARK":
            seen.append(("BOOKMARK", event["raw_object"]["metadata"]["resourceVersion"]))
            break
        assert isinstance(obj, k8s.V1Pod)
        seen.append((event["type"], str(obj.spec and obj.spec.node_name)))

    assert seen == [
        ("ADDED", "None"),
        ("MODIFIED", "n"),
        ("DELETED", "n"),
        ("BOOKMARK", str(apiserver.resource_version)),
    ]


def test_real_client_watch_raises_410_for_an_expired_version(
    apiserver: FakeApiServer,  # noqa: F811
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_node("n")
    apiserver.add_node("m")
    apiserver.expire_history()

    with pytest.raises(ApiException) as e:
        # With timeout_seconds the client does not retry the 410 itself.
        list(k8s_watch().stream(core.list_node, resource_version="1", timeout_seconds=5))

    assert e.value.status == 410
    assert "Expired: too old resource version" in str(e.value.reason)


def k8s_watch() -> Any:
    from kubernetes import watch

    return watch.Watch()


# --- lists in pages ------------------------------------------------------------------------------


def test_list_pages_are_a_consistent_snapshot(
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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


# --- binding, leases, events ---------------------------------------------------------------------


def test_binding_bumps_the_version_and_checks_uid_and_name(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    pod = apiserver.add_pod("p", annotations={"keep": "1"})
    path = "/api/v1/namespaces/default/pods/p/binding"

    def bind(metadata: dict[str, str]) -> int:
        body = {"metadata": metadata, "target": {"kind": "Node", "name": "gpu-1"}}
        return _call(http, apiserver, "POST", path, body)[0]

    assert bind({"name": "p", "uid": "someone-else"}) == 409
    assert bind({"name": "q"}) == 400
    assert apiserver.get_pod("default", "p") == pod
    assert bind({"name": "p", "uid": pod["metadata"]["uid"]}) == 201

    bound = apiserver.get_pod("default", "p")
    assert bound is not None
    assert bound["spec"]["nodeName"] == "gpu-1"
    assert int(bound["metadata"]["resourceVersion"]) == int(pod["metadata"]["resourceVersion"]) + 1
    assert bound["metadata"]["annotations"] == {"keep": "1"}


def test_leases_through_the_real_client(
    apiserver: FakeApiServer,  # noqa: F811
) -> None:
    api_client = apiserver.api_client()
    leases = k8s.CoordinationV1Api(api_client)
    lease = k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name="hami-scheduler", namespace="kube-system"),
        spec=k8s.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )

    created = leases.create_namespaced_lease("kube-system", lease)
    assert created.metadata is not None and created.spec is not None
    assert created.kind == "Lease"
    assert created.api_version == "coordination.k8s.io/v1"
    with pytest.raises(ApiException) as e:
        leases.create_namespaced_lease("kube-system", lease)
    assert e.value.status == 409

    created.spec.holder_identity = "b"
    renewed = leases.replace_namespaced_lease("hami-scheduler", "kube-system", created)
    assert renewed.metadata is not None and renewed.spec is not None
    assert renewed.spec.holder_identity == "b"
    assert int(str(renewed.metadata.resource_version)) > int(str(created.metadata.resource_version))

    created.spec.holder_identity = "c"  # still at the old version: someone renewed since
    with pytest.raises(ApiException) as e:
        leases.replace_namespaced_lease("hami-scheduler", "kube-system", created)
    assert e.value.status == 409
    assert leases.read_namespaced_lease("hami-scheduler", "kube-system").spec.holder_identity == "b"
    names = [
        str(x.metadata and x.metadata.name) for x in leases.list_lease_for_all_namespaces().items
    ]
    assert names == ["hami-scheduler"]
    assert leases.list_namespaced_lease("default").items == []
    api_client.rest_client.close()


def test_lease_watch_and_field_selector(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    start = apiserver.resource_version
    stream = _Stream(
        _open_watch(
            http,
            apiserver,
            f"{path}?watch=true&fieldSelector=metadata.name%3Dl&resourceVersion={start}",
        )
    )

    created = _call(http, apiserver, "POST", path, lease)[1]
    created["spec"]["holderIdentity"] = "b"
    status, _ = _call(http, apiserver, "PUT", f"{path}/l", created)
    events = stream.take(2)
    stream.close()

    assert status == 200
    assert [(e["type"], e["object"]["spec"]["holderIdentity"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "b"),
    ]
    assert events[0]["object"]["apiVersion"] == "coordination.k8s.io/v1"


def test_put_with_another_name_is_rejected(
    apiserver: FakeApiServer,  # noqa: F811
    http: urllib3.PoolManager,
) -> None:
    node = apiserver.add_node("n")
    node["metadata"]["name"] = "m"

    status, body = _call(http, apiserver, "PUT", "/api/v1/nodes/n", node)

    assert status == 400
    assert "does not match the name on the URL" in body["message"]


def test_events_are_listed_by_involved_object(
    apiserver: FakeApiServer,  # noqa: F811
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


def test_stop_ends_open_watches(http: urllib3.PoolManager) -> None:
    before = set(threading.enumerate())
    server = FakeApiServer().start()
    stream = _Stream(_open_watch(http, server, "/api/v1/nodes?watch=true"))
    while server.watch_count == 0:
        time.sleep(0.01)

    server.stop()

    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream.next_event()
    http.clear()
    assert set(threading.enumerate()) <= before
