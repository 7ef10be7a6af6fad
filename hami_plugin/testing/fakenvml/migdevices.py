"""The fake NVML's MIG devices: the calls on the devices that compute instances make, with
pynvml's names.

`MigDeviceCalls` is mixed into `FakeNvml` beside `fakenvml.migcalls.MigCalls` (MIG mode and the
instances). A MIG device handle (`nvmlDeviceGetMigDeviceHandleByIndex`) is a
`FakeMigDeviceHandle`, accepted by the device calls that work on MIG devices
(`nvmlDeviceGetUUID`, `nvmlDeviceGetMemoryInfo`, `nvmlDeviceGetName`,
`nvmlDeviceGetComputeRunningProcesses` ...). NVML's answers: NVML_ERROR_NOT_SUPPORTED on a GPU
with MIG disabled, NVML_ERROR_INVALID_ARGUMENT for an index past
`nvmlDeviceGetMaxMigDeviceCount`, NVML_ERROR_NOT_FOUND for an index or handle with no device
behind it, NVML_ERROR_GPU_IS_LOST while the parent GPU is unhealthy.
"""

# pynvml's names (nvmlDeviceGetMigDeviceHandleByIndex, migDevice ...), so the fake is a drop-in.
# ruff: noqa: N803

from __future__ import annotations

import threading
from typing import Any

from hami_plugin.testing.fakenvml import mignames as naming
from hami_plugin.testing.fakenvml.errors import (
    NVMLError_GpuIsLost,
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
from hami_plugin.testing.fakenvml.migtables import MAX_MIG_DEVICES
from hami_plugin.testing.fakenvml.migvalues import FakeMigDeviceHandle, FakeProcessInfo
from hami_plugin.testing.fakenvml.values import FakeDeviceHandle, FakeMemoryInfo

_NOT_AVAILABLE = 0xFFFFFFFF
_MIB = 1024 * 1024


class MigDeviceCalls:
    """pynvml's calls on MIG devices, over `FakeMigStore`; mixed into `FakeNvml`."""

    # Provided by FakeNvml and MigCalls.
    _lock: threading.Lock
    _gpus: dict[str, FakeGpuSpec]
    _mig_store: FakeMigStore
    _process_overrides: dict[str, tuple[int, ...]]

    def _lookup(self, handle: FakeDeviceHandle, *, live: bool) -> FakeGpuSpec:
        raise NotImplementedError

    def _check_init(self) -> None:
        raise NotImplementedError

    def _refresh(self, *, force_read: bool = False) -> None:
        raise NotImplementedError

    def _mig_locked(self, gpu: FakeGpuSpec) -> FakeGpuMig | None:
        raise NotImplementedError

    def _mig_gpu_locked(self, gpu: FakeGpuSpec, *, enabled: bool = True) -> FakeGpuMig:
        raise NotImplementedError

    def _mig_device_locked(
        self, handle: FakeMigDeviceHandle
    ) -> tuple[FakeGpuSpec, FakeGpuMig, FakeGpuInstance, FakeComputeInstance]:
        self._mig_store.sync(self._gpus)
        for state in self._mig_store.gpus():
            for gi, ci in state.mig_devices():
                if ci.uuid == handle.uuid:
                    return self._gpus[state.uuid], state, gi, ci
        raise NVMLError_NotFound()

    def _mig_device(
        self, handle: FakeMigDeviceHandle
    ) -> tuple[FakeGpuSpec, FakeGpuMig, FakeGpuInstance, FakeComputeInstance]:
        self._check_init()
        self._refresh()
        with self._lock:
            found = self._mig_device_locked(handle)
        if not found[0].healthy:
            raise NVMLError_GpuIsLost()
        return found

    # -- test hooks (not part of pynvml) --

    def set_running_processes(self, uuid: str, pids: tuple[int, ...]) -> None:
        """Make `nvmlDeviceGetComputeRunningProcesses` report these pids on a GPU or MIG device
        (by UUID), instead of what the fake GPU file says (for tests)."""
        with self._lock:
            self._process_overrides[uuid] = tuple(pids)

    # -- MIG devices --

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeDeviceHandle) -> int:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_locked(gpu)
        return MAX_MIG_DEVICES if state is not None and state.current else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, device: FakeDeviceHandle, index: int
    ) -> FakeMigDeviceHandle:
        gpu = self._lookup(device, live=True)
        with self._lock:
            state = self._mig_gpu_locked(gpu)
            devices = state.mig_devices()
        if not 0 <= index < MAX_MIG_DEVICES:
            raise NVMLError_InvalidArgument()
        if index >= len(devices):
            raise NVMLError_NotFound()
        return FakeMigDeviceHandle(devices[index][1].uuid)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> int:
        if isinstance(device, FakeMigDeviceHandle):
            self._mig_device(device)
            return 1
        self._lookup(device, live=False)
        return 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        self, migDevice: FakeMigDeviceHandle
    ) -> FakeDeviceHandle:
        if not isinstance(migDevice, FakeMigDeviceHandle):
            raise NVMLError_InvalidArgument()
        gpu, _state, _gi, _ci = self._mig_device(migDevice)
        return FakeDeviceHandle(gpu.uuid)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        if not isinstance(device, FakeMigDeviceHandle):
            self._lookup(device, live=True)
            raise NVMLError_NotSupported()
        return self._mig_device(device)[2].id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        if not isinstance(device, FakeMigDeviceHandle):
            self._lookup(device, live=True)
            raise NVMLError_NotSupported()
        return self._mig_device(device)[3].id

    # -- device calls that also take MIG device handles --

    def _mig_uuid(self, handle: FakeMigDeviceHandle) -> str:
        return self._mig_device(handle)[3].uuid

    def _mig_name(self, handle: FakeMigDeviceHandle) -> str:
        gpu, _state, gi, ci = self._mig_device(handle)
        name = naming.mig_profile_name(
            gi.profile.slice_count,
            ci.slice_count,
            gi.profile.suffix,
            gi.profile.memory_mib,
            (gpu.memory_mib or 0) * _MIB,
        )
        return f"{gpu.name} MIG {name}"

    def _mig_memory(self, handle: FakeMigDeviceHandle) -> FakeMemoryInfo:
        _gpu, _state, gi, _ci = self._mig_device(handle)
        total = gi.profile.memory_mib * _MIB
        return FakeMemoryInfo(total=total, free=total, used=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        """The GPU's own processes and, with MIG enabled, those of its MIG devices (with their
        instance ids); on a MIG device handle, that device's processes."""
        if isinstance(handle, FakeMigDeviceHandle):
            _gpu, _state, gi, ci = self._mig_device(handle)
            with self._lock:
                pids = self._process_overrides.get(ci.uuid, ci.processes)
            return [FakeProcessInfo(pid, None, gi.id, ci.id) for pid in pids]
        gpu = self._lookup(handle, live=True)
        with self._lock:
            own = self._process_overrides.get(gpu.uuid, gpu.processes)
            out = [FakeProcessInfo(pid, None, _NOT_AVAILABLE, _NOT_AVAILABLE) for pid in own]
            state = self._mig_locked(gpu)
            if state is not None and state.current:
                for gi, ci in state.mig_devices():
                    pids = self._process_overrides.get(ci.uuid, ci.processes)
                    out.extend(FakeProcessInfo(pid, None, gi.id, ci.id) for pid in pids)
        return out

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        """No graphics processes run on the fake GPUs."""
        if isinstance(handle, FakeMigDeviceHandle):
            self._mig_device(handle)
        else:
            self._lookup(handle, live=True)
        return []

    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
