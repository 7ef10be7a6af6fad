"""MIG as the device plugin sees it: the GPU instance profiles a GPU offers, the MIG devices
(GPU instance + compute instance) present on it, and the small NVML surface the rest of the
plugin uses to list, create and destroy them (`MigNvml`, implemented in `mig.nvml` over
`pynvml`, and by the fake NVML in tests). Pure data, no I/O.

Names follow NVIDIA: a profile is `<slices>g.<memory>gb` (`1g.10gb`), a placement is the
profile's start slice and size in slices (NVML `nvmlGpuInstancePlacement_t`), a MIG device's
UUID starts with `MIG-`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hami_plugin.protocol.model import MigPlacement

__all__ = ["MigDevice", "MigModeState", "MigNvml", "MigProfileInfo"]


@dataclass(frozen=True, slots=True)
class MigProfileInfo:
    """One GPU instance profile as NVML reports it for one GPU
    (`nvmlDeviceGetGpuInstanceProfileInfo` + `nvmlDeviceGetGpuInstancePossiblePlacements`)."""

    name: str
    """NVIDIA's profile name, e.g. `1g.10gb`, `3g.40gb`, `7g.80gb`."""
    gi_profile_id: int
    """The NVML GPU instance profile constant (`NVML_GPU_INSTANCE_PROFILE_1_SLICE`, ...)."""
    slice_count: int
    memory_mib: int
    multiprocessor_count: int
    instance_count: int
    """How many instances of this profile the empty GPU can hold."""
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device present on a GPU: a GPU instance with its compute instance."""

    uuid: str
    """`MIG-<uuid>`, what `NVIDIA_VISIBLE_DEVICES` names."""
    parent_uuid: str
    parent_index: int
    mig_index: int
    """Its index for `nvmlDeviceGetMigDeviceHandleByIndex` on the parent."""
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    placement: MigPlacement
    memory_mib: int


@dataclass(frozen=True, slots=True)
class MigModeState:
    """`nvmlDeviceGetMigMode`: the current and the pending mode (True: enabled);
    `supported` is False on a GPU without MIG (NVML_ERROR_NOT_SUPPORTED)."""

    current: bool
    pending: bool
    supported: bool = True


class MigNvml(Protocol):
    """The NVML calls MIG needs, by GPU index. Every call raises `NvmlError` (from
    `deviceplugin.nvml`) carrying NVML's return code on failure."""

    def mig_mode(self, gpu_index: int) -> MigModeState: ...

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None: ...

    def profiles(self, gpu_index: int) -> Sequence[MigProfileInfo]:
        """Every GPU instance profile the GPU supports, with its possible placements."""
        ...

    def mig_devices(self, gpu_index: int) -> Sequence[MigDevice]:
        """The MIG devices (GI + CI pairs) present on the GPU now, in MIG index order."""
        ...

    def create_instance(self, gpu_index: int, profile: str, placement: MigPlacement) -> MigDevice:
        """Create a GPU instance of `profile` at `placement`, then its full-size compute
        instance; on a compute-instance failure the GPU instance is destroyed again."""
        ...

    def destroy_instance(
        self, gpu_index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """Destroy the compute instance, then the GPU instance; one already gone
        (NVML_ERROR_NOT_FOUND) is not an error."""
        ...

    def destroy_all(self, gpu_index: int) -> None:
        """Destroy every compute and GPU instance on the GPU."""
        ...

    def has_processes(self, gpu_index: int) -> bool:
        """Whether any compute process runs on the GPU or one of its MIG devices."""
        ...

    def mig_device_has_processes(self, gpu_index: int, mig_index: int) -> bool:
        """Whether a compute or graphics process runs on the GPU's MIG device `mig_index`
        (`MigDevice.mig_index`); a failed process query counts as busy, as HAMi's
        `deviceHasProcesses` (mig_startup.go:173-186). Raises `NvmlError` when the MIG device
        handle cannot be had."""
        ...
