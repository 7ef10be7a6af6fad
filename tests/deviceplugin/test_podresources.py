"""Kubelet's PodResources API: the client against the test kubelet over a real unix socket, its
errors, and the allocator asking it (in-flight/v2, docs/design.md 5.6)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from hami_plugin.deviceplugin.admitting import KubeletAdmission
from hami_plugin.deviceplugin.allocate import AllocateConfig, AllocateFailure, FailureReason
from hami_plugin.deviceplugin.allocator import (
    EVENT_REASON_ADMISSION_UNCONFIRMED,
    AdmissionUnconfirmed,
    PodAllocator,
)
from hami_plugin.deviceplugin.api.podresources import api_pb2 as podresources_pb2
from hami_plugin.deviceplugin.api.podresources import api_pb2_grpc as podresources_pb2_grpc
from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
from hami_plugin.deviceplugin.pending import KubeletPods
from hami_plugin.deviceplugin.podresources import PodResourcesClient, PodResourcesError
from hami_plugin.deviceplugin.preferred import PreferredRequest
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_NODE_LOCK
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet, ListedContainer, ListedPod
from tests.bookings import signed_fields
from tests.deviceplugin.pods import (
    GPU_A,
    GPU_B,
    NODE,
    add_pending_pod,
    dev,
    node_annotations,
    pod_annotations,
    vgpus,
)
from tests.deviceplugin.records import KEYS

GPU = "nvidia.com/gpu"


@pytest.fixture
def kubelet(sock_dir: str) -> Iterator[FakeKubelet]:
    with FakeKubelet(sock_dir) as fake:
        yield fake


@pytest.fixture
def client(kubelet: FakeKubelet) -> Iterator[PodResourcesClient]:
    podresources = PodResourcesClient(kubelet.pod_resources_socket, timeout_seconds=1.0)
    try:
        yield podresources
    finally:
        podresources.close()


def pods(*listed: ListedPod) -> Sequence[ListedPod]:
    return listed


# --- the client ---------------------------------------------------------------------------------


def test_without_devices_names_the_pods_holding_none_of_the_resource(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    admitted = ListedPod("default", "admitted", (ListedContainer("main", {GPU: ("GPU-a-0",)}),))
    admitting = ListedPod("default", "admitting", (ListedContainer("main"),))
    other_resource = ListedPod(
        "ml", "fpga", (ListedContainer("main", {"example.com/fpga": ("fpga-0",)}),)
    )
    # one app container with a GPU is enough to hold the resource
    sidecar_gpu = ListedPod(
        "ml", "two", (ListedContainer("log"), ListedContainer("train", {GPU: ("GPU-b-3",)}))
    )
    no_containers = ListedPod("kube-system", "empty")
    kubelet.install_pod_resources(
        lambda: pods(admitted, admitting, other_resource, sidecar_gpu, no_containers)
    )
    assert client.kubelet_pods(GPU).without_devices == {
        ("default", "admitting"),
        ("ml", "fpga"),
        ("kube-system", "empty"),
    }
    assert client.kubelet_pods("example.com/fpga").without_devices == {
        ("default", "admitted"),
        ("default", "admitting"),
        ("ml", "two"),
        ("kube-system", "empty"),
    }
    assert kubelet.pod_resources_calls == 2


def test_without_a_provider_kubelet_lists_no_pod(client: PodResourcesClient) -> None:
    assert client.kubelet_pods(GPU).without_devices == frozenset()


def test_a_missing_socket_is_one_clear_error(sock_dir: str) -> None:
    client = PodResourcesClient(f"{sock_dir}/nothing.sock")
    with pytest.raises(PodResourcesError, match=r"nothing\.sock does not exist .*not mounted"):
        client.kubelet_pods(GPU)


def test_an_unavailable_kubelet_is_an_error_and_the_next_call_dials_again(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    assert client.kubelet_pods(GPU).without_devices == frozenset()
    kubelet.fail_pod_resources(grpc.StatusCode.UNAVAILABLE, times=1)
    with pytest.raises(PodResourcesError, match=r"PodResources API on .* is unavailable"):
        client.kubelet_pods(GPU)
    assert client.kubelet_pods(GPU).without_devices == frozenset()


def test_a_kubelet_restart_costs_the_calls_while_it_is_down(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    kubelet.install_pod_resources(lambda: pods(ListedPod("default", "p")))
    assert client.kubelet_pods(GPU).without_devices == {("default", "p")}
    kubelet.stop()
    with pytest.raises(PodResourcesError):
        client.kubelet_pods(GPU)
    kubelet.start()
    assert client.kubelet_pods(GPU).without_devices == {("default", "p")}


def test_a_slow_kubelet_is_a_timeout(kubelet: FakeKubelet, sock_dir: str) -> None:
    release = threading.Event()

    def slow() -> Sequence[ListedPod]:
        release.wait(5)
        return ()

    kubelet.install_pod_resources(slow)
    client = PodResourcesClient(kubelet.pod_resources_socket, timeout_seconds=0.2)
    try:
        with pytest.raises(PodResourcesError, match=r"did not answer within 0\.2 s"):
            client.kubelet_pods(GPU)
    finally:
        release.set()
        client.close()


def test_kubelets_rate_limit_is_waited_out_within_the_budget(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    kubelet.fail_pod_resources(grpc.StatusCode.RESOURCE_EXHAUSTED, times=2)
    assert client.kubelet_pods(GPU).without_devices == frozenset()
    assert kubelet.pod_resources_calls == 3
    kubelet.fail_pod_resources(grpc.StatusCode.RESOURCE_EXHAUSTED)
    with pytest.raises(PodResourcesError, match="refused every try within 1 s"):
        client.kubelet_pods(GPU)


def test_an_error_status_is_named(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.fail_pod_resources(grpc.StatusCode.UNIMPLEMENTED, times=1)
    with pytest.raises(PodResourcesError, match="does not serve v1 List"):
        client.kubelet_pods(GPU)
    kubelet.fail_pod_resources(grpc.StatusCode.PERMISSION_DENIED, times=1)
    with pytest.raises(PodResourcesError, match="failed: PERMISSION_DENIED"):
        client.kubelet_pods(GPU)


def test_the_test_kubelets_get_answers_one_pod_as_kubelet_does(kubelet: FakeKubelet) -> None:
    kubelet.install_pod_resources(
        lambda: pods(ListedPod("ml", "p", (ListedContainer("c", {GPU: ("GPU-a-0", "GPU-a-1")}),)))
    )
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.Get(podresources_pb2.GetPodResourcesRequest(pod_name="p", pod_namespace="ml"))
        (container,) = answer.pod_resources.containers
        assert (container.name, list(container.devices[0].device_ids)) == (
            "c",
            ["GPU-a-0", "GPU-a-1"],
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub.Get(podresources_pb2.GetPodResourcesRequest(pod_name="q", pod_namespace="ml"))
        assert caught.value.code() is grpc.StatusCode.UNKNOWN
        assert caught.value.details() == "pod q in namespace ml not found"


# --- the allocator asking it ----------------------------------------------------------------------

ADVERTISED = {device.id for device in vgpus(GPU_A, GPU_B)}
SAME_SECOND = "2026-03-01T00:00:07Z"


class FakeKubeletPods:
    """A stand-in for `PodResourcesClient.kubelet_pods`: answers `listed` (the pods listed
    without devices; `with_devices` are listed too), or raises."""

    def __init__(self) -> None:
        self.listed: frozenset[tuple[str, str]] = frozenset()
        self.with_devices: frozenset[tuple[str, str]] = frozenset()
        self.error: Exception | None = None
        self.calls = 0
        self.reported: list[Exception] = []
        self.recently_v2 = False
        """What the daemon answers a reported failure: the node claimed v2 recently."""

    def report(self, error: Exception) -> bool:
        self.reported.append(error)
        return self.recently_v2

    def __call__(self) -> KubeletPods:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return KubeletPods(self.listed | self.with_devices, self.listed)


@pytest.fixture
def kubelet_pods() -> FakeKubeletPods:
    return FakeKubeletPods()


@pytest.fixture
def allocator(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path, kubelet_pods: FakeKubeletPods
) -> PodAllocator:
    apiserver.add_node(NODE)
    install_fake_hamicore(tmp_path / "hook")
    return PodAllocator(
        kube,
        NODE,
        AllocateConfig(hook_path=str(tmp_path / "hook"), vgpulock_host_path=str(tmp_path / "l")),
        kubelet=KubeletAdmission(kubelet_pods, kubelet_pods.report),
        hamicore=HamiCoreWatch(str(tmp_path / "hook"), node_name=NODE, version="9.9.9"),
    )


def add_twins(apiserver: FakeApiServer) -> None:
    """Two identical pods created in the same second, each booked one GPU."""
    for name, gpu in (("twin-a", GPU_A), ("twin-b", GPU_B)):
        add_pending_pod(apiserver, name, [[dev(gpu, 2000)]], lock=None, created=SAME_SECOND)


def test_one_pending_pod_is_chosen_without_asking_kubelet(
    apiserver: FakeApiServer, allocator: PodAllocator, kubelet_pods: FakeKubeletPods
) -> None:
    add_pending_pod(apiserver, "only", [[dev(GPU_A, 2000)]], lock=None, created=SAME_SECOND)
    decision = allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert decision.complete
    assert kubelet_pods.calls == 0


def test_kubelets_list_names_which_of_two_identical_pods_is_being_admitted(
    apiserver: FakeApiServer, allocator: PodAllocator, kubelet_pods: FakeKubeletPods
) -> None:
    add_twins(apiserver)
    kubelet_pods.listed = frozenset({("default", "twin-b")})
    (answer,) = allocator.preferred([_request()])
    assert answer.device_ids == (f"{GPU_B}-0",)  # GetPreferredAllocation follows twin-b's GPU
    decision = allocator.allocate([[f"{GPU_B}-0"]], ADVERTISED)
    (container,) = decision.containers
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert pod_annotations(apiserver, "twin-b")[ANNOTATION_BIND_PHASE] == "success"
    assert pod_annotations(apiserver, "twin-a")[ANNOTATION_BIND_PHASE] == "allocating"
    assert kubelet_pods.calls == 2
    # twin-a alone is pending now: chosen without asking
    allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert pod_annotations(apiserver, "twin-a")[ANNOTATION_BIND_PHASE] == "success"
    assert kubelet_pods.calls == 2


def test_a_failing_kubelet_falls_back_to_the_v1_rule_logged_once_and_reported(
    apiserver: FakeApiServer,
    allocator: PodAllocator,
    kubelet_pods: FakeKubeletPods,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_twins(apiserver)
    error = PodResourcesError("kubelet's PodResources API on /x.sock is unavailable: down")
    kubelet_pods.error = error
    with caplog.at_level(logging.INFO, logger="hami_plugin.deviceplugin.admitting"):
        for _ in range(3):
            with pytest.raises(AllocateFailure) as caught:
                allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
            # the v1 rule cannot tell same-second twins apart: no pod is touched
            assert caught.value.reason is FailureReason.NO_MATCHING_POD
            assert "same second" in str(caught.value)
        assert kubelet_pods.reported == [error, error, error]
        warnings = [r for r in caplog.records if "is unavailable: down" in r.getMessage()]
        assert len(warnings) == 1
        assert "told apart by creation order alone" in warnings[0].getMessage()
        kubelet_pods.error = None
        kubelet_pods.listed = frozenset({("default", "twin-a")})
        allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert pod_annotations(apiserver, "twin-a")[ANNOTATION_BIND_PHASE] == "success"
    assert any("answers again" in r.getMessage() for r in caplog.records)


def _request(size: int = 1) -> PreferredRequest:
    return PreferredRequest(available=tuple(sorted(ADVERTISED)), must_include=(), size=size)


@pytest.mark.parametrize("recently_v2", [False, True])
def test_kubelet_failing_after_the_node_claimed_v2_no_guess_by_creation_order(
    apiserver: FakeApiServer,
    allocator: PodAllocator,
    kubelet_pods: FakeKubeletPods,
    recently_v2: bool,
) -> None:
    """Two identical pods of successive seconds: the v1 rule takes the older, which is right
    for pods the scheduler bound under v1, but pods bound under v2 may have reached kubelet in
    the other order, so while the node may still hold such pods no pod is guessed."""
    add_pending_pod(apiserver, "older", [[dev(GPU_A, 2000)]], lock=None, created=SAME_SECOND)
    add_pending_pod(
        apiserver, "younger", [[dev(GPU_B, 2000)]], lock=None, created="2026-03-01T00:00:09Z"
    )
    kubelet_pods.error = PodResourcesError("kubelet's PodResources API on /x.sock: down")
    kubelet_pods.recently_v2 = recently_v2
    if not recently_v2:
        decision = allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
        assert decision.containers[0].envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
        assert pod_annotations(apiserver, "older")[ANNOTATION_BIND_PHASE] == "success"
        return
    with pytest.raises(AllocateFailure) as caught:
        allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert caught.value.reason is FailureReason.NO_MATCHING_POD
    assert "default/older" in str(caught.value) and "default/younger" in str(caught.value)
    for name in ("older", "younger"):
        assert pod_annotations(apiserver, name)[ANNOTATION_BIND_PHASE] == "allocating"


# --- with a booking key: kubelet's list confirms every call (issue 25) ---------------------------


@pytest.fixture
def keyed_allocator(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path, kubelet_pods: FakeKubeletPods
) -> PodAllocator:
    apiserver.add_node(NODE)
    install_fake_hamicore(tmp_path / "hook")
    return PodAllocator(
        kube,
        NODE,
        AllocateConfig(hook_path=str(tmp_path / "hook"), vgpulock_host_path=str(tmp_path / "l")),
        booking_keys=lambda: KEYS,
        kubelet=KubeletAdmission(kubelet_pods, kubelet_pods.report),
        hamicore=HamiCoreWatch(str(tmp_path / "hook"), node_name=NODE, version="9.9.9"),
    )


def add_signed_pod(apiserver: FakeApiServer, name: str, gpu: str, lock: str | None) -> None:
    """A pending pod as our scheduler's bind leaves it, booking signed over its UID."""
    uid = str(add_pending_pod(apiserver, name, [[dev(gpu, 2000)]], lock=lock)["metadata"]["uid"])
    fields = signed_fields(uid, pod_annotations(apiserver, name))
    assert fields is not None
    apiserver.update_object(
        "pods",
        "default",
        name,
        lambda pod: pod["metadata"]["annotations"].update(
            {ANNOTATION_BOOKING_SIGNATURE: KEYS.sign(fields)}
        ),
    )


@pytest.mark.parametrize("lock", [None, "owned"], ids=["one-candidate", "node-lock"])
def test_with_a_key_the_one_candidate_is_served_only_when_kubelet_lists_it_as_admitting(
    apiserver: FakeApiServer,
    keyed_allocator: PodAllocator,
    kubelet_pods: FakeKubeletPods,
    lock: str | None,
) -> None:
    add_signed_pod(apiserver, "victim", GPU_A, lock)
    before = pod_annotations(apiserver, "victim")
    kubelet_pods.listed = frozenset({("default", "thief")})  # kubelet admits another pod
    with pytest.raises(AdmissionUnconfirmed) as caught:
        keyed_allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert not caught.value.pod_known
    assert "does not show it yet" in str(caught.value)
    assert pod_annotations(apiserver, "victim") == before  # booking, phase, lock untouched
    if lock is not None:
        assert node_annotations(apiserver)[ANNOTATION_NODE_LOCK].endswith(",default,victim")
    (event,) = apiserver.events("default")
    assert (event["involvedObject"]["name"], event["type"]) == ("victim", "Warning")
    assert event["reason"] == EVENT_REASON_ADMISSION_UNCONFIRMED
    # GetPreferredAllocation falls back for the thief, following no booking
    assert keyed_allocator.preferred([_request()])[0].fallback_note
    # the victim's own admission: kubelet lists it without devices
    kubelet_pods.listed = frozenset({("default", "victim")})
    decision = keyed_allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
    assert decision.containers[0].envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert pod_annotations(apiserver, "victim")[ANNOTATION_BIND_PHASE] == "success"
    assert kubelet_pods.calls == 3


def test_with_a_key_a_failing_kubelet_serves_no_booking_and_fails_no_pod(
    apiserver: FakeApiServer,
    keyed_allocator: PodAllocator,
    kubelet_pods: FakeKubeletPods,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_signed_pod(apiserver, "victim", GPU_A, None)
    error = PodResourcesError("kubelet's PodResources API on /x.sock is unavailable: down")
    kubelet_pods.error = error
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.admitting"):
        for _ in range(2):
            with pytest.raises(AdmissionUnconfirmed) as caught:
                keyed_allocator.allocate([[f"{GPU_A}-0"]], ADVERTISED)
            assert "is unavailable: down" in str(caught.value)
    assert kubelet_pods.reported == [error, error]  # the register loop stops claiming v2
    (warning,) = [r for r in caplog.records if "is unavailable: down" in r.getMessage()]
    assert "no booking is served" in warning.getMessage()
    assert pod_annotations(apiserver, "victim")[ANNOTATION_BIND_PHASE] == "allocating"
    assert len(apiserver.events("default")) == 2
