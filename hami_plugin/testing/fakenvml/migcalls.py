"""The MIG calls of the fake NVML (MIG mode, profiles, GPU and compute instances), with
pynvml's names, argument order and return types.

`MigCalls` is mixed into `FakeNvml`, beside `fakenvml.migdevices.MigDeviceCalls` (the MIG
devices the compute instances make). What pynvml returns as ctypes structures is a ctypes
structure here too, with pynvml's field names (`c_nvmlGpuInstanceProfileInfo_v2_t`,
`c_nvmlGpuInstancePlacement_t` ...); GPU and compute instance handles are ctypes pointers
(`c_nvmlGpuInstance_t`, `c_nvmlComputeInstance_t`), so the callers' arrays of handles
(`(nvml.c_nvmlGpuInstance_t * n)()` for `nvmlDeviceGetGpuInstances`) hold them as with the real
library; the calls that fill caller arrays take the array and `byref(count)` as pynvml does.

NVML's answers, as its documentation gives them: NVML_ERROR_NOT_SUPPORTED for a GPU without
MIG, or with MIG disabled, and for a profile the GPU lacks; NVML_ERROR_INVALID_ARGUMENT for an
unknown profile id, a placement that is not one of the profile's or a stale instance handle;
NVML_ERROR_NOT_FOUND for an instance id with nothing behind it; the creation and destruction
rules are `fakenvml.migstate`'s.
"""

# pynvml's names (c_nvmlGpuInstance_t, nvmlDeviceGetMigMode ...), so that the fake is a drop-in.
# ruff: noqa: N803

from __future__ import annotations

import threading
from ctypes import (
    Structure,
    pointer,
)
from typing import Any

from hami_plugin.testing.fakenvml import mignames as naming
from hami_plugin.testing.fakenvml.errors import (
    NVMLError_FunctionNotFound,
    NVMLError_InsufficientResources,
    NVMLError_InsufficientSize,
    NVMLError_InUse,
    NVMLError_InvalidArgument,
    NVMLError_NotFound,
    NVMLError_NotSupported,
)
from hami_plugin.testing.fakenvml.gpufile import FakeGpuSpec
from hami_plugin.testing.fakenvml.migstate import (
    FakeComputeInstance,
    FakeGpuInstance,
    FakeGpuMig,
    FakeMigStore,
)
from hami_plugin.testing.fakenvml.migtables import profile_display_name
from hami_plugin.testing.fakenvml.migvalues import (
    NVML_DEVICE_NAME_V2_BUFFER_SIZE,
    FakeComputeInstanceInfo,
    FakeGpuInstanceInfo,
    c_nvmlComputeInstance_t,
    c_nvmlComputeInstancePlacement_t,
    c_nvmlComputeInstanceProfileInfo_t,
    c_nvmlComputeInstanceProfileInfo_v2_t,
    c_nvmlGpuInstance_t,
    c_nvmlGpuInstancePlacement_t,
    c_nvmlGpuInstanceProfileInfo_t,
    c_nvmlGpuInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v2,
    nvmlGpuInstanceProfileInfo_v2,
    struct_c_nvmlComputeInstance_t,
    struct_c_nvmlGpuInstance_t,
)
from hami_plugin.testing.fakenvml.values import (
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    FakeDeviceHandle,
)


def _deref(value: Any) -> Any:
    """The object behind `byref(x)` / `pointer(x)`, or `x` itself."""
    inner = getattr(value, "_obj", None)
    if inner is not None:
        return inner
    if hasattr(value, "contents"):
        try:
            return value.contents
        except ValueError:  # NULL pointer
            raise NVMLError_InvalidArgument() from None
    return value


def _token(handle: Any, kind: type[Structure]) -> int:
    try:
        contents = handle.contents
    except (AttributeError, ValueError):
        raise NVMLError_InvalidArgument() from None
    if not isinstance(contents, kind):
        raise NVMLError_InvalidArgument()
    return int(contents.token)


_MIB = 1024 * 1024


class MigCalls:
    """pynvml's MIG surface over `FakeMigStore`; mixed into `FakeNvml`."""

    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_IN_USE = 19
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23
    NVML_ERROR_INVALID_STATE = 29
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = naming.GI_1_SLICE
    NVML_GPU_INSTANCE_PROFILE_2_SLICE = naming.GI_2_SLICE
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = naming.GI_3_SLICE
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = naming.GI_4_SLICE
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = naming.GI_7_SLICE
    NVML_GPU_INSTANCE_PROFILE_8_SLICE = naming.GI_8_SLICE
    NVML_GPU_INSTANCE_PROFILE_6_SLICE = naming.GI_6_SLICE
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = naming.GI_1_SLICE_REV1
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = naming.GI_2_SLICE_REV1
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = naming.GI_1_SLICE_REV2
    NVML_GPU_INSTANCE_PROFILE_COUNT = naming.GI_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = naming.CI_1_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = naming.CI_2_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = naming.CI_3_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = naming.CI_4_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = naming.CI_7_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = naming.CI_8_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = naming.CI_6_SLICE
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = naming.CI_1_SLICE_REV1
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = naming.CI_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = naming.CI_ENGINE_PROFILE_SHARED
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT = 1
    NVML_DEVICE_NAME_V2_BUFFER_SIZE = NVML_DEVICE_NAME_V2_BUFFER_SIZE
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstanceProfileInfo_t = c_nvmlGpuInstanceProfileInfo_t
    c_nvmlGpuInstanceProfileInfo_v2_t = c_nvmlGpuInstanceProfileInfo_v2_t
    c_nvmlComputeInstancePlacement_t = c_nvmlComputeInstancePlacement_t
    c_nvmlComputeInstanceProfileInfo_t = c_nvmlComputeInstanceProfileInfo_t
    c_nvmlComputeInstanceProfileInfo_v2_t = c_nvmlComputeInstanceProfileInfo_v2_t
    c_nvmlGpuInstance_t = c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = c_nvmlComputeInstance_t

    # Provided by FakeNvml.
    _lock: threading.Lock
    _gpus: dict[str, FakeGpuSpec]

    def _lookup(self, handle: FakeDeviceHandle, *, live: bool) -> FakeGpuSpec:
        raise NotImplementedError

    def _check_init(self) -> None:
        raise NotImplementedError

    def _refresh(self, *, force_read: bool = False) -> None:
        raise NotImplementedError

    # -- state --

    def _mig_setup(self, path: str) -> None:
        self._mig_store = FakeMigStore(path)
        self._mig_tokens: dict[int, tuple[str, int, int, int]] = {}
        """token -> (GPU uuid, GI id, CI id or -1, serial)."""
        self._mig_token_of: dict[tuple[str, int, int, int], int] = {}
        self._mig_structs: dict[int, Structure] = {}
        """token -> the structure its handles point at (kept alive as long as the fake)."""
        self._process_overrides: dict[str, tuple[int, ...]] = {}

    def _mig_locked(self, gpu: FakeGpuSpec) -> FakeGpuMig | None:
        """The GPU's MIG state, the store brought up to date (call with the lock held)."""
        self._mig_store.sync(self._gpus)
        return self._mig_store.gpu(gpu.uuid)

    def _mig_gpu_locked(self, gpu: FakeGpuSpec, *, enabled: bool = True) -> FakeGpuMig:
        state = self._mig_locked(gpu)
        if state is None or (enabled and not state.current):
            raise NVMLError_NotSupported()
        return state

    def _gi_handle(self, uuid: str, gi: FakeGpuInstance) -> Any:
        return self._handle_for(uuid, gi.id, -1, gi.serial, struct_c_nvmlGpuInstance_t)

    def _ci_handle(self, uuid: str, gi: FakeGpuInstance, ci: FakeComputeInstance) -> Any:
        return self._handle_for(uuid, gi.id, ci.id, ci.serial, struct_c_nvmlComputeInstance_t)

    def _handle_for(
        self, uuid: str, gi_id: int, ci_id: int, serial: int, kind: type[Structure]
    ) -> Any:
        key = (uuid, gi_id, ci_id, serial)
        token = self._mig_token_of.get(key)
        if token is None:
            token = len(self._mig_tokens) + 1
            self._mig_tokens[token] = key
            self._mig_token_of[key] = token
        struct = self._mig_structs.get(token)
        if struct is None:
            struct = self._mig_structs[token] = kind(token=token)
        return pointer(struct)

    def _resolve_gi_locked(self, handle: Any) -> tuple[FakeGpuSpec, FakeGpuMig, FakeGpuInstance]:
        uuid, gi_id, _ci_id, serial = self._mig_tokens.get(
            _token(handle, struct_c_nvmlGpuInstance_t), ("", -1, -1, -1)
        )
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise NVMLError_InvalidArgument()
        state = self._mig_locked(gpu)
        gi = state.gpu_instances.get(gi_id) if state is not None else None
        if state is None or gi is None or gi.serial != serial:
            raise NVMLError_InvalidArgument()
        return gpu, state, gi

    def _resolve_ci_locked(
        self, handle: Any
    ) -> tuple[FakeGpuSpec, FakeGpuMig, FakeGpuInstance, FakeComputeInstance]:
        uuid, gi_id, ci_id, serial = self._mig_tokens.get(
            _token(handle, struct_c_nvmlComputeInstance_t), ("", -1, -1, -1)
        )
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise NVMLError_InvalidArgument()
        state = self._mig_locked(gpu)
        gi = state.gpu_instances.get(gi_id) if state is not None else None
        ci = gi.compute_instances.get(ci_id) if gi is not None else None
        if state is None or gi is None or ci is None or ci.serial != serial:
            raise NVMLError_InvalidArgument()
        return gpu, state, gi, ci

    # -- MIG mode --

    def nvmlDeviceGetMigMode(self, handle: FakeDeviceHandle) -> list[int]:
        gpu = self._lookup(handle, live=True)
        with self._lock:
            state = self._mig_locked(gpu)
        if state is None:
            if not gpu.mig:
                raise NVMLError_NotSupported()
            # A MIG-enabled GPU of a model without a profile table.
            return [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]
        return [
            NVML_DEVICE_MIG_ENABLE if state.current else NVML_DEVICE_MIG_DISABLE,
            NVML_DEVICE_MIG_ENABLE if state.pending else NVML_DEVICE_MIG_DISABLE,
        ]

    def nvmlDeviceSetMigMode(self, device: FakeDeviceHandle, mode: int) -> int:
        """Switch the mode at once (the GPU is idle and resettable); returns the activation
        status (NVML_SUCCESS). IN_USE while instances or processes remain."""
        gpu = self._lookup(device, live=True)
        if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
            raise NVMLError_InvalidArgument()
        with self._lock:
            state = self._mig_locked(gpu)
            if state is None:
                raise NVMLError_NotSupported()
            enable = mode == NVML_DEVICE_MIG_ENABLE
            if enable != state.current and (
                state.gpu_instances or self._process_overrides.get(gpu.uuid, gpu.processes)
            ):
                raise NVMLError_InUse()
            state.current = state.pending = enable
            self._mig_store.save()
        return 0

    # -- GPU instance profiles --

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: FakeDeviceHandle, profile: int, version: int = 2
    ) -> Any:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
        if not 0 <= profile < naming.GI_PROFILE_COUNT:
            raise NVMLError_InvalidArgument()
        found = next((p for p in state.profiles if p.constant == profile), None)
        if found is None:
            raise NVMLError_NotSupported()
        if version not in (1, 2):
            raise NVMLError_FunctionNotFound()
        info: Any = (
            c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else c_nvmlGpuInstanceProfileInfo_t()
        )
        if version == 2:
            info.version = nvmlGpuInstanceProfileInfo_v2
            name = profile_display_name(found, gpu.memory_mib or 0)
            info.name = f"MIG {name}".encode()
        info.id = found.id
        info.isP2pSupported = 0
        info.sliceCount = found.slice_count
        info.instanceCount = found.instance_count
        info.multiprocessorCount = found.multiprocessor_count
        info.copyEngineCount = found.copy_engines
        info.decoderCount = found.decoders
        info.encoderCount = 0
        info.jpegCount = found.jpegs
        info.ofaCount = found.ofas
        info.memorySizeMB = found.memory_mib
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: FakeDeviceHandle, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
        profile = state.profile_by_id(profileId)
        if profile is None:
            raise NVMLError_InvalidArgument()
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(profile.starts)
            return 0
        if count.value < len(profile.starts):
            count.value = len(profile.starts)
            raise NVMLError_InsufficientSize()
        for position, start in enumerate(profile.starts):
            placementsRef[position].start = start
            placementsRef[position].size = profile.size
        count.value = len(profile.starts)
        return 0

    def nvmlDeviceGetGpuInstanceRemainingCapacity(
        self, device: FakeDeviceHandle, profileId: int
    ) -> int:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            profile = state.profile_by_id(profileId)
            if profile is None:
                raise NVMLError_InvalidArgument()
            return len(state.free_placements(profile))

    # -- GPU instances --

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: FakeDeviceHandle, profileId: int, placement: Any
    ) -> Any:
        gpu = self._lookup(device, live=True)
        wanted = _deref(placement)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            profile = state.profile_by_id(profileId)
            if profile is None:
                raise NVMLError_InvalidArgument()
            gi = state.create_gpu_instance(profile, int(wanted.start), int(wanted.size))
            self._mig_store.save()
            return self._gi_handle(gpu.uuid, gi)

    def nvmlDeviceCreateGpuInstance(self, device: FakeDeviceHandle, profileId: int) -> Any:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            profile = state.profile_by_id(profileId)
            if profile is None:
                raise NVMLError_InvalidArgument()
            free = state.free_placements(profile)
            if not free:
                raise NVMLError_InsufficientResources()
            gi = state.create_gpu_instance(profile, free[0], profile.size)
            self._mig_store.save()
            return self._gi_handle(gpu.uuid, gi)

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        self._check_init()
        with self._lock:
            _gpu, state, gi = self._resolve_gi_locked(gpuInstance)
            state.destroy_gpu_instance(gi)
            self._mig_store.save()
        return 0

    def nvmlDeviceGetGpuInstances(
        self, device: FakeDeviceHandle, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            if state.profile_by_id(profileId) is None:
                raise NVMLError_InvalidArgument()
            found = [
                state.gpu_instances[gi_id]
                for gi_id in sorted(state.gpu_instances)
                if state.gpu_instances[gi_id].profile.id == profileId
            ]
            count = _deref(countRef)
            capacity = len(gpuInstancesRef) if hasattr(gpuInstancesRef, "__len__") else count.value
            if len(found) > capacity:
                count.value = len(found)
                raise NVMLError_InsufficientSize()
            for position, gi in enumerate(found):
                gpuInstancesRef[position] = self._gi_handle(gpu.uuid, gi)
            count.value = len(found)
        return 0

    def nvmlDeviceGetGpuInstanceById(self, device: FakeDeviceHandle, gpuInstanceId: int) -> Any:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            gi = state.gpu_instances.get(gpuInstanceId)
            if gi is None:
                raise NVMLError_NotFound()
            return self._gi_handle(gpu.uuid, gi)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> FakeGpuInstanceInfo:
        self._check_init()
        with self._lock:
            gpu, _state, gi = self._resolve_gi_locked(gpuInstance)
        return FakeGpuInstanceInfo(
            device=FakeDeviceHandle(gpu.uuid),
            id=gi.id,
            profileId=gi.profile.id,
            placement=c_nvmlGpuInstancePlacement_t(gi.start, gi.profile.size),
        )

    # -- compute instances --

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        self._check_init()
        with self._lock:
            gpu, _state, gi = self._resolve_gi_locked(device)
        if not 0 <= profile < naming.CI_PROFILE_COUNT or engProfile != 0:
            raise NVMLError_InvalidArgument()
        slices = naming.CI_PROFILE_SLICES.get(profile)
        # The modelled GPUs have no 6- or 8-slice compute instance profiles.
        if slices is None or slices > gi.profile.slice_count or slices in (6, 8):
            raise NVMLError_NotSupported()
        info: Any = (
            c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else c_nvmlComputeInstanceProfileInfo_t()
        )
        if version == 2:
            info.version = nvmlComputeInstanceProfileInfo_v2
            name = naming.mig_profile_name(
                gi.profile.slice_count,
                slices,
                gi.profile.suffix,
                gi.profile.memory_mib,
                (gpu.memory_mib or 0) * _MIB,
            )
            info.name = f"MIG {name}".encode()
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi.profile.slice_count // slices
        info.multiprocessorCount = (
            gi.profile.multiprocessor_count * slices // gi.profile.slice_count
        )
        info.sharedCopyEngineCount = gi.profile.copy_engines
        info.sharedDecoderCount = gi.profile.decoders
        info.sharedEncoderCount = 0
        info.sharedJpegCount = gi.profile.jpegs
        info.sharedOfaCount = gi.profile.ofas
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        self._check_init()
        with self._lock:
            gpu, state, gi = self._resolve_gi_locked(gpuInstance)
            ci = state.create_compute_instance(gi, profileId)
            self._mig_store.save()
            return self._ci_handle(gpu.uuid, gi, ci)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        self._check_init()
        with self._lock:
            gpu, _state, gi = self._resolve_gi_locked(gpuInstance)
            found = [
                gi.compute_instances[ci_id]
                for ci_id in sorted(gi.compute_instances)
                if gi.compute_instances[ci_id].profile == profileId
            ]
            count = _deref(countRef)
            capacity = (
                len(computeInstancesRef) if hasattr(computeInstancesRef, "__len__") else count.value
            )
            if len(found) > capacity:
                count.value = len(found)
                raise NVMLError_InsufficientSize()
            for position, ci in enumerate(found):
                computeInstancesRef[position] = self._ci_handle(gpu.uuid, gi, ci)
            count.value = len(found)
        return 0

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        self._check_init()
        with self._lock:
            gpu, _state, gi = self._resolve_gi_locked(gpuInstance)
            ci = gi.compute_instances.get(computeInstanceId)
            if ci is None:
                raise NVMLError_NotFound()
            return self._ci_handle(gpu.uuid, gi, ci)

    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: Any) -> FakeComputeInstanceInfo:
        self._check_init()
        with self._lock:
            gpu, _state, gi, ci = self._resolve_ci_locked(computeInstance)
            gi_handle = self._gi_handle(gpu.uuid, gi)
            start = sum(
                other.slice_count for other in gi.compute_instances.values() if other.id < ci.id
            )
        return FakeComputeInstanceInfo(
            device=FakeDeviceHandle(gpu.uuid),
            gpuInstance=gi_handle,
            id=ci.id,
            profileId=ci.profile,
            placement=c_nvmlComputeInstancePlacement_t(start, ci.slice_count),
        )

    nvmlComputeInstanceGetInfo = nvmlComputeInstanceGetInfo_v2

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        self._check_init()
        with self._lock:
            _gpu, state, gi, ci = self._resolve_ci_locked(computeInstance)
            if self._process_overrides.get(ci.uuid, ci.processes):
                raise NVMLError_InUse()
            state.destroy_compute_instance(gi, ci)
            self._mig_store.save()
        return 0
