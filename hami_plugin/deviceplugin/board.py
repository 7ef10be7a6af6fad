"""What kubelet is told: the vGPU device list every ListAndWatch stream sends.

Health and inventory changes publish to the `DeviceBoard`; every ListAndWatch stream waits on
its condition and sends the full list on change. A stream leaves as soon as its RPC ends (the
servicer wakes the board) or the board closes, so no thread outlives a dead stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.protocol.model import HEALTHY, UNHEALTHY

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.inventory import VgpuDevice


def device_message(device: VgpuDevice) -> api_pb2.Device:
    """One kubelet Device: exact health strings; topology only for a known NUMA node."""
    message = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_node is not None and device.numa_node >= 0:
        message.topology.nodes.add(ID=device.numa_node)
    return message


class DeviceBoard:
    """The vGPU device list kubelet should see, with a version bumped on every change."""

    def __init__(self, devices: Sequence[VgpuDevice] = ()) -> None:
        self._condition = threading.Condition()
        self._devices: tuple[VgpuDevice, ...] = tuple(devices)
        self._version = 0
        self._closed = False
        self._message = self._build(self._devices)

    @staticmethod
    def _build(devices: Sequence[VgpuDevice]) -> api_pb2.ListAndWatchResponse:
        return api_pb2.ListAndWatchResponse(devices=[device_message(d) for d in devices])

    def publish(self, devices: Sequence[VgpuDevice]) -> bool:
        """Make `devices` the current list; returns False (and wakes nobody) if unchanged."""
        new = tuple(devices)
        message = self._build(new)
        with self._condition:
            if new == self._devices:
                return False
            self._devices = new
            self._message = message
            self._version += 1
            self._condition.notify_all()
        return True

    @property
    def devices(self) -> tuple[VgpuDevice, ...]:
        with self._condition:
            return self._devices

    def wake(self) -> None:
        """Wake every waiting stream so it re-checks whether it should leave."""
        with self._condition:
            self._condition.notify_all()

    def close(self) -> None:
        """End every stream (the plugin is stopping)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def next_message(
        self, seen_version: int | None, cancelled: Callable[[], bool]
    ) -> tuple[int, api_pb2.ListAndWatchResponse] | None:
        """Block until the list differs from `seen_version` (None: return the current list).

        Returns None once the board is closed or `cancelled()` is true.
        """
        with self._condition:
            self._condition.wait_for(
                lambda: self._closed or cancelled() or self._version != seen_version
            )
            if self._closed or cancelled():
                return None
            return self._version, self._message
