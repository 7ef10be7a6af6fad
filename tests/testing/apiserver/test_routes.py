"""The REST verbs: status bodies, preconditions, names, bindings, leases."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer
from tests.testing.apiserver.wire import call


def test_not_found_is_a_status_body(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    status, body = call(http, apiserver, "GET", "/api/v1/namespaces/default/pods/ghost")

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


def test_put_with_stale_version_is_conflict(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    node = apiserver.add_node("n")
    apiserver.update_object("nodes", "", "n", lambda n: n["metadata"]["labels"].update(x="y"))

    status, body = call(http, apiserver, "PUT", "/api/v1/nodes/n", node)

    assert status == 409
    assert body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


def test_put_with_another_name_is_rejected(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    node = apiserver.add_node("n")
    node["metadata"]["name"] = "m"

    status, body = call(http, apiserver, "PUT", "/api/v1/nodes/n", node)

    assert status == 400
    assert "does not match the name on the URL" in body["message"]


def test_binding_sets_node_once(
    apiserver: FakeApiServer,
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


def test_binding_bumps_the_version_and_checks_uid_and_name(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    pod = apiserver.add_pod("p", annotations={"keep": "1"})
    path = "/api/v1/namespaces/default/pods/p/binding"

    def bind(metadata: dict[str, str]) -> int:
        body = {"metadata": metadata, "target": {"kind": "Node", "name": "gpu-1"}}
        return call(http, apiserver, "POST", path, body)[0]

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
    apiserver: FakeApiServer,
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
    spec = leases.read_namespaced_lease("hami-scheduler", "kube-system").spec
    assert spec is not None and spec.holder_identity == "b"
    names = [
        str(x.metadata and x.metadata.name) for x in leases.list_lease_for_all_namespaces().items
    ]
    assert names == ["hami-scheduler"]
    assert leases.list_namespaced_lease("default").items == []
    api_client.rest_client.close()
