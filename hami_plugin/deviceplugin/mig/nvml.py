"""`NvmlMig`: the `MigNvml` interface over an NVML module (`pynvml`, or the fake NVML).

Constructed with the module `deviceplugin.nvml.NvmlBackend` calls (`NvmlBackend.nvml`), NVML
initialised by the caller. Every NVML failure becomes a `MigNvmlError` (an `NvmlError`, from
`mig.nvmlcalls`, which makes the calls) carrying NVML's return code in `.code` and a message
naming the call, worded as HAMi v2.10's
pkg/device-plugin/nvidiadevice/nvinternal/plugin/migmgr.go words it.

What follows HAMi:

* profile names: HAMi's dynamic MIG takes them from its allowlist and maps them to NVML by slice
  key (migmgr.go:23-41, :109-114); its static MIG names devices with go-nvlib's
  `MigProfile.String()` (rm/device_map.go:154-159). `profiles` and `mig_devices` name what NVML
  reports the go-nvlib way (`mig.naming`), from the profile constants and the parent's memory;
* `profiles` asks for the profiles HAMi's `discoverMigProfiles` asks for (register.go:209-252:
  each `profileNameToGIProfileID` constant, then its possible placements);
* `create_instance` is `EnsureAllocation` (migmgr.go:349-417): slice key -> GI and CI profile
  constants, the placement checked against NVML's possible placements, the GI created at it, a
  full-size CI with COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, the GI (and CI) destroyed again when
  a later step fails, the MIG UUID found by `findMigUUIDForGI` (:533-556). MIG mode is not
  switched on here (HAMi's `ensureMigModeEnabled`, :175-220, is the manager's step, with
  `mig_mode` / `set_mig_mode`);
* `destroy_instance` is `destroyMigInstance` (:224-250; a GI or CI already gone is no error),
  `destroy_all` is `destroyAllMigInstances` (:254-294), `has_processes` is mig_startup.go
  `nvmlBusyGPUs` for one GPU (:141-168) with `deviceHasProcesses` (:173-186).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from hami_plugin.deviceplugin.mig import naming
from hami_plugin.deviceplugin.mig.devices import (
    MigDevice,
    MigModeState,
    MigProfileInfo,
)
from hami_plugin.deviceplugin.mig.nvmlcalls import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    MigNvmlError,
    NvmlCalls,
    text,
)
from hami_plugin.protocol.model import MigPlacement

__all__ = ["MigNvmlError", "NvmlMig"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024

_HAMI_GI_ORDER = (
    naming.GI_1_SLICE,
    naming.GI_2_SLICE,
    naming.GI_3_SLICE,
    naming.GI_4_SLICE,
    naming.GI_6_SLICE,
    naming.GI_7_SLICE,
    naming.GI_8_SLICE,
)
"""The GPU instance profiles HAMi's `destroyAllMigInstances` walks (migmgr.go:255-263), also
the values of its `profileNameToGIProfileID`."""


def _placements_message(gpu_index: int, profile_id: int, reason: str) -> str:
    return f"gpu {gpu_index} get placements for profile {profile_id}: {reason}"


def _placement_text(start: int, size: int) -> str:
    """Go's `%+v` of an nvml.GpuInstancePlacement, as HAMi's messages print it."""
    return f"{{Start:{start} Size:{size}}}"


class NvmlMig(NvmlCalls):
    """`MigNvml` over an NVML module object (pynvml, or the fake NVML's `FakeNvml`)."""

    # -- MIG mode --

    def mig_mode(self, gpu_index: int) -> MigModeState:
        handle = self._handle(gpu_index)
        try:
            current, pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._error_type as error:
            if self._code(error) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                return MigModeState(current=False, pending=False, supported=False)
            raise MigNvmlError(
                f"gpu {gpu_index} get mig mode: {error}", self._code(error)
            ) from error
        enable = self._nvml.NVML_DEVICE_MIG_ENABLE
        return MigModeState(current=current == enable, pending=pending == enable)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """migmgr.go:197-203: set the mode, then check the activation status NVML returns."""
        handle = self._handle(gpu_index)
        mode = self._nvml.NVML_DEVICE_MIG_ENABLE if enabled else self._nvml.NVML_DEVICE_MIG_DISABLE
        activation = self._call(
            lambda reason: f"gpu {gpu_index} set mig mode: {reason}",
            lambda: self._nvml.nvmlDeviceSetMigMode(handle, mode),
        )
        status = int(getattr(activation, "value", activation))
        if status != NVML_SUCCESS:
            raise MigNvmlError(
                f"gpu {gpu_index} activate mig mode: {self._error_string(status)}", status
            )

    # -- profiles --

    def profiles(self, gpu_index: int) -> Sequence[MigProfileInfo]:
        """The GPU instance profiles of HAMi's `profileNameToGIProfileID` the GPU has (a profile
        NVML answers NotSupported / InvalidArgument for is not there; MIG disabled: none), with
        their go-nvlib names and possible placements (register.go:215-245)."""
        handle = self._handle(gpu_index)
        total = self._total_memory_bytes(handle, gpu_index)
        out: list[MigProfileInfo] = []
        for constant in _HAMI_GI_ORDER:
            info, ret = self._gi_profile_info(handle, constant)
            if info is None:
                if ret in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise MigNvmlError(
                    f"gpu {gpu_index} get GI profile {constant}: {self._error_string(ret)}", ret
                )
            placements = self._call(
                partial(_placements_message, gpu_index, int(info.id)),
                partial(self._placements, handle, info),
            )
            name = naming.profile_name(
                constant,
                naming.HAMI_CI_PROFILE_BY_SLICE_KEY[f"{naming.GI_PROFILE_SLICES[constant]}g"],
                int(info.memorySizeMB),
                total,
            )
            assert name is not None  # HAMi's constants all have a slice rule
            out.append(
                MigProfileInfo(
                    name=name,
                    gi_profile_id=constant,
                    slice_count=int(info.sliceCount),
                    memory_mib=int(info.memorySizeMB),
                    multiprocessor_count=int(info.multiprocessorCount),
                    instance_count=int(info.instanceCount),
                    placements=tuple(placements),
                )
            )
        return out

    # -- MIG devices --

    def _gi_constant_by_id(self, handle: Any) -> dict[int, int]:
        """NVML profile id (`info.id`) -> NVML_GPU_INSTANCE_PROFILE_* constant, as go-nvlib's
        `GetProfile` finds it (mig_device.go: every constant below the profile count)."""
        out: dict[int, int] = {}
        for constant in range(int(self._nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            info, _ret = self._gi_profile_info(handle, constant)
            if info is not None:
                out.setdefault(int(info.id), constant)
        return out

    def _ci_constant_by_id(self, gi: Any) -> dict[int, int]:
        out: dict[int, int] = {}
        shared = self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for constant in range(int(self._nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            info, _ret = self._try(
                partial(
                    self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, constant, shared
                )
            )
            if info is not None:
                out.setdefault(int(info.id), constant)
        return out

    def _mig_handles(self, handle: Any, gpu_index: int) -> list[tuple[int, Any]]:
        """(MIG index, handle) of every MIG device present (migmgr.go:533-546's walk)."""
        max_count = self._call(
            lambda reason: f"get max MIG device count: {reason}",
            lambda: self._nvml.nvmlDeviceGetMaxMigDeviceCount(handle),
        )
        out: list[tuple[int, Any]] = []
        for index in range(int(max_count)):
            mig, _ret = self._try(
                partial(self._nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)
            )
            if mig is not None:
                out.append((index, mig))
        return out

    def mig_devices(self, gpu_index: int) -> Sequence[MigDevice]:
        handle = self._handle(gpu_index)
        mode = self.mig_mode(gpu_index)
        if not mode.supported or not mode.current:
            return []
        parent_uuid = text(
            self._call(
                lambda reason: f"gpu {gpu_index} get UUID: {reason}",
                lambda: self._nvml.nvmlDeviceGetUUID(handle),
            )
        )
        total = self._total_memory_bytes(handle, gpu_index)
        gi_constants = self._gi_constant_by_id(handle)
        out: list[MigDevice] = []
        for mig_index, mig in self._mig_handles(handle, gpu_index):
            out.append(
                self._describe(handle, gpu_index, parent_uuid, total, gi_constants, mig_index, mig)
            )
        return out

    def _describe(
        self,
        handle: Any,
        gpu_index: int,
        parent_uuid: str,
        total: int,
        gi_constants: dict[int, int],
        mig_index: int,
        mig: Any,
    ) -> MigDevice:
        """One MIG device as go-nvlib's `GetProfile` reads it (mig_device.go)."""
        nvml = self._nvml
        where = f"MIG device {mig_index} of gpu {gpu_index}"
        gi_id = int(
            self._call(
                lambda r: f"{where}: get GPU instance id: {r}",
                lambda: nvml.nvmlDeviceGetGpuInstanceId(mig),
            )
        )
        ci_id = int(
            self._call(
                lambda r: f"{where}: get compute instance id: {r}",
                lambda: nvml.nvmlDeviceGetComputeInstanceId(mig),
            )
        )
        uuid = text(self._call(lambda r: f"get MIG UUID: {r}", lambda: nvml.nvmlDeviceGetUUID(mig)))
        memory = self._call(
            lambda r: f"{where}: get memory info: {r}", lambda: nvml.nvmlDeviceGetMemoryInfo(mig)
        )
        gi = self._call(
            lambda r: f"get GI {gi_id} on gpu {gpu_index}: {r}",
            lambda: nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id),
        )
        gi_info = self._call(lambda r: f"get GI info: {r}", lambda: nvml.nvmlGpuInstanceGetInfo(gi))
        ci = self._call(
            lambda r: f"get CI {ci_id} on gpu {gpu_index}: {r}",
            lambda: nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id),
        )
        ci_info = self._call(
            lambda r: f"get CI info: {r}", lambda: nvml.nvmlComputeInstanceGetInfo(ci)
        )
        gi_constant = gi_constants.get(int(gi_info.profileId))
        ci_constant = self._ci_constant_by_id(gi).get(int(ci_info.profileId))
        gi_memory_mib = 0
        if gi_constant is not None:
            info, _ret = self._gi_profile_info(handle, gi_constant)
            gi_memory_mib = int(info.memorySizeMB) if info is not None else 0
        name = (
            naming.profile_name(gi_constant, ci_constant, gi_memory_mib, total)
            if gi_constant is not None and ci_constant is not None
            else None
        )
        if name is None:
            raise MigNvmlError(
                f"{where}: unknown MIG profile (GPU instance profile id {gi_info.profileId}, "
                f"compute instance profile id {ci_info.profileId})"
            )
        return MigDevice(
            uuid=uuid,
            parent_uuid=parent_uuid,
            parent_index=gpu_index,
            mig_index=mig_index,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            profile=name,
            placement=MigPlacement(
                start=int(gi_info.placement.start), size=int(gi_info.placement.size)
            ),
            memory_mib=int(memory.total) // _MIB,
        )

    def _find_mig_for_gi(self, handle: Any, gpu_index: int, gi_id: int) -> tuple[int, Any]:
        """migmgr.go:533-556 `findMigUUIDForGI`: the first MIG device of the GI."""
        for mig_index, mig in self._mig_handles(handle, gpu_index):
            got, _ret = self._try(partial(self._nvml.nvmlDeviceGetGpuInstanceId, mig))
            if got is not None and int(got) == gi_id:
                return mig_index, mig
        raise MigNvmlError(f"no MIG device found for GI {gi_id}")

    # -- create --

    def create_instance(self, gpu_index: int, profile: str, placement: MigPlacement) -> MigDevice:
        """migmgr.go:349-417 (`EnsureAllocation` after its cache and mode steps)."""
        nvml = self._nvml
        key = naming.profile_slice_key(profile)
        gi_constant = naming.HAMI_GI_PROFILE_BY_SLICE_KEY.get(key)
        if gi_constant is None:
            raise MigNvmlError(f'unsupported MIG profile "{profile}"')
        ci_constant = naming.HAMI_CI_PROFILE_BY_SLICE_KEY.get(key)
        if ci_constant is None:
            raise MigNvmlError(f'unsupported MIG compute profile "{profile}"')
        handle = self._handle(gpu_index)
        gi_info, ret = self._gi_profile_info(handle, gi_constant)
        if gi_info is None:
            raise MigNvmlError(f"get GI profile {profile}: {self._error_string(ret)}", ret)
        possible = self._call(
            lambda r: f"get placements for {profile}: {r}",
            lambda: self._placements(handle, gi_info),
        )
        shown = _placement_text(placement.start, placement.size)
        if placement not in possible:
            raise MigNvmlError(
                f"scheduler selected invalid placement {shown} for profile {profile}"
            )
        wanted = nvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        gi = self._call(
            lambda r: f"create GI profile={profile} placement={shown}: {r}",
            lambda: nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, int(gi_info.id), ctypes.byref(wanted)
            ),
        )
        ci: Any = None
        try:
            gi_data = self._call(
                lambda r: f"get GI info: {r}", lambda: nvml.nvmlGpuInstanceGetInfo(gi)
            )
            ci_info = self._call(
                lambda r: f"get CI profile info: {r}",
                lambda: nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_constant, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                ),
            )
            ci = self._call(
                lambda r: f"create CI: {r}",
                lambda: nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id)),
            )
            self._call(lambda r: f"get CI info: {r}", lambda: nvml.nvmlComputeInstanceGetInfo(ci))
            gi_id = int(gi_data.id)
            mig_index, mig = self._find_mig_for_gi(handle, gpu_index, gi_id)
            parent_uuid = text(
                self._call(
                    lambda r: f"gpu {gpu_index} get UUID: {r}",
                    lambda: nvml.nvmlDeviceGetUUID(handle),
                )
            )
            device = self._describe(
                handle,
                gpu_index,
                parent_uuid,
                self._total_memory_bytes(handle, gpu_index),
                self._gi_constant_by_id(handle),
                mig_index,
                mig,
            )
        except MigNvmlError:
            # HAMi destroys what it made and ignores the outcome (migmgr.go:386-409).
            if ci is not None:
                self._try(lambda: nvml.nvmlComputeInstanceDestroy(ci))
            self._try(lambda: nvml.nvmlGpuInstanceDestroy(gi))
            raise
        logger.info(
            "created MIG instance %s on gpu %d: profile %s, placement %d+%d, "
            "GPU instance %d, compute instance %d",
            device.uuid,
            gpu_index,
            device.profile,
            placement.start,
            placement.size,
            device.gpu_instance_id,
            device.compute_instance_id,
        )
        return device

    # -- destroy --

    def destroy_instance(
        self, gpu_index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        """migmgr.go:224-250 `destroyMigInstance`."""
        nvml = self._nvml
        handle = self._handle(gpu_index)
        gi, ret = self._try(lambda: nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id))
        if ret == NVML_ERROR_NOT_FOUND:
            return
        if gi is None:
            raise MigNvmlError(
                f"get GI {gpu_instance_id} on gpu {gpu_index}: {self._error_string(ret)}", ret
            )
        ci, ret = self._try(
            lambda: nvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance_id)
        )
        if ci is not None:
            self._call(
                lambda r: f"destroy CI {compute_instance_id} on gpu {gpu_index}: {r}",
                lambda: nvml.nvmlComputeInstanceDestroy(ci),
            )
        elif ret != NVML_ERROR_NOT_FOUND:
            raise MigNvmlError(
                f"get CI {compute_instance_id} on gpu {gpu_index}: {self._error_string(ret)}", ret
            )
        self._call(
            lambda r: f"destroy GI {gpu_instance_id} on gpu {gpu_index}: {r}",
            lambda: nvml.nvmlGpuInstanceDestroy(gi),
        )

    def destroy_all(self, gpu_index: int) -> None:
        """migmgr.go:254-294 `destroyAllMigInstances`, over HAMi's profiles first and then the
        other profile constants NVML has (HAMi's list misses e.g. `1g.10gb` on an A100-40GB,
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, which a static layout may hold)."""
        nvml = self._nvml
        handle = self._handle(gpu_index)
        total = int(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        order = list(_HAMI_GI_ORDER) + [c for c in range(total) if c not in _HAMI_GI_ORDER]
        shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for constant in order:
            info, _ret = self._gi_profile_info(handle, constant)
            if info is None:
                continue
            gis = self._list(
                nvml.c_nvmlGpuInstance_t,
                int(info.instanceCount),
                partial(nvml.nvmlDeviceGetGpuInstances, handle, int(info.id)),
            )
            for gi in gis or []:
                for ci_constant in range(int(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                    ci_info, _r = self._try(
                        partial(
                            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                            gi,
                            ci_constant,
                            shared,
                        )
                    )
                    if ci_info is None:
                        continue
                    cis = self._list(
                        nvml.c_nvmlComputeInstance_t,
                        int(ci_info.instanceCount),
                        partial(nvml.nvmlGpuInstanceGetComputeInstances, gi, int(ci_info.id)),
                    )
                    for ci in cis or []:
                        self._call(
                            lambda r: f"destroy compute instance: {r}",
                            partial(nvml.nvmlComputeInstanceDestroy, ci),
                        )
                self._call(
                    lambda r: f"destroy gpu instance: {r}",
                    partial(nvml.nvmlGpuInstanceDestroy, gi),
                )

    # -- busy --

    def _device_has_processes(self, device: Any) -> bool:
        """mig_startup.go:173-186 `deviceHasProcesses`: a failed query counts as busy."""
        procs, _ret = self._try(lambda: self._nvml.nvmlDeviceGetComputeRunningProcesses(device))
        if procs is None:
            return True
        if len(procs) > 0:
            return True
        graphics, _ret = self._try(lambda: self._nvml.nvmlDeviceGetGraphicsRunningProcesses(device))
        if graphics is None:
            return True
        return len(graphics) > 0

    def has_processes(self, gpu_index: int) -> bool:
        """mig_startup.go:141-168 for one GPU: the GPU itself unless MIG is on, else each MIG
        device (a failed max-count query: not busy, as HAMi's `continue`)."""
        handle = self._handle(gpu_index)
        mode, _ret = self._try(lambda: self._nvml.nvmlDeviceGetMigMode(handle))
        if mode is None or mode[0] != self._nvml.NVML_DEVICE_MIG_ENABLE:
            return self._device_has_processes(handle)
        max_count, _ret = self._try(lambda: self._nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        if max_count is None:
            return False
        for index in range(int(max_count)):
            mig, _ret = self._try(
                partial(self._nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)
            )
            if mig is not None and self._device_has_processes(mig):
                return True
        return False

    def mig_device_has_processes(self, gpu_index: int, mig_index: int) -> bool:
        """`deviceHasProcesses` (mig_startup.go:173-186) on one MIG device, found as HAMi walks
        them (`GetMigDeviceHandleByIndex`, mig_startup.go:159-164)."""
        handle = self._handle(gpu_index)
        mig = self._call(
            lambda r: f"get MIG device {mig_index} of gpu {gpu_index}: {r}",
            lambda: self._nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index),
        )
        return self._device_has_processes(mig)
