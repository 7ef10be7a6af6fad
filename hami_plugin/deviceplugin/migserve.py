"""Static MIG on the wire: one DevicePlugin server and kubelet registration per MIG resource.

NVIDIA's plugin manager (HAMi v2.10 cmd/device-plugin/nvidia/plugin-manager.go:35-80) makes one
plugin per resource manager, and `NewNVMLResourceManagers` one resource manager per resource
of the device map (rm/nvml_manager.go:56-91): each serves its devices on
`nvidia-<resource suffix>.sock` (plugin/server.go:211) and registers its resource with kubelet.
`StaticMigServers` does that for the MIG resources `mig.static.plan_static_mig` returned, next to
the daemon's own vGPU plugin: under `mixed`, `nvidia.com/mig-<profile>` beside the HAMi-shared
`nvidia.com/gpu`; under `single`, `nvidia.com/gpu` on the configured socket, in place of the vGPU
plugin (the daemon does not start that one then).

Allocate hands out whole MIG devices as kubelet chose them (NVIDIA's Allocate,
plugin/server.go:914-953): the MIG UUIDs through the configured device list strategies
(`device_list.device_list_answer`: `NVIDIA_VISIBLE_DEVICES=MIG-...`, volume mounts, or the CDI
names `k8s.device-plugin.nvidia.com/gpu=MIG-...`). No HAMi-core environment, no booking: nothing
a tenant wrote is read (HAMi's Allocate looks up the node's pending HAMi pod first,
plugin/server.go:757-768, which a pod asking only for `nvidia.com/mig-*` never is: there the call
fails). An ID the resource does not advertise is refused with HAMi's words (`invalid allocation
request for '<resource>': unknown device: <id>`, plugin/server.go:782-787).

Health: a MIG device is unhealthy while its parent GPU is (the daemon's health monitor), or
after a critical XID naming its GPU and compute instance (`mig.static.unhealthy_mig_uuids`).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.api.podresources import api_pb2 as podresources_pb2
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.device_list import (
    VOLUME_MOUNTS_HOST_PATH,
    DeviceListAnswer,
    DeviceListConfig,
    device_list_answer,
)
from hami_plugin.deviceplugin.inventory import PhysicalGpu, VgpuDevice
from hami_plugin.deviceplugin.kubelet import KubeletRegistrar
from hami_plugin.deviceplugin.metrics import MigDeviceInfo
from hami_plugin.deviceplugin.mig.devices import MigDevice, MigNvml
from hami_plugin.deviceplugin.mig.static import (
    NO_INSTANCE,
    SINGLE_RESOURCE_NAME,
    MigEvent,
    ServedMigDevice,
    StaticMigError,
    StaticMigPlan,
    mig_socket_name,
    plan_static_mig,
    unhealthy_mig_uuids,
)
from hami_plugin.deviceplugin.server import DevicePluginService

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.nvml import GpuEvent, NvmlBackend
    from hami_plugin.deviceplugin.podresources import PodResourcesClient
    from hami_plugin.deviceplugin.settings import DevicePluginSettings

__all__ = [
    "MigDeviceService",
    "StaticMigError",
    "StaticMigServers",
    "list_mig_devices",
    "mig_container_answer",
    "mig_kubelet_devices",
]

logger = logging.getLogger(__name__)


def list_mig_devices(mig: MigNvml, gpus: Iterable[PhysicalGpu]) -> dict[int, tuple[MigDevice, ...]]:
    """The MIG devices NVML lists on each MIG-enabled GPU, by GPU index. Raises `NvmlError`."""
    return {gpu.index: tuple(mig.mig_devices(gpu.index)) for gpu in gpus if gpu.mig_enabled}


def mig_kubelet_devices(
    devices: Sequence[ServedMigDevice], unhealthy: Collection[str]
) -> list[VgpuDevice]:
    """The kubelet device list of one MIG resource: one whole device per MIG UUID, with its
    parent's NUMA node whenever it is known (HAMi rm/devices.go:217-221 sends a MIG device's own
    topology, whatever `--enable-numa-topology` says; that flag is for the vGPU slots)."""
    return [
        VgpuDevice(
            id=d.id,
            gpu_uuid=d.device.parent_uuid,
            healthy=d.id not in unhealthy,
            numa_node=d.numa_node if d.numa_node >= 0 else None,
        )
        for d in devices
    ]


def mig_container_answer(
    resource_name: str,
    device_ids: Sequence[str],
    advertised: Collection[str],
    config: DeviceListConfig,
    response_id: str,
) -> DeviceListAnswer:
    """One container's answer for the whole MIG devices kubelet chose.

    Raises AllocateFailure(INVALID_REQUEST) for an ID this resource does not advertise, in
    HAMi's words (plugin/server.go:782-787), and for an empty request.
    """
    if not device_ids:
        raise AllocateFailure(
            FailureReason.INVALID_REQUEST, "invalid request: no devices", pod_known=False
        )
    for device_id in device_ids:
        if device_id not in advertised:
            raise AllocateFailure(
                FailureReason.INVALID_REQUEST,
                f"invalid allocation request for '{resource_name}': unknown device: {device_id}",
                pod_known=False,
            )
    try:
        return device_list_answer(device_ids, config, response_id)
    except ValueError as error:
        raise AllocateFailure(FailureReason.INVALID_REQUEST, str(error), pod_known=False) from None


class MigDeviceService(DevicePluginService):
    """The DevicePlugin RPCs of one MIG resource: its board, whole-device Allocate.

    GetPreferredAllocation is not offered (kubelet then picks any free MIG devices).
    """

    def __init__(
        self,
        board: DeviceBoard,
        resource_name: str,
        config: DeviceListConfig,
        *,
        new_response_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        # Not DevicePluginService.__init__: there is no vGPU pod allocator behind MIG devices.
        self.board = board
        self.resource_name = resource_name
        self._config = config
        self._new_response_id = new_response_id
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=False
        )

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        advertised = {device.id for device in self.board.devices}
        response = api_pb2.AllocateResponse()
        for container in request.container_requests:
            ids = list(container.devices_ids)
            answer = mig_container_answer(
                self.resource_name, ids, advertised, self._config, self._new_response_id()
            )
            response.container_responses.add(
                envs=dict(answer.envs),
                mounts=[
                    api_pb2.Mount(
                        container_path=path, host_path=VOLUME_MOUNTS_HOST_PATH, read_only=False
                    )
                    for path in answer.mount_paths
                ],
                annotations=dict(answer.annotations),
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in answer.cdi_devices],
            )
            logger.info("%s: allocated %s", self.resource_name, ",".join(ids))
        return response

    def preferred_allocation(
        self, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        """Not offered; answered anyway with kubelet's must-include IDs, then the first free."""
        response = api_pb2.PreferredAllocationResponse()
        for container in request.container_requests:
            chosen = list(dict.fromkeys(container.must_include_deviceIDs))
            for device_id in container.available_deviceIDs:
                if len(chosen) >= container.allocation_size:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
            response.container_responses.add(deviceIDs=chosen)
        return response


class StaticMigServers:
    """The MIG resources of a static MIG plan, each served and registered with kubelet."""

    def __init__(self, plan: StaticMigPlan, settings: DevicePluginSettings) -> None:
        self.plan = plan
        self._settings = settings
        self._lock = threading.Lock()
        self._marked: frozenset[str] = frozenset()
        """MIG devices an Xid of their own instance marked (kept: as HAMi, they stay unhealthy)."""
        self._parents: frozenset[str] = frozenset()
        self.boards: dict[str, DeviceBoard] = {}
        self.registrars: dict[str, KubeletRegistrar] = {}
        for name, devices in plan.mig_resources.items():
            board = self.boards[name] = DeviceBoard(mig_kubelet_devices(devices, ()))
            service = MigDeviceService(board, name, settings.device_list)
            socket_name = (
                settings.socket_name
                if name == SINGLE_RESOURCE_NAME and not plan.vgpu_served
                else mig_socket_name(name)
            )
            self.registrars[name] = KubeletRegistrar(
                service,
                plugin_dir=settings.device_plugin_path,
                socket_name=socket_name,
                resource_name=name,
            )

    @classmethod
    def for_node(
        cls, mig: MigNvml, gpus: Sequence[PhysicalGpu], settings: DevicePluginSettings
    ) -> StaticMigServers:
        """List the MIG devices and plan them; raises StaticMigError (NVIDIA's message) or
        NvmlError."""
        plan = plan_static_mig(
            settings.mig_strategy,
            gpus,
            list_mig_devices(mig, gpus),
            filter_uuids=settings.filter_uuids,
        )
        for name, devices in plan.mig_resources.items():
            logger.info(
                "%s: serving %d MIG devices: %s",
                name,
                len(devices),
                ", ".join(f"{d.index}:{d.id}" for d in devices),
            )
        return cls(plan, settings)

    @property
    def unhealthy(self) -> frozenset[str]:
        """The MIG UUIDs reported unhealthy now."""
        with self._lock:
            return unhealthy_mig_uuids(self.plan.devices, self._parents) | self._marked

    def update_health(self, unhealthy_parents: Collection[str]) -> None:
        """Publish every MIG resource's list again for the GPUs the health check lost."""
        with self._lock:
            self._parents = frozenset(unhealthy_parents)
        self._publish()

    def on_event(self, event: GpuEvent) -> bool:
        """The health monitor's `mig_event` hook: True when `event` is a critical Xid naming a
        GPU and compute instance on a GPU whose MIG devices are served here (rm/health.go:
        175-190: only the MIG device with that GI and CI turns unhealthy, none when no served
        device has them); False leaves the event to the GPU's own health."""
        xid = event.xid
        if (
            xid is None
            or event.uuid is None
            or NO_INSTANCE in (event.gpu_instance_id, event.compute_instance_id)
            or not self._settings.xid_is_critical(xid)
        ):
            return False
        on_parent = [d for d in self.plan.devices if d.device.parent_uuid == event.uuid]
        if not on_parent:
            return False
        named = [
            d
            for d in on_parent
            if d.device.gpu_instance_id == event.gpu_instance_id
            and d.device.compute_instance_id == event.compute_instance_id
        ]
        if not named:
            logger.info(
                "Xid %d on GPU %s (gi=%d, ci=%d) names no served MIG device: ignored",
                xid,
                event.uuid,
                event.gpu_instance_id,
                event.compute_instance_id,
            )
            return True
        logger.warning("MIG device %s: Xid %d, marked unhealthy", named[0].id, xid)
        self.on_xid(MigEvent(event.uuid, event.gpu_instance_id, event.compute_instance_id))
        return True

    def on_xid(self, event: MigEvent) -> None:
        """A critical XID on a MIG-enabled GPU: mark the MIG device(s) it names."""
        with self._lock:
            self._marked |= unhealthy_mig_uuids(self.plan.devices, (), [event])
        self._publish()

    @classmethod
    def for_daemon(
        cls, backend: NvmlBackend, gpus: Sequence[PhysicalGpu], settings: DevicePluginSettings
    ) -> StaticMigServers:
        """The daemon's: the MIG devices through NVML's MIG calls on the daemon's session
        (`mig.nvml.NvmlMig`). Raises StaticMigError or NvmlError."""
        from hami_plugin.deviceplugin.mig.nvml import NvmlMig

        return cls.for_node(NvmlMig(backend.nvml), gpus, settings)

    def device_info(self, listed: podresources_pb2.ListPodResourcesResponse) -> list[MigDeviceInfo]:
        """`hami_mig_device_info`'s rows from kubelet's PodResources `List`: each served MIG
        device a container holds under one of our MIG resources (kubelet's own record of what
        it allocated; no annotation is read)."""
        served = {
            d.id: (name, d) for name, devices in self.plan.mig_resources.items() for d in devices
        }
        rows: list[MigDeviceInfo] = []
        for pod in listed.pod_resources:
            for container in pod.containers:
                position = 0
                for entry in container.devices:
                    for device_id in entry.device_ids:
                        found = served.get(device_id)
                        if found is None or found[0] != entry.resource_name:
                            continue
                        device = found[1].device
                        rows.append(
                            MigDeviceInfo(
                                namespace=pod.namespace,
                                pod=pod.name,
                                container=container.name,
                                vdevice_index=position,
                                device_uuid=device.parent_uuid,
                                mig_uuid=device.uuid,
                                profile=device.profile,
                                gpu_instance_id=device.gpu_instance_id,
                                compute_instance_id=device.compute_instance_id,
                            )
                        )
                        position += 1
        return rows

    def device_info_from(
        self, podresources: PodResourcesClient
    ) -> Callable[[], list[MigDeviceInfo]]:
        """A scrape-time reader of `device_info` over kubelet's PodResources API (its failure,
        `PodResourcesError`, leaves the family empty for that scrape)."""
        return lambda: self.device_info(podresources.list())

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        """Every served MIG device (for the CDI spec)."""
        return tuple(served.device for served in self.plan.devices)

    def _publish(self) -> None:
        unhealthy = self.unhealthy
        for name, devices in self.plan.mig_resources.items():
            listed = mig_kubelet_devices(devices, unhealthy)
            if self.boards[name].publish(listed):
                bad = sum(1 for d in listed if not d.healthy)
                logger.info("%s: advertising %d MIG devices (%d unhealthy)", name, len(listed), bad)

    def start(self) -> None:
        for registrar in self.registrars.values():
            registrar.start()

    def stop(self) -> None:
        for name, registrar in self.registrars.items():
            registrar.stop()
            self.boards[name].close()
