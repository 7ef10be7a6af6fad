"""A pod that skips the scheduler cannot take a signed booking pending on its node (issue 25).

The attack: a tenant's pod with `spec.nodeName` set, `nvidia.com/gpu: 1` and the label
`hami.io/webhook: ignore`, carrying no booking at all, reaches kubelet in the same batch as a
victim whose signed booking is pending there, and is older, so kubelet admits it first
(kubernetes/kubernetes@000d954 pkg/kubelet/kubelet.go HandlePodAdditions: the batch is sorted by
creationTimestamp, each pod is added to the pod manager just before its admission, and the
device manager's admit handler calls Allocate). Kubelet's Allocate names no pod: the device
plugin used to serve the one pending candidate, the victim's booking, to the thief.

`hami device-plugin --booking-key-file ... --pod-resources-socket <the test kubelet's>` runs as a
sub-process (`test_signed_wire`'s node); the test kubelet's `PodAdmitter` admits both pods in one
batch, in creation order, and answers PodResources `List` from its pod manager as kubelet does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
)
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from hami_plugin.testing.kubelet import ListedPod
from tests.deviceplugin.test_signed_wire import (
    GPUS,
    NODE,
    TENANT,
    Node,
    _running,
    annotations_of,
    create_and_bind_tenant,
    entries,
    gpu_container,
    key_file_args,
    stamp,
    stored,
)

THIEF = ("default", "thief")
NOT_FOR_THIS_POD = "AllocateNotForThisPod"


@pytest.fixture
def keyed_node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The device plugin with a booking key and the test kubelet's PodResources socket."""
    yield from _running(sock_dir, tmp_path, apiserver, kube, *key_file_args(tmp_path))


@pytest.fixture
def keyless_node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The same without a booking key: HAMi's behaviour."""
    yield from _running(sock_dir, tmp_path, apiserver, kube)


def create_thief(apiserver: FakeApiServer, gpus: int) -> None:
    """Bound by its author (no scheduler, no booking), webhook skipped, older than the tenant."""
    pod = make_pod(
        THIEF[1],
        node_name=NODE,
        scheduler_name="my-own-scheduler",
        labels={"hami.io/webhook": "ignore"},
        containers=[gpu_container(gpus)],
        creation_timestamp=stamp(0),
    )
    apiserver.add_pod(pod)


def admit_in_one_batch(node: Node) -> PodAdmitter:
    """The test kubelet sees both pods at its first poll: one batch, the thief first."""
    with PodAdmitter(node.kubelet, node.apiserver.url, NODE, poll_interval_seconds=0.02) as kubelet:
        kubelet.wait_for([THIEF, TENANT], timeout=30)
    assert kubelet.batches == [[THIEF, TENANT]]
    return kubelet


def warnings_about(apiserver: FakeApiServer, name: str) -> list[dict[str, str]]:
    return [
        event
        for event in apiserver.events("default")
        if event["involvedObject"]["name"] == name and event["type"] == "Warning"
    ]


def test_a_pod_that_skipped_the_scheduler_does_not_get_the_pending_signed_booking(
    keyed_node: Node,
) -> None:
    node = keyed_node
    create_thief(node.apiserver, 1)
    create_and_bind_tenant(node, entries((3, 81920)))
    kubelet = admit_in_one_batch(node)

    # The thief: its Allocate failed, nothing handed out, its pod untouched by the plugin.
    assert "kubelet is not admitting this pod" in kubelet.failures[THIEF]
    assert [key for key in kubelet.responses if key[:2] == THIEF] == []
    assert stored(node.apiserver, THIEF)["status"]["phase"] == "Failed"
    assert ANNOTATION_BIND_PHASE not in stored(node.apiserver, THIEF)["metadata"].get(
        "annotations", {}
    )

    # The tenant runs on its own booking: the whole of GPU 3.
    assert kubelet.admitted == [TENANT]
    (container,) = [r for key, r in kubelet.responses.items() if key[:2] == TENANT]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]
    assert container.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"
    tenant = annotations_of(node.apiserver, TENANT)
    assert tenant[ANNOTATION_BIND_PHASE] == "success"
    assert stored(node.apiserver, TENANT)["status"]["phase"] == "Running"

    # The refused call is told on the pod whose booking it would have taken.
    (event,) = warnings_about(node.apiserver, TENANT[1])
    assert event["reason"] == NOT_FOR_THIS_POD
    assert "does not show it yet" in event["message"]


def test_two_gpus_asked_by_the_thief_are_no_denial_of_service(keyed_node: Node) -> None:
    node = keyed_node
    create_thief(node.apiserver, 2)
    create_and_bind_tenant(node, entries((2, 81920), (3, 81920)))
    kubelet = admit_in_one_batch(node)

    assert THIEF in kubelet.failures
    assert [key for key in kubelet.responses if key[:2] == THIEF] == []
    assert kubelet.admitted == [TENANT]
    (container,) = [r for key, r in kubelet.responses.items() if key[:2] == TENANT]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPUS[2]},{GPUS[3]}"
    assert annotations_of(node.apiserver, TENANT)[ANNOTATION_BIND_PHASE] == "success"
    assert stored(node.apiserver, TENANT)["status"]["phase"] == "Running"


def test_without_kubelets_pod_resources_a_signed_booking_is_not_served_and_left_intact(
    keyed_node: Node,
) -> None:
    """Kubelet cannot say which pod it admits (UNIMPLEMENTED: a kubelet without the API): the
    call fails with a Warning event on the pod, whose booking stays as signed, not failed."""
    node = keyed_node
    create_and_bind_tenant(node, entries((3, 81920)))
    before = annotations_of(node.apiserver, TENANT)
    node.kubelet.fail_pod_resources(grpc.StatusCode.UNIMPLEMENTED)
    node.kubelet.install_pod_resources(lambda: [])
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate([f"{GPUS[3]}-0"])
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    message = caught.value.details()
    assert message.startswith("the booking of pod default/tenant is not served: ")
    assert "PodResources" in message and "does not serve v1 List" in message
    after = annotations_of(node.apiserver, TENANT)
    assert after == before  # still allocating, nothing consumed
    assert after[ANNOTATION_DEVICES_TO_ALLOCATE] == before[ANNOTATION_DEVICES_TO_ALLOCATE]
    assert after[ANNOTATION_BOOKING_SIGNATURE] == before[ANNOTATION_BOOKING_SIGNATURE]
    (event,) = warnings_about(node.apiserver, TENANT[1])
    assert event["reason"] == NOT_FOR_THIS_POD
    assert "does not serve v1 List" in event["message"]

    # Once kubelet answers and lists the tenant as being admitted, its own call is served.
    node.kubelet.fail_pod_resources(None)
    node.kubelet.install_pod_resources(lambda: [_listed(TENANT)])
    (container,) = node.kubelet.allocate([f"{GPUS[3]}-0"]).container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]
    assert annotations_of(node.apiserver, TENANT)[ANNOTATION_BIND_PHASE] == "success"


def test_without_a_key_the_thief_still_gets_the_booking_as_in_hami(keyless_node: Node) -> None:
    """What the key changes: without one the plugin serves the one pending pod to whichever
    pod kubelet admits (HAMi's behaviour, kept for nodes beside HAMi's scheduler)."""
    node = keyless_node
    create_thief(node.apiserver, 1)
    create_and_bind_tenant(node, entries((3, 81920)))
    kubelet = admit_in_one_batch(node)
    (stolen,) = [r for key, r in kubelet.responses.items() if key[:2] == THIEF]
    assert stolen.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]
    assert "no binding pod found" in kubelet.failures[TENANT]


def _listed(key: tuple[str, str]) -> ListedPod:
    return ListedPod(key[0], key[1], ())
