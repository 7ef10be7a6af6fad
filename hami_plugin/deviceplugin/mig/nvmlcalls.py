"""How the MIG adapter (`mig.nvml.NvmlMig`) calls NVML: one call at a time, its failure a
`MigNvmlError` carrying NVML's return code, plus the lookups its operations share (a GPU's
handle and memory, a GPU instance profile's info and possible placements, an array of handles
NVML fills).

NVML is the module the adapter is constructed with (pynvml, or the fake NVML in tests),
initialised by the caller.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.protocol.model import MigPlacement

_T = TypeVar("_T")

# NVML return codes (nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13

NO_PERMISSION_HINT = (
    " (MIG management needs CAP_SYS_ADMIN and the MIG capability devices: run the device "
    "plugin privileged, chart value devicePlugin.securityContext)"
)
"""Added to an NVML `Insufficient Permissions` answer: the usual cause is the chart's
unprivileged default on a dynamic-MIG node (docs/device-plugin.md, "Dynamic MIG")."""


class MigNvmlError(NvmlError):
    """A MIG NVML call failed. `code` is NVML's return code (None: refused before NVML was
    asked, e.g. an unsupported profile name or a placement NVML does not offer). A refusal for
    missing permissions says what to change (`NO_PERMISSION_HINT`)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        if code == NVML_ERROR_NO_PERMISSION:
            message += NO_PERMISSION_HINT
        super().__init__(message)
        self.code = code


def text(value: object) -> str:
    """An NVML string (bytes from pynvml's older calls) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCalls:
    """NVML calls with the MIG adapter's error handling, over an NVML module object."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._error_type: type[Exception] = nvml.NVMLError

    def _code(self, error: BaseException) -> int | None:
        value = getattr(error, "value", None)
        return value if isinstance(value, int) else None

    def _error_string(self, code: int) -> str:
        try:
            return text(self._nvml.nvmlErrorString(code))
        except Exception:  # only used to word a message
            return f"NVML error {code}"

    def _call(self, describe: Callable[[str], str], function: Callable[[], _T]) -> _T:
        """Run one NVML call; its NVMLError becomes MigNvmlError(describe(reason), code)."""
        try:
            return function()
        except self._error_type as error:
            raise MigNvmlError(describe(str(error)), self._code(error)) from error

    def _try(self, function: Callable[[], _T]) -> tuple[_T | None, int]:
        """Run one NVML call; (result, NVML_SUCCESS) or (None, its return code)."""
        try:
            return function(), NVML_SUCCESS
        except self._error_type as error:
            code = self._code(error)
            return None, code if code is not None else -1

    def _handle(self, gpu_index: int) -> Any:
        """migmgr.go:161-167 `deviceHandleByIndex`."""
        return self._call(
            lambda reason: f"nvml get handle by index {gpu_index}: {reason}",
            lambda: self._nvml.nvmlDeviceGetHandleByIndex(gpu_index),
        )

    def _total_memory_bytes(self, handle: Any, gpu_index: int) -> int:
        info = self._call(
            lambda reason: f"gpu {gpu_index} get memory info: {reason}",
            lambda: self._nvml.nvmlDeviceGetMemoryInfo(handle),
        )
        return int(info.total)

    def _gi_profile_info(self, handle: Any, constant: int) -> tuple[Any | None, int]:
        """`nvmlDeviceGetGpuInstanceProfileInfo` (pynvml asks the driver's `...InfoV` first; a
        driver without it answers FunctionNotFound, then the v1 call is used)."""
        info, ret = self._try(
            lambda: self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        )
        if ret == NVML_ERROR_FUNCTION_NOT_FOUND:
            info, ret = self._try(
                lambda: self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant, 1)
            )
        return info, ret

    def _placements(self, handle: Any, info: Any) -> list[MigPlacement]:
        """`nvmlDeviceGetGpuInstancePossiblePlacements` for a profile (raises the NVMLError)."""
        count = ctypes.c_uint(0)
        # A NULL array asks for the count (nvmlDeviceGetGpuInstancePossiblePlacements_v2).
        self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, int(info.id), None, ctypes.byref(count)
        )
        capacity = max(int(count.value), 1)
        array = (self._nvml.c_nvmlGpuInstancePlacement_t * capacity)()
        count = ctypes.c_uint(capacity)
        self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, int(info.id), array, ctypes.byref(count)
        )
        return [
            MigPlacement(start=int(array[i].start), size=int(array[i].size))
            for i in range(int(count.value))
        ]

    def _list(
        self, handle_type: Any, capacity: int, fill: Callable[[Any, Any], object]
    ) -> list[Any] | None:
        """Call an NVML "fill this array" function; None when NVML refuses (HAMi skips those)."""
        size = max(capacity, 1)
        array = (handle_type * size)()
        count = ctypes.c_uint(size)
        _result, ret = self._try(lambda: fill(array, ctypes.byref(count)))
        if ret != NVML_SUCCESS:
            return None
        return [array[i] for i in range(int(count.value))]
