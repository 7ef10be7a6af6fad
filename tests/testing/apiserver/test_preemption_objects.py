"""What preemption writes and reads besides pods: PodDisruptionBudgets (policy/v1), a pod's
status (the DisruptionTarget condition, `nominatedNodeName`) and the Events about a pod."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client as k8s

from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.testing.apiserver.wire import Stream, call, open_watch, summary


@pytest.fixture
def policy(apiserver: FakeApiServer) -> Iterator[k8s.PolicyV1Api]:
    api_client = apiserver.api_client()
    yield k8s.PolicyV1Api(api_client)
    api_client.rest_client.close()


def _budget(name: str, namespace: str = "ml") -> k8s.V1PodDisruptionBudget:
    return k8s.V1PodDisruptionBudget(
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
        spec=k8s.V1PodDisruptionBudgetSpec(
            min_available=1, selector=k8s.V1LabelSelector(match_labels={"app": "train"})
        ),
    )


def test_pod_disruption_budgets_are_served_and_their_status_written_by_the_test(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
    policy: k8s.PolicyV1Api,
) -> None:
    start = apiserver.resource_version
    stream = Stream(
        open_watch(
            http,
            apiserver,
            f"/apis/policy/v1/poddisruptionbudgets?watch=true&resourceVersion={start}",
        )
    )

    created = policy.create_namespaced_pod_disruption_budget("ml", _budget("train")).to_dict()
    policy.create_namespaced_pod_disruption_budget("other", _budget("serve", "other"))
    status = {"status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}}
    written = policy.patch_namespaced_pod_disruption_budget_status("train", "ml", status).to_dict()
    in_ml = policy.list_namespaced_pod_disruption_budget("ml").to_dict()["items"]
    everywhere = policy.list_pod_disruption_budget_for_all_namespaces().to_dict()["items"]
    policy.delete_namespaced_pod_disruption_budget("serve", "other")
    events = stream.take(4)
    stream.close()

    assert (created["kind"], created["api_version"]) == ("PodDisruptionBudget", "policy/v1")
    assert created["spec"]["min_available"] == 1
    assert written["status"]["disruptions_allowed"] == 0
    assert written["spec"]["selector"]["match_labels"] == {"app": "train"}
    assert [b["metadata"]["name"] for b in in_ml] == ["train"]
    assert in_ml[0]["status"]["current_healthy"] == 1
    assert sorted(b["metadata"]["name"] for b in everywhere) == ["serve", "train"]
    assert [(kind, name) for kind, name, _ in summary(events)] == [
        ("ADDED", "train"),
        ("ADDED", "serve"),
        ("MODIFIED", "train"),
        ("DELETED", "serve"),
    ]
    assert apiserver.get_object("poddisruptionbudgets", "other", "serve") is None


def test_priority_classes_are_cluster_scoped(
    apiserver: FakeApiServer, http: urllib3.PoolManager
) -> None:
    body = {"metadata": {"name": "high"}, "value": 100000}

    status, created = call(
        http, apiserver, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body
    )
    got = call(http, apiserver, "GET", "/apis/scheduling.k8s.io/v1/priorityclasses/high")[1]

    assert status == 201
    assert (created["kind"], created["apiVersion"]) == ("PriorityClass", "scheduling.k8s.io/v1")
    assert "namespace" not in got["metadata"]
    assert apiserver.get_object("priorityclasses", "", "high") == got


def test_a_status_strategic_merge_patch_merges_conditions_by_type(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    pod = make_pod("victim", node_name="node-1", phase="Running")
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True"},
    ]
    apiserver.add_pod(pod)
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "hami-scheduler: preempting to accommodate a higher priority pod",
    }

    # A dict body goes out as application/strategic-merge-patch+json.
    core.patch_namespaced_pod_status("victim", "default", {"status": {"conditions": [disruption]}})
    core.patch_namespaced_pod_status(
        "victim",
        "default",
        {
            "status": {
                "$setElementOrder/conditions": [{"type": "PodScheduled"}, {"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "False"}],
            }
        },
    )
    stored = apiserver.get_pod("default", "victim")

    assert stored is not None
    assert stored["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "False"},
        disruption,
    ]
    assert stored["status"]["phase"] == "Running"


def test_a_status_patch_sets_the_nominated_node_and_removes_a_condition(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    pod = make_pod("preemptor")
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    apiserver.add_pod(pod)

    patched = core.patch_namespaced_pod_status(
        "preemptor", "default", {"status": {"nominatedNodeName": "node-1"}}
    )
    cleared = core.patch_namespaced_pod_status(
        "preemptor",
        "default",
        {"status": {"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}},
    )

    assert patched.status is not None and cleared.status is not None
    assert patched.status.nominated_node_name == "node-1"
    assert [c.type for c in patched.status.conditions or []] == ["PodScheduled"]
    assert cleared.status.conditions == []
    assert cleared.status.nominated_node_name == "node-1"


def test_the_events_about_a_pod_are_listed_by_its_involved_object(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    for name, about in (("victim.1", "victim"), ("preemptor.1", "preemptor")):
        core.create_namespaced_event(
            "default",
            k8s.CoreV1Event(
                metadata=k8s.V1ObjectMeta(name=name),
                involved_object=k8s.V1ObjectReference(
                    kind="Pod", namespace="default", name=about, uid=f"uid-{about}"
                ),
                reason="Preempted",
                message="Preempted by pod default/preemptor on node node-1",
                type="Normal",
            ),
        )

    listed = core.list_namespaced_event(
        "default", field_selector="involvedObject.kind=Pod,involvedObject.name=victim"
    )

    assert [e.metadata.name for e in listed.items] == ["victim.1"]
    assert listed.items[0].reason == "Preempted"
    assert [e["metadata"]["name"] for e in apiserver.events_about("default", "victim")] == [
        "victim.1"
    ]
    assert apiserver.events_about("default", "victim", kind="Node") == []
