"""Another device plugin serving our resource: the pure decision, the watch over a real
device-plugins directory and the API server double, and the daemon beside a rival plugin that
registers `nvidia.com/gpu` with the test kubelet."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import grpc
import pytest

from hami_plugin.deviceplugin.allocator import PodAllocator
from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.inventory import VgpuDevice
from hami_plugin.deviceplugin.kubelet import SOCKET_REPLACED
from hami_plugin.deviceplugin.rivals import (
    CHECKPOINT_NAME,
    EVENT_REASON,
    CheckpointError,
    OwnDevices,
    Rival,
    RivalWatch,
    find_rival,
    is_ours,
    nvidia_socket_name,
    registered_devices,
)
from hami_plugin.deviceplugin.server import DevicePluginService, PluginServer
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.deviceplugin.test_daemon import GPU_0, GPU_1, NODE, write_gpus
from tests.processes import wait_until

RESOURCE = "nvidia.com/gpu"
OURS = frozenset({f"{GPU_0}-0", f"{GPU_0}-1", f"{GPU_1}-0", f"{GPU_1}-1"})
OWN = OwnDevices(OURS, frozenset({GPU_0, GPU_1}))


def checkpoint(registered: dict[str, list[str]]) -> bytes:
    """Kubelet's checkpoint as `checkpoint.go` marshals it."""
    entries = [
        {
            "PodUID": "5e1f",
            "ContainerName": "cuda",
            "ResourceName": RESOURCE,
            "DeviceIDs": {"-1": [GPU_0]},
            "AllocResp": "",
        }
    ]
    data = {"PodDeviceEntries": entries, "RegisteredDevices": registered}
    return json.dumps({"Data": data, "Checksum": 1234567}).encode()


# --- the pure decision ------------------------------------------------------------------------


def test_the_checkpoint_gives_the_ids_registered_for_our_resource() -> None:
    blob = checkpoint({RESOURCE: [GPU_0, GPU_1], "example.com/nic": ["eth1"]})
    assert registered_devices(blob, RESOURCE) == (GPU_0, GPU_1)
    assert registered_devices(blob, "nvidia.com/mig-1g.10gb") == ()
    assert registered_devices(b'{"Data": {"RegisteredDevices": null}}', RESOURCE) == ()


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "no Data object"),
        (b'{"Data": 3}', "no Data object"),
        (b'{"Data": {"RegisteredDevices": []}}', "RegisteredDevices is not an object"),
        (b'{"Data": {"RegisteredDevices": {"nvidia.com/gpu": "GPU-1"}}}', "not a list of IDs"),
        (b'{"Data": {"RegisteredDevices": {"nvidia.com/gpu": [1]}}}', "not a list of IDs"),
    ],
)
def test_a_malformed_checkpoint_is_one_error_naming_the_part(blob: bytes, problem: str) -> None:
    with pytest.raises(CheckpointError, match=problem):
        registered_devices(blob, RESOURCE)


@pytest.mark.parametrize(
    ("device_id", "ours"),
    [
        (f"{GPU_0}-1", True),  # advertised now
        (f"{GPU_1}-7", True),  # ours under another split count
        (GPU_0, False),  # NVIDIA's: the bare UUID
        (f"{GPU_0}::0", False),  # NVIDIA's time-slicing replica
        ("0", False),  # NVIDIA's index strategy
        ("GPU-99999999-0000-0000-0000-000000000000-0", False),  # not a GPU of ours
    ],
)
def test_which_ids_are_ours(device_id: str, ours: bool) -> None:
    assert is_ours(device_id, OWN.ids, OWN.gpu_uuids) is ours


def decide(
    sockets: list[str],
    registered: list[str] | None,
    *,
    own_socket: str = "hami-gpu.sock",
    replaced: int = 0,
) -> Rival | None:
    return find_rival(
        sockets,
        registered,
        resource_name=RESOURCE,
        own_socket=own_socket,
        own_ids=OWN.ids,
        own_gpu_uuids=OWN.gpu_uuids,
        socket_replaced=replaced,
    )


def test_nothing_but_ours_is_no_rival() -> None:
    assert nvidia_socket_name(RESOURCE) == "nvidia-gpu.sock"
    assert decide(["hami-gpu.sock", "rdma.sock"], sorted(OURS)) is None
    assert decide(["hami-gpu.sock"], None) is None


def test_nvidias_socket_beside_ours_is_a_rival_unless_it_is_ours() -> None:
    assert decide(["hami-gpu.sock", "nvidia-gpu.sock"], None) == Rival(socket="nvidia-gpu.sock")
    assert decide(["nvidia-gpu.sock"], None, own_socket="nvidia-gpu.sock") is None


def test_foreign_ids_and_replacements_are_a_rival() -> None:
    rival = decide([], [GPU_1, f"{GPU_0}-0", GPU_0, GPU_1])
    assert rival == Rival(foreign_devices=(GPU_0, GPU_1))
    assert decide([], None, replaced=2) == Rival(socket_replaced=2)


def test_the_message_names_what_was_seen_and_the_way_out() -> None:
    foreign = tuple(f"GPU-{n}" for n in range(5))
    message = Rival("nvidia-gpu.sock", foreign, 1).message(RESOURCE, "/dp/", "nvidia-gpu.sock")
    assert message.startswith("another device plugin serves nvidia.com/gpu on this node: ")
    assert "socket nvidia-gpu.sock in /dp/" in message
    assert "kubelet lists 5 nvidia.com/gpu device(s) that are not ours" in message
    assert "(GPU-0, GPU-1, GPU-2 and 2 more)" in message
    assert "our socket nvidia-gpu.sock was replaced by another process 1 time(s)" in message
    assert "--set devicePlugin.enabled=false" in message
    assert "\n" not in message


# --- the watch over a real directory and the API server double -------------------------------


@contextlib.contextmanager
def unix_socket(path: str) -> Iterator[None]:
    """A real unix socket file at `path` while the block runs."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    try:
        yield
    finally:
        server.close()
        os.unlink(path)


def write_checkpoint(directory: str, blob: bytes) -> None:
    """Written whole through a temporary file, as kubelet's checkpoint manager does."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    with open(f"{path}.tmp", "wb") as file:
        file.write(blob)
    os.replace(f"{path}.tmp", path)


@pytest.fixture
def watch(sock_dir: str, apiserver: FakeApiServer, kube: KubeClient) -> RivalWatch:
    apiserver.add_node(NODE)
    return RivalWatch(
        kube,
        NODE,
        plugin_dir=sock_dir,
        resource_name=RESOURCE,
        own_socket="hami-gpu.sock",
        own=lambda: OWN,
    )


def node_events(apiserver: FakeApiServer) -> list[dict[str, object]]:
    return apiserver.events_about("", NODE, kind="Node")


def test_a_rival_socket_is_one_warning_and_one_node_event_per_change(
    watch: RivalWatch, sock_dir: str, apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hami_plugin.deviceplugin.rivals")
    assert watch.check() is None
    with unix_socket(os.path.join(sock_dir, "nvidia-gpu.sock")):
        assert watch.check() == Rival(socket="nvidia-gpu.sock")
        assert watch.check() == Rival(socket="nvidia-gpu.sock")  # unchanged: told once
        events = node_events(apiserver)
        assert len(events) == 1
        event = events[0]
        assert event["reason"] == EVENT_REASON == "AnotherDevicePlugin"
        assert event["type"] == "Warning"
        assert event["involvedObject"] == {
            "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE,
        }  # fmt: skip
        assert event["source"] == {"component": "hami-device-plugin"}
        assert "socket nvidia-gpu.sock in" in str(event["message"])
    assert watch.check() is None
    assert watch.current is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [event["message"]]
    assert "no other device plugin serves nvidia.com/gpu on this node any more" in caplog.text
    with unix_socket(os.path.join(sock_dir, "nvidia-gpu.sock")):
        watch.check()
    assert len(node_events(apiserver)) == 2  # back again: a change, told again


def test_the_checkpoint_counts_only_once_kubelet_rewrote_it_after_our_registration(
    watch: RivalWatch, sock_dir: str, apiserver: FakeApiServer
) -> None:
    # What the operator's plugin left before we registered: not a rival (yet).
    write_checkpoint(sock_dir, checkpoint({RESOURCE: [GPU_0, GPU_1]}))
    assert watch.check() is None
    watch.registered(())
    assert watch.check() is None
    write_checkpoint(sock_dir, checkpoint({RESOURCE: sorted(OURS)}))  # our list arrived
    assert watch.check() is None
    write_checkpoint(sock_dir, checkpoint({RESOURCE: [GPU_1, GPU_0]}))  # another plugin's
    assert watch.check() == Rival(foreign_devices=(GPU_0, GPU_1))
    assert len(node_events(apiserver)) == 1
    assert "kubelet lists 2 nvidia.com/gpu device(s)" in str(node_events(apiserver)[0]["message"])
    watch.stop()


def test_a_malformed_checkpoint_is_one_line_and_the_sockets_are_still_looked_at(
    watch: RivalWatch, sock_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    watch.registered(())
    write_checkpoint(sock_dir, b'{"Data": {"RegisteredDevices": ')
    with unix_socket(os.path.join(sock_dir, "nvidia-gpu.sock")):
        assert watch.check() == Rival(socket="nvidia-gpu.sock")
        write_checkpoint(sock_dir, b'{"Data": {"RegisteredDevices": ')  # rewritten, still bad
        assert watch.check() == Rival(socket="nvidia-gpu.sock")
    problems = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(problems) == 1
    assert problems[0].startswith(f"cannot read kubelet's checkpoint {sock_dir}/{CHECKPOINT_NAME}")
    assert problems[0].endswith("not JSON (Expecting value: line 1 column 32 (char 31)); "
                                "looking at the sockets only")  # fmt: skip
    watch.stop()


def test_our_socket_replaced_counts_until_the_next_look(
    watch: RivalWatch, apiserver: FakeApiServer
) -> None:
    watch.registered(("kubelet.sock was re-created",))
    assert watch.check() is None
    watch.registered((SOCKET_REPLACED,))
    assert watch.check() == Rival(socket_replaced=1)
    assert watch.check() is None
    assert len(node_events(apiserver)) == 1
    watch.stop()


# --- the daemon beside a rival plugin -------------------------------------------------------


@contextlib.contextmanager
def nvidia_plugin(kubelet: FakeKubelet, socket_name: str) -> Iterator[PluginServer]:
    """NVIDIA's device plugin as kubelet sees it: `nvidia.com/gpu` served as the bare GPU UUIDs
    on `socket_name`, registered with `kubelet`. It is never asked to Allocate."""
    board = DeviceBoard([VgpuDevice(uuid, uuid, True, None) for uuid in (GPU_0, GPU_1)])
    service = DevicePluginService(board, cast(PodAllocator, None))
    server = PluginServer(service, os.path.join(kubelet.plugin_dir, socket_name))
    server.start()
    try:
        request = api_pb2.RegisterRequest(
            version="v1beta1", endpoint=socket_name, resource_name=RESOURCE
        )
        with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=10)  # type: ignore[no-untyped-call]
        yield server
    finally:
        server.stop()
        board.close()


@contextlib.contextmanager
def daemon_beside_kubelet(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient, socket_name: str
) -> Iterator[tuple[DevicePluginDaemon, FakeKubelet]]:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    hook = str(tmp_path / "hook")
    install_fake_hamicore(hook)
    settings = DevicePluginSettings(
        metrics_bind_address="0",
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=2,
        hook_path=hook,
        socket_name=socket_name,
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "lock")
    )
    kubelet = FakeKubelet(sock_dir, write_checkpoint=True).start()
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    try:
        assert daemon.started.wait(10)
        assert daemon.registrar is not None and daemon.registrar.wait_registered(1, timeout=10)
        kubelet.wait_for_list(lambda states: {s.id for s in states} == OURS)
        yield daemon, kubelet
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
    assert exit_codes == [0]


def test_the_daemon_tells_of_nvidias_plugin_registered_beside_it(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    with daemon_beside_kubelet(sock_dir, tmp_path, apiserver, kube, "hami-gpu.sock") as (
        daemon,
        kubelet,
    ):
        rivals = daemon.rivals
        assert rivals is not None
        assert rivals.check() is None  # our own list in kubelet's checkpoint
        with nvidia_plugin(kubelet, "nvidia-gpu.sock"):
            kubelet.wait_for_list(lambda states: {s.id for s in states} == {GPU_0, GPU_1})
            found = rivals.check()
        assert found == Rival("nvidia-gpu.sock", (GPU_0, GPU_1))
        events = node_events(apiserver)
        assert [e["reason"] for e in events] == ["AnotherDevicePlugin"]
        assert "socket nvidia-gpu.sock" in str(events[0]["message"])
        assert "kubelet lists 2 nvidia.com/gpu device(s)" in str(events[0]["message"])


def test_the_daemon_tells_of_a_plugin_that_takes_its_socket_path(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    with daemon_beside_kubelet(sock_dir, tmp_path, apiserver, kube, "nvidia-gpu.sock") as (
        daemon,
        kubelet,
    ):
        rivals, registrar = daemon.rivals, daemon.registrar
        assert rivals is not None and registrar is not None
        with nvidia_plugin(kubelet, "nvidia-gpu.sock"):
            # We take our path back (a new socket, registered again).
            assert registrar.wait_registered(2, timeout=10)
            wait_until(lambda: rivals.check() is not None, "our socket seen replaced")
        current = rivals.current
        assert current is not None and current.socket_replaced >= 1
        assert [e["reason"] for e in node_events(apiserver)] == ["AnotherDevicePlugin"]
