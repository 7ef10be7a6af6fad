"""Watches: the wire (chunked JSON lines, versions, selectors, bookmarks, 410, drops) and the
real client's watch."""

from __future__ import annotations

from typing import Any, cast

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.processes import wait_until
from tests.testing.apiserver.wire import MERGE, Stream, call, k8s_watch, open_watch, summary


def test_watch_streams_every_write_as_chunked_json_lines_at_its_version(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    start = apiserver.resource_version
    response = open_watch(http, apiserver, f"/api/v1/pods?watch=true&resourceVersion={start}")
    stream = Stream(response)

    assert response.status == 200
    assert response.headers["Transfer-Encoding"] == "chunked"
    assert response.headers["Content-Type"] == "application/json"
    created = call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))[1]
    patched = call(
        http,
        apiserver,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        {"metadata": {"labels": {"a": "b"}}},
        MERGE,
    )[1]
    apiserver.update_object("pods", "default", "p", lambda p: p["metadata"]["labels"].clear())
    deleted = call(http, apiserver, "DELETE", "/api/v1/namespaces/default/pods/p")[1]
    events = stream.take(5)
    stream.close()

    # A pod DELETE first writes its deletionTimestamp (grace 0: the pod is not bound), then
    # removes it: two writes, as kube-apiserver's Store.Delete does them.
    assert summary(events) == [
        ("ADDED", "p", created["metadata"]["resourceVersion"]),
        ("MODIFIED", "p", patched["metadata"]["resourceVersion"]),
        ("MODIFIED", "p", str(start + 3)),
        ("MODIFIED", "p", str(start + 4)),
        ("DELETED", "p", deleted["metadata"]["resourceVersion"]),
    ]
    assert [int(rv) for _, _, rv in summary(events)] == [
        start + 1,
        start + 2,
        start + 3,
        start + 4,
        start + 5,
    ]
    assert events[0]["object"]["kind"] == "Pod"
    assert events[0]["object"]["apiVersion"] == "v1"
    assert events[1]["object"]["metadata"]["labels"] == {"a": "b"}
    assert events[3]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    # DELETED carries the last state, at the deletion's version.
    assert events[4]["object"]["metadata"]["labels"] == {}
    assert events[4]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0


def test_watch_from_an_older_version_replays_the_history(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    first = apiserver.add_node("a")
    apiserver.add_node("b")
    apiserver.update_object("nodes", "", "a", lambda n: n["metadata"]["labels"].update(x="1"))

    version = first["metadata"]["resourceVersion"]
    path = f"/api/v1/nodes?watch=true&timeoutSeconds=1&resourceVersion={version}"
    events = Stream(open_watch(http, apiserver, path)).rest()

    assert [(t, n) for t, n, _ in summary(events)] == [("ADDED", "b"), ("MODIFIED", "a")]


def test_watch_without_version_sends_the_current_objects_first(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("a")
    apiserver.add_pod("b", "other")
    apiserver.add_pod("c")
    apiserver.delete_pod("default", "c")

    for version in ("", "&resourceVersion=0"):
        events = Stream(
            open_watch(http, apiserver, f"/api/v1/pods?watch=true&timeoutSeconds=1{version}")
        ).rest()
        assert sorted((t, n) for t, n, _ in summary(events)) == [("ADDED", "a"), ("ADDED", "b")]


def test_namespaced_watch_sees_only_its_namespace(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    start = apiserver.resource_version
    apiserver.add_pod("a", "ml")
    apiserver.add_pod("b", "default")
    apiserver.add_pod("c", "ml")

    path = f"/api/v1/namespaces/ml/pods?watch=true&timeoutSeconds=1&resourceVersion={start}"
    events = Stream(open_watch(http, apiserver, path)).rest()

    assert [n for _, n, _ in summary(events)] == ["a", "c"]


def test_watch_timeout_ends_the_stream_cleanly_and_keeps_the_connection(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    response = open_watch(http, apiserver, "/api/v1/nodes?watch=true&timeoutSeconds=1")

    assert Stream(response).rest() == []
    response.release_conn()
    # The connection went back to the pool and serves the next request.
    assert call(http, apiserver, "GET", "/api/v1/nodes")[0] == 200


def test_selector_watch_sends_added_and_deleted_as_objects_start_and_stop_matching(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("p", labels={"gpu": "yes"})
    apiserver.add_pod("other")
    start = apiserver.resource_version
    path = f"/api/v1/pods?watch=true&labelSelector=gpu%3Dyes&resourceVersion={start}"
    stream = Stream(open_watch(http, apiserver, path))

    def relabel(name: str, labels: dict[str, str]) -> dict[str, Any]:
        _, pod = call(
            http,
            apiserver,
            "PATCH",
            f"/api/v1/namespaces/default/pods/{name}",
            {"metadata": {"labels": labels}},
            MERGE,
        )
        return cast(dict[str, Any], pod)

    out = relabel("p", {"gpu": "no"})
    relabel("other", {"unrelated": "x"})
    back = relabel("p", {"gpu": "yes"})
    events = stream.take(2)
    stream.close()

    assert summary(events) == [
        ("DELETED", "p", out["metadata"]["resourceVersion"]),
        ("ADDED", "p", back["metadata"]["resourceVersion"]),
    ]
    # The DELETED object is the last state that matched, at the event's version.
    assert events[0]["object"]["metadata"]["labels"] == {"gpu": "yes"}


def test_field_selector_watch_sees_a_pod_bound_to_its_node(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    pod = apiserver.add_pod("p")
    start = apiserver.resource_version
    path = f"/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dgpu-1&resourceVersion={start}"
    stream = Stream(open_watch(http, apiserver, path))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "uid": pod["metadata"]["uid"]},
        "target": {"kind": "Node", "name": "gpu-1"},
    }

    status, _ = call(http, apiserver, "POST", "/api/v1/namespaces/default/pods/p/binding", binding)
    [event] = stream.take(1)
    stream.close()

    assert status == 201
    assert (event["type"], event["object"]["spec"]["nodeName"]) == ("ADDED", "gpu-1")
    assert event["object"]["metadata"]["resourceVersion"] == str(start + 1)
    assert {"type": "PodScheduled", "status": "True"} in event["object"]["status"]["conditions"]


def test_bookmarks_only_when_allowed(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.bookmark_interval_seconds = 0.05
    apiserver.add_pod("p")
    version = str(apiserver.resource_version)

    with_bookmarks = Stream(
        open_watch(
            http,
            apiserver,
            f"/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion={version}",
        )
    )
    bookmark = with_bookmarks.take(1)[0]
    with_bookmarks.close()
    without = Stream(
        open_watch(
            http, apiserver, f"/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion={version}"
        )
    ).rest()

    assert bookmark == {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": version}},
    }
    assert without == []


def test_too_old_version_is_an_expired_error_event(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_pod("p")
    apiserver.add_pod("q")
    apiserver.expire_history()
    current = apiserver.resource_version

    response = open_watch(http, apiserver, "/api/v1/pods?watch=true&resourceVersion=1")
    events = Stream(response).rest()
    fresh = open_watch(
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
    assert Stream(fresh).rest() == []


def test_history_is_a_ring_buffer(http: urllib3.PoolManager) -> None:
    with FakeApiServer(history_size=3) as server:
        versions = [server.add_node(name)["metadata"]["resourceVersion"] for name in "abcde"]

        def first_event(version: str) -> dict[str, Any]:
            path = f"/api/v1/nodes?watch=true&timeoutSeconds=1&resourceVersion={version}"
            return Stream(open_watch(http, server, path)).take(1)[0]

        # The history keeps the last 3 writes (c, d, e): from a's version, b's is missing.
        assert first_event(versions[0])["type"] == "ERROR"
        assert first_event(versions[1])["object"]["metadata"]["name"] == "c"


def test_drop_watches_cuts_the_stream_without_its_end(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    stream = Stream(open_watch(http, apiserver, "/api/v1/pods?watch=true&resourceVersion=0"))
    wait_until(lambda: apiserver.watch_count > 0, "the watch is open")

    apiserver.drop_watches()

    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream.next_event()
    wait_until(lambda: apiserver.watch_count == 0, "the server sees the watch end", timeout=30)


def test_bad_watch_requests_are_rejected_before_streaming(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    assert call(http, apiserver, "GET", "/api/v1/pods?watch=true&resourceVersion=x")[0] == 400
    assert call(http, apiserver, "GET", "/api/v1/pods?watch=true&labelSelector=a%20b")[0] == 400
    assert call(http, apiserver, "GET", "/api/v1/pods?watch=true&fieldSelector=x%3Dy")[0] == 400
    assert call(http, apiserver, "GET", "/api/v1/gadgets?watch=true")[0] == 404


def test_lease_watch_and_field_selector(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    start = apiserver.resource_version
    stream = Stream(
        open_watch(
            http,
            apiserver,
            f"{path}?watch=true&fieldSelector=metadata.name%3Dl&resourceVersion={start}",
        )
    )

    created = call(http, apiserver, "POST", path, lease)[1]
    created["spec"]["holderIdentity"] = "b"
    status, _ = call(http, apiserver, "PUT", f"{path}/l", created)
    events = stream.take(2)
    stream.close()

    assert status == 200
    assert [(e["type"], e["object"]["spec"]["holderIdentity"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "b"),
    ]
    assert events[0]["object"]["apiVersion"] == "coordination.k8s.io/v1"


def test_real_client_watch_gets_typed_events_and_bookmarks(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
