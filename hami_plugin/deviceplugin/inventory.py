"""Physical GPUs -> the vGPU devices kubelet sees and the devices the node registers (pure).

HAMi (docs/hami-reference.md 4.2, 4.3) advertises each physical GPU as `split_count` kubelet devices
with IDs `<UUID>-0 ... <UUID>-<n-1>` and registers the GPU itself in `hami.io/node-nvidia-register`
with its memory and cores scaled. No I/O here: the daemon passes the scan and health state in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.protocol.model import GpuDevice, OperatingMode


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One physical GPU as NVML reports it."""

    uuid: str
    index: int
    name: str
    memory_mib: int
    numa_node: int
    """NUMA node of the GPU's PCI device; -1 when unknown."""
    mig_enabled: bool
    pci_bus_id: str
    minor_number: int | None

    @property
    def card_type(self) -> str:
        """The card type HAMi registers: the NVML name, prefixed `NVIDIA-` unless it has it."""
        return self.name if self.name.startswith("NVIDIA") else f"NVIDIA-{self.name}"


@dataclass(frozen=True, slots=True)
class InventoryConfig:
    """What turns the node's GPUs into devices: the settings of the same names, and the node's
    operating mode (on a dynamic-MIG node MIG-enabled GPUs are offered)."""

    split_count: int = 10
    memory_scaling: float = 1.0
    cores_scaling: float = 1.0
    enable_numa_topology: bool = False
    filter_uuids: frozenset[str] = frozenset()
    filter_indexes: frozenset[int] = frozenset()
    operating_mode: OperatingMode = OperatingMode.HAMI_CORE


def vgpu_device_ids(gpu_uuid: str, split_count: int) -> list[str]:
    """The kubelet device IDs of one GPU: `<UUID>-0` ... `<UUID>-<split_count-1>`."""
    return [f"{gpu_uuid}-{slot}" for slot in range(split_count)]


def physical_uuid_of(device_id: str) -> str:
    """The physical GPU UUID behind a kubelet device ID (inverse of `vgpu_device_ids`).

    HAMi's rule: IDs containing `MIG` pass through; `<uuid>::<n>` loses the `::<n>` part; an
    ID with exactly 6 dashes whose last part is a number loses `-<n>` (a GPU UUID has 5).
    Anything else is returned unchanged.
    """
    if "MIG" in device_id:
        return device_id
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    if device_id.count("-") == 6:
        head, _, slot = device_id.rpartition("-")
        if slot.isdigit():
            return head
    return device_id


@dataclass(frozen=True, slots=True)
class VgpuDevice:
    """One kubelet device (a vGPU slot of a physical GPU)."""

    id: str
    gpu_uuid: str
    healthy: bool
    numa_node: int | None
    """NUMA node to report to kubelet; None when topology is disabled or unknown."""


def advertised_gpus(gpus: Sequence[PhysicalGpu], config: InventoryConfig) -> list[PhysicalGpu]:
    """The GPUs this plugin offers: MIG-enabled ones and `filterdevices` matches left out."""
    return [
        gpu
        for gpu in gpus
        if (not gpu.mig_enabled or config.operating_mode == OperatingMode.MIG)
        and gpu.uuid not in config.filter_uuids
        and gpu.index not in config.filter_indexes
    ]


def build_vgpu_devices(
    gpus: Sequence[PhysicalGpu], unhealthy: Collection[str], config: InventoryConfig
) -> list[VgpuDevice]:
    """`split_count` kubelet devices per advertised GPU; all slots of a GPU share its health.

    `unhealthy` holds physical UUIDs. The caller logs skipped MIG-enabled GPUs.
    """
    devices: list[VgpuDevice] = []
    for gpu in advertised_gpus(gpus, config):
        numa = gpu.numa_node if config.enable_numa_topology and gpu.numa_node >= 0 else None
        healthy = gpu.uuid not in unhealthy
        devices.extend(
            VgpuDevice(id=device_id, gpu_uuid=gpu.uuid, healthy=healthy, numa_node=numa)
            for device_id in vgpu_device_ids(gpu.uuid, config.split_count)
        )
    return devices


def build_register_devices(
    gpus: Sequence[PhysicalGpu],
    unhealthy: Collection[str],
    config: InventoryConfig,
    *,
    hamicore_ready: bool = True,
    mig_devices: Mapping[str, GpuDevice] | None = None,
) -> list[GpuDevice]:
    """The devices written to `hami.io/node-nvidia-register` for the advertised GPUs.

    As HAMi: devmem = memory MiB x memory scaling, truncated; devcore = int(cores scaling x
    100); count = split count; type = card type; numa = NUMA node, 0 when unknown. Without
    HAMi-core on the node (`hamicore_ready` False) every GPU is registered unhealthy, so the
    scheduler places no vGPU pod where Allocate would refuse it (kubelet is told nothing:
    `docs/device-plugin.md`, "HAMi-core on the node").

    On a dynamic-MIG node (`operatingmode: mig`) each advertised GPU registers the entry
    `mig_devices` holds for its UUID (HAMi register.go:148-202, built from NVML's profiles by
    `mig.dynamic.DynamicMig.register_devices`; HAMi-core is not needed there), and a GPU
    without one is not registered.
    """
    if config.operating_mode == OperatingMode.MIG:
        entries = mig_devices or {}
        return [entries[g.uuid] for g in advertised_gpus(gpus, config) if g.uuid in entries]
    return [
        GpuDevice(
            uuid=gpu.uuid,
            index=gpu.index,
            split_count=config.split_count,
            memory_mib=int(gpu.memory_mib * config.memory_scaling),
            cores_percent=int(config.cores_scaling * 100),
            type=gpu.card_type,
            numa_node=max(gpu.numa_node, 0),
            mode=OperatingMode.HAMI_CORE,
            healthy=hamicore_ready and gpu.uuid not in unhealthy,
        )
        for gpu in advertised_gpus(gpus, config)
    ]
