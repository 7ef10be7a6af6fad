"""Several pods in flight on one node, over real wires.

The real daemon (fake NVML file) serves gRPC on a unix socket, the test kubelet registers it and
its `PodAdmitter` admits pods as kubelet does (batches from polling the API server double, sorted
by creation second with random ties, one pod at a time, GetPreferredAllocation then Allocate per
GPU container). A small scheduler stand-in writes each pod as the extender's bind does (one
annotation patch, then the Binding), only when `inflight.must_wait_for` allows, from several
threads at once. Every container must get exactly its own booking.

The test kubelet also serves kubelet's PodResources API from the admitter's pod manager: the
daemon asks it (`--pod-resources-socket`) and the node says in-flight/v2, so the stand-in binds
pods of one shape together (`must_wait_for(level=2)`); the `node_v1` fixture turns it off.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import yaml

from hami_plugin.deviceplugin.api.podresources import api_pb2 as podresources_pb2
from hami_plugin.deviceplugin.api.podresources import api_pb2_grpc as podresources_pb2_grpc
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import NotFound
from hami_plugin.protocol import codec
from hami_plugin.protocol.hostpaths import container_dir
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
    InFlightPod,
    must_wait_for,
    protocol_level,
)
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    ContainerDevice,
    PodDevices,
)
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.processes import wait_until

NODE = "gpu-node-1"
GPU_0 = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_1 = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
SPLIT = 10
EPOCH = datetime(2026, 3, 1, tzinfo=UTC)


@dataclass
class Node:
    apiserver: FakeApiServer
    kube: KubeClient
    kubelet: FakeKubelet
    daemon: DevicePluginDaemon


@contextlib.contextmanager
def running_node(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    *,
    pod_resources: bool = True,
    register_interval_seconds: float = 0.3,
) -> Iterator[Node]:
    """The daemon and the test kubelet on one node; `pod_resources`: the daemon asks the test
    kubelet's PodResources API (else --pod-resources-socket is empty)."""
    apiserver.add_node(NODE)
    kubelet = FakeKubelet(sock_dir)
    gpus_file = tmp_path / "gpus.yaml"
    gpus = [
        {"uuid": GPU_0, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0},
        {"uuid": GPU_1, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0},
    ]
    gpus_file.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")
    install_fake_hamicore(tmp_path / "hook")
    settings = DevicePluginSettings(
        metrics_bind_address="0",  # no /metrics port in wire tests
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=SPLIT,
        hook_path=str(tmp_path / "hook"),
        register_interval_seconds=register_interval_seconds,
        pod_resources_socket=kubelet.pod_resources_socket if pod_resources else "",
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    kubelet.start()
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        assert daemon.started.wait(10)
        kubelet.wait_for_registrations(1)
        kubelet.wait_for_list(lambda states: len(states) == 2 * SPLIT)
        yield Node(apiserver, kube, kubelet, daemon)
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()


@pytest.fixture
def node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The node with kubelet's PodResources API: it says in-flight/v2."""
    with running_node(sock_dir, tmp_path, apiserver, kube) as running:
        yield running


@pytest.fixture
def node_v1(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The node with --pod-resources-socket empty: it says in-flight/v1."""
    with running_node(sock_dir, tmp_path, apiserver, kube, pod_resources=False) as running:
        yield running


def node_protocol(node: Node) -> str | None:
    stored = node.apiserver.get_node(NODE)
    assert stored is not None
    protocol: str | None = stored["metadata"]["annotations"].get(ANNOTATION_ALLOCATE_PROTOCOL)
    return protocol


def wait_for_protocol(node: Node, protocol: str) -> None:
    wait_until(lambda: node_protocol(node) == protocol, f"the node says {protocol}", timeout=30.0)


def admitter(node: Node, seed: int) -> PodAdmitter:
    return PodAdmitter(
        node.kubelet, node.apiserver.url, NODE, seed=seed, poll_interval_seconds=0.02
    )


# --- a scheduler stand-in -------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A pod to create and bind: its creation second and one entry per container."""

    name: str
    created: int
    entries: PodDevices  # init containers first; () = a container without GPUs
    init_count: int = 0
    shape: Hashable | None = None  # the scheduler's reading of the GPU requests

    @property
    def key(self) -> tuple[str, str]:
        return "default", self.name

    def container_names(self) -> list[str]:
        return [f"c{i}" for i in range(len(self.entries))]


def booking(name_index: int, counts: Sequence[int], cores: int = 10) -> PodDevices:
    """Distinct memory per (pod, container, device), so a mix-up cannot go unnoticed."""
    entries = []
    for c, count in enumerate(counts):
        devices = []
        for d in range(count):
            gpu = (GPU_0, GPU_1)[(name_index + d) % 2]
            memory = 1000 + 100 * name_index + 10 * c + d
            devices.append(ContainerDevice(gpu, "NVIDIA", memory, cores + c))
        entries.append(tuple(devices))
    return tuple(entries)


class Scheduler:
    """Binds pods as the extender's bind does, holding each back while `must_wait_for` says so
    at the node's protocol level (read from its annotation when created)."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self.level = protocol_level(
            kube.get_node(NODE).annotations.get(ANNOTATION_ALLOCATE_PROTOCOL)
        )
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, str], InFlightPod] = {}
        self.waits = 0

    def _refresh(self) -> list[InFlightPod]:
        views = []
        for key, pod in list(self._in_flight.items()):
            if pod.bound:
                try:
                    record = self._kube.get_pod(*key)
                except NotFound:
                    del self._in_flight[key]
                    continue
                annotations = record.annotations
                if (
                    record.phase != "Pending"
                    or annotations.get(ANNOTATION_BIND_PHASE) != "allocating"
                ):
                    del self._in_flight[key]
                    continue
                left = codec.decode_pod_devices(annotations[ANNOTATION_DEVICES_TO_ALLOCATE])
                pod = InFlightPod(
                    pod.namespace,
                    pod.name,
                    pod.created_seconds,
                    pod.allocated,
                    left,
                    shape=pod.shape,
                )
                self._in_flight[key] = pod
            views.append(pod)
        return views

    def _admit(self, spec: Spec) -> InFlightPod | None:
        """Register `spec` as in flight (unbound) unless something blocks it; the blocker."""
        created = int(EPOCH.timestamp()) + spec.created
        candidate = InFlightPod(
            "default", spec.name, created, spec.entries, spec.entries, False, shape=spec.shape
        )
        with self._lock:
            blocker = must_wait_for(candidate, self._refresh(), level=self.level)
            if blocker is None:
                self._in_flight[spec.key] = candidate
            else:
                self.waits += 1
            return blocker

    def try_bind(self, spec: Spec) -> bool:
        """Bind now if nothing blocks `spec`; False (nothing written) otherwise."""
        if self._admit(spec) is not None:
            return False
        self._write(spec)
        return True

    def bind(self, spec: Spec, timeout: float = 20.0) -> None:
        """Bind, waiting while something blocks `spec` (the extender's bind waits likewise)."""
        deadline = time.monotonic() + timeout
        while (blocker := self._admit(spec)) is not None:
            assert time.monotonic() < deadline, f"{spec.name} waited for {blocker.name}"
            time.sleep(0.01)
        self._write(spec)

    def _write(self, spec: Spec) -> None:
        created = int(EPOCH.timestamp()) + spec.created
        value = codec.encode_pod_devices(spec.entries)
        self._kube.patch_pod_metadata(
            "default",
            spec.name,
            {
                ANNOTATION_DEVICES_TO_ALLOCATE: value,
                ANNOTATION_DEVICES_ALLOCATED: value,
                ANNOTATION_VGPU_NODE: NODE,
                ANNOTATION_VGPU_TIME: str(created),
                ANNOTATION_BIND_PHASE: "allocating",
                ANNOTATION_BIND_TIME: str(created + 1),
            },
            {LABEL_VGPU_NODE: NODE},
        )
        record = self._kube.get_pod("default", spec.name)
        self._kube.bind_pod("default", spec.name, record.uid, NODE)
        with self._lock:
            self._in_flight[spec.key] = InFlightPod(
                "default", spec.name, created, spec.entries, spec.entries, True, shape=spec.shape
            )


def create(apiserver: FakeApiServer, spec: Spec) -> None:
    """The user's pod, unbound, with its creationTimestamp."""
    containers = [
        make_container(name, limits={"nvidia.com/gpu": str(len(entry))} if entry else None)
        for name, entry in zip(spec.container_names(), spec.entries, strict=True)
    ]
    pod = make_pod(
        spec.name,
        init_containers=containers[: spec.init_count],
        containers=containers[spec.init_count :],
    )
    stamp = datetime.fromtimestamp(EPOCH.timestamp() + spec.created, UTC)
    pod["metadata"]["creationTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    apiserver.add_pod(pod)


def phase(apiserver: FakeApiServer, name: str) -> str:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return str(pod["status"]["phase"])


def bind_phase(apiserver: FakeApiServer, name: str) -> str:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    return str(pod["metadata"]["annotations"][ANNOTATION_BIND_PHASE])


def assert_each_container_got_its_own_booking(
    node: Node, admitted: PodAdmitter, specs: Sequence[Spec]
) -> None:
    responses = admitted.responses
    for spec in specs:
        for name, entry in zip(spec.container_names(), spec.entries, strict=True):
            if not entry:
                assert (*spec.key, name) not in responses
                continue
            envs = responses[(*spec.key, name)].envs
            assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(dict.fromkeys(d.uuid for d in entry))
            for i, device in enumerate(entry):
                assert envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{device.used_mem_mib}m"
            assert envs["CUDA_DEVICE_SM_LIMIT"] == str(entry[0].used_cores)
        pod = node.apiserver.get_pod("default", spec.name)
        assert pod is not None
        assert pod["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "success", spec.name
        assert pod["status"]["phase"] == "Running"
    assert sorted(admitted.admitted) == sorted(s.key for s in specs)
    assert admitted.failures == {}


def run_burst(node: Node, specs: Sequence[Spec], seed: int, waves: int = 3) -> PodAdmitter:
    """Create every pod; bind those that may be in flight together before kubelet runs (its
    first batch), then the others from 8 threads in a random order, in waves, while it admits."""
    for spec in specs:
        create(node.apiserver, spec)
    scheduler = Scheduler(node.kube)
    # Whatever may be in flight together goes out before kubelet runs: its first batch.
    first: list[Spec] = []
    for spec in sorted(specs, key=lambda s: s.created):
        if len(first) < max(2, len(specs) // 3) and scheduler.try_bind(spec):
            first.append(spec)
    assert len(first) > 1
    order = [s for s in specs if s not in first]
    random.Random(seed).shuffle(order)
    with admitter(node, seed) as kubelet, futures.ThreadPoolExecutor(8) as pool:
        for wave in range(waves):
            list(pool.map(scheduler.bind, order[wave::waves]))
        kubelet.wait_for([s.key for s in specs], timeout=30)
    return kubelet


def test_without_the_pod_resources_socket_the_node_claims_in_flight_v1(node_v1: Node) -> None:
    wait_for_protocol(node_v1, "in-flight/v1")
    assert node_v1.kubelet.pod_resources_calls == 0


def test_with_kubelets_pod_resources_api_the_node_claims_in_flight_v2(node: Node) -> None:
    wait_for_protocol(node, "in-flight/v2")
    # the test kubelet's GetAllocatableResources: every advertised slot (no NUMA node: the
    # daemon reports none without --enable-numa-topology)
    with grpc.insecure_channel(f"unix://{node.kubelet.pod_resources_socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.GetAllocatableResources(podresources_pb2.AllocatableResourcesRequest())
    assert len(answer.devices) == 2 * SPLIT
    assert {d.resource_name for d in answer.devices} == {"nvidia.com/gpu"}
    assert {d.device_ids[0] for d in answer.devices} == {f"{GPU_0}-{i}" for i in range(SPLIT)} | {
        f"{GPU_1}-{i}" for i in range(SPLIT)
    }
    assert not any(d.topology.nodes for d in answer.devices)
    # while the API fails the node says v1, and v2 again once it answers
    node.kubelet.fail_pod_resources(grpc.StatusCode.UNAVAILABLE)
    wait_for_protocol(node, ALLOCATE_PROTOCOL)
    node.kubelet.fail_pod_resources(None)
    wait_for_protocol(node, ALLOCATE_PROTOCOL_V2)


def test_an_allocate_that_finds_the_api_failing_has_the_node_say_v1_at_once(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    # A register round every minute: only the Allocate's report can make the node say v1 now.
    with running_node(sock_dir, tmp_path, apiserver, kube, register_interval_seconds=60) as node:
        wait_for_protocol(node, ALLOCATE_PROTOCOL_V2)
        scheduler = Scheduler(node.kube)
        older, newer = Spec("older", 0, booking(0, [1])), Spec("newer", 1, booking(1, [1]))
        for spec in (older, newer):
            create(node.apiserver, spec)
            scheduler.bind(spec)
        calls = node.kubelet.pod_resources_calls
        node.kubelet.fail_pod_resources(grpc.StatusCode.UNAVAILABLE, times=1)
        # The node claimed v2: pods bound together under it may have reached kubelet in any
        # order, so creation order is no answer; the call fails, nothing is served or patched.
        with pytest.raises(grpc.RpcError) as caught:
            node.kubelet.allocate([f"{GPU_0}-0"])
        assert "kubelet is admitting none of them" in str(caught.value.details())
        assert node.kubelet.pod_resources_calls == calls + 1
        wait_for_protocol(node, ALLOCATE_PROTOCOL)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_burst_created_in_different_seconds_gets_every_booking_right(
    node: Node, seed: int
) -> None:
    rng = random.Random(seed)
    seconds = rng.sample(range(40), 10)
    specs = [Spec(f"p{i}", seconds[i], booking(i, [1])) for i in range(10)]
    kubelet = run_burst(node, specs, seed)
    assert_each_container_got_its_own_booking(node, kubelet, specs)
    # Several pods reached kubelet in one batch (the first wave), ordered by creation second.
    assert len(kubelet.batches[0]) > 1
    for batch in kubelet.batches:
        created = [next(s.created for s in specs if s.key == key) for key in batch]
        assert created == sorted(created)


@pytest.mark.parametrize("seed", [4, 5])
def test_same_second_pods_with_mixed_counts_and_containers(node: Node, seed: int) -> None:
    specs = [
        Spec("one-a", 0, booking(0, [1])),
        Spec("one-b", 0, booking(1, [1])),  # ties with one-a: the scheduler holds one back
        Spec("two", 0, booking(2, [2])),
        Spec("init", 1, booking(3, [1, 0, 2]), init_count=1),
        Spec("pair", 1, booking(4, [2, 2])),
        Spec("late", 2, booking(5, [1])),
    ]
    kubelet = run_burst(node, specs, seed, waves=2)
    assert_each_container_got_its_own_booking(node, kubelet, specs)
    # The app container after a GPU init container got the init container's device IDs back.
    ids = kubelet.device_ids
    assert set(ids[("default", "init", "c2")]) & set(ids[("default", "init", "c0")])


def test_kubelet_admission_survives_api_server_faults(node: Node) -> None:
    specs = [Spec(f"f{i}", i, booking(i, [1])) for i in range(4)]
    for spec in specs:
        create(node.apiserver, spec)
    scheduler = Scheduler(node.kube)
    with admitter(node, 7) as kubelet:
        node.apiserver.inject_fault("GET", "/api/v1/pods", status=500, times=3)
        node.apiserver.inject_fault("GET", "/api/v1/pods", disconnect=True, times=2)
        node.apiserver.inject_fault("PATCH", "/api/v1/namespaces/default/pods/f0", status=503)
        for spec in specs:
            scheduler.bind(spec)
        kubelet.wait_for([s.key for s in specs], timeout=30)
        # The status patch answered 503 once is sent again.
        wait_until(lambda: phase(node.apiserver, "f0") == "Running", "f0 Running", timeout=30.0)
    assert_each_container_got_its_own_booking(node, kubelet, specs)


def test_a_hami_lock_still_selects_the_named_pod(node: Node) -> None:
    older, locked = Spec("older", 0, booking(0, [1])), Spec("locked", 5, booking(1, [1]))
    scheduler = Scheduler(node.kube)
    for spec in (older, locked):
        create(node.apiserver, spec)
        scheduler.bind(spec)
    node.apiserver.update_object(
        "nodes",
        "",
        NODE,
        lambda n: n["metadata"]["annotations"].update(
            {ANNOTATION_NODE_LOCK: "2026-03-01T00:00:00Z,default,locked"}
        ),
    )
    (device_id,) = node.kubelet.preferred([f"{GPU_1}-0", f"{GPU_0}-0"], size=1)
    assert device_id.startswith(locked.entries[0][0].uuid)
    answer = node.kubelet.allocate([device_id]).container_responses[0]
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{locked.entries[0][0].used_mem_mib}m"
    assert bind_phase(node.apiserver, "locked") == "success"
    assert bind_phase(node.apiserver, "older") == "allocating"
    stored = node.apiserver.get_node(NODE)
    assert stored is not None
    assert ANNOTATION_NODE_LOCK not in stored["metadata"]["annotations"]


def test_candidates_that_cannot_be_told_apart_fail_without_a_patch(node_v1: Node) -> None:
    node = node_v1
    # Two pods bound in the same second with the same count: no scheduler following the rule
    # does this, so it is written by hand.
    specs = [Spec("twin-a", 3, booking(0, [1])), Spec("twin-b", 3, booking(1, [1]))]
    for spec in specs:
        create(node.apiserver, spec)
        value = codec.encode_pod_devices(spec.entries)
        node.kube.patch_pod_metadata(
            "default",
            spec.name,
            {
                ANNOTATION_DEVICES_TO_ALLOCATE: value,
                ANNOTATION_DEVICES_ALLOCATED: value,
                ANNOTATION_VGPU_NODE: NODE,
                ANNOTATION_BIND_PHASE: "allocating",
                ANNOTATION_BIND_TIME: "1",
            },
        )
        record = node.kube.get_pod("default", spec.name)
        node.kube.bind_pod("default", spec.name, record.uid, NODE)
    node.apiserver.clear_requests()
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate([f"{GPU_0}-0"])
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "allocation of 1 device(s)" in caught.value.details()
    assert "default/twin-a" in caught.value.details()
    assert node.apiserver.requests_matching("PATCH|POST", "/api/v1/namespaces/default/.*") == []
    # With the test kubelet: it rejects the pod it was admitting, and the other one is then the
    # only candidate.
    with admitter(node, 11) as kubelet:
        kubelet.wait_for([s.key for s in specs], timeout=20)
    (failed,) = kubelet.failures
    assert kubelet.failures[failed].startswith(
        "Allocate failed due to rpc error: code = FailedPrecondition desc = "
    )
    assert "cannot tell which pod an allocation of 1 device(s) is for" in kubelet.failures[failed]
    (succeeded,) = kubelet.admitted
    annotation_patches = [
        r.json()
        for r in node.apiserver.requests_matching(
            "PATCH", f"/api/v1/namespaces/default/pods/{failed[1]}"
        )
        if "annotations" in r.json().get("metadata", {})
    ]
    assert annotation_patches == []
    pod = node.apiserver.get_pod(*failed)
    assert pod is not None
    assert pod["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "allocating"
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    other = node.apiserver.get_pod(*succeeded)
    assert other is not None
    assert other["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "success"


def test_the_test_kubelet_counts_devices_and_frees_those_of_deleted_pods(node: Node) -> None:
    scheduler = Scheduler(node.kube)
    big = Spec("big", 0, booking(0, [2] * SPLIT))  # every one of the 2 x SPLIT device IDs
    late = Spec("late", 1, booking(1, [1]))
    with admitter(node, 3) as kubelet:
        create(node.apiserver, big)
        scheduler.bind(big)
        kubelet.wait_for([big.key])
        create(node.apiserver, late)
        scheduler.bind(late)
        kubelet.wait_for([late.key])
        assert kubelet.failures[late.key] == (
            "requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0"
        )
        assert phase(node.apiserver, "late") == "Failed"
        node.apiserver.delete_pod("default", "big")
        node.apiserver.delete_pod("default", "late")
        again = Spec("again", 2, booking(2, [1]))
        create(node.apiserver, again)
        scheduler.bind(again)
        kubelet.wait_for([again.key])
    assert kubelet.admitted == [big.key, again.key]
    used = {i for key, ids in kubelet.device_ids.items() if key[1] == "big" for i in ids}
    assert len(used) == 2 * SPLIT


# --- in-flight/v2: identical pods in flight together ---------------------------------------------

JOB_MEMORY_MIB = 2000


def job_pod(index: int) -> Spec:
    """One pod of a Job: one GPU of 2000 MiB, created in the same second as the others; the
    scheduler books GPU 0 or GPU 1."""
    gpu = (GPU_0, GPU_1)[index % 2]
    entries = ((ContainerDevice(gpu, "NVIDIA", JOB_MEMORY_MIB, 10),),)
    return Spec(f"job-{index:02d}", 0, entries, shape=("1 GPU", JOB_MEMORY_MIB, 10))


@pytest.mark.parametrize("seed", [21, 22])
def test_twenty_identical_pods_bound_at_once_each_get_their_own_booking(
    node: Node, seed: int
) -> None:
    wait_for_protocol(node, ALLOCATE_PROTOCOL_V2)
    specs = [job_pod(i) for i in range(2 * SPLIT)]  # every slot of both GPUs
    for spec in specs:
        create(node.apiserver, spec)
    scheduler = Scheduler(node.kube)
    assert scheduler.level == 2
    # half bound before kubelet runs (its first batch), the rest from 8 threads while it admits
    first = specs[:SPLIT]
    assert all(scheduler.try_bind(spec) for spec in first)
    rest = specs[SPLIT:]
    random.Random(seed).shuffle(rest)
    with admitter(node, seed) as kubelet, futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(scheduler.try_bind, rest))
        kubelet.wait_for([s.key for s in specs], timeout=30)
    assert scheduler.waits == 0  # nobody waited for anybody
    assert_each_container_got_its_own_booking(node, kubelet, specs)
    # the memory is the same for all: the container's host directory names whose booking it got
    hook = str(Path(node.daemon.settings.hook_path))
    for spec in specs:
        pod = node.apiserver.get_pod(*spec.key)
        assert pod is not None
        host_dirs = {m.host_path for m in kubelet.responses[(*spec.key, "c0")].mounts}
        assert container_dir(hook, pod["metadata"]["uid"], "c0") in host_dirs, spec.name
    # kubelet's order was its own (ties in random order), and the device plugin asked it
    admitted = kubelet.admitted
    assert admitted != sorted(admitted)
    assert node.kubelet.pod_resources_calls >= len(specs) - 1


def test_without_the_pod_resources_socket_identical_pods_wait_for_each_other(
    node_v1: Node,
) -> None:
    wait_for_protocol(node_v1, ALLOCATE_PROTOCOL)
    specs = [job_pod(i) for i in range(2 * SPLIT)]
    for spec in specs:
        create(node_v1.apiserver, spec)
    scheduler = Scheduler(node_v1.kube)
    assert scheduler.level == 1
    assert scheduler.try_bind(specs[0])
    assert not scheduler.try_bind(specs[1])  # same count, same second: in-flight/v1 waits
    with admitter(node_v1, 23) as kubelet, futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(scheduler.bind, specs[1:]))
        kubelet.wait_for([s.key for s in specs], timeout=30)
    assert scheduler.waits > 1
    assert_each_container_got_its_own_booking(node_v1, kubelet, specs)
    assert node_v1.kubelet.pod_resources_calls == 0
