"""Static MIG: which pre-made MIG devices this node serves to kubelet, under which resource (pure).

HAMi v2.10's device plugin is NVIDIA's here. `--mig-strategy` (cmd/device-plugin/nvidia/
main.go:86-87, validated at main.go:238-244) picks how GPUs that already carry MIG devices (made
beforehand, e.g. by the GPU Operator's mig-manager) are offered:

* `none` (the default): MIG is ignored; MIG-enabled GPUs are not HAMi-shared (this plugin leaves
  them out, `inventory.advertised_gpus`).
* `single`: every MIG device goes under `nvidia.com/gpu` (rm/rm.go:123-124,
  `AddMIGResource("*", "gpu")`); every GPU must be MIG-enabled with MIG devices of one kind
  (`requireUniformMIGDevices`, rm/device_map.go:104-116).
* `mixed`: each full-compute MIG profile gets `nvidia.com/mig-<profile>`, `+` written `.`
  (rm/rm.go:147-154: only profiles whose compute-instance slices equal the GPU-instance slices,
  `info.C == info.G`); GPUs without MIG stay under the configured resource (here: HAMi-shared
  vGPUs, as with `none`).

`plan_static_mig` follows `buildDeviceMapFromConfigResources` (rm/device_map.go:89-121) step by
step, with its error strings wrapped as `NewNVMLResourceManagers` and `build` wrap them
(rm/nvml_manager.go:66-69, rm/device_map.go:77-80), so a node NVIDIA's plugin refuses is refused
here with the same words. Resources left without devices are not served
(rm/nvml_manager.go:73-76), and MIG devices named in `filterdevices.uuid` are dropped
(nvml_manager.go:77-82, `FilterDeviceToRegister` by device ID, the MIG UUID).

A MIG device is a whole kubelet device: its ID is its MIG UUID (NVIDIA's default
`--device-id-strategy=uuid`), its index `<gpu index>:<mig index>` (rm/nvml_devices.go:73-75),
its NUMA node its parent's (nvml_devices.go:193-201). No HAMi booking is involved: kubelet picks
whole devices and nothing a tenant wrote is read.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hami_plugin.deviceplugin.mig.devices import MigDevice

__all__ = [
    "NO_INSTANCE",
    "SINGLE_RESOURCE_NAME",
    "MigEvent",
    "MigStrategy",
    "ScannedGpu",
    "ServedMigDevice",
    "StaticMigError",
    "StaticMigPlan",
    "mig_resource_name",
    "mig_socket_name",
    "plan_static_mig",
    "unhealthy_mig_uuids",
]

logger = logging.getLogger(__name__)


class MigStrategy(enum.StrEnum):
    """NVIDIA's `spec.MigStrategyNone/Single/Mixed`, in main.go:238-244's order."""

    NONE = "none"
    """MIG-enabled GPUs are left out."""
    SINGLE = "single"
    """MIG devices replace the GPUs under `nvidia.com/gpu`."""
    MIXED = "mixed"
    """One `nvidia.com/mig-<profile>` resource per profile."""


RESOURCE_PREFIX = "nvidia.com/"
"""`AddMIGResource` names resources `nvidia.com/<name>` (NVIDIA's api/config/v1)."""
SINGLE_RESOURCE_NAME = RESOURCE_PREFIX + "gpu"
"""Where `single` puts MIG devices: `AddMIGResource("*", "gpu")` (rm/rm.go:124)."""

NO_INSTANCE = 0xFFFFFFFF
"""NVML's GPU/compute instance id of an event that is not about one MIG device (health.go:181)."""

_PROFILE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.\d+gb(?:\+\w+)*$")
"""NVIDIA's MIG profile string: `[<C>c.]<G>g.<memory>gb[+<attribute>...]` (go-nvlib)."""


class ScannedGpu(Protocol):
    """What the plan reads of a scanned GPU (`inventory.PhysicalGpu`; not imported: the
    inventory imports `mig`)."""

    @property
    def uuid(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def numa_node(self) -> int: ...
    @property
    def mig_enabled(self) -> bool: ...


class StaticMigError(Exception):
    """The node's MIG layout is one NVIDIA's plugin refuses for the strategy (its message)."""


@dataclass(frozen=True, slots=True)
class ServedMigDevice:
    """One MIG device advertised to kubelet under a MIG resource."""

    device: MigDevice
    numa_node: int
    """The parent GPU's NUMA node; -1 when unknown."""

    @property
    def id(self) -> str:
        """The kubelet device ID: the MIG UUID."""
        return self.device.uuid

    @property
    def index(self) -> str:
        """NVIDIA's MIG device index, `<gpu index>:<mig index>` (nvml_devices.go:73-75)."""
        return f"{self.device.parent_index}:{self.device.mig_index}"


@dataclass(frozen=True, slots=True)
class StaticMigPlan:
    """What the node serves: the MIG resources and whether the HAMi vGPU resource is served."""

    strategy: MigStrategy
    mig_resources: Mapping[str, tuple[ServedMigDevice, ...]]
    """Resource name -> its MIG devices in (GPU index, MIG index) order; names sorted."""
    vgpu_served: bool
    """Whether the configured resource still offers the non-MIG GPUs as HAMi vGPUs (False
    under `single` once MIG devices take `nvidia.com/gpu`)."""

    @property
    def devices(self) -> tuple[ServedMigDevice, ...]:
        """Every served MIG device, over all resources."""
        return tuple(d for devices in self.mig_resources.values() for d in devices)


@dataclass(frozen=True, slots=True)
class MigEvent:
    """An XID event as the MIG health check needs it: the parent GPU and NVML's GI/CI ids."""

    parent_uuid: str
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


def _profile_slices(profile: str) -> tuple[int, int] | None:
    """(compute slices, GPU slices) of a profile string; None when it is not one."""
    match = _PROFILE.match(profile)
    if match is None:
        return None
    g = int(match["g"])
    return (int(match["c"]) if match["c"] else g), g


def mig_resource_name(profile: str) -> str | None:
    """`mixed`'s resource for a profile: `nvidia.com/mig-<profile>` with `+` as `.`
    (rm/rm.go:147-154), or None for a profile with fewer compute slices than GPU slices (no
    resource pattern names it: rm/rm.go:149-151)."""
    slices = _profile_slices(profile)
    if slices is None or slices[0] != slices[1]:
        return None
    return RESOURCE_PREFIX + ("mig-" + profile).replace("+", ".")


def mig_socket_name(resource_name: str) -> str:
    """The plugin socket of a MIG resource, as NVIDIA names sockets: `nvidia-<name>.sock`
    (`nvidia-mig-1g.10gb.sock`; plugin/server.go:211)."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def _wrap(message: str) -> StaticMigError:
    # NewNVMLResourceManagers (nvml_manager.go:68) + build (device_map.go:79).
    return StaticMigError(
        f"error building device map: error building device map from config.resources: {message}"
    )


def plan_static_mig(
    strategy: MigStrategy | str,
    gpus: Sequence[ScannedGpu],
    mig_devices: Mapping[int, Sequence[MigDevice]],
    *,
    filter_uuids: Collection[str] = frozenset(),
) -> StaticMigPlan:
    """The resources to serve for `strategy`, or StaticMigError with NVIDIA's message.

    `mig_devices` holds the MIG devices NVML lists per GPU index (only MIG-enabled GPUs are
    looked up). Steps as rm/device_map.go:89-121: the GPU map (non-MIG GPUs, :124-148), the
    MIG map (:151-167), every MIG-enabled GPU has MIG devices (:171-198, an error under
    `single`, a warning under `mixed`), one kind of MIG device under `single` (:200-213), and
    under `single` no mix of MIG and non-MIG GPUs (:114-116).
    """
    try:
        strategy = MigStrategy(strategy)
    except ValueError:
        raise StaticMigError(f"unknown MIG strategy: {strategy}") from None  # main.go:243
    if strategy == MigStrategy.NONE:
        return StaticMigPlan(strategy, {}, vgpu_served=True)
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    plain_gpus = [gpu for gpu in ordered if not gpu.mig_enabled]
    mig_gpus = [gpu for gpu in ordered if gpu.mig_enabled]
    uniform = strategy == MigStrategy.SINGLE

    resources: dict[str, list[ServedMigDevice]] = {}
    for gpu in mig_gpus:
        for device in sorted(mig_devices.get(gpu.index, ()), key=lambda d: d.mig_index):
            name = SINGLE_RESOURCE_NAME if uniform else mig_resource_name(device.profile)
            if name is None:
                raise _wrap(
                    "error building MIG device map: MIG profile "
                    f"'{device.profile}' does not match any resource patterns"
                )
            resources.setdefault(name, []).append(ServedMigDevice(device, gpu.numa_node))

    for gpu in mig_gpus:
        if mig_devices.get(gpu.index):
            continue
        if uniform:
            raise _wrap(
                "invalid MIG configuration: at least one device with migEnabled=true was not "
                f"configured correctly: device {gpu.index} has no MIG devices configured"
            )
        logger.warning("device %d has no MIG devices configured", gpu.index)
    if uniform:
        kinds = {
            (d.profile, d.memory_mib, d.placement.size)
            for gpu in mig_gpus
            for d in mig_devices.get(gpu.index, ())
        }
        if len(kinds) > 1:
            raise _wrap("invalid MIG configuration: more than one MIG device type present on node")
        if plain_gpus and resources:
            raise _wrap("all devices on the node must be configured with the same migEnabled value")

    served = {
        name: tuple(d for d in resources[name] if d.id not in filter_uuids)
        for name in sorted(resources)
    }
    served = {name: devices for name, devices in served.items() if devices}
    vgpu_served = not (uniform and resources)
    return StaticMigPlan(strategy, served, vgpu_served=vgpu_served)


def unhealthy_mig_uuids(
    devices: Sequence[ServedMigDevice],
    unhealthy_parents: Collection[str],
    events: Sequence[MigEvent] = (),
) -> frozenset[str]:
    """The MIG devices to report unhealthy: every one on a GPU the health check lost, and the
    ones a critical XID names by GPU/compute instance.

    As rm/health.go:175-190: an event with both ids set marks only the MIG device with that
    GI and CI on its parent; one without (`NO_INSTANCE`) is about the whole GPU. NVIDIA keeps one
    MIG device per parent in its event map (health.go:104, the last one listed), so an event for
    the whole GPU marks that one only; here it marks every MIG device of the GPU.
    """
    marked = {d.id for d in devices if d.device.parent_uuid in unhealthy_parents}
    for event in events:
        whole = NO_INSTANCE in (event.gpu_instance_id, event.compute_instance_id)
        for served in devices:
            device = served.device
            if device.parent_uuid != event.parent_uuid:
                continue
            if whole or (
                device.gpu_instance_id == event.gpu_instance_id
                and device.compute_instance_id == event.compute_instance_id
            ):
                marked.add(served.id)
    return frozenset(marked)
