"""hami_plugin.kube.client against the HTTP API server double, through the real kubernetes
client: each call's request and answer."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from hami_plugin.clock import ManualClock
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Conflict, NotFound
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.records import LeaseRecord, ObjectRef
from hami_plugin.protocol.objects import ContainerSpec, PodInfo, read_node
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.kube.support import FAST, SleepRecorder

# --- nodes ------------------------------------------------------------------------------------


def test_get_node_returns_metadata_and_allocatable(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1")
    node = kube.get_node("gpu-1")

    after = kube.patch_node_annotations("gpu-1", {"a": "b"}, resource_version=node.resource_version)

    assert after.annotations == {"a": "b"}
    body = apiserver.requests_matching("PATCH")[0].json()
    assert body["metadata"]["resourceVersion"] == node.resource_version


def test_patch_node_with_stale_resource_version_is_conflict_and_not_retried(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    assert record.init_containers == (ContainerSpec("setup", env={"STAGE": "init"}),)
    assert record.containers == (ContainerSpec("main", env={"CUDA_DISABLE_CONTROL": "true"}),)
    assert record.resource_version == stored["metadata"]["resourceVersion"]
    assert record.creation_timestamp == datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC)


def test_list_pods_on_node_uses_field_selector_across_namespaces(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("a", node_name="gpu-2")

    assert kube.list_pods_on_node("gpu-1") == []


def test_one_unreadable_pod_leaves_the_others_listed_and_is_logged_once_per_version(
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod `read_pod` refuses (an env entry without a name) used to fail the whole list,
    so the device plugin saw none of its node's pods; now it is skipped with one warning per
    version of it, however often the node is listed."""
    apiserver.add_pod("good", node_name="gpu-1")
    bad = make_pod("bad", "ml", node_name="gpu-1")
    bad["spec"]["containers"][0]["env"] = [{"value": "no name"}]
    apiserver.add_pod(bad)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        assert [pod.name for pod in kube.list_pods_on_node("gpu-1")] == ["good"]
        assert [pod.name for pod in kube.list_pods_on_node("gpu-1")] == ["good"]
        [first] = caplog.records
        assert "skipping pod ml/bad" in first.getMessage()
        assert "env[0] must be an object with a name" in first.getMessage()

        apiserver.update_object(
            "pods", "ml", "bad", lambda pod: pod["metadata"].update(labels={"changed": "yes"})
        )
        kube.list_pods_on_node("gpu-1")
        kube.list_pods_on_node("gpu-1")
        assert len(caplog.records) == 2  # the new version, once

        apiserver.delete_pod("ml", "bad")
        assert [pod.name for pod in kube.list_pods_on_node("gpu-1")] == ["good"]
    assert len(caplog.records) == 2
    assert kube._unreadable == {}  # only the pods of the latest list are remembered


def test_patch_pod_metadata_merges_annotations_and_labels(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", "ml")
    pod = kube.get_pod("ml", "p")

    kube.create_pod_event(
        PodEvent.of_pod(pod, "AllocateFailed", "device number not matched", "Warning")
    )

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
    apiserver: FakeApiServer,
) -> None:
    pod = PodInfo(namespace="ml", name="p")
    clock = ManualClock(datetime(2026, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC))

    with KubeClient(apiserver.api_client(), FAST, clock=clock) as kube:
        kube.create_pod_event(PodEvent.of_pod(pod, "R", "m", "Normal"))

    [event] = apiserver.events("ml")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p",
    }
    assert re.fullmatch(r"p\.[0-9a-f]+", event["metadata"]["name"])
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-03-04T05:06:07Z"


def test_create_pod_event_failure_is_logged_not_raised(
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_pod("p")
    pod = kube.get_pod("default", "p")
    apiserver.inject_fault("POST", r".*/events", status=500, times=None)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_pod_event(PodEvent.of_pod(pod, "BindingFailed", "boom", "Normal"))

    assert apiserver.events() == []
    assert len(apiserver.requests_matching("POST")) == FAST.attempts
    [line] = caplog.records
    assert "event not recorded" in line.getMessage()
    assert "create event BindingFailed for pod default/p" in line.getMessage()


def test_create_pod_event_already_exists_counts_as_done(
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_pod("p")
    pod = kube.get_pod("default", "p")
    apiserver.inject_fault("POST", r".*/events", status=409)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_pod_event(PodEvent.of_pod(pod, "R", "m", "Normal"))

    assert caplog.records == []


# --- binding ----------------------------------------------------------------------------------


def test_bind_pod_posts_a_binding(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", node_name="gpu-2")

    with pytest.raises(Conflict, match=r'bind pod default/p to node gpu-1: HTTP 409: .*"gpu-2"'):
        kube.bind_pod("default", "p", "", "gpu-1")


def test_bind_pod_already_bound_to_that_node_counts_as_done(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    # What a retry sees when the first attempt was applied but its answer lost.
    pod = apiserver.add_pod("p", node_name="gpu-1")

    kube.bind_pod("default", "p", pod["metadata"]["uid"], "gpu-1")

    assert [r.method for r in apiserver.requests] == ["POST", "GET"]


def test_bind_pod_of_another_uid_is_conflict(
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
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
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.inject_fault("POST", r".*/events", status=403)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.client"):
        kube.create_event(ObjectRef("Pod", "ml", "p"), "R", "m", "Warning")

    [line] = caplog.records
    assert "create event R for pod ml/p: HTTP 403" in line.getMessage()


def test_patch_pod_metadata_with_a_stale_version_is_conflict(
    apiserver: FakeApiServer,
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


def test_list_items_come_without_kind_and_still_decode(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_node("gpu-1", allocatable={"nvidia.com/gpu": "10"})

    [item] = kube.list_objects("/api/v1/nodes").items

    assert "kind" not in item
    assert read_node(item).allocatable == {"nvidia.com/gpu": "10"}


# --- what gets loaded -------------------------------------------------------------------------

_GENERATED_MODULES_PROBE = """
import json, sys
def generated():
    return sorted(
        m for m in sys.modules
        if m.startswith(("kubernetes.client.api.", "kubernetes.client.models."))
    )
from hami_plugin.kube import client, errors, events, records, retry
after_import = generated()
with client.KubeClient.from_config(sys.argv[1], retry.RetryPolicy(attempts=1)) as kube:
    node = kube.get_node("gpu-1")
    kube.patch_node_annotations("gpu-1", {"a": "b"}, resource_version=node.resource_version)
    pod = kube.get_pod("default", "p")
    kube.list_pods_on_node("gpu-1")
    kube.patch_pod_metadata("default", "p", {"a": None}, labels={"l": "v"})
    kube.create_pod_event(events.PodEvent.of_pod(pod, "R", "m", "Normal"))
    try:
        kube.get_pod("default", "ghost")
    except errors.NotFound:
        pass
    listed = kube.list_objects("/api/v1/pods", page_size=1)
    for _ in kube.watch_objects("/api/v1/pods", listed.resource_version, timeout_seconds=1):
        pass
    kube.bind_pod("default", "q", "", "gpu-1")
    lease = kube.create_lease(records.LeaseRecord("ns", "l", "me", 15, None, None, 0))
    kube.update_lease(lease)
    kube.get_lease("ns", "l")
    kube.create_event(records.ObjectRef("Node", "", "gpu-1"), "R", "m")
unused = sorted(
    m for m in sys.modules
    if m.split(".")[:2] in (
        ["kubernetes", "dynamic"], ["kubernetes", "stream"], ["kubernetes", "watch"],
        ["kubernetes", "leaderelection"], ["kubernetes", "informer"],
    )
    or m in ("jsonschema", "websocket", "kubernetes_validate", "kubernetes.utils.create_from_yaml")
)
print(json.dumps({"after_import": after_import, "after_calls": generated(), "unused": unused}))
"""


def test_generated_api_and_models_are_never_imported(
    apiserver: FakeApiServer,
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
    # nor the parts of the `kubernetes` package its __init__ would load (hami_plugin.kube)
    assert loaded == {"after_import": [], "after_calls": [], "unused": []}
    assert len(apiserver.events()) == 2  # the probe did make every call
    assert apiserver.get_lease("ns", "l") is not None
