"""Registration with a test kubelet over real unix sockets, and re-registration after restarts."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.allocate import AllocateConfig
from hami_plugin.deviceplugin.allocator import PodAllocator
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.inventory import VgpuDevice
from hami_plugin.deviceplugin.kubelet import (
    KubeletRegistrar,
    RestartSignal,
    SocketId,
    SocketPollWatch,
    socket_id,
)
from hami_plugin.deviceplugin.server import DevicePluginService
from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.kubelet import DeviceState, FakeKubelet, is_extended_resource_name
from tests.processes import wait_until

GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
SOCKET = "nvidia-gpu.sock"


class QuietWatch:
    """An injected event source that never fires: only the stream signal is left."""

    def start(self, signal: RestartSignal) -> None:
        self.signal = signal

    def expect(self, kubelet_socket: SocketId | None, plugin_socket: SocketId | None) -> None:
        pass

    def stop(self) -> None:
        pass


def devices(healthy: bool = True) -> list[VgpuDevice]:
    return [VgpuDevice(f"{GPU}-{i}", GPU, healthy, None) for i in range(3)]


@pytest.fixture
def service(kube: KubeClient) -> Iterator[DevicePluginService]:
    board = DeviceBoard(devices())
    yield DevicePluginService(board, PodAllocator(kube, "node", AllocateConfig()))
    board.close()


@pytest.fixture
def kubelet(sock_dir: str) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(sock_dir)
    try:
        yield fake
    finally:
        fake.stop()


def make_registrar(
    service: DevicePluginService,
    sock_dir: str,
    *,
    resource_name: str = "nvidia.com/gpu",
    watch: object | None = None,
) -> KubeletRegistrar:
    return KubeletRegistrar(
        service,
        plugin_dir=sock_dir,
        socket_name=SOCKET,
        resource_name=resource_name,
        watch=watch,  # type: ignore[arg-type]
    )


@pytest.fixture
def registrar(service: DevicePluginService, sock_dir: str) -> Iterator[KubeletRegistrar]:
    plugin = make_registrar(service, sock_dir)
    try:
        yield plugin
    finally:
        plugin.stop()


def all_healthy(states: tuple[DeviceState, ...]) -> bool:
    return len(states) == 3 and all(s.health == "Healthy" for s in states)


def test_first_registration(kubelet: FakeKubelet, registrar: KubeletRegistrar) -> None:
    kubelet.start()
    registrar.start()
    (connection,) = kubelet.wait_for_registrations(1)
    assert connection.request.version == "v1beta1"
    assert connection.request.endpoint == SOCKET
    assert connection.request.resource_name == "nvidia.com/gpu"
    assert connection.request.options == connection.options
    assert connection.options.get_preferred_allocation_available
    listed = kubelet.wait_for_list(all_healthy)
    assert [s.id for s in listed] == [f"{GPU}-{i}" for i in range(3)]
    assert registrar.wait_registered(1, timeout=30.0)


def test_registration_waits_for_kubelet(kubelet: FakeKubelet, registrar: KubeletRegistrar) -> None:
    registrar.start()
    assert not registrar.wait_registered(1, timeout=0.3)
    assert os.path.exists(registrar.socket_path)  # served before kubelet is there
    kubelet.start(cleanup=False)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(all_healthy)


def test_kubelet_restarts_are_followed_every_time(
    kubelet: FakeKubelet, registrar: KubeletRegistrar
) -> None:
    kubelet.start()
    registrar.start()
    kubelet.wait_for_registrations(1)
    for restart in range(1, 4):
        kubelet.restart()
        connections = kubelet.wait_for_registrations(restart + 1)
        kubelet.wait_for_list(all_healthy, connection=connections[restart])
        assert connections[restart - 1].stream_ended.is_set()
    assert kubelet.restarts == 3
    assert kubelet.errors == []


def test_a_dropped_stream_alone_triggers_re_registration(
    kubelet: FakeKubelet, service: DevicePluginService, sock_dir: str
) -> None:
    registrar = make_registrar(service, sock_dir, watch=QuietWatch())
    kubelet.start()
    registrar.start()
    try:
        first = kubelet.wait_for_registrations(1)[0]
        kubelet.wait_for_list(all_healthy)
        first.close()  # kubelet drops the client; the sockets stay
        second = kubelet.wait_for_registrations(2)[1]
        kubelet.wait_for_list(all_healthy, connection=second)
    finally:
        registrar.stop()


def test_a_burst_of_signals_is_one_re_registration(
    kubelet: FakeKubelet, service: DevicePluginService, sock_dir: str
) -> None:
    registrar = make_registrar(service, sock_dir, watch=QuietWatch())
    kubelet.start()
    registrar.start()
    try:
        kubelet.wait_for_registrations(1)
        for n in range(5):
            registrar.signal.trigger(f"event {n}")
        assert registrar.wait_registered(2, timeout=30.0)
        # The old server's stream end is ours (re-serve), not kubelet's: no third round.
        assert not registrar.wait_registered(3, timeout=0.5)
        assert len(kubelet.connections) == 2
    finally:
        registrar.stop()


def test_health_changes_reach_the_current_stream(
    kubelet: FakeKubelet, registrar: KubeletRegistrar, service: DevicePluginService
) -> None:
    kubelet.start()
    registrar.start()
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(all_healthy)
    service.board.publish(devices(healthy=False))
    kubelet.wait_for_list(lambda s: all(d.health == "Unhealthy" for d in s))
    kubelet.restart()
    kubelet.wait_for_registrations(2)
    # The new kubelet gets the current (unhealthy) list first.
    kubelet.wait_for_list(lambda s: len(s) == 3 and all(d.health == "Unhealthy" for d in s))


def test_kubelet_refuses_a_bad_resource_name(
    kubelet: FakeKubelet, service: DevicePluginService, sock_dir: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    registrar = make_registrar(service, sock_dir, resource_name="kubernetes.io/gpu")
    kubelet.start()
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.kubelet"):
        registrar.start()
        wait_until(lambda: len(kubelet.errors) >= 2, "a retried registration", timeout=30.0)
        registrar.stop()
    assert kubelet.errors[0] == 'the ResourceName "kubernetes.io/gpu" is invalid'
    assert len(kubelet.errors) >= 2  # retried
    failures = [r for r in caplog.records if "Register with kubelet failed" in r.getMessage()]
    assert len(failures) == 1  # logged once, then quietly retried
    assert "is invalid" in failures[0].getMessage()


def test_stop_removes_the_socket_and_leaks_no_threads(
    kubelet: FakeKubelet, service: DevicePluginService, sock_dir: str
) -> None:
    # the threads: tests/conftest.py fails a test that leaves one running
    kubelet.start()
    registrar = make_registrar(service, sock_dir)
    registrar.start()
    kubelet.wait_for_registrations(1)
    kubelet.restart()
    kubelet.wait_for_registrations(2)
    registrar.stop()
    assert not os.path.exists(registrar.socket_path)
    kubelet.stop()


# --- the default event source, the test kubelet's name rule --------------------------------------


def test_socket_poll_watch_reports_each_kind_of_change_once(tmp_path: Path) -> None:
    kubelet_sock = tmp_path / "kubelet.sock"
    plugin_sock = tmp_path / SOCKET
    kubelet_sock.touch()
    plugin_sock.touch()
    watch = SocketPollWatch(str(tmp_path), SOCKET)
    assert watch.check() is None  # nothing expected yet
    expected = (socket_id(str(kubelet_sock)), socket_id(str(plugin_sock)))
    watch.expect(*expected)
    assert watch.check() is None

    plugin_sock.unlink()
    assert watch.check() == "our socket was removed"
    assert watch.check() is None  # reported once per registration

    plugin_sock.touch()
    watch.expect(expected[0], socket_id(str(plugin_sock)))
    kubelet_sock.rename(tmp_path / "old")
    Path(kubelet_sock).touch()
    assert watch.check() == "kubelet.sock was re-created"


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("nvidia.com/gpu", True),
        ("hami.io/vgpu", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("x.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("Nvidia.com/gpu", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid
