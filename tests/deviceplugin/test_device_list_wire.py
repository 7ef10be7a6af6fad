"""The device list strategies over the real wire: the daemon on fake NVML, the test kubelet's
Allocate, the API server double; what kubelet receives (envs, mounts, annotations, cdi_devices)
and the CDI spec the daemon wrote."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.device_list import parse_device_list_strategies
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.model import ContainerDevice
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.deviceplugin.daemons import serving
from tests.deviceplugin.test_daemon import (
    GPU_0,
    GPU_1,
    NODE,
    SPLIT,
    bind_as_the_scheduler_would,
    healthy_ids,
    write_gpus,
)


@dataclass
class Running:
    kubelet: FakeKubelet
    apiserver: FakeApiServer
    hook_path: str
    cdi_dir: Path


def start(
    strategies: str, sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Running]:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    hook = str(tmp_path / "hook")
    install_fake_hamicore(hook)
    cdi_dir = tmp_path / "cdi"
    settings = DevicePluginSettings(
        metrics_bind_address="0",
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=SPLIT,
        hook_path=hook,
        register_interval_seconds=0.3,
        pod_resources_socket="",
        device_list_strategies=parse_device_list_strategies(strategies),
        cdi_spec_dir=str(cdi_dir),
        gdrcopy_enabled=True,
        mofed_enabled=True,
    )
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=load_nvml_module,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=ManualClock(),
    )
    with serving(daemon, sock_dir) as kubelet:
        yield Running(kubelet, apiserver, hook, cdi_dir)


@pytest.fixture
def cdi_running(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Running]:
    yield from start("cdi-annotations,cdi-cri", sock_dir, tmp_path, apiserver, kube)


@pytest.fixture
def mounts_running(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Running]:
    yield from start("volume-mounts", sock_dir, tmp_path, apiserver, kube)


def allocate_two_gpus(running: Running) -> api_pb2.ContainerAllocateResponse:
    kubelet = running.kubelet
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == 2 * SPLIT)
    bind_as_the_scheduler_would(
        running.apiserver,
        "trainer",
        ((ContainerDevice(GPU_1, "NVIDIA", 4000, 25), ContainerDevice(GPU_0, "NVIDIA", 8000, 25)),),
    )
    return kubelet.allocate([f"{GPU_1}-0", f"{GPU_0}-0"]).container_responses[0]


def test_cdi_strategies_reach_kubelet_as_annotations_and_cdi_devices(
    cdi_running: Running,
) -> None:
    answer = allocate_two_gpus(cdi_running)
    names = [
        f"k8s.device-plugin.nvidia.com/gpu={GPU_1}",
        f"k8s.device-plugin.nvidia.com/gpu={GPU_0}",
    ]
    assert [device.name for device in answer.cdi_devices] == names
    ((key, value),) = answer.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
    assert len(key.rsplit("_", 1)[1]) == 36  # a UUIDv4 per response, as HAMi
    assert value == ",".join(names)
    envs = dict(answer.envs)
    # CDI only: no device list env, no NVIDIA_GDRCOPY/NVIDIA_MOFED; HAMi-core's part as always.
    assert "NVIDIA_VISIBLE_DEVICES" not in envs
    assert "NVIDIA_GDRCOPY" not in envs and "NVIDIA_MOFED" not in envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
    assert [m.container_path for m in answer.mounts][:2] == [
        f"{cdi_running.hook_path}/vgpu/libvgpu.so",
        f"{cdi_running.hook_path}/vgpu",
    ]
    spec = json.loads(
        (cdi_running.cdi_dir / "k8s.device-plugin.nvidia.com-gpu.json").read_text("utf-8")
    )
    in_spec = {f"{spec['kind']}={device['name']}" for device in spec["devices"]}
    assert set(names) <= in_spec


def test_volume_mounts_reach_kubelet_with_the_gdrcopy_and_mofed_envs(
    mounts_running: Running,
) -> None:
    answer = allocate_two_gpus(mounts_running)
    envs = dict(answer.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert envs["NVIDIA_GDRCOPY"] == "enabled"
    assert envs["NVIDIA_MOFED"] == "enabled"
    assert "NVIDIA_GDS" not in envs
    mounts = [(m.container_path, m.host_path) for m in answer.mounts]
    assert mounts[:2] == [
        (f"/var/run/nvidia-container-devices/{GPU_1}", "/dev/null"),
        (f"/var/run/nvidia-container-devices/{GPU_0}", "/dev/null"),
    ]
    assert mounts[2][0] == f"{mounts_running.hook_path}/vgpu/libvgpu.so"
    assert not answer.annotations and not answer.cdi_devices
    assert not mounts_running.cdi_dir.exists()  # no CDI strategy: no spec written


def test_a_cdi_spec_that_cannot_be_written_stops_the_daemon(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    blocker = tmp_path / "cdi"
    blocker.write_text("not a directory", encoding="utf-8")
    settings = DevicePluginSettings(
        metrics_bind_address="0",
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        pod_resources_socket="",
        device_list_strategies=parse_device_list_strategies("cdi-cri"),
        cdi_spec_dir=str(blocker),
    )
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=load_nvml_module,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=ManualClock(),
    )
    assert daemon.run() == 1
    assert not daemon.started.is_set()
    assert os.listdir(sock_dir) == []  # never served kubelet
