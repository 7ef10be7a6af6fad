"""GPU quotas over the wire: the real `kubernetes` client creates, replaces and deletes a
ResourceQuota on the API server double, the scheduler's informer feeds it to the state, and
`/filter` over HTTP refuses a pod with HAMi's `ResourceQuotaNotFit`."""

from __future__ import annotations

from kubernetes import client as k8s

from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

NAMESPACE = "team"


def quota(memory_mib: str) -> k8s.V1ResourceQuota:
    return k8s.V1ResourceQuota(
        metadata=k8s.V1ObjectMeta(name="gpu", namespace=NAMESPACE),
        spec=k8s.V1ResourceQuotaSpec(
            hard={"limits.nvidia.com/gpumem": memory_mib, "limits.cpu": "8"}
        ),
    )


def test_a_resource_quota_refuses_the_pod_beyond_it(
    apiserver: FakeApiServer, kube_api_client: k8s.ApiClient
) -> None:
    core = k8s.CoreV1Api(kube_api_client)
    core.create_namespaced_resource_quota(NAMESPACE, quota("3000"))
    listed = core.list_namespaced_resource_quota(NAMESPACE).to_dict()["items"]
    assert [item["spec"]["hard"]["limits.nvidia.com/gpumem"] for item in listed] == ["3000"]
    apiserver.add_object(gpu_node("n1", 2))
    first = apiserver.add_object(gpu_pod("a", memory=2000, namespace=NAMESPACE))
    second = apiserver.add_object(gpu_pod("b", memory=2000, namespace=NAMESPACE))
    elsewhere = apiserver.add_object(gpu_pod("c", memory=2000, namespace="default"))
    with running_scheduler(apiserver) as scheduler:
        wait_until(lambda: scheduler.state.has_quota(NAMESPACE), what="the quota")
        assert scheduler.schedule(first, ["n1"]) == "n1"
        refused = scheduler.filter(second, ["n1"])
        assert refused["NodeNames"] is None  # HAMi answers FailedNodes only
        assert refused["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
        # the webhook denies the same pod at admission, as HAMi's fitResourceQuota does
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "r1",
                "namespace": NAMESPACE,
                "operation": "CREATE",
                "object": second,
            },
        }
        status, answer = scheduler.post("/webhook", review)
        assert status == 200
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"]["message"] == "exceeding resource quota"
        # a namespace without a quota is not limited
        assert scheduler.filter(elsewhere, ["n1"])["NodeNames"] == ["n1"]
        # the quota raised: the informer's update takes the new limit
        core.replace_namespaced_resource_quota("gpu", NAMESPACE, quota("4000"))
        wait_until(
            lambda: any(e.limit == 4000 for e in scheduler.state.quota_entries()),
            what="the raised limit",
        )
        assert scheduler.filter(second, ["n1"])["NodeNames"] == ["n1"]
        core.delete_namespaced_resource_quota("gpu", NAMESPACE)
        wait_until(lambda: not scheduler.state.has_quota(NAMESPACE), what="no quota")
        entries = {(e.namespace, e.resource): e for e in scheduler.state.quota_entries()}
        used = entries[(NAMESPACE, "nvidia.com/gpumem")]
        assert (used.used, used.limit_set) == (4000, False)
