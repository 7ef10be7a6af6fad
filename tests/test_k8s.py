"""hami_plugin.k8s against the HTTP API server double, through the real kubernetes client."""

from __future__ import annotations

import json
import logging
import random
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException

from hami_plugin.k8s import (
    Conflict,
    ContainerSpec,
    KubeClient,
    KubeError,
    NotFound,
    PodRecord,
    Retryable,
    RetryPolicy,
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

    with caplog.at_level(logging.WARNING, logger="hami_plugin.k8s"):
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

    with caplog.at_level(logging.WARNING, logger="hami_plugin.k8s"):
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


def test_bearer_token_is_read_from_the_configuration_on_every_attempt(
    apiserver: FakeApiServer,  # noqa: F811
) -> None:
    # The in-cluster loader rotates the service-account token through this hook.
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=503)
    tokens = iter(["first", "second"])

    def refresh(configuration: Configuration) -> None:
        configuration.api_key["BearerToken"] = next(tokens)

    configuration = apiserver.configuration()
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    # The library annotates the hook as None only.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]

    with KubeClient(ApiClient(configuration), FAST, sleep=SleepRecorder()) as kube:
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
import hami_plugin.k8s as k8s
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
    assert len(apiserver.events()) == 1  # the probe did make every call


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
