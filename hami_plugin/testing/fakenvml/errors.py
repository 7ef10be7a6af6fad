"""NVML's errors as pynvml has them: `NVMLError` with the NVML return code in `.value`, one
subclass per code (`NVMLError_GpuIsLost` ...), pynvml's messages, and `nvmlExceptionClass`."""

# The names copy pynvml's (NVMLError_GpuIsLost ...) so that the fake is a drop-in for the module.
# ruff: noqa: N801, N818

from __future__ import annotations

from typing import ClassVar

NVML_SUCCESS = 0


class NVMLError(Exception):
    """Base NVML error; `.value` is the NVML return code, as in pynvml."""

    _strings: ClassVar[dict[int, str]] = {}

    def __init__(self, value: int, detail: str | None = None) -> None:
        super().__init__(value)
        self.value = value
        self.detail = detail

    def __str__(self) -> str:
        if self.detail:
            return self.detail
        return self._strings.get(self.value, f"NVML Error with code {self.value}")


class _CodedError(NVMLError):
    CODE: ClassVar[int] = 999

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(self.CODE, detail)


class NVMLError_Uninitialized(_CodedError):
    CODE = 1


class NVMLError_InvalidArgument(_CodedError):
    CODE = 2


class NVMLError_NotSupported(_CodedError):
    CODE = 3


class NVMLError_NoPermission(_CodedError):
    CODE = 4


class NVMLError_AlreadyInitialized(_CodedError):
    CODE = 5


class NVMLError_NotFound(_CodedError):
    CODE = 6


class NVMLError_InsufficientSize(_CodedError):
    CODE = 7


class NVMLError_DriverNotLoaded(_CodedError):
    CODE = 9


class NVMLError_Timeout(_CodedError):
    CODE = 10


class NVMLError_LibraryNotFound(_CodedError):
    CODE = 12


class NVMLError_FunctionNotFound(_CodedError):
    CODE = 13


class NVMLError_CorruptedInforom(_CodedError):
    CODE = 14


class NVMLError_GpuIsLost(_CodedError):
    CODE = 15


class NVMLError_ResetRequired(_CodedError):
    CODE = 16


class NVMLError_LibRmVersionMismatch(_CodedError):
    CODE = 18


class NVMLError_InUse(_CodedError):
    CODE = 19


class NVMLError_Memory(_CodedError):
    CODE = 20


class NVMLError_NoData(_CodedError):
    CODE = 21


class NVMLError_InsufficientResources(_CodedError):
    CODE = 23


class NVMLError_ArgumentVersionMismatch(_CodedError):
    CODE = 25


class NVMLError_Deprecated(_CodedError):
    CODE = 26


class NVMLError_NotReady(_CodedError):
    CODE = 27


class NVMLError_GpuNotFound(_CodedError):
    CODE = 28


class NVMLError_InvalidState(_CodedError):
    CODE = 29


class NVMLError_Unknown(_CodedError):
    CODE = 999


ERROR_CLASSES: dict[int, type[_CodedError]] = {
    cls.CODE: cls
    for cls in (
        NVMLError_Uninitialized,
        NVMLError_InvalidArgument,
        NVMLError_NotSupported,
        NVMLError_NoPermission,
        NVMLError_AlreadyInitialized,
        NVMLError_NotFound,
        NVMLError_InsufficientSize,
        NVMLError_DriverNotLoaded,
        NVMLError_Timeout,
        NVMLError_LibraryNotFound,
        NVMLError_FunctionNotFound,
        NVMLError_CorruptedInforom,
        NVMLError_GpuIsLost,
        NVMLError_ResetRequired,
        NVMLError_LibRmVersionMismatch,
        NVMLError_InUse,
        NVMLError_Memory,
        NVMLError_NoData,
        NVMLError_InsufficientResources,
        NVMLError_ArgumentVersionMismatch,
        NVMLError_Deprecated,
        NVMLError_NotReady,
        NVMLError_GpuNotFound,
        NVMLError_InvalidState,
        NVMLError_Unknown,
    )
}
"""NVML return code -> its NVMLError subclass."""
ERROR_CODES = {cls.__name__.removeprefix("NVMLError_"): code for code, cls in ERROR_CLASSES.items()}
"""Error name as the fake GPU file's `init_error` spells it (`LibraryNotFound`) -> NVML code."""
NVMLError._strings = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In Use",
    20: "Insufficient Memory",
    21: "No Data",
    23: "Insufficient Resources",
    25: "Argument Version Mismatch",
    26: "Deprecated",
    27: "Not Ready",
    28: "GPU Not Found",
    29: "Invalid State",
    999: "Unknown Error",
}


def nvmlExceptionClass(code: int) -> type[NVMLError]:
    """The NVMLError subclass for an NVML return code (pynvml raises ValueError if unknown)."""
    try:
        return ERROR_CLASSES[code]
    except KeyError:
        raise ValueError(f"nvmlErrorCode {code} is not valid") from None


def nvml_error(code: int, detail: str | None = None) -> NVMLError:
    """An instance of the NVMLError subclass for an NVML return code (a known one)."""
    return ERROR_CLASSES[code](detail)
