"""The device list kubelet is told: exact health strings, topology, versions, wake-ups."""

from __future__ import annotations

import threading

import pytest

from hami_plugin.deviceplugin.board import DeviceBoard, device_message
from hami_plugin.deviceplugin.inventory import VgpuDevice

GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


@pytest.mark.parametrize(
    ("device", "health", "numa_nodes"),
    [
        (VgpuDevice(f"{GPU}-0", GPU, True, 1), "Healthy", [1]),
        (VgpuDevice(f"{GPU}-0", GPU, False, 0), "Unhealthy", [0]),
        (VgpuDevice(f"{GPU}-0", GPU, True, None), "Healthy", []),  # topology unknown
        (VgpuDevice(f"{GPU}-0", GPU, True, -1), "Healthy", []),  # NVML's "no NUMA node"
    ],
)
def test_device_message(device: VgpuDevice, health: str, numa_nodes: list[int]) -> None:
    message = device_message(device)
    assert device.id == message.ID
    assert message.health == health
    assert [node.ID for node in message.topology.nodes] == numa_nodes


def never() -> bool:
    return False


def test_each_change_bumps_the_version_and_an_unchanged_list_does_not() -> None:
    board = DeviceBoard([VgpuDevice(f"{GPU}-0", GPU, True, None)])
    first = board.next_message(None, never)
    assert first is not None
    version, message = first
    assert [d.ID for d in message.devices] == [f"{GPU}-0"]
    assert not board.publish(board.devices)
    assert board.publish([VgpuDevice(f"{GPU}-0", GPU, False, None)])
    second = board.next_message(version, never)
    assert second is not None and second[0] != version
    assert [d.health for d in second[1].devices] == ["Unhealthy"]


def test_a_waiting_stream_leaves_when_cancelled_or_closed() -> None:
    board = DeviceBoard()
    current = board.next_message(None, never)
    assert current is not None
    version = current[0]
    cancelled = threading.Event()
    answers: list[object] = []
    waiter = threading.Thread(
        target=lambda: answers.append(board.next_message(version, cancelled.is_set))
    )
    waiter.start()
    cancelled.set()
    board.wake()
    waiter.join(5)
    assert answers == [None]
    board.close()
    assert board.next_message(None, never) is None
