"""What the fake NVML's calls return, shaped like pynvml's: device handles, memory, utilisation,
PCI info, event sets and event data, and the constants they carry."""

# The names copy pynvml's (nvmlEventTypeXidCriticalError, busId ...) so that the fake is a drop-in
# for the module.
# ruff: noqa: N816

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0
SUPPORTED_EVENTS = (
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError
)
"""The event types every fake GPU can register (`nvmlDeviceGetSupportedEventTypes`)."""
NOT_APPLICABLE = 0xFFFFFFFF
"""NVML's NVML_VALUE_NOT_AVAILABLE: the instance ids of an event on a GPU without MIG."""


@dataclass(frozen=True, slots=True)
class FakeDeviceHandle:
    """What `nvmlDeviceGetHandleBy*` returns: the GPU is looked up by UUID on every call."""

    uuid: str


@dataclass(frozen=True, slots=True)
class FakeMemoryInfo:
    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class FakeUtilization:
    """Shaped like pynvml's c_nvmlUtilization_t (percent of the last sample period)."""

    gpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class FakePciInfo:
    busId: str
    busIdLegacy: str


@dataclass(slots=True)
class FakeEventData:
    """Shaped like pynvml's c_nvmlEventData_t."""

    device: FakeDeviceHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = NOT_APPLICABLE
    computeInstanceId: int = NOT_APPLICABLE


@dataclass(slots=True)
class FakeEventSet:
    registered: dict[str, int] = field(default_factory=dict)
    queue: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False
