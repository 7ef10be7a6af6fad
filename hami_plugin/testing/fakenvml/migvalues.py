"""What the fake NVML's MIG calls return, shaped as pynvml's: the ctypes structures with
pynvml's field names (profile infos, placements, the opaque instance handles) and the info and
process records (`fakenvml.migcalls` makes them)."""

# pynvml's names (c_nvmlGpuInstance_t ...), so that the fake is a drop-in.
# ruff: noqa: N801, N816

from __future__ import annotations

from ctypes import POINTER, Structure, c_char, c_uint, c_ulonglong
from dataclasses import dataclass
from typing import Any

from hami_plugin.testing.fakenvml.values import FakeDeviceHandle

__all__ = [
    "NVML_DEVICE_NAME_V2_BUFFER_SIZE",
    "FakeComputeInstanceInfo",
    "FakeGpuInstanceInfo",
    "FakeMigDeviceHandle",
    "FakeProcessInfo",
    "c_nvmlComputeInstancePlacement_t",
    "c_nvmlComputeInstanceProfileInfo_t",
    "c_nvmlComputeInstanceProfileInfo_v2_t",
    "c_nvmlComputeInstance_t",
    "c_nvmlGpuInstancePlacement_t",
    "c_nvmlGpuInstanceProfileInfo_t",
    "c_nvmlGpuInstanceProfileInfo_v2_t",
    "c_nvmlGpuInstance_t",
    "nvmlComputeInstanceProfileInfo_v2",
    "nvmlGpuInstanceProfileInfo_v2",
    "struct_c_nvmlComputeInstance_t",
    "struct_c_nvmlGpuInstance_t",
]

NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
nvmlGpuInstanceProfileInfo_v2 = 0x02000098
nvmlComputeInstanceProfileInfo_v2 = 0x02000088


class c_nvmlGpuInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlGpuInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


class c_nvmlGpuInstanceProfileInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class c_nvmlComputeInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlComputeInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
    ]


class c_nvmlComputeInstanceProfileInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class struct_c_nvmlGpuInstance_t(Structure):
    """Opaque in pynvml; here it carries the fake's token for the instance."""

    _fields_ = [("token", c_ulonglong)]


class struct_c_nvmlComputeInstance_t(Structure):
    _fields_ = [("token", c_ulonglong)]


c_nvmlGpuInstance_t = POINTER(struct_c_nvmlGpuInstance_t)
c_nvmlComputeInstance_t = POINTER(struct_c_nvmlComputeInstance_t)


@dataclass(frozen=True, slots=True)
class FakeMigDeviceHandle:
    """What `nvmlDeviceGetMigDeviceHandleByIndex` returns: a MIG device, by its UUID."""

    uuid: str


@dataclass(frozen=True, slots=True)
class FakeGpuInstanceInfo:
    """Shaped like pynvml's c_nvmlGpuInstanceInfo_t."""

    device: FakeDeviceHandle
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


@dataclass(frozen=True, slots=True)
class FakeComputeInstanceInfo:
    """Shaped like pynvml's c_nvmlComputeInstanceInfo_t."""

    device: FakeDeviceHandle
    gpuInstance: Any
    id: int
    profileId: int
    placement: c_nvmlComputeInstancePlacement_t


@dataclass(frozen=True, slots=True)
class FakeProcessInfo:
    """Shaped like the objects pynvml's nvmlDeviceGetComputeRunningProcesses returns."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int
    computeInstanceId: int
