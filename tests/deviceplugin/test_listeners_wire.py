"""The device plugin's listeners under the issue 25 attack, over real wires (the fake NVML, the
test kubelet over gRPC, the API server double): half-sent requests held on `/metrics` leave the
threads bounded, and Allocate and kubelet's probes (`--probe-bind-address`) keep answering
while they are held and after they go; `/healthz` fails once the gRPC server stops answering.
Small enough for a loaded 2-core CI; every wait is on a condition."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.metrics.server import METRICS_LIMITS
from hami_plugin.protocol.model import ContainerDevice
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.deviceplugin.daemons import serving
from tests.deviceplugin.test_daemon import GPU_0, NODE, bind_as_the_scheduler_would, write_gpus
from tests.httpserve.attack import HALF_SENT, connection_threads, get, holding
from tests.processes import wait_until

ATTACKERS = 40


@dataclass
class Plugin:
    daemon: DevicePluginDaemon
    kubelet: FakeKubelet
    apiserver: FakeApiServer

    @property
    def probe_port(self) -> int:
        probes = self.daemon.probes
        assert probes is not None and probes.server is not None
        return probes.server.port

    @property
    def metrics_port(self) -> int:
        assert self.daemon.metrics is not None
        return self.daemon.metrics.server.port

    def allocates(self, pod: str, slot: int) -> bool:
        device = ContainerDevice(GPU_0, "NVIDIA", 1000, 10)
        bind_as_the_scheduler_would(self.apiserver, pod, ((device,),))
        answer = self.kubelet.allocate([f"{GPU_0}-{slot}"]).container_responses[0]
        return bool(answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_0)


@pytest.fixture
def plugin(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Plugin]:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    install_fake_hamicore(str(tmp_path / "hook"))
    settings = DevicePluginSettings(
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=3,
        hook_path=str(tmp_path / "hook"),
        register_interval_seconds=0.3,
        metrics_bind_address="127.0.0.1:0",
        probe_bind_address="127.0.0.1:0",
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    with serving(daemon, sock_dir) as kubelet:
        kubelet.wait_for_registrations(1)
        yield Plugin(daemon, kubelet, apiserver)


def test_half_sent_scrapes_leave_allocate_and_the_probes_served(plugin: Plugin) -> None:
    assert get(plugin.probe_port, "/healthz") == (200, b"ok\n")
    assert get(plugin.probe_port, "/readyz")[0] == 200
    kept = METRICS_LIMITS.max_per_client
    with holding(plugin.metrics_port, ATTACKERS, data=HALF_SENT) as held:
        # >=: the held ones are closed too once METRICS_LIMITS.request_seconds pass
        wait_until(
            lambda: held.closed_by_server() >= ATTACKERS - kept,
            what="half-sent connections over the per-client cap closed",
        )
        assert connection_threads() <= kept
        assert plugin.allocates("while-held", 0)
        assert get(plugin.probe_port, "/healthz") == (200, b"ok\n")
        assert get(plugin.metrics_port, "/metrics", source="127.0.0.3")[0] == 200
    wait_until(lambda: connection_threads() == 0, what="the attackers' threads gone")
    assert plugin.allocates("after", 1)
    assert get(plugin.probe_port, "/healthz") == (200, b"ok\n")


def test_liveness_fails_when_the_grpc_server_stops_answering(plugin: Plugin) -> None:
    assert get(plugin.probe_port, "/healthz")[0] == 200
    registrar = plugin.daemon.registrar
    assert registrar is not None and registrar._server is not None
    grpc_server = registrar._server._server  # the grpc.Server kubelet's calls reach
    assert grpc_server is not None
    grpc_server.stop(0).wait()
    status, body = get(plugin.probe_port, "/healthz")
    assert status == 500
    assert body.startswith(b"the DevicePlugin gRPC server on ") and b"does not answer" in body
