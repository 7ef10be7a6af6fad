"""hami_plugin.kube.client against the HTTP API server double, through the real kubernetes
client."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException

from hami_plugin.kube.client import (
    Conflict,
    ContainerSpec,
    Gone,
    KubeClient,
    KubeError,
    LeaseRecord,
    NotFound,
    ObjectRef,
    PodRecord,
    Retryable,
    RetryPolicy,
    WatchEvent,
    node_record,
    pod_record,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.fakes.pytest_fixtures import apiserver  # noqa: F401 - fixture

FAST = RetryPolicy(
    attempts=3, initial_backoff_seconds=0.001, max_backoff_seconds=0.01, timeout_seconds=2.0
)


class SleepRecorder:
    """Stands in for time.sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def kube(apiserver: FakeApiServer, sleeps: SleepRecorder) -> Iterator[KubeClient]:  # noqa: F811
    with KubeClient(apiserver.api_client(), FAST, sleep=sleeps, rng=random.Random(7)) as client:
        yield client


def _client(server: FakeApiServer, policy: RetryPolicy) -> KubeClient:
    return KubeClient(server.api_client(), policy, sleep=SleepRecorder())


# --- nodes ------------------------------------------------------------------------------------


def test_get_node_returns_metadata_and_allocatable(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    stored = apiserver.add_node(
        "gpu-1",
        annotations={"hami.io/node-handshake": "Requesting_2024-05-10 08:01:02"},
        labels={"gpu": "on"},
        allocatable={"nvidia.com/gpu": "20", "cpu": "8"},
    )

    node = kube.get_node("gpu-1")

    assert node.name == "gpu-1"
    assert node.annotations == {"hami.io/node-handshake": "Requesting_2024-05-10 08:01:02"}
    assert node.labels == {"gpu": "on"}
    assert node.allocatable == {"nvidia.com/gpu": "20", "cpu": "8"}
    assert node.resource_version == stored["metadata"]["resourceVersion"]
    [request] = apiserver.requests
    assert (request.method, request.path) == ("GET", "/api/v1/nodes/gpu-1")
    assert request.headers["accept"] == "application/json"
    assert request.headers["authorization"] == "Bearer fake-token"


def test_get_missing_node_is_not_found_and_not_retried(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    with pytest.raises(NotFound, match=r"get node ghost: HTTP 404: nodes \"ghost\" not found") as e:
        kube.get_node("ghost")

    assert e.value.status == 404
    assert isinstance(e.value.__cause__, ApiException)
    assert len(apiserver.requests) == 1
    assert sleeps.waits == []


def test_patch_node_annotations_sends_json_merge_patch_and_null_deletes(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1", annotations={"keep": "1", "drop": "2"})
    before = kube.get_node("gpu-1")

    after = kube.patch_node_annotations(
        "gpu-1", {"drop": None, "hami.io/mutex.lock": "2024-05-10T08:01:02Z,default,p"}
    )

    assert after.annotations == {
        "keep": "1",
        "hami.io/mutex.lock": "2024-05-10T08:01:02Z,default,p",
    }
    assert int(after.resource_version) > int(before.resource_version)
    stored = apiserver.get_node("gpu-1")
    assert stored is not None
    assert stored["metadata"]["annotations"] == after.annotations
    patch = apiserver.requests_matching("PATCH")[0]
    assert patch.content_type == "application/merge-patch+json"
    assert patch.json() == {
        "metadata": {
            "annotations": {"drop": None, "hami.io/mutex.lock": "2024-05-10T08:01:02Z,default,p"}
        }
    }


def test_patch_node_with_current_resource_version_applies(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1")
    node = kube.get_node("gpu-1")

    after = kube.patch_node_annotations("gpu-1", {"a": "b"}, resource_version=node.resource_version)

    assert after.annotations == {"a": "b"}
    body = apiserver.requests_matching("PATCH")[0].json()
    assert body["metadata"]["resourceVersion"] == node.resource_version


def test_patch_node_with_stale_resource_version_is_conflict_and_not_retried(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1")
    stale = kube.get_node("gpu-1")
    apiserver.update_object(
        "nodes", "", "gpu-1", lambda n: n["metadata"]["annotations"].update(other="writer")
    )

    with pytest.raises(Conflict, match="patch node gpu-1 annotations: HTTP 409") as e:
        kube.patch_node_annotations("gpu-1", {"a": "b"}, resource_version=stale.resource_version)

    assert "the object has been modified" in str(e.value)
    assert len(apiserver.requests_matching("PATCH")) == 1
    stored = apiserver.get_node("gpu-1")
    assert stored is not None
    assert stored["metadata"]["annotations"] == {"other": "writer"}


# --- pods -------------------------------------------------------------------------------------


def test_get_pod_reads_containers_env_and_timestamps(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    pod = make_pod(
        "trainer",
        "ml",
        node_name="gpu-1",
        phase="Running",
        annotations={"hami.io/bind-phase": "allocating"},
        labels={"app": "trainer"},
        init_containers=[make_container("setup", env={"STAGE": "init"})],
        containers=[make_container("main", env={"CUDA_DISABLE_CONTROL": "true"})],
    )
    pod["spec"]["containers"][0]["env"].append(
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    )
    pod["metadata"]["creationTimestamp"] = "2024-05-10T08:01:02Z"
    stored = apiserver.add_pod(pod)

    record = kube.get_pod("ml", "trainer")

    assert record.namespace == "ml"
    assert record.name == "trainer"
    assert record.uid == stored["metadata"]["uid"]
    assert record.phase == "Running"
    assert record.node_name == "gpu-1"
    assert record.annotations == {"hami.io/bind-phase": "allocating"}
    assert record.labels == {"app": "trainer"}
    assert record.init_containers == (ContainerSpec("setup", {"STAGE": "init"}),)
    assert record.containers == (ContainerSpec("main", {"CUDA_DISABLE_CONTROL": "true"}),)
    assert record.resource_version == stored["metadata"]["resourceVersion"]
    assert record.creation_timestamp == datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC)


def test_list_pods_on_node_uses_field_selector_across_namespaces(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("a", "default", node_name="gpu-1")
    apiserver.add_pod("b", "ml", node_name="gpu-1")
    apiserver.add_pod("c", "default", node_name="gpu-2")
    apiserver.add_pod("d", "default")

    pods = kube.list_pods_on_node("gpu-1")

    assert sorted((p.namespace, p.name) for p in pods) == [("default", "a"), ("ml", "b")]
    [request] = apiserver.requests
    assert request.path == "/api/v1/pods"
    assert request.query["fieldSelector"] == ["spec.nodeName=gpu-1"]


def test_list_pods_on_empty_node_is_empty(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("a", node_name="gpu-2")

    assert kube.list_pods_on_node("gpu-1") == []


def test_patch_pod_metadata_merges_annotations_and_labels(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod(
        "p",
        annotations={"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,1000,30:;", "x": "1"},
        labels={"hami.io/vgpu-node": "gpu-1", "app": "p"},
    )

    record = kube.patch_pod_metadata(
        "default",
        "p",
        {"hami.io/vgpu-devices-to-allocate": ";", "hami.io/bind-phase": "success"},
        labels={"hami.io/vgpu-node": None},
    )

    assert record.annotations == {
        "hami.io/vgpu-devices-to-allocate": ";",
        "hami.io/bind-phase": "success",
        "x": "1",
    }
    assert record.labels == {"app": "p"}
    patch = apiserver.requests_matching("PATCH")[0]
    assert patch.path == "/api/v1/namespaces/default/pods/p"
    assert patch.content_type == "application/merge-patch+json"


def test_patch_missing_pod_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(NotFound, match="patch pod default/ghost metadata"):
        kube.patch_pod_metadata("default", "ghost", {"a": "b"})


# --- events -----------------------------------------------------------------------------------


def test_create_pod_event_records_core_v1_event(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", "ml")
    pod = kube.get_pod("ml", "p")

    kube.create_pod_event(pod, "AllocateFailed", "device number not matched", "Warning")

    [event] = apiserver.events("ml")
    assert event["reason"] == "AllocateFailed"
    assert event["message"] == "device number not matched"
    assert event["type"] == "Warning"
    assert event["source"] == {"component": "hami-device-plugin"}
    assert event["count"] == 1
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p",
        "uid": pod.uid,
        "resourceVersion": pod.resource_version,
    }
    assert event["metadata"]["name"].startswith("p.")
    post = apiserver.requests_matching("POST")[0]
    assert post.path == "/api/v1/namespaces/ml/events"
    assert post.content_type == "application/json"


def test_create_pod_event_stamps_whole_seconds_and_omits_unknown_uid(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    pod = PodRecord(
        namespace="ml",
        name="p",
        uid="",
        phase="",
        node_name="",
        annotations={},
        labels={},
        init_containers=(),
        containers=(),
        resource_version="",
        creation_timestamp=None,
    )
    before = datetime.now(UTC).replace(microsecond=0)

    kube.create_pod_event(pod, "R", "m")

    [event] = apiserver.events("ml")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p",
    }
    assert re.fullmatch(r"p\.[0-9a-f]+", event["metadata"]["name"])
    stamp = event["firstTimestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    assert event["lastTimestamp"] == stamp
    assert before <= datetime.fromisoformat(stamp) <= datetime.now(UTC)


def test_create_pod_event_failure_is_logged_not_raised(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_pod("p")
    pod = kube.get_pod("default", "p")
    apiserver.inject_fault("POST", r".*/events", status=500, times=None)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_pod_event(pod, "BindingFailed", "boom")

    assert apiserver.events() == []
    assert len(apiserver.requests_matching("POST")) == FAST.attempts
    [line] = caplog.records
    assert "event not recorded" in line.getMessage()
    assert "create event BindingFailed for pod default/p" in line.getMessage()


def test_create_pod_event_already_exists_counts_as_done(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_pod("p")
    pod = kube.get_pod("default", "p")
    apiserver.inject_fault("POST", r".*/events", status=409)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_pod_event(pod, "R", "m")

    assert caplog.records == []


# --- retries, timeouts, translation -----------------------------------------------------------


def test_two_server_errors_then_success_is_retried(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1", annotations={"a": "1"})
    fault = apiserver.inject_fault("GET", r"/api/v1/nodes/gpu-1", status=500, times=2)

    node = kube.get_node("gpu-1")

    assert node.annotations == {"a": "1"}
    assert fault.fired == 2
    assert len(apiserver.requests) == 3
    assert len(sleeps.waits) == 2
    # exponential backoff with jitter: retry k waits within [b/2, b], b = min(0.001*2^(k-1), max)
    assert 0.0005 <= sleeps.waits[0] <= 0.001
    assert 0.001 <= sleeps.waits[1] <= 0.002


def test_service_unavailable_forever_gives_up_as_retryable(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault(".*", ".*", status=503, times=None)

    with pytest.raises(
        Retryable, match=r"get node gpu-1: HTTP 503: .*gave up after 3 attempts"
    ) as e:
        kube.get_node("gpu-1")

    assert e.value.status == 503
    assert isinstance(e.value.__cause__, ApiException)
    assert len(apiserver.requests) == 3
    assert len(sleeps.waits) == 2


def test_too_many_requests_honours_retry_after(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=429, headers={"Retry-After": "0.005"})

    kube.get_node("gpu-1")

    assert sleeps.waits == [0.005]


def test_retry_after_is_capped_by_max_backoff(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=429, headers={"Retry-After": "120"})

    kube.get_node("gpu-1")

    assert sleeps.waits == [FAST.max_backoff_seconds]


@pytest.mark.parametrize("status", [400, 403, 422])
def test_client_errors_are_permanent(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    status: int,
) -> None:
    apiserver.add_pod("p")
    apiserver.inject_fault("PATCH", ".*", status=status, times=None)

    with pytest.raises(KubeError) as e:
        kube.patch_pod_metadata("default", "p", {"a": "b"})

    assert type(e.value) is KubeError
    assert e.value.status == status
    assert f"patch pod default/p metadata: HTTP {status}: injected fault" in str(e.value)
    assert len(apiserver.requests) == 1


def test_hanging_server_times_out_as_retryable(apiserver: FakeApiServer) -> None:  # noqa: F811
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", hang_seconds=30, times=None)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with (
        _client(apiserver, policy) as kube,
        pytest.raises(
            Retryable, match=r"get node gpu-1: timed out .*gave up after 2 attempts"
        ) as e,
    ):
        kube.get_node("gpu-1")

    assert isinstance(e.value.__cause__, urllib3.exceptions.HTTPError)
    # urllib3's own retries are off: one request per attempt, not four.
    assert len(apiserver.requests) == 2


def test_one_slow_answer_then_success(apiserver: FakeApiServer) -> None:  # noqa: F811
    apiserver.add_node("gpu-1", annotations={"a": "1"})
    apiserver.inject_fault("GET", ".*", hang_seconds=30)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with _client(apiserver, policy) as kube:
        assert kube.get_node("gpu-1").annotations == {"a": "1"}


def test_dropped_connection_is_retried(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", node_name="gpu-1")
    apiserver.inject_fault("GET", ".*", disconnect=True)

    assert [p.name for p in kube.list_pods_on_node("gpu-1")] == ["p"]
    assert len(apiserver.requests) == 2


def test_connection_refused_is_retryable() -> None:
    with FakeApiServer() as server:
        api_client = server.api_client()
    # The server is gone and its port closed.
    with (
        KubeClient(api_client, FAST, sleep=SleepRecorder()) as kube,
        pytest.raises(Retryable, match=r"get node gpu-1: connection failed: .*gave up after 3"),
    ):
        kube.get_node("gpu-1")


def test_malformed_json_is_a_kube_error_not_retried(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body=b'{"metadata": {"name": ')

    with pytest.raises(KubeError, match="get node gpu-1: malformed response") as e:
        kube.get_node("gpu-1")

    assert type(e.value) is KubeError
    assert isinstance(e.value.__cause__, ValueError)
    assert len(apiserver.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"metadata": {"annotations": ["not", "a", "map"]}}',
        b'{"metadata": {"annotations": {"k": 1}}}',
        b'{"metadata": {"name": "p", "creationTimestamp": "yesterday"}}',
        b'{"spec": {"containers": [{"name": "c", "env": [{"value": "no name"}]}]}}',
        b'{"spec": {"containers": "c"}}',
    ],
)
def test_wrong_shapes_are_kube_errors(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    body: bytes,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body=body)

    with pytest.raises(KubeError, match="get pod default/p: malformed response"):
        kube.get_pod("default", "p")


def test_malformed_list_item_is_a_kube_error(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body={"kind": "PodList", "items": ["x"]})

    with pytest.raises(KubeError, match="list pods on node gpu-1: malformed response"):
        kube.list_pods_on_node("gpu-1")


def test_server_error_with_garbage_body_is_still_retryable(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=502, body=b"<html>bad gateway</html>", times=None)

    with pytest.raises(Retryable, match=r"HTTP 502: <html>bad gateway</html>"):
        kube.get_node("gpu-1")


def test_concurrent_calls_share_one_client(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    names = [f"p{i}" for i in range(8)]
    for name in names:
        apiserver.add_pod(name, node_name="gpu-1")
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            for round_ in range(5):
                kube.patch_pod_metadata("default", name, {"round": str(round_)})
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert {p.annotations["round"] for p in kube.list_pods_on_node("gpu-1")} == {"4"}


# --- list -------------------------------------------------------------------------------------


def test_list_objects_follows_continue_page_by_page(
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("a", "ml", node_name="gpu-1")
    apiserver.add_pod("b", "ml")
    apiserver.add_pod("c", "default", node_name="gpu-1")

    listed = kube.list_objects(
        "/api/v1/namespaces/ml/pods", field_selector="spec.nodeName=gpu-1", page_size=0
    )

    assert [pod_record(p).name for p in listed.items] == ["a"]
    assert "limit" not in apiserver.requests[0].query


# --- watch ------------------------------------------------------------------------------------


def test_watch_objects_yields_the_events_after_the_version_in_order(
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", status=410)

    with pytest.raises(Gone):
        list(kube.watch_objects("/api/v1/pods", "5"))

    assert len(apiserver.requests) == 1


def test_watch_error_event_with_a_server_error_is_retryable(
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
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
    apiserver: FakeApiServer,  # noqa: F811
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", hang_seconds=30, times=None)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with _client(apiserver, policy) as kube, pytest.raises(Retryable, match="timed out"):
        # The read timeout for events is long; the wait for the headers is the call's timeout.
        list(kube.watch_objects("/api/v1/pods", "1", read_timeout_seconds=300))


def test_malformed_watch_line_is_a_kube_error(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", query=".*watch=true.*", status=200, body=b"{not json\n")

    with pytest.raises(KubeError, match=r"watch /api/v1/pods .*malformed response") as e:
        list(kube.watch_objects("/api/v1/pods", "1"))

    assert type(e.value) is KubeError


def test_a_watch_line_that_never_ends_is_a_kube_error(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("hami_plugin.kube.client._MAX_WATCH_LINE_BYTES", 100)
    apiserver.inject_fault("GET", query=".*watch=true.*", status=200, body=b"x" * 500)

    with pytest.raises(KubeError, match="an event longer than 100 bytes"):
        list(kube.watch_objects("/api/v1/pods", "1"))


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


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
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0"))
    _wait_for(lambda: apiserver.watch_count == 1, "the watch")
    apiserver.add_pod("p")
    _wait_for(lambda: len(consumer.events) == 1, "the ADDED event")

    apiserver.drop_watches()
    consumer.join()

    assert consumer.error is None
    assert [e.type for e in consumer.events] == ["ADDED"]


def test_silent_watch_ends_after_the_read_timeout(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    # No bookmarks within the read timeout: the connection counts as dead.
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0", read_timeout_seconds=0.3))

    consumer.join()

    assert consumer.error is None
    assert consumer.events == []


def test_stop_wakes_a_watch_blocked_in_a_read(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    stop = threading.Event()
    consumer = _Consumer(kube.watch_objects("/api/v1/pods", "0", stop=stop))
    _wait_for(lambda: apiserver.watch_count == 1, "the watch")

    stop.set()
    consumer.join()

    assert consumer.error is None
    _wait_for(lambda: apiserver.watch_count == 0, "the server to see the watch closed")
    # The connection was closed, not put back half-read: the client still works.
    apiserver.add_node("n")
    assert kube.get_node("n").name == "n"


def test_watch_event_resource_version_of_odd_objects() -> None:
    assert WatchEvent("ADDED", {}).resource_version == ""
    assert WatchEvent("ADDED", {"metadata": "x"}).resource_version == ""
    assert WatchEvent("ADDED", {"metadata": {"resourceVersion": 5}}).resource_version == ""


# --- binding ----------------------------------------------------------------------------------


def test_bind_pod_posts_a_binding(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    pod = apiserver.add_pod("p", "ml")

    kube.bind_pod("ml", "p", pod["metadata"]["uid"], "gpu-1")

    assert kube.get_pod("ml", "p").node_name == "gpu-1"
    post = apiserver.requests_matching("POST")[0]
    assert post.path == "/api/v1/namespaces/ml/pods/p/binding"
    assert post.json() == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "ml", "uid": pod["metadata"]["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }


def test_bind_pod_bound_elsewhere_is_conflict(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", node_name="gpu-2")

    with pytest.raises(Conflict, match=r'bind pod default/p to node gpu-1: HTTP 409: .*"gpu-2"'):
        kube.bind_pod("default", "p", "", "gpu-1")


def test_bind_pod_already_bound_to_that_node_counts_as_done(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    # What a retry sees when the first attempt was applied but its answer lost.
    pod = apiserver.add_pod("p", node_name="gpu-1")

    kube.bind_pod("default", "p", pod["metadata"]["uid"], "gpu-1")

    assert [r.method for r in apiserver.requests] == ["POST", "GET"]


def test_bind_pod_of_another_uid_is_conflict(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p")

    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: old-uid"):
        kube.bind_pod("default", "p", "old-uid", "gpu-1")

    assert kube.get_pod("default", "p").node_name == ""


def test_bind_missing_pod_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(NotFound):
        kube.bind_pod("default", "ghost", "", "gpu-1")


# --- leases -----------------------------------------------------------------------------------

_ACQUIRED = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _lease(**changes: object) -> LeaseRecord:
    record = LeaseRecord(
        namespace="kube-system",
        name="hami-scheduler",
        holder_identity="replica-a",
        lease_duration_seconds=15,
        acquire_time=_ACQUIRED,
        renew_time=_ACQUIRED,
        lease_transitions=0,
    )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def test_create_lease_writes_micro_times_and_reads_them_back(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    created = kube.create_lease(_lease(renew_time=datetime(2026, 11, 30, 12, 0, 1, 250000, UTC)))

    post = apiserver.requests_matching("POST")[0]
    assert post.path == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    assert post.json() == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hami-scheduler", "namespace": "kube-system"},
        "spec": {
            "holderIdentity": "replica-a",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 0,
            "acquireTime": "2026-11-30T12:00:00.000000Z",
            "renewTime": "2026-11-30T12:00:01.250000Z",
        },
    }
    assert created.resource_version == str(apiserver.resource_version)
    assert created == _lease(
        renew_time=datetime(2026, 11, 30, 12, 0, 1, 250000, UTC),
        resource_version=created.resource_version,
    )
    assert kube.get_lease("kube-system", "hami-scheduler") == created


def test_lease_update_needs_the_current_version(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    created = kube.create_lease(_lease())
    later = _ACQUIRED.replace(second=5)

    renewed = kube.update_lease(dataclasses.replace(created, renew_time=later))
    with pytest.raises(Conflict, match="update lease kube-system/hami-scheduler: HTTP 409"):
        # A second replica still holding the version it read before the renewal.
        kube.update_lease(dataclasses.replace(created, holder_identity="replica-b"))

    assert int(renewed.resource_version) > int(created.resource_version)
    assert renewed.renew_time == later
    assert kube.get_lease("kube-system", "hami-scheduler").holder_identity == "replica-a"
    put = apiserver.requests_matching("PUT")[0]
    assert put.path == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/hami-scheduler"
    assert put.json()["metadata"]["resourceVersion"] == created.resource_version


def test_lease_create_twice_is_conflict_and_missing_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(NotFound, match="get lease kube-system/hami-scheduler"):
        kube.get_lease("kube-system", "hami-scheduler")
    kube.create_lease(_lease())

    with pytest.raises(Conflict, match="create lease kube-system/hami-scheduler: HTTP 409"):
        kube.create_lease(_lease(holder_identity="replica-b"))


def test_update_lease_without_a_version_is_a_programming_error(kube: KubeClient) -> None:
    with pytest.raises(ValueError, match="no resource_version"):
        kube.update_lease(_lease())


def test_released_lease_reads_as_empty_fields(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_object(
        {
            "kind": "Lease",
            "metadata": {"name": "l", "namespace": "ns"},
            "spec": {"holderIdentity": None, "renewTime": "2026-11-30T12:00:00.123456Z"},
        }
    )

    lease = kube.get_lease("ns", "l")

    assert (lease.holder_identity, lease.lease_duration_seconds, lease.acquire_time) == (
        "",
        0,
        None,
    )
    assert lease.renew_time == datetime(2026, 11, 30, 12, 0, 0, 123456, UTC)


# --- events and preconditions -----------------------------------------------------------------


def test_create_event_about_a_node_goes_to_the_default_namespace(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    kube.create_event(ObjectRef("Node", "", "gpu-1", uid="u1"), "NodeLockReleased", "stale lock")

    [event] = apiserver.events("default")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
        "uid": "u1",
    }
    assert event["source"] == {"component": "hami-scheduler"}
    assert event["type"] == "Normal"
    assert re.fullmatch(r"gpu-1\.[0-9a-f]+", event["metadata"]["name"])


def test_create_event_failure_names_the_object(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.inject_fault("POST", r".*/events", status=403)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_event(ObjectRef("Pod", "ml", "p"), "R", "m", "Warning")

    [line] = caplog.records
    assert "create event R for pod ml/p: HTTP 403" in line.getMessage()


def test_patch_pod_metadata_with_a_stale_version_is_conflict(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p")
    seen = kube.get_pod("default", "p")
    fresh = kube.patch_pod_metadata(
        "default", "p", {"a": "1"}, resource_version=seen.resource_version
    )

    with pytest.raises(Conflict):
        kube.patch_pod_metadata("default", "p", {"a": "2"}, resource_version=seen.resource_version)

    assert kube.get_pod("default", "p").annotations == {"a": "1"}
    assert fresh.annotations == {"a": "1"}


def test_public_decoders_read_list_items_and_reject_wrong_shapes(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1", allocatable={"nvidia.com/gpu": "10"})

    [item] = kube.list_objects("/api/v1/nodes").items

    assert "kind" not in item  # list items come without kind, and still decode
    assert node_record(item).allocatable == {"nvidia.com/gpu": "10"}
    with pytest.raises(ValueError, match="annotations"):
        node_record({"metadata": {"annotations": []}})
    with pytest.raises(ValueError, match="containers"):
        pod_record({"spec": {"containers": {}}})


# --- configuration ----------------------------------------------------------------------------


def test_from_config_with_kubeconfig_file(
    apiserver: FakeApiServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    apiserver.add_node("gpu-1")
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig", token="s3cret")

    with KubeClient.from_config(str(path), FAST) as kube:
        assert kube.get_node("gpu-1").name == "gpu-1"

    assert apiserver.requests[0].headers["authorization"] == "Bearer s3cret"


def test_from_config_reads_kubeconfig_env(
    apiserver: FakeApiServer,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    apiserver.add_node("gpu-1")
    monkeypatch.setenv("KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kc")))

    with KubeClient.from_config(retry=FAST) as kube:
        assert kube.get_node("gpu-1").name == "gpu-1"


def test_bearer_token_is_read_from_the_configuration_again_on_a_later_attempt(
    apiserver: FakeApiServer,  # noqa: F811
) -> None:
    # The in-cluster loader rotates the service-account token through this hook (run at most
    # once a second: this clock moves 2 s per reading).
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=503)
    tokens = iter(["first", "second"])

    def refresh(configuration: Configuration) -> None:
        configuration.api_key["BearerToken"] = next(tokens)

    configuration = apiserver.configuration()
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    # The library annotates the hook as None only.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]

    clock = itertools.count(0.0, 2.0).__next__
    with KubeClient(ApiClient(configuration), FAST, sleep=SleepRecorder(), clock=clock) as kube:
        kube.get_node("gpu-1")

    assert [r.headers["authorization"] for r in apiserver.requests] == [
        "Bearer first",
        "Bearer second",
    ]


def test_from_config_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"

    with pytest.raises(
        KubeError, match=f"cannot load Kubernetes configuration from kubeconfig .*{missing}"
    ):
        KubeClient.from_config(str(missing))


@pytest.mark.parametrize(
    "text",
    ["a: [b\n", "apiVersion: v1\nkind: Config\n", "- 1\n- 2\n"],
    ids=["yaml", "empty", "list"],
)
def test_from_config_broken_file_is_a_kube_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)

    with pytest.raises(KubeError, match="cannot load Kubernetes configuration from kubeconfig"):
        KubeClient.from_config(str(path))


def test_from_config_without_any_config_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)

    with pytest.raises(KubeError, match="in-cluster config"):
        KubeClient.from_config()


# --- what gets loaded -------------------------------------------------------------------------

_GENERATED_MODULES_PROBE = """
import json, sys
def generated():
    return sorted(
        m for m in sys.modules
        if m.startswith(("kubernetes.client.api.", "kubernetes.client.models."))
    )
import hami_plugin.kube.client as k8s
after_import = generated()
with k8s.KubeClient.from_config(sys.argv[1], k8s.RetryPolicy(attempts=1)) as kube:
    node = kube.get_node("gpu-1")
    kube.patch_node_annotations("gpu-1", {"a": "b"}, resource_version=node.resource_version)
    pod = kube.get_pod("default", "p")
    kube.list_pods_on_node("gpu-1")
    kube.patch_pod_metadata("default", "p", {"a": None}, labels={"l": "v"})
    kube.create_pod_event(pod, "R", "m")
    try:
        kube.get_pod("default", "ghost")
    except k8s.NotFound:
        pass
    listed = kube.list_objects("/api/v1/pods", page_size=1)
    for _ in kube.watch_objects("/api/v1/pods", listed.resource_version, timeout_seconds=1):
        pass
    kube.bind_pod("default", "q", "", "gpu-1")
    lease = kube.create_lease(k8s.LeaseRecord("ns", "l", "me", 15, None, None, 0))
    kube.update_lease(lease)
    kube.get_lease("ns", "l")
    kube.create_event(k8s.ObjectRef("Node", "", "gpu-1"), "R", "m")
print(json.dumps({"after_import": after_import, "after_calls": generated()}))
"""


def test_generated_api_and_models_are_never_imported(
    apiserver: FakeApiServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    # CoreV1Api alone costs ~20 MiB of daemon memory (pydantic validate_call on ~400 methods and
    # ~250 model modules). A fresh interpreter, so other tests' imports don't count.
    apiserver.add_node("gpu-1")
    apiserver.add_pod("p", node_name="gpu-1")
    apiserver.add_pod("q")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")

    result = subprocess.run(
        [sys.executable, "-c", _GENERATED_MODULES_PROBE, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "kubernetes.client.api.core_v1_api" not in loaded["after_import"]
    assert loaded == {"after_import": [], "after_calls": []}
    assert len(apiserver.events()) == 2  # the probe did make every call
    assert apiserver.get_lease("ns", "l") is not None


# --- policy -----------------------------------------------------------------------------------


@given(
    retry=st.integers(min_value=1, max_value=40),
    initial=st.floats(min_value=0, max_value=5),
    maximum=st.floats(min_value=0, max_value=30),
    seed=st.integers(),
)
def test_backoff_is_jittered_exponential_and_capped(
    retry: int, initial: float, maximum: float, seed: int
) -> None:
    policy = RetryPolicy(initial_backoff_seconds=initial, max_backoff_seconds=maximum)
    ceiling = min(initial * 2 ** (retry - 1), maximum)

    wait = policy.backoff_seconds(retry, random.Random(seed))

    assert ceiling / 2 <= wait <= ceiling
    assert wait <= maximum


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"timeout_seconds": 0}, {"initial_backoff_seconds": -1}],
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_token_refresh_hook_runs_at_most_once_a_second(
    apiserver: FakeApiServer,  # noqa: F811
) -> None:
    # The kubeconfig loader's hook re-applies the whole configuration before every request;
    # a busy scheduler makes hundreds a second. Rotated tokens still reach requests in 1 s.
    apiserver.add_node("n1")
    api_client = apiserver.api_client()
    calls: list[float] = []
    api_client.configuration.refresh_api_key_hook = lambda configuration: calls.append(now[0])
    now = [100.0]
    with KubeClient(api_client, FAST, clock=lambda: now[0]) as client:
        for _ in range(5):
            client.get_node("n1")
        assert calls == [100.0]
        now[0] = 100.5
        client.get_node("n1")
        assert calls == [100.0]
        now[0] = 101.2
        client.get_node("n1")
        assert calls == [100.0, 101.2]


def test_a_refresh_hook_that_reinstalls_itself_stays_throttled(tmp_path: Path) -> None:
    # kubeconfig's loader: its hook re-applies the configuration, hook included, every time.
    with FakeApiServer() as server:
        server.add_node("n1")
        client_calls: list[int] = []
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        with KubeClient.from_config(str(kubeconfig), FAST) as kube:
            configuration = kube._api_client.configuration
            hook = configuration.refresh_api_key_hook
            assert hook is not None
            for _ in range(20):
                kube.get_node("n1")
                client_calls.append(id(configuration.refresh_api_key_hook))
            # still our throttle after the loader's hook ran and re-installed itself
            assert set(client_calls) == {id(hook)}
