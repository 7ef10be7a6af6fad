"""LIST and WATCH as the API server streams them (hami_plugin.kube.client, hami_plugin.kube.watch),
against the HTTP API server double."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Gone, KubeError, Retryable
from hami_plugin.kube.records import WatchEvent
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol.objects import read_pod
from hami_plugin.testing.apiserver import FakeApiServer
from tests.kube.support import FAST, SleepRecorder, client_for
from tests.processes import wait_until

# --- list -------------------------------------------------------------------------------------


def test_list_objects_follows_continue_page_by_page(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    for name in "abcde":
        apiserver.add_node(name, labels={"gpu": "on"})
    apiserver.add_node("cpu-only", labels={})

    listed = kube.list_objects("/api/v1/nodes", label_selector="gpu=on", page_size=2)

    assert [n["metadata"]["name"] for n in listed.items] == list("abcde")
    assert listed.resource_version == str(apiserver.resource_version)
    requests = apiserver.requests
    assert [r.query.get("limit") for r in requests] == [["2"]] * 3
    assert "continue" not in requests[0].query
    assert all(r.query["labelSelector"] == ["gpu=on"] for r in requests)
    assert requests[2].query["continue"] != requests[1].query["continue"]


def test_list_objects_lists_again_in_one_page_when_the_continue_token_expires(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    for name in "abc":
        apiserver.add_pod(name)
    apiserver.inject_fault("GET", "/api/v1/pods", query=".*continue=.*", status=410)

    listed = kube.list_objects("/api/v1/pods", page_size=1)

    assert [p["metadata"]["name"] for p in listed.items] == ["a", "b", "c"]
    requests = apiserver.requests
    assert len(requests) == 3
    assert "limit" not in requests[2].query
    assert "continue" not in requests[2].query


def test_list_objects_of_a_namespace_with_a_field_selector(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("a", "ml", node_name="gpu-1")
    apiserver.add_pod("b", "ml")
    apiserver.add_pod("c", "default", node_name="gpu-1")

    listed = kube.list_objects(
        "/api/v1/namespaces/ml/pods", field_selector="spec.nodeName=gpu-1", page_size=0
    )

    assert [read_pod(p).name for p in listed.items] == ["a"]
    assert "limit" not in apiserver.requests[0].query


# --- watch ------------------------------------------------------------------------------------


def test_watch_objects_yields_the_events_after_the_version_in_order(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("before")
    start = str(apiserver.resource_version)
    apiserver.add_pod("p", labels={"app": "x"})
    apiserver.update_object("pods", "default", "p", lambda p: p["metadata"]["labels"].clear())
    apiserver.delete_pod("default", "p")

    events = list(kube.watch_objects("/api/v1/pods", start, timeout_seconds=1))

    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("ADDED", "p"),
        ("MODIFIED", "p"),
        ("DELETED", "p"),
    ]
    assert [int(e.resource_version) for e in events] == [
        int(start) + 1,
        int(start) + 2,
        int(start) + 3,
    ]
    [request] = apiserver.requests
    assert request.query == {
        "watch": ["true"],
        "allowWatchBookmarks": ["true"],
        "timeoutSeconds": ["1"],
        "resourceVersion": [start],
    }


def test_watch_objects_passes_selectors_and_sees_objects_leave_them(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", labels={"app": "x"}, node_name="gpu-1")
    start = str(apiserver.resource_version)
    apiserver.update_object("pods", "default", "p", lambda p: p["metadata"]["labels"].clear())

    events = list(
        kube.watch_objects(
            "/api/v1/pods",
            start,
            label_selector="app=x",
            field_selector="spec.nodeName=gpu-1",
            timeout_seconds=1,
        )
    )

    assert [(e.type, e.resource_version) for e in events] == [("DELETED", str(int(start) + 1))]
    query = apiserver.requests[0].query
    assert (query["labelSelector"], query["fieldSelector"]) == (["app=x"], ["spec.nodeName=gpu-1"])


def test_watch_objects_yields_bookmarks(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.bookmark_interval_seconds = 0.05
    version = apiserver.add_node("n")["metadata"]["resourceVersion"]

    first = next(iter(kube.watch_objects("/api/v1/nodes", version)))

    assert first == WatchEvent(
        "BOOKMARK",
        {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": version}},
    )
    assert first.resource_version == version


def test_watch_from_an_expired_version_is_gone(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_node("a")
    apiserver.add_node("b")
    apiserver.expire_history()

    with pytest.raises(
        Gone, match="watch /api/v1/nodes from resourceVersion 1: HTTP 410: too old"
    ) as e:
        list(kube.watch_objects("/api/v1/nodes", "1", timeout_seconds=5))

    assert e.value.status == 410
    assert isinstance(e.value.__cause__, ApiException)


def test_watch_answered_http_410_is_gone_and_not_retried(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", status=410)

    with pytest.raises(Gone):
        list(kube.watch_objects("/api/v1/pods", "5"))

    assert len(apiserver.requests) == 1


def test_watch_error_event_with_a_server_error_is_retryable(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    added = {"type": "ADDED", "object": {"metadata": {"name": "p", "resourceVersion": "7"}}}
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd down"}}
    body = (json.dumps(added) + "\n" + json.dumps(error) + "\n").encode()
    apiserver.inject_fault("GET", query=".*watch=true.*", status=200, body=body)
    events: list[WatchEvent] = []

    with pytest.raises(Retryable, match="HTTP 500: etcd down"):
        events.extend(kube.watch_objects("/api/v1/pods", "6"))

    assert [e.resource_version for e in events] == ["7"]


def test_watch_that_cannot_be_opened_retries_then_is_retryable(
    apiserver: FakeApiServer,
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", status=503, times=None)

    with pytest.raises(Retryable, match=r"watch /api/v1/pods from .*HTTP 503.*gave up after 3"):
        list(kube.watch_objects("/api/v1/pods", "1"))

    assert len(apiserver.requests) == FAST.attempts
    assert len(sleeps.waits) == FAST.attempts - 1


def test_watch_of_a_server_that_is_gone_is_retryable() -> None:
    with FakeApiServer() as server:
        api_client = server.api_client()
    with (
        KubeClient(api_client, FAST, sleep=SleepRecorder()) as kube,
        pytest.raises(Retryable, match="connection failed"),
    ):
        list(kube.watch_objects("/api/v1/pods", "1"))


def test_watch_whose_headers_never_come_times_out_as_retryable(
    apiserver: FakeApiServer,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", hang_seconds=30, times=None)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with client_for(apiserver, policy) as kube, pytest.raises(Retryable, match="timed out"):
        # The read timeout for events is long; the wait for the headers is the call's timeout.
        list(kube.watch_objects("/api/v1/pods", "1", read_timeout_seconds=300))


def test_malformed_watch_line_is_a_kube_error(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", status=200, body=b"{not json\n")

    with pytest.raises(KubeError, match=r"watch /api/v1/pods .*malformed response") as e:
        list(kube.watch_objects("/api/v1/pods", "1"))

    assert type(e.value) is KubeError


def test_a_watch_line_that_never_ends_is_a_kube_error(
    apiserver: FakeApiServer,
    kube: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hami_plugin.kube.watch._MAX_WATCH_LINE_BYTES", 100)
    apiserver.inject_fault("GET", query=".*watch=true.*", status=200, body=b"x" * 500)

    with pytest.raises(KubeError, match="an event longer than 100 bytes"):
        list(kube.watch_objects("/api/v1/pods", "1"))


class _Consumer:
    """Reads a watch in a thread, keeping what it saw and how it ended."""

    def __init__(self, events: Iterator[WatchEvent]) -> None:
        self.events: list[WatchEvent] = []
        self.error: BaseException | None = None
        self._source = events
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self._source:
                self.events.append(event)
        except BaseException as exc:  # kept for the assertions
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the watch did not end"


def test_dropped_watch_ends_the_iterator_cleanly(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0"))
    wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)
    apiserver.add_pod("p")
    wait_until(lambda: len(consumer.events) == 1, "the ADDED event", timeout=30.0)

    apiserver.drop_watches()
    consumer.join()

    assert consumer.error is None
    assert [e.type for e in consumer.events] == ["ADDED"]


def test_silent_watch_ends_after_the_read_timeout(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    # No bookmarks within the read timeout: the connection counts as dead.
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0", read_timeout_seconds=0.3))

    consumer.join()

    assert consumer.error is None
    assert consumer.events == []


def test_stop_wakes_a_watch_blocked_in_a_read(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    stop = threading.Event()
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0", stop=stop))
    wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)

    stop.set()
    consumer.join()

    assert consumer.error is None
    wait_until(
        lambda: apiserver.watch_count == 0, "the server to see the watch closed", timeout=30.0
    )
    # The connection was closed, not put back half-read: the client still works.
    apiserver.add_node("n")
    assert kube.get_node("n").name == "n"


def test_watch_event_resource_version_of_odd_objects() -> None:
    assert WatchEvent("ADDED", {}).resource_version == ""
    assert WatchEvent("ADDED", {"metadata": "x"}).resource_version == ""
    assert WatchEvent("ADDED", {"metadata": {"resourceVersion": 5}}).resource_version == ""
