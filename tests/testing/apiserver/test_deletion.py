"""Graceful pod deletion over HTTP, as kube-apiserver's `BeforeDelete` and
`podStrategy.CheckGracefulDelete` do it, and kubelet's last DELETE (`finish_termination`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, JsonObject, make_pod
from tests.testing.apiserver.wire import MERGE, Stream, call, open_watch, summary


def _bound_pod(apiserver: FakeApiServer, name: str, grace: int | None = 20) -> JsonObject:
    pod = make_pod(name, node_name="node-1", phase="Running")
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    return apiserver.add_pod(pod)


def _meta(obj: k8s.V1Pod) -> k8s.V1ObjectMeta:
    assert obj.metadata is not None
    return obj.metadata


def _deadline(obj: k8s.V1Pod) -> datetime:
    deadline = _meta(obj).deletion_timestamp
    assert isinstance(deadline, datetime)
    return deadline


def _when(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp)


def test_a_bound_pod_stays_terminating_for_its_grace_period_then_kubelet_removes_it(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
    core: k8s.CoreV1Api,
) -> None:
    stored = _bound_pod(apiserver, "victim")
    start = apiserver.resource_version
    stream = Stream(open_watch(http, apiserver, f"/api/v1/pods?watch=true&resourceVersion={start}"))
    before = datetime.now(UTC).replace(microsecond=0)

    answered = core.delete_namespaced_pod("victim", "default")
    terminating = apiserver.get_pod("default", "victim")
    assert apiserver.finish_termination("default", "victim")
    events = stream.take(3)
    stream.close()

    assert terminating is not None
    metadata = terminating["metadata"]
    assert metadata["deletionGracePeriodSeconds"] == 20
    deadline = _when(metadata["deletionTimestamp"])
    assert before + timedelta(seconds=20) <= deadline <= datetime.now(UTC) + timedelta(seconds=20)
    assert metadata["resourceVersion"] == str(start + 1)
    assert metadata["uid"] == stored["metadata"]["uid"]
    assert _meta(answered).deletion_grace_period_seconds == 20
    assert _meta(answered).resource_version == str(start + 1)
    assert [e for e, _, _ in summary(events)] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    assert apiserver.get_pod("default", "victim") is None
    assert not apiserver.finish_termination("default", "victim")


def test_a_later_delete_only_shortens_the_grace_period(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    _bound_pod(apiserver, "victim", grace=None)  # no terminationGracePeriodSeconds: 30

    first = core.delete_namespaced_pod("victim", "default")
    version = apiserver.resource_version
    longer = core.delete_namespaced_pod("victim", "default", grace_period_seconds=45)
    unchanged_version = apiserver.resource_version
    shorter = core.delete_namespaced_pod("victim", "default", grace_period_seconds=5)

    assert _meta(first).deletion_grace_period_seconds == 30
    assert _meta(longer).deletion_grace_period_seconds == 30
    assert _meta(longer).resource_version == str(version)
    assert unchanged_version == version
    assert _meta(shorter).deletion_grace_period_seconds == 5
    assert _deadline(shorter) == _deadline(first) - timedelta(seconds=25)
    assert apiserver.resource_version == version + 1

    gone = core.delete_namespaced_pod(
        "victim", "default", body=k8s.V1DeleteOptions(grace_period_seconds=0)
    )

    assert _meta(gone).name == "victim"
    assert apiserver.get_pod("default", "victim") is None


@pytest.mark.parametrize(
    ("node_name", "phase"),
    [("", "Pending"), ("node-1", "Succeeded"), ("node-1", "Failed")],
)
def test_an_unbound_or_finished_pod_is_removed_at_once(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
    node_name: str,
    phase: str,
) -> None:
    pod = make_pod("p", node_name=node_name, phase=phase)
    pod["spec"]["terminationGracePeriodSeconds"] = 60
    apiserver.add_pod(pod)

    answered = core.delete_namespaced_pod("p", "default")

    assert apiserver.get_pod("default", "p") is None
    assert _meta(answered).deletion_grace_period_seconds == 0


def test_grace_period_from_the_query_when_there_is_no_body(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    _bound_pod(apiserver, "a")
    _bound_pod(apiserver, "b")
    path = "/api/v1/namespaces/default/pods"

    response = http.request("DELETE", f"{apiserver.url}{path}/a?gracePeriodSeconds=7")
    # With a body, the body's options are used and the query is not read.
    status, body = call(http, apiserver, "DELETE", f"{path}/b?gracePeriodSeconds=7", {})

    assert response.status == 200
    assert json.loads(response.data)["metadata"]["deletionGracePeriodSeconds"] == 7
    assert (status, body["metadata"]["deletionGracePeriodSeconds"]) == (200, 20)


def test_a_negative_grace_period_is_one_second(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    _bound_pod(apiserver, "p")

    answered = core.delete_namespaced_pod("p", "default", grace_period_seconds=-5)

    assert _meta(answered).deletion_grace_period_seconds == 1


def test_failed_preconditions_are_conflicts_with_the_api_servers_wording(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    pod = _bound_pod(apiserver, "p")
    uid, version = pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
    path = "/api/v1/namespaces/default/pods/p"

    wrong_uid = call(http, apiserver, "DELETE", path, {"preconditions": {"uid": "other"}})
    wrong_version = call(
        http, apiserver, "DELETE", path, {"preconditions": {"resourceVersion": "1"}}
    )
    untouched = apiserver.get_pod("default", "p")
    right = call(
        http,
        apiserver,
        "DELETE",
        path,
        {"gracePeriodSeconds": 0, "preconditions": {"uid": uid, "resourceVersion": version}},
    )

    assert wrong_uid[0] == 409
    assert wrong_uid[1]["reason"] == "Conflict"
    assert wrong_uid[1]["message"] == (
        f'Operation cannot be fulfilled on Pod "p": the UID in the precondition (other) does '
        f"not match the UID in record ({uid}). The object might have been deleted and then "
        "recreated"
    )
    assert wrong_version[0] == 409
    assert wrong_version[1]["message"] == (
        f'Operation cannot be fulfilled on Pod "p": the ResourceVersion in the precondition '
        f"(1) does not match the ResourceVersion in record ({version}). The object might have "
        "been modified"
    )
    assert untouched is not None and "deletionTimestamp" not in untouched["metadata"]
    assert right[0] == 200
    assert apiserver.get_pod("default", "p") is None


def test_an_update_cannot_take_the_deletion_back(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
    core: k8s.CoreV1Api,
) -> None:
    _bound_pod(apiserver, "p")
    deleted = core.delete_namespaced_pod("p", "default")
    undo = {"metadata": {"deletionTimestamp": None, "deletionGracePeriodSeconds": None}}

    status, patched = call(
        http, apiserver, "PATCH", "/api/v1/namespaces/default/pods/p", undo, MERGE
    )

    assert status == 200
    assert _when(patched["metadata"]["deletionTimestamp"]) == _deadline(deleted)
    assert patched["metadata"]["deletionGracePeriodSeconds"] == 20


def test_other_resources_are_still_removed_at_once(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    created = call(http, apiserver, "POST", path, lease)[1]
    version = apiserver.resource_version

    conflict = call(http, apiserver, "DELETE", f"{path}/l", {"preconditions": {"uid": "x"}})
    status, _ = call(http, apiserver, "DELETE", f"{path}/l")

    assert conflict[0] == 409
    assert conflict[1]["message"].startswith(
        'Operation cannot be fulfilled on Lease.coordination.k8s.io "l": the UID in the '
        f"precondition (x) does not match the UID in record ({created['metadata']['uid']})"
    )
    assert status == 200
    assert apiserver.resource_version == version + 1
    assert apiserver.get_lease("default", "l") is None


def test_the_client_sees_a_terminating_pod_as_a_pod(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    _bound_pod(apiserver, "p")
    core.delete_namespaced_pod("p", "default")

    pod = core.read_namespaced_pod("p", "default")

    assert _meta(pod).deletion_timestamp is not None
    with pytest.raises(ApiException) as missing:
        apiserver.finish_termination("default", "p")
        core.read_namespaced_pod("p", "default")
    assert missing.value.status == 404
