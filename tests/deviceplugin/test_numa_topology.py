"""`nvidia.enableNumaTopology` of HAMi's device config, over the wire: the daemon started from
its flags and config file as the DaemonSet starts it, kubelet (the test kubelet) reading each
device's NUMA node from ListAndWatch only when the config turns it on."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import add_arguments, resolve_settings
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from tests.deviceplugin.daemons import serving

NODE = "gpu-node-1"
GPU_0 = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_1 = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"


@pytest.mark.parametrize(("enabled", "numa"), [(True, {GPU_0: (0,), GPU_1: (1,)}), (False, {})])
def test_kubelet_sees_the_numa_nodes_when_the_device_config_enables_them(
    enabled: bool,
    numa: dict[str, tuple[int, ...]],
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_node(NODE)
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"uuid": GPU_0, "name": "NVIDIA A100", "memory_mib": 81920, "numa_node": 0},
                    {"uuid": GPU_1, "name": "NVIDIA A100", "memory_mib": 81920, "numa_node": 1},
                ]
            }
        ),
        "utf-8",
    )
    config = tmp_path / "device-config.yaml"
    config.write_text(
        f"nvidia:\n  deviceSplitCount: 2\n  enableNumaTopology: {str(enabled).lower()}\n", "utf-8"
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--node-name", NODE, "--nvml", "fake", "--fake-gpus", str(gpus),
            "--device-plugin-path", sock_dir, "--hook-path", str(tmp_path / "hook"),
            "--metrics-bind-address", "0", "--config-file", str(config),
        ]
    )  # fmt: skip
    settings = resolve_settings(args, {})
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=load_nvml_module,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=ManualClock(),
    )
    with serving(daemon, sock_dir) as kubelet:
        kubelet.wait_for_registrations(1, timeout=10)
        devices = kubelet.wait_for_list(lambda states: len(states) == 4, timeout=30.0)
    seen = {device.id.rsplit("-", 1)[0]: device.numa_nodes for device in devices}
    assert {gpu: nodes for gpu, nodes in seen.items() if nodes} == numa
