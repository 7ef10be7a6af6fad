"""Writes HAMi-core shared-region files for tests, v0 and v1, independently of the reader.

The layouts are ctypes mirrors of HAMi-core's C structs (`multiprocess_memory_limit.h`:
`shared_region_t`, `shrreg_proc_slot_t`, `device_memory_t`, `device_util_t`; `sem_t` is
glibc's 32-byte union aligned to 8), with the field types HAMi v2.10 reads them as
(`pkg/monitor/nvidia/v0/spec.go:26-73`, `v1/spec.go:26-87`). ctypes applies the C ABI's
alignment, so the offsets come from the compiler rules, not from
hami_plugin.deviceplugin.monitor.region;
`REFERENCE_OFFSETS` holds the numbers of docs/hami-reference.md 5.1 and test_region_writer checks
both agree.

Files are written sparse: the header, the used process slots and the tail are written at their
offsets, the rest stays a hole, so 1,000 region files cost little disk.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = 19920718
DEVICES = 16
PROCESSES = 1024

c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64


class SemT(ctypes.Union):
    """glibc x86_64 `sem_t`: `char __size[32]; long int __align;`."""

    _fields_ = (("size", ctypes.c_char * 32), ("align", ctypes.c_long))


class DeviceMemoryV0(ctypes.Structure):
    _fields_ = (
        ("context_size", c_uint64),
        ("module_size", c_uint64),
        ("buffer_size", c_uint64),
        ("offset", c_uint64),
        ("total", c_uint64),
    )


class DeviceMemoryV1(ctypes.Structure):
    _fields_ = (*DeviceMemoryV0._fields_, ("unused", c_uint64 * 3))


class DeviceUtilV0(ctypes.Structure):
    _fields_ = (("dec_util", c_uint64), ("enc_util", c_uint64), ("sm_util", c_uint64))


class DeviceUtilV1(ctypes.Structure):
    _fields_ = (*DeviceUtilV0._fields_, ("unused", c_uint64 * 3))


class ProcSlotV0(ctypes.Structure):
    _fields_ = (
        ("pid", c_int32),
        ("hostpid", c_int32),
        ("used", DeviceMemoryV0 * DEVICES),
        ("monitorused", c_uint64 * DEVICES),
        ("device_util", DeviceUtilV0 * DEVICES),
        ("status", c_int32),
    )


class ProcSlotV1(ctypes.Structure):
    _fields_ = (
        ("pid", c_int32),
        ("hostpid", c_int32),
        ("used", DeviceMemoryV1 * DEVICES),
        ("monitorused", c_uint64 * DEVICES),
        ("device_util", DeviceUtilV1 * DEVICES),
        ("status", c_int32),
        ("unused", c_uint64 * 3),
    )


class SharedRegionV0(ctypes.Structure):
    _fields_ = (
        ("initialized_flag", c_int32),
        ("sm_init_flag", c_int32),
        ("owner_pid", c_uint32),
        ("sem", SemT),
        ("num", c_uint64),
        ("uuids", (ctypes.c_char * 96) * DEVICES),
        ("limit", c_uint64 * DEVICES),
        ("sm_limit", c_uint64 * DEVICES),
        ("procs", ProcSlotV0 * PROCESSES),
        ("proc_num", c_int32),
        ("utilization_switch", c_int32),
        ("recent_kernel", c_int32),
        ("priority", c_int32),
    )


class SharedRegionV1(ctypes.Structure):
    _fields_ = (
        ("initialized_flag", c_int32),
        ("major_version", c_int32),
        ("minor_version", c_int32),
        ("sm_init_flag", c_int32),
        ("owner_pid", ctypes.c_size_t),
        ("sem", SemT),
        ("num", c_uint64),
        ("uuids", (ctypes.c_char * 96) * DEVICES),
        ("limit", c_uint64 * DEVICES),
        ("sm_limit", c_uint64 * DEVICES),
        ("procs", ProcSlotV1 * PROCESSES),
        ("proc_num", c_int32),
        ("utilization_switch", c_int32),
        ("recent_kernel", c_int32),
        ("priority", c_int32),
        ("last_kernel_time", c_int64),
        ("unused", c_uint64 * 4),
    )


REFERENCE_OFFSETS = {
    # docs/hami-reference.md 5.1, field -> (v0 offset, v1 offset); None: not in that version.
    "initialized_flag": (0, 0),
    "major_version": (None, 4),
    "minor_version": (None, 8),
    "sm_init_flag": (4, 12),
    "owner_pid": (8, 16),
    "num": (48, 56),
    "uuids": (56, 64),
    "limit": (1592, 1600),
    "sm_limit": (1720, 1728),
    "procs": (1848, 1856),
    "proc_num": (1197880, 2008896),
    "utilization_switch": (1197884, 2008900),
    "recent_kernel": (1197888, 2008904),
    "priority": (1197892, 2008908),
    "last_kernel_time": (None, 2008912),
}
REFERENCE_SIZES = {"region": (1197896, 2008952), "slot": (1168, 1960)}


@dataclass
class DeviceMemory:
    context: int = 0
    module: int = 0
    buffer: int = 0
    offset: int = 0
    total: int = 0


@dataclass
class Proc:
    """One process slot; `used[i]` and `sm_util[i]` are for device i."""

    pid: int = 1
    hostpid: int = 1000
    status: int = 1
    used: Sequence[DeviceMemory] = ()
    sm_util: Sequence[int] = ()
    dec_util: Sequence[int] = ()
    monitorused: Sequence[int] = ()


@dataclass
class RegionSpec:
    """What to write. Out-of-range values are written as given (for hostile files)."""

    version: int = 1
    uuids: Sequence[bytes | str] = ()
    limits: Sequence[int] = ()
    sm_limits: Sequence[int] = ()
    procs: Sequence[Proc] = ()
    num: int | None = None
    """Default: len(uuids)."""
    procnum: int | None = None
    """Default: len(procs)."""
    magic: int = MAGIC
    major_version: int = 1
    minor_version: int = 0
    sm_init_flag: int = 1
    owner_pid: int = 4242
    utilization_switch: int = 0
    recent_kernel: int = 0
    priority: int = 1
    last_kernel_time: int = 0
    extra_bytes: int = 0
    """Appended zero bytes (the file is larger than the struct)."""
    sem: bytes = field(default=b"\x01" * 16)


def region_struct(spec: RegionSpec) -> SharedRegionV0 | SharedRegionV1:
    """The filled C struct."""
    region: SharedRegionV0 | SharedRegionV1
    if spec.version == 0:
        region = SharedRegionV0()
    else:
        region = SharedRegionV1()
        region.major_version = spec.major_version
        region.minor_version = spec.minor_version
        region.last_kernel_time = spec.last_kernel_time
    region.initialized_flag = spec.magic
    region.sm_init_flag = spec.sm_init_flag
    region.owner_pid = spec.owner_pid
    region.sem.size = spec.sem
    region.num = len(spec.uuids) if spec.num is None else spec.num
    for index, uuid in enumerate(spec.uuids):
        raw = uuid.encode() if isinstance(uuid, str) else uuid
        ctypes.memmove(ctypes.addressof(region.uuids[index]), raw, min(len(raw), 96))
    for index, limit in enumerate(spec.limits):
        region.limit[index] = limit
    for index, sm_limit in enumerate(spec.sm_limits):
        region.sm_limit[index] = sm_limit
    for slot, proc in enumerate(spec.procs):
        target = region.procs[slot]
        target.pid = proc.pid
        target.hostpid = proc.hostpid
        target.status = proc.status
        for device, memory in enumerate(proc.used):
            used = target.used[device]
            used.context_size = memory.context
            used.module_size = memory.module
            used.buffer_size = memory.buffer
            used.offset = memory.offset
            used.total = memory.total
        for device, value in enumerate(proc.sm_util):
            target.device_util[device].sm_util = value
        for device, value in enumerate(proc.dec_util):
            target.device_util[device].dec_util = value
        for device, value in enumerate(proc.monitorused):
            target.monitorused[device] = value
    region.proc_num = len(spec.procs) if spec.procnum is None else spec.procnum
    region.utilization_switch = spec.utilization_switch
    region.recent_kernel = spec.recent_kernel
    region.priority = spec.priority
    return region


def region_bytes(spec: RegionSpec) -> bytes:
    """The whole file's bytes."""
    return bytes(region_struct(spec)) + bytes(spec.extra_bytes)


def write_region(path: str | os.PathLike[str], spec: RegionSpec) -> Path:
    """Write the region file sparsely (see the module docstring); returns the path."""
    region = region_struct(spec)
    struct_type = type(region)
    slot_size = ctypes.sizeof(ProcSlotV0 if spec.version == 0 else ProcSlotV1)
    procs_offset = struct_type.procs.offset
    tail_offset = struct_type.proc_num.offset
    size = ctypes.sizeof(region)
    base = ctypes.addressof(region)
    used_slots = min(len(spec.procs), PROCESSES)
    spans = (
        (0, procs_offset),
        (procs_offset, used_slots * slot_size),
        (tail_offset, size - tail_offset),
    )
    target = Path(path)
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size + spec.extra_bytes)
        for offset, length in spans:
            if length:
                os.pwrite(fd, ctypes.string_at(base + offset, length), offset)
    finally:
        os.close(fd)
    return target


def field_offset(version: int, name: str) -> int:
    """Offset of a top-level field by the C layout."""
    struct_type = SharedRegionV0 if version == 0 else SharedRegionV1
    return int(getattr(struct_type, name).offset)
