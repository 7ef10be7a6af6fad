"""The DevicePlugin gRPC server over a real unix socket, with the API server double behind it."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_plugin.deviceplugin.allocate import AllocateConfig
from hami_plugin.deviceplugin.allocator import PodAllocator
from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.gpu_admin import gpu_admin_reader
from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
from hami_plugin.deviceplugin.inventory import VgpuDevice
from hami_plugin.deviceplugin.server import DevicePluginService, PluginServer
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.fake import FakeKube
from hami_plugin.protocol.gpu_admin import LABEL_GPU_ADMIN
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
)
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
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

CACHE_ID = "00000000-0000-4000-8000-000000000000"


@dataclass
class Plugin:
    stub: api_pb2_grpc.DevicePluginStub
    board: DeviceBoard
    server: PluginServer
    hook_path: str
    vgpulock: str
    lost: list[str] = field(default_factory=list)


@pytest.fixture
def plugin(sock_dir: str, tmp_path: Path, kube: KubeClient) -> Iterator[Plugin]:
    with running_plugin(sock_dir, tmp_path, kube) as started:
        yield started


@contextlib.contextmanager
def running_plugin(
    sock_dir: str, tmp_path: Path, kube: KubeClient, **config: Any
) -> Iterator[Plugin]:
    board = DeviceBoard(vgpus(GPU_A, GPU_B))
    hook = str(tmp_path / "hook")
    install_fake_hamicore(hook)
    vgpulock = str(tmp_path / "vgpulock")
    allocator = PodAllocator(
        kube,
        NODE,
        AllocateConfig(hook_path=hook, vgpulock_host_path=vgpulock, **config),
        new_cache_id=lambda: CACHE_ID,
        hamicore=HamiCoreWatch(hook, node_name=NODE, version="9.9.9"),
    )
    service = DevicePluginService(board, allocator)
    lost: list[str] = []
    server = PluginServer(
        service, os.path.join(sock_dir, "p.sock"), on_stream_lost=lambda: lost.append("lost")
    )
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    try:
        yield Plugin(stub, board, server, hook, vgpulock, lost)
    finally:
        channel.close()
        server.stop()
        board.close()


def allocate(plugin: Plugin, *ids: str) -> api_pb2.ContainerAllocateResponse:
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=list(ids))
    response = plugin.stub.Allocate(request, timeout=10)
    assert len(response.container_responses) == 1
    result: api_pb2.ContainerAllocateResponse = response.container_responses[0]
    return result


@pytest.fixture(autouse=True)
def node(apiserver: FakeApiServer) -> None:
    apiserver.add_node(NODE)


# --- options, PreStart ------------------------------------------------------------------------


def test_options_and_prestart(plugin: Plugin) -> None:
    options = plugin.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available
    assert not options.pre_start_required
    plugin.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["x"]), timeout=5)


# --- ListAndWatch ---------------------------------------------------------------------------------


def test_list_and_watch_sends_the_list_then_each_change(plugin: Plugin) -> None:
    stream = plugin.stub.ListAndWatch(api_pb2.Empty())
    first = next(stream)
    assert [(d.ID, d.health) for d in first.devices] == [
        (f"{GPU_A}-0", "Healthy"),
        (f"{GPU_A}-1", "Healthy"),
        (f"{GPU_B}-0", "Healthy"),
        (f"{GPU_B}-1", "Healthy"),
    ]
    assert not first.devices[0].HasField("topology")

    assert not plugin.board.publish(vgpus(GPU_A, GPU_B))  # unchanged: nothing sent
    sick = [VgpuDevice(d.id, d.gpu_uuid, d.gpu_uuid != GPU_B, 1) for d in vgpus(GPU_A, GPU_B)]
    assert plugin.board.publish(sick)
    second = next(stream)
    assert [d.health for d in second.devices] == ["Healthy", "Healthy", "Unhealthy", "Unhealthy"]
    assert [n.ID for n in second.devices[0].topology.nodes] == [1]
    stream.cancel()


def test_a_cancelled_stream_frees_its_thread_and_reports_the_loss(plugin: Plugin) -> None:
    baseline = threading.active_count()
    streams = [plugin.stub.ListAndWatch(api_pb2.Empty()) for _ in range(3)]
    for stream in streams:
        next(stream)
    assert plugin.server.live_streams == 3
    for stream in streams:
        stream.cancel()
    for _ in range(200):
        if plugin.server.live_streams == 0 and len(plugin.lost) == 3:
            break
        threading.Event().wait(0.01)
    assert plugin.server.live_streams == 0
    assert plugin.lost == ["lost"] * 3
    # The executor keeps idle workers; what matters is that none is stuck in a stream.
    assert threading.active_count() <= baseline + 16


def test_stopping_the_server_ends_streams_without_reporting_a_loss(plugin: Plugin) -> None:
    stream = plugin.stub.ListAndWatch(api_pb2.Empty())
    next(stream)
    plugin.server.stop()
    with pytest.raises((grpc.RpcError, StopIteration)):  # ended, cleanly or cancelled
        next(stream)
    assert plugin.server.live_streams == 0
    assert plugin.lost == []
    assert not os.path.exists(plugin.server.socket_path)


def test_closing_the_board_ends_the_stream(plugin: Plugin) -> None:
    stream = plugin.stub.ListAndWatch(api_pb2.Empty())
    next(stream)
    plugin.board.close()
    with pytest.raises(StopIteration):
        next(stream)


# --- Allocate -----------------------------------------------------------------------------------


def test_allocate_answers_with_hami_core_env_and_finishes_the_pod(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    uid = add_pending_pod(apiserver, "p1", [[dev(GPU_B, 3000, 30)]])["metadata"]["uid"]
    answer = allocate(plugin, f"{GPU_B}-1")

    assert dict(answer.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPU_B,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{plugin.hook_path}/vgpu/{CACHE_ID}.cache",
    }
    container_dir = f"{plugin.hook_path}/vgpu/containers/{uid}_main"
    assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
        (f"{plugin.hook_path}/vgpu/libvgpu.so", f"{plugin.hook_path}/vgpu/libvgpu.so", True),
        (f"{plugin.hook_path}/vgpu", container_dir, False),
        ("/tmp/vgpulock", plugin.vgpulock, False),
        ("/etc/ld.so.preload", f"{plugin.hook_path}/vgpu/ld.so.preload", True),
    ]
    assert stat.S_IMODE(os.stat(container_dir).st_mode) == 0o777
    assert os.path.isdir(plugin.vgpulock)

    annotations = pod_annotations(apiserver, "p1")
    assert annotations[ANNOTATION_BIND_PHASE] == "success"
    assert annotations[ANNOTATION_DEVICES_TO_ALLOCATE] == ";;"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)
    assert apiserver.events() == []


def test_a_multi_container_pod_keeps_the_lock_until_the_last_container(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    add_pending_pod(
        apiserver, "p2", [[dev(GPU_A, 1000)], [dev(GPU_B, 2000)]], containers=("a", "b")
    )
    first = allocate(plugin, f"{GPU_A}-0")
    assert first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert pod_annotations(apiserver, "p2")[ANNOTATION_BIND_PHASE] == "allocating"
    assert ANNOTATION_NODE_LOCK in node_annotations(apiserver)

    second = allocate(plugin, f"{GPU_B}-0")
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert pod_annotations(apiserver, "p2")[ANNOTATION_BIND_PHASE] == "success"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)


def test_versioned_libvgpu_and_disable_control(plugin: Plugin, apiserver: FakeApiServer) -> None:
    """Before: `CUDA_DISABLE_CONTROL=true` in the pod's env left `/etc/ld.so.preload` out of
    kubelet's Allocate answer (HAMi's choice), so HAMi-core never loaded. After: it is there,
    read-only, as for any container."""
    install_fake_hamicore(plugin.hook_path, version="9.9.9")
    add_pending_pod(apiserver, "p3", [[dev(GPU_A)]], env={"CUDA_DISABLE_CONTROL": "true"})
    answer = allocate(plugin, f"{GPU_A}-0")
    mounts = {m.container_path: m for m in answer.mounts}
    assert mounts[f"{plugin.hook_path}/vgpu/libvgpu.so"].host_path.endswith("/libvgpu.so.9.9.9")
    preload = mounts["/etc/ld.so.preload"]
    assert (preload.host_path, preload.read_only) == (
        f"{plugin.hook_path}/vgpu/ld.so.preload",
        True,
    )


@pytest.mark.parametrize(
    ("labels", "preload"),
    [
        ({LABEL_GPU_ADMIN: "true"}, False),
        ({LABEL_GPU_ADMIN: "yes"}, True),
        ({}, True),
        (None, True),  # no such namespace: the read fails, the preload is mounted
    ],
)
def test_only_a_gpu_admin_namespace_may_turn_hamicore_off(
    sock_dir: str,
    tmp_path: Path,
    kube: KubeClient,
    apiserver: FakeApiServer,
    labels: dict[str, str] | None,
    preload: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The device plugin reads the pod's namespace (GET /api/v1/namespaces/<name>) only for a
    container that sets `CUDA_DISABLE_CONTROL=true`, and leaves the preload out only when the
    namespace is labelled hami-plugin.io/gpu-admin=true."""
    if labels is not None:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
        namespace["metadata"]["labels"] = labels  # type: ignore[index]
        api_namespace = apiserver.add_object(namespace)
        assert api_namespace["metadata"]["name"] == "default"
    add_pending_pod(apiserver, "tool", [[dev(GPU_A)]], env={"CUDA_DISABLE_CONTROL": "true"})
    with (
        running_plugin(
            sock_dir, tmp_path, kube, gpu_admin_namespace=gpu_admin_reader(kube)
        ) as started,
        caplog.at_level(logging.WARNING, "hami_plugin.deviceplugin.gpu_admin"),
    ):
        answer = allocate(started, f"{GPU_A}-0")
    paths = {m.container_path for m in answer.mounts}
    assert ("/etc/ld.so.preload" in paths) is preload
    reads = [r for r in apiserver.requests if r.path == "/api/v1/namespaces/default"]
    assert [r.method for r in reads] == ["GET"]
    assert ("cannot read namespace default" in caplog.text) is (labels is None)


def test_no_namespace_read_without_cuda_disable_control(
    sock_dir: str, tmp_path: Path, kube: KubeClient, apiserver: FakeApiServer
) -> None:
    add_pending_pod(apiserver, "plain", [[dev(GPU_A)]])
    with running_plugin(
        sock_dir, tmp_path, kube, gpu_admin_namespace=gpu_admin_reader(kube)
    ) as started:
        answer = allocate(started, f"{GPU_A}-0")
    assert "/etc/ld.so.preload" in {m.container_path for m in answer.mounts}
    assert not [r for r in apiserver.requests if r.path.startswith("/api/v1/namespaces/default")
                and "/pods" not in r.path and "/events" not in r.path]  # fmt: skip


def test_two_concurrent_allocates_serve_two_pending_pods(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    # In flight together (no node lock): kubelet admits the older-created pod first.
    older, newer = "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"
    add_pending_pod(apiserver, "older", [[dev(GPU_A, 1111)]], lock=None, created=older)
    add_pending_pod(apiserver, "newer", [[dev(GPU_B, 2222)]], lock=None, created=newer)
    with futures.ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda device_id: allocate(plugin, device_id), [f"{GPU_A}-0", f"{GPU_B}-0"])
        )
    limits = sorted(a.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] for a in answers)
    assert limits == ["1111m", "2222m"]
    assert pod_annotations(apiserver, "older")[ANNOTATION_BIND_PHASE] == "success"
    assert pod_annotations(apiserver, "newer")[ANNOTATION_BIND_PHASE] == "success"


def test_malformed_annotation_fails_the_pod_and_the_server_keeps_serving(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    add_pending_pod(apiserver, "bad", [], raw_value=f"{GPU_A},NVIDIA,3000:;")
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "default/bad" in caught.value.details()
    assert ANNOTATION_DEVICES_TO_ALLOCATE in caught.value.details()
    assert pod_annotations(apiserver, "bad")[ANNOTATION_BIND_PHASE] == "failed"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)
    (event,) = apiserver.events("default")
    assert event["reason"] == "AllocateFailed"
    assert event["type"] == "Warning"
    assert ANNOTATION_DEVICES_TO_ALLOCATE in event["message"]

    add_pending_pod(apiserver, "good", [[dev(GPU_A)]], bind_time=300)
    assert allocate(plugin, f"{GPU_A}-1").envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert pod_annotations(apiserver, "good")[ANNOTATION_BIND_PHASE] == "success"


def test_a_failing_event_does_not_hide_the_allocation_error(
    plugin: Plugin, apiserver: FakeApiServer, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_event(*args: object, **kwargs: object) -> None:
        raise RuntimeError("event sink exploded")

    monkeypatch.setattr(kube, "create_pod_event", broken_event)
    add_pending_pod(apiserver, "bad", [], raw_value=f"{GPU_A},NVIDIA,3000:;")
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert ANNOTATION_DEVICES_TO_ALLOCATE in caught.value.details()
    assert pod_annotations(apiserver, "bad")[ANNOTATION_BIND_PHASE] == "failed"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)


def test_wrong_device_count_is_an_invalid_argument(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    add_pending_pod(apiserver, "two", [[dev(GPU_A), dev(GPU_B)]])
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "device number not matched" in caught.value.details()
    assert pod_annotations(apiserver, "two")[ANNOTATION_BIND_PHASE] == "failed"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)


def test_no_pending_pod_patches_nothing(plugin: Plugin, apiserver: FakeApiServer) -> None:
    apiserver.clear_requests()
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == f"no binding pod found on node {NODE}"
    assert apiserver.requests_matching("PATCH|POST") == []


def test_a_lock_held_by_another_pod_is_left_alone(plugin: Plugin, apiserver: FakeApiServer) -> None:
    add_pending_pod(apiserver, "mine", [[dev(GPU_A)]], lock=None)
    other = "2026-01-01T00:00:00Z,default,someone-else"
    apiserver.update_object(
        "nodes",
        "",
        NODE,
        lambda n: n["metadata"]["annotations"].update({ANNOTATION_NODE_LOCK: other}),
    )
    allocate(plugin, f"{GPU_A}-0")
    assert pod_annotations(apiserver, "mine")[ANNOTATION_BIND_PHASE] == "success"
    assert node_annotations(apiserver)[ANNOTATION_NODE_LOCK] == other


def test_lock_release_retries_after_a_conflict(plugin: Plugin, apiserver: FakeApiServer) -> None:
    add_pending_pod(apiserver, "racy", [[dev(GPU_A)]])
    apiserver.inject_fault("PATCH", f"/api/v1/nodes/{NODE}", status=409, times=1)
    allocate(plugin, f"{GPU_A}-0")
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)
    patches = apiserver.requests_matching("PATCH", f"/api/v1/nodes/{NODE}")
    assert len(patches) == 2
    assert all("resourceVersion" in p.json()["metadata"] for p in patches)


def test_api_server_away_is_unavailable(plugin: Plugin, apiserver: FakeApiServer) -> None:
    apiserver.inject_fault("GET", f"/api/v1/nodes/{NODE}", status=503, times=None)
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_host_dir_failure_fails_the_pod(plugin: Plugin, apiserver: FakeApiServer) -> None:
    Path(f"{plugin.hook_path}/vgpu/containers").write_text("not a directory")
    add_pending_pod(apiserver, "nodir", [[dev(GPU_A)]])
    with pytest.raises(grpc.RpcError) as caught:
        allocate(plugin, f"{GPU_A}-0")
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert "cannot create" in caught.value.details()
    assert pod_annotations(apiserver, "nodir")[ANNOTATION_BIND_PHASE] == "failed"


def test_unexpected_errors_are_unknown_and_logged_once(
    sock_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    board = DeviceBoard(vgpus(GPU_A))
    broken = FakeKube()
    broken.fail("get_node", RuntimeError("boom"), times=None)
    allocator = PodAllocator(broken, NODE, AllocateConfig())
    server = PluginServer(DevicePluginService(board, allocator), os.path.join(sock_dir, "u.sock"))
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=[f"{GPU_A}-0"])
            with caplog.at_level(logging.ERROR), pytest.raises(grpc.RpcError) as caught:
                stub.Allocate(request, timeout=5)
            # GetPreferredAllocation never fails, even then.
            preferred = api_pb2.PreferredAllocationRequest()
            preferred.container_requests.add(
                available_deviceIDs=[f"{GPU_A}-0", f"{GPU_A}-1"], allocation_size=1
            )
            answer = stub.GetPreferredAllocation(preferred, timeout=5)
    finally:
        server.stop()
    assert caught.value.code() is grpc.StatusCode.UNKNOWN
    assert "boom" in caught.value.details()
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert list(answer.container_responses[0].deviceIDs) == [f"{GPU_A}-0"]


# --- GetPreferredAllocation ---------------------------------------------------------------------


def preferred(plugin: Plugin, available: Sequence[str], size: int) -> list[str]:
    request = api_pb2.PreferredAllocationRequest()
    request.container_requests.add(available_deviceIDs=list(available), allocation_size=size)
    response = plugin.stub.GetPreferredAllocation(request, timeout=5)
    return list(response.container_responses[0].deviceIDs)


def test_preferred_allocation_follows_the_pending_pod(
    plugin: Plugin, apiserver: FakeApiServer
) -> None:
    add_pending_pod(apiserver, "pref", [[dev(GPU_B)]])
    available = [f"{GPU_A}-0", f"{GPU_A}-1", f"{GPU_B}-0", f"{GPU_B}-1"]
    assert preferred(plugin, available, 1) == [f"{GPU_B}-0"]
    apiserver.inject_fault(status=500, times=None)
    assert preferred(plugin, available, 2) == [f"{GPU_A}-0", f"{GPU_B}-0"]
