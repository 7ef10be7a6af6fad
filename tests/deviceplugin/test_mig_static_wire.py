"""Static MIG over the real wire: the daemon on the fake NVML (GPUs with `mig: true` and
`mig_devices`), the test kubelet registering every resource over gRPC, Allocate answers for
whole MIG devices, health of MIG devices, refusal at start, and `hami_mig_device_info`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.daemon import EXIT_FAILURE, DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.fakenvml.nvml import FakeNvml
from hami_plugin.testing.fakenvml.values import (
    FakeDeviceHandle,
    FakeEventData,
    nvmlEventTypeXidCriticalError,
)
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import (
    DeviceState,
    FakeKubelet,
    ListedContainer,
    ListedPod,
    PluginConnection,
)
from tests.deviceplugin.daemons import serving
from tests.deviceplugin.test_metrics_daemon import scrape, value

NODE = "mig-node-1"
PLAIN = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
MIG_GPU = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
MIG_GPU_2 = "GPU-2bfede84-4e70-2174-49af-f07ebb94d1ae"
MIG_A = "MIG-11111111-1111-1111-1111-111111111111"
MIG_B = "MIG-22222222-2222-2222-2222-222222222222"
MIG_C = "MIG-33333333-3333-3333-3333-333333333333"
MIG_D = "MIG-44444444-4444-4444-4444-444444444444"
SMALL = "nvidia.com/mig-1g.10gb"
LARGE = "nvidia.com/mig-3g.40gb"
A100 = "NVIDIA A100-SXM4-80GB"


def plain_gpu(uuid: str = PLAIN) -> dict[str, object]:
    return {"uuid": uuid, "name": A100, "memory_mib": 81920, "numa_node": 0}


def mig_gpu(uuid: str, devices: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {
        "uuid": uuid,
        "name": A100,
        "numa_node": 1,
        "mig": True,
        "mig_devices": devices,
        **extra,
    }


MIXED_NODE = [
    plain_gpu(),
    mig_gpu(
        MIG_GPU,
        [
            {"profile": "1g.10gb", "start": 0, "uuid": MIG_A},
            {"profile": "1g.10gb", "start": 1, "uuid": MIG_B},
            {"profile": "3g.40gb", "start": 4, "uuid": MIG_C},
        ],
    ),
]


def write_gpus(path: Path, gpus: list[dict[str, object]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")
    tmp.replace(path)


@dataclass
class Node:
    daemon: DevicePluginDaemon
    kubelet: FakeKubelet
    gpus_file: Path
    gpus: list[dict[str, object]]

    def connection(self, resource: str) -> PluginConnection:
        found = [c for c in self.kubelet.connections if c.request.resource_name == resource]
        assert found, f"{resource} is not registered"
        return found[-1]

    def listed(self, resource: str, predicate: object = None) -> tuple[DeviceState, ...]:
        connection = self.connection(resource)
        return self.kubelet.wait_for_list(
            predicate if callable(predicate) else (lambda states: True),
            connection=connection,
        )

    def allocate(self, resource: str, ids: list[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=ids)
        response: api_pb2.AllocateResponse = self.connection(resource).stub.Allocate(
            request, timeout=10
        )
        return response


def settings_for(
    sock_dir: str, tmp_path: Path, strategy: str, gpus: list[dict[str, object]], **extra: object
) -> DevicePluginSettings:
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file, gpus)
    hook = tmp_path / "hook"
    install_fake_hamicore(str(hook))
    return DevicePluginSettings(
        **{
            "metrics_bind_address": "0",
            "node_name": NODE,
            "device_plugin_path": sock_dir,
            "nvml": "fake",
            "fake_gpus": str(gpus_file),
            "split_count": 2,
            "hook_path": str(hook),
            "register_interval_seconds": 0.3,
            "health_recovery_seconds": 0,
            "pod_resources_socket": "",
            "mig_strategy": strategy,
            **extra,
        }  # type: ignore[arg-type]
    )


def run_node(
    settings: DevicePluginSettings,
    sock_dir: str,
    tmp_path: Path,
    kube: KubeClient,
    gpus: list[dict[str, object]],
    registrations: int,
) -> Iterator[Node]:
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=load_nvml_module,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=ManualClock(),
    )
    with serving(daemon, sock_dir) as kubelet:
        kubelet.wait_for_registrations(registrations)
        yield Node(daemon, kubelet, tmp_path / "gpus.yaml", gpus)


@pytest.fixture
def mixed(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    apiserver.add_node(NODE)
    settings = settings_for(sock_dir, tmp_path, "mixed", MIXED_NODE)
    yield from run_node(settings, sock_dir, tmp_path, kube, MIXED_NODE, 3)


def test_mixed_registers_the_vgpu_resource_and_one_resource_per_profile(mixed: Node) -> None:
    names = sorted(c.request.resource_name for c in mixed.kubelet.connections)
    assert names == ["nvidia.com/gpu", SMALL, LARGE]
    endpoints = {c.request.resource_name: c.request.endpoint for c in mixed.kubelet.connections}
    assert endpoints[SMALL] == "nvidia-mig-1g.10gb.sock"
    assert endpoints[LARGE] == "nvidia-mig-3g.40gb.sock"
    small = mixed.listed(SMALL, lambda states: len(states) == 2)
    assert [(s.id, s.health) for s in small] == [(MIG_A, "Healthy"), (MIG_B, "Healthy")]
    assert {s.numa_nodes for s in small} == {(1,)}  # the parent's, as HAMi's devices.go:217-221
    assert [s.id for s in mixed.listed(LARGE)] == [MIG_C]
    # The plain GPU stays HAMi-shared; the MIG GPU is not among the vGPU slots.
    vgpus = mixed.listed("nvidia.com/gpu", lambda states: len(states) == 2)
    assert [s.id for s in vgpus] == [f"{PLAIN}-0", f"{PLAIN}-1"]


def test_mixed_allocate_hands_out_whole_mig_devices(mixed: Node) -> None:
    mixed.listed(SMALL, lambda states: len(states) == 2)
    response = mixed.allocate(SMALL, [MIG_B, MIG_A])
    (container,) = response.container_responses
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{MIG_B},{MIG_A}"}
    assert not container.mounts and not container.cdi_devices


def test_mixed_allocate_refuses_a_device_of_another_resource(mixed: Node) -> None:
    mixed.listed(SMALL, lambda states: len(states) == 2)
    with pytest.raises(grpc.RpcError) as caught:
        mixed.allocate(SMALL, [MIG_C])
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        f"invalid allocation request for '{SMALL}': unknown device: {MIG_C}"
    )


def test_an_xid_on_the_parent_gpu_marks_its_mig_devices_unhealthy(mixed: Node) -> None:
    mixed.listed(SMALL, lambda states: len(states) == 2)
    gpus = [dict(gpu) for gpu in mixed.gpus]
    gpus[1]["xid"] = 79
    write_gpus(mixed.gpus_file, gpus)
    small = mixed.listed(SMALL, lambda states: {s.health for s in states} == {"Unhealthy"})
    assert [s.id for s in small] == [MIG_A, MIG_B]
    large = mixed.listed(LARGE, lambda states: {s.health for s in states} == {"Unhealthy"})
    assert [s.id for s in large] == [MIG_C]
    vgpus = mixed.listed("nvidia.com/gpu")
    assert {s.health for s in vgpus} == {"Healthy"}


def test_single_serves_the_mig_devices_under_nvidia_com_gpu(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    gpus = [
        mig_gpu(MIG_GPU, [{"profile": "1g.10gb", "start": 0, "uuid": MIG_A}]),
        mig_gpu(MIG_GPU_2, [{"profile": "1g.10gb", "start": 0, "uuid": MIG_D}]),
    ]
    settings = settings_for(sock_dir, tmp_path, "single", gpus)
    for node in run_node(settings, sock_dir, tmp_path, kube, gpus, 1):
        (connection,) = node.kubelet.connections
        assert connection.request.resource_name == "nvidia.com/gpu"
        assert connection.request.endpoint == "nvidia-gpu.sock"
        listed = node.listed("nvidia.com/gpu", lambda states: len(states) == 2)
        assert [s.id for s in listed] == [MIG_A, MIG_D]
        response = node.allocate("nvidia.com/gpu", [MIG_D])
        assert dict(response.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": MIG_D}


def test_single_refuses_to_start_with_two_kinds_of_mig_devices(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_node(NODE)
    settings = settings_for(sock_dir, tmp_path, "single", MIXED_NODE)
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    with caplog.at_level(logging.ERROR):
        assert daemon.run() == EXIT_FAILURE
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "error building device map: error building device map from config.resources: "
        "invalid MIG configuration: more than one MIG device type present on node"
    ]


def test_single_refuses_a_plain_gpu_next_to_uniform_mig_devices(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_node(NODE)
    gpus = [plain_gpu(), mig_gpu(MIG_GPU, [{"profile": "1g.10gb", "start": 0, "uuid": MIG_A}])]
    settings = settings_for(sock_dir, tmp_path, "single", gpus)
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    with caplog.at_level(logging.ERROR):
        assert daemon.run() == EXIT_FAILURE
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "error building device map: error building device map from config.resources: "
        "all devices on the node must be configured with the same migEnabled value"
    ]


def test_hami_mig_device_info_names_the_containers_holding_mig_devices(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    kubelet = FakeKubelet(sock_dir).start()
    kubelet.install_pod_resources(
        lambda: [
            ListedPod(
                "team-a",
                "trainer",
                (
                    ListedContainer("main", {SMALL: (MIG_B,), "nvidia.com/gpu": ("x",)}),
                    ListedContainer("side", {LARGE: (MIG_C,)}),
                ),
            )
        ]
    )
    settings = settings_for(
        sock_dir,
        tmp_path,
        "mixed",
        MIXED_NODE,
        metrics_bind_address="127.0.0.1:0",
        pod_resources_socket=kubelet.pod_resources_socket,
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    try:
        assert daemon.started.wait(10)
        kubelet.wait_for_registrations(3)
        assert daemon.metrics is not None
        families = scrape(daemon.metrics.url)
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
    assert exit_codes == [0]
    samples = families["hami_mig_device_info"]
    assert len(samples) == 2
    assert (
        value(
            families,
            "hami_mig_device_info",
            namespace="team-a",
            pod="trainer",
            container="main",
            vdevice_index="0",
            device_uuid=MIG_GPU,
            mig_uuid=MIG_B,
            profile="1g.10gb",
            compute_instance_id="0",
            zone="vGPU",
        )
        == 1
    )
    side = value(families, "hami_mig_device_info", container="side", mig_uuid=MIG_C)
    assert side == 1


def inject_instance_xid(fake: FakeNvml, uuid: str, xid: int, gi: int, ci: int) -> None:
    """An XidCriticalError naming one GPU and compute instance, as NVML reports an error inside
    a MIG device (the fake's file can only fire whole-GPU Xids)."""
    with fake._changed:
        for event_set in fake._event_sets:
            if event_set.registered.get(uuid, 0) & nvmlEventTypeXidCriticalError:
                event_set.queue.append(
                    FakeEventData(
                        FakeDeviceHandle(uuid), nvmlEventTypeXidCriticalError, xid, gi, ci
                    )
                )
        fake._changed.notify_all()


def test_an_xid_inside_one_mig_device_marks_only_that_device(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    settings = settings_for(sock_dir, tmp_path, "mixed", MIXED_NODE)
    assert settings.fake_gpus is not None
    fake = FakeNvml(settings.fake_gpus)
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=lambda _kind, _path: fake,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=ManualClock(),
    )
    with serving(daemon, sock_dir) as kubelet:
        kubelet.wait_for_registrations(3)
        node = Node(daemon, kubelet, tmp_path / "gpus.yaml", MIXED_NODE)
        node.listed(SMALL, lambda states: len(states) == 2)
        assert daemon.static_mig is not None
        (b,) = [d.device for d in daemon.static_mig.plan.devices if d.id == MIG_B]
        # A CI no served device has: ignored, as rm/health.go:184-186.
        inject_instance_xid(fake, MIG_GPU, 79, b.gpu_instance_id, b.compute_instance_id + 5)
        inject_instance_xid(fake, MIG_GPU, 79, b.gpu_instance_id, b.compute_instance_id)
        small = node.listed(SMALL, lambda states: "Unhealthy" in {s.health for s in states})
        assert [(s.id, s.health) for s in small] == [(MIG_A, "Healthy"), (MIG_B, "Unhealthy")]
        assert [s.health for s in node.listed(LARGE)] == ["Healthy"]
        assert daemon.static_mig.unhealthy == {MIG_B}
        # The parent GPU keeps its health: only the MIG device had the error.
        assert MIG_GPU not in daemon._unhealthy()
