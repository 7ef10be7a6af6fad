"""HAMi-core's shared region (the `*.cache` file of a container), parsed as HAMi's monitor does.

Pure: no I/O. `parse_region` takes a whole buffer (bytes, memoryview, mmap);
`parse_region_from` takes a `read(offset, length)` callable and the file size, so the caller can
read only the parts a scrape needs (header, tail, the used process slots) with `os.pread`.

Rules, all from HAMi v2.10 (docs/hami-reference.md 5.1):

* magic 19920718 at offset 0 (`pkg/monitor/nvidia/cudevshr.go:45,284`), a file smaller than the
  12-byte header is refused (cudevshr.go:266);
* layout (cudevshr.go:288-298): v0 when v0 size <= file size < v1 size, whatever the bytes at
  offset 4 say; else v1 when `majorVersion` (offset 4) == 1 and file size >= v1 size; else refused;
* the struct layouts are `pkg/monitor/nvidia/v0/spec.go:26-73` and `v1/spec.go:26-87`;
* devices are `num` (DeviceNum, v1/spec.go:97-99); per device the aggregates sum over the first
  `procnum` process slots whose status != 0 (v1/spec.go:104-173);
* a device's UUID is valid when its first byte is not 0 (v1/spec.go:182-184); the metrics label
  is the first 40 bytes (`cmd/vGPUmonitor/metrics.go:456`), skipped when not UTF-8 (:457);
* v0 has no `lastKernelTime` and reports 0 (v0/spec.go:187-189).

Deliberate differences: HAMi clamps `num` to 16 and `procnum` to 0..1024 and reads on; a region
with either out of range is not what HAMi-core writes (torn, foreign or hostile), so it is
refused here as a whole. A per-device sum beyond 2**64-1 (HAMi wraps it) is refused the same
way. The UUID label is cut at its first NUL byte (HAMi keeps the NULs of a short UUID in the
label).
"""

from __future__ import annotations

import functools
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass

REGION_MAGIC = 19920718
"""`initializedFlag` of an initialised region (cudevshr.go:45)."""
MAX_DEVICES = 16
MAX_PROCESSES = 1024
UUID_SLOT_BYTES = 96
UUID_LABEL_BYTES = 40
"""HAMi labels a container's device with the first 40 bytes of the slot (metrics.go:456)."""
HEADER_BYTES = 12
"""`headerT` {initializedFlag, majorVersion, minorVersion}: smaller files are refused."""

_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class RegionLayout:
    """Byte offsets of one HAMi-core region version (little-endian, 64-bit Linux ABI)."""

    version: int
    size: int
    """sizeof(sharedRegionT): the smallest file of this layout."""
    sm_init_flag_offset: int
    owner_pid_format: str
    owner_pid_offset: int
    num_offset: int
    uuids_offset: int
    limit_offset: int
    sm_limit_offset: int
    procs_offset: int
    slot_size: int
    memory_words: int
    """u64 words per `deviceMemory` in a slot (5 in v0; v1 adds unused[3])."""
    utilization_words: int
    """u64 words per `deviceUtilization` in a slot (3 in v0; v1 adds unused[3])."""
    procnum_offset: int
    utilization_switch_offset: int
    recent_kernel_offset: int
    priority_offset: int
    last_kernel_time_offset: int | None

    @property
    def tail_offset(self) -> int:
        """Start of the fields after the process slots (procnum first)."""
        return self.procnum_offset

    @property
    def tail_bytes(self) -> int:
        end = self.priority_offset + 4
        if self.last_kernel_time_offset is not None:
            end = self.last_kernel_time_offset + 8
        return end - self.procnum_offset


LAYOUT_V0 = RegionLayout(
    version=0,
    size=1197896,
    sm_init_flag_offset=4,
    owner_pid_format="<I",
    owner_pid_offset=8,
    num_offset=48,
    uuids_offset=56,
    limit_offset=1592,
    sm_limit_offset=1720,
    procs_offset=1848,
    slot_size=1168,
    memory_words=5,
    utilization_words=3,
    procnum_offset=1197880,
    utilization_switch_offset=1197884,
    recent_kernel_offset=1197888,
    priority_offset=1197892,
    last_kernel_time_offset=None,
)
LAYOUT_V1 = RegionLayout(
    version=1,
    size=2008952,
    sm_init_flag_offset=12,
    owner_pid_format="<Q",
    owner_pid_offset=16,
    num_offset=56,
    uuids_offset=64,
    limit_offset=1600,
    sm_limit_offset=1728,
    procs_offset=1856,
    slot_size=1960,
    memory_words=8,
    utilization_words=6,
    procnum_offset=2008896,
    utilization_switch_offset=2008900,
    recent_kernel_offset=2008904,
    priority_offset=2008908,
    last_kernel_time_offset=2008912,
)


class RegionError(ValueError):
    """The buffer is not a readable HAMi-core region.

    `reason` is a short stable code (for "log once per file and reason"): `truncated`,
    `bad-magic`, `unknown-layout`, `device-count`, `process-count`, `overflow`.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One of the container's devices (index < `num`), with HAMi's per-device aggregates."""

    index: int
    uuid: str | None
    """The metrics label: first 40 bytes up to the first NUL; None when the slot is not
    initialised (first byte 0) or not UTF-8, which HAMi skips (metrics.go:452-460)."""
    gpu_key: str | None
    """The whole slot as in `Region.gpu_keys` (None when not initialised): what a booking's
    UUID is compared with, so that a label cut at 40 bytes cannot pass for another GPU."""
    memory_limit_bytes: int
    sm_limit: int
    memory_used_bytes: int
    """Sum of used[i].total (DeviceMemoryTotal)."""
    context_bytes: int
    module_bytes: int
    buffer_bytes: int
    offset_bytes: int
    sm_utilization: int
    """Sum of deviceUtil[i].smUtil (DeviceSmUtil)."""


@dataclass(frozen=True, slots=True)
class ProcessSlot:
    """A used process slot (index < procnum, status != 0)."""

    slot: int
    pid: int
    host_pid: int
    status: int


@dataclass(frozen=True, slots=True)
class Region:
    """A parsed region: a snapshot, it does not follow later writes."""

    layout: RegionLayout
    size_bytes: int
    major_version: int
    """0 for v0 (which has no version fields)."""
    minor_version: int
    sm_init_flag: int
    owner_pid: int
    devices: tuple[DeviceUsage, ...]
    gpu_keys: tuple[str, ...]
    """The GPU identities the feedback loop compares: every one of the 16 UUID slots whose first
    byte is not 0 (HAMi walks DeviceMax, not num: feedback.go:83-89), the whole 96-byte slot
    (DeviceUUID, v1/spec.go:186-188) decoded as latin-1 with trailing NULs removed (a bijection
    on fixed-size slots, so equal keys are equal slots)."""
    process_count: int
    """procnum as written (0..1024)."""
    processes: tuple[ProcessSlot, ...]
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int
    """Unix seconds of the last kernel launch; 0 when unknown and always 0 for v0."""

    @property
    def version(self) -> int:
        return self.layout.version


Buffer = bytes | bytearray | memoryview | mmap.mmap
Reader = Callable[[int, int], bytes | memoryview]
"""`read(offset, length)`: at most `length` bytes at `offset` (fewer only at end of file)."""

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<iii")
_VERSION = struct.Struct("<ii")
_TAIL = struct.Struct("<iiii")
"""procnum, utilizationSwitch, recentKernel, priority."""
_PER_DEVICE = struct.Struct(f"<{MAX_DEVICES}Q")


_PIDS = struct.Struct("<ii")


@functools.cache
def _u64s(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}Q")


def choose_layout(size: int, header: bytes | memoryview) -> RegionLayout:
    """HAMi's layout decision from the file size and the 12-byte header (cudevshr.go:266-298).

    Raises RegionError (`truncated`, `bad-magic`, `unknown-layout`).
    """
    if size < HEADER_BYTES or len(header) < HEADER_BYTES:
        raise RegionError(
            "truncated", f"region of {size} bytes is smaller than its {HEADER_BYTES}-byte header"
        )
    magic, major, minor = _HEADER.unpack_from(header, 0)
    if magic != REGION_MAGIC:
        raise RegionError(
            "bad-magic",
            f"initializedFlag is {magic}, not {REGION_MAGIC}: not an initialised HAMi-core region",
        )
    if LAYOUT_V0.size <= size < LAYOUT_V1.size:
        return LAYOUT_V0
    if major == 1 and size >= LAYOUT_V1.size:
        return LAYOUT_V1
    raise RegionError(
        "unknown-layout",
        f"unknown region layout: {size} bytes, version {major}.{minor} "
        f"(v0 needs {LAYOUT_V0.size}..{LAYOUT_V1.size - 1} bytes, "
        f"v1 needs version 1.x and >= {LAYOUT_V1.size} bytes)",
    )


def parse_region(buffer: Buffer) -> Region:
    """Parse a whole region held in memory (its length is the file size).

    Raises RegionError and nothing else for any content.
    """
    with memoryview(buffer) as view, view.cast("B") as flat:

        def read(offset: int, length: int) -> memoryview:
            return flat[offset : offset + length]

        return parse_region_from(read, flat.nbytes)


def _read_exact(read: Reader, offset: int, length: int, what: str) -> bytes | memoryview:
    data = read(offset, length)
    if len(data) != length:
        raise RegionError(
            "truncated",
            f"region ends inside {what}: {len(data)} of {length} bytes at offset {offset}",
        )
    return data


def parse_region_from(read: Reader, size: int) -> Region:
    """Parse a region of `size` bytes through `read(offset, length)`.

    Reads three spans: the header (up to the process slots), the tail (procnum onwards) and the
    first `procnum` slots. A short read (the file shrank) is `truncated`. Raises RegionError.
    """
    header = read(0, min(size, LAYOUT_V1.procs_offset))
    layout = choose_layout(size, header)
    if len(header) < layout.procs_offset:
        raise RegionError(
            "truncated",
            f"region ends inside its header: {len(header)} of {layout.procs_offset} bytes",
        )
    tail = _read_exact(read, layout.tail_offset, layout.tail_bytes, "its tail")

    num = _U64.unpack_from(header, layout.num_offset)[0]
    if num > MAX_DEVICES:
        raise RegionError("device-count", f"num is {num}, more than {MAX_DEVICES} devices")
    procnum, utilization_switch, recent_kernel, priority = _TAIL.unpack_from(tail, 0)
    if not 0 <= procnum <= MAX_PROCESSES:
        raise RegionError(
            "process-count", f"procnum is {procnum}, outside 0..{MAX_PROCESSES} process slots"
        )
    last_kernel_time = 0
    if layout.last_kernel_time_offset is not None:
        last_kernel_time = _I64.unpack_from(
            tail, layout.last_kernel_time_offset - layout.tail_offset
        )[0]

    slots = _read_exact(
        read, layout.procs_offset, procnum * layout.slot_size, f"{procnum} process slots"
    )
    processes, sums = _aggregate(layout, slots, procnum, num)

    limits = _PER_DEVICE.unpack_from(header, layout.limit_offset)
    sm_limits = _PER_DEVICE.unpack_from(header, layout.sm_limit_offset)
    # Only initialised UUID slots (first byte not 0) are copied: usually `num` of the 16.
    uuid_slots: dict[int, bytes] = {}
    for index in range(MAX_DEVICES):
        start = layout.uuids_offset + index * UUID_SLOT_BYTES
        if header[start] != 0:
            uuid_slots[index] = bytes(header[start : start + UUID_SLOT_BYTES])
    devices = tuple(
        DeviceUsage(
            index=index,
            uuid=_uuid_label(uuid_slots.get(index)),
            gpu_key=_gpu_key(uuid_slots.get(index)),
            memory_limit_bytes=limits[index],
            sm_limit=sm_limits[index],
            memory_used_bytes=sums[index][4],
            context_bytes=sums[index][0],
            module_bytes=sums[index][1],
            buffer_bytes=sums[index][2],
            offset_bytes=sums[index][3],
            sm_utilization=sums[index][5],
        )
        for index in range(num)
    )
    major, minor = _VERSION.unpack_from(header, 4) if layout.version == 1 else (0, 0)
    return Region(
        layout=layout,
        size_bytes=size,
        major_version=major,
        minor_version=minor,
        sm_init_flag=_I32.unpack_from(header, layout.sm_init_flag_offset)[0],
        owner_pid=struct.unpack_from(layout.owner_pid_format, header, layout.owner_pid_offset)[0],
        devices=devices,
        gpu_keys=tuple(_gpu_key(raw) or "" for raw in uuid_slots.values()),
        process_count=procnum,
        processes=processes,
        utilization_switch=utilization_switch,
        recent_kernel=recent_kernel,
        priority=priority,
        last_kernel_time=last_kernel_time,
    )


def _aggregate(
    layout: RegionLayout, slots: bytes | memoryview, procnum: int, num: int
) -> tuple[tuple[ProcessSlot, ...], list[list[int]]]:
    """The used slots, and per device [context, module, buffer, offset, total, smUtil] sums.

    A slot is pid, hostpid (i32 each), used[16] (memory_words u64 each), monitorused[16] u64,
    deviceUtil[16] (utilization_words u64 each), status i32; only the words of the first `num`
    devices are unpacked.
    """
    memory_words = layout.memory_words
    util_words = layout.utilization_words
    util_offset = 8 + 8 * MAX_DEVICES * (memory_words + 1)
    status_offset = util_offset + 8 * MAX_DEVICES * util_words
    used_struct = _u64s(num * memory_words)
    util_struct = _u64s(num * util_words)
    sums = [[0, 0, 0, 0, 0, 0] for _ in range(num)]
    processes: list[ProcessSlot] = []
    for slot in range(procnum):
        start = slot * layout.slot_size
        status = _I32.unpack_from(slots, start + status_offset)[0]
        if status == 0:
            continue
        pid, host_pid = _PIDS.unpack_from(slots, start)
        processes.append(ProcessSlot(slot=slot, pid=pid, host_pid=host_pid, status=status))
        used = used_struct.unpack_from(slots, start + 8)
        util = util_struct.unpack_from(slots, start + util_offset)
        for device, acc in enumerate(sums):
            base = device * memory_words
            acc[0] += used[base]
            acc[1] += used[base + 1]
            acc[2] += used[base + 2]
            acc[3] += used[base + 3]
            acc[4] += used[base + 4]
            acc[5] += util[device * util_words + 2]
    for device, acc in enumerate(sums):
        if max(acc, default=0) > _U64_MAX:
            raise RegionError(
                "overflow", f"device {device}: a sum over the process slots exceeds 64 bits"
            )
    return tuple(processes), sums


def _uuid_label(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    label = raw[:UUID_LABEL_BYTES].split(b"\0", 1)[0]
    try:
        return label.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _gpu_key(raw: bytes | None) -> str | None:
    return None if raw is None else raw.rstrip(b"\0").decode("latin-1")
