"""The region reader against files written from HAMi-core's C structs (region_writer.py)."""

from __future__ import annotations

import ctypes
import mmap
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_plugin.deviceplugin.monitor.region import (
    LAYOUT_V0,
    LAYOUT_V1,
    REGION_MAGIC,
    Region,
    RegionError,
    RegionLayout,
    parse_region,
    parse_region_from,
)
from tests.deviceplugin.monitor import region_writer as w
from tests.deviceplugin.monitor.region_writer import DeviceMemory, Proc, RegionSpec, region_bytes

UUID_A = "GPU-0b7e3d4c-1111-2222-3333-444455556666"
UUID_B = "GPU-9f00aa11-7777-8888-9999-aaaabbbbcccc"


def two_gpu_spec(version: int) -> RegionSpec:
    """Two devices, four slots: slot 1 unused (status 0), slot 3 beyond procnum."""
    return RegionSpec(
        version=version,
        uuids=[UUID_A, UUID_B],
        limits=[3000 << 20, 5000 << 20],
        sm_limits=[50, 30],
        procs=[
            Proc(
                pid=7,
                hostpid=7007,
                used=[DeviceMemory(10, 20, 30, 40, 100), DeviceMemory(1, 2, 3, 4, 10)],
                sm_util=[25, 5],
            ),
            Proc(pid=8, status=0, used=[DeviceMemory(total=1 << 40)], sm_util=[99]),
            Proc(pid=9, hostpid=9009, status=2, used=[DeviceMemory(5, 6, 7, 8, 50)], sm_util=[10]),
            Proc(pid=10, used=[DeviceMemory(total=1 << 40)], sm_util=[99]),
        ],
        procnum=3,
        utilization_switch=1,
        recent_kernel=2,
        priority=0,
        last_kernel_time=1_700_000_000,
        owner_pid=4242,
        major_version=1,
        minor_version=3,
    )


def test_writer_layout_is_the_reference_layout() -> None:
    """The C-ABI layout (ctypes) and docs/hami-reference.md 5.1 agree on every offset."""
    for name, offsets in w.REFERENCE_OFFSETS.items():
        for version, offset in enumerate(offsets):
            if offset is not None:
                assert w.field_offset(version, name) == offset, (version, name)
    assert ctypes.sizeof(w.SharedRegionV0) == w.REFERENCE_SIZES["region"][0]
    assert ctypes.sizeof(w.SharedRegionV1) == w.REFERENCE_SIZES["region"][1]
    assert ctypes.sizeof(w.ProcSlotV0) == w.REFERENCE_SIZES["slot"][0]
    assert ctypes.sizeof(w.ProcSlotV1) == w.REFERENCE_SIZES["slot"][1]


@pytest.mark.parametrize(("version", "layout"), [(0, LAYOUT_V0), (1, LAYOUT_V1)])
def test_reader_layout_is_the_c_layout(version: int, layout: RegionLayout) -> None:
    assert layout.size == w.REFERENCE_SIZES["region"][version]
    assert layout.slot_size == w.REFERENCE_SIZES["slot"][version]
    for name, attribute in (
        ("sm_init_flag", "sm_init_flag_offset"),
        ("owner_pid", "owner_pid_offset"),
        ("num", "num_offset"),
        ("uuids", "uuids_offset"),
        ("limit", "limit_offset"),
        ("sm_limit", "sm_limit_offset"),
        ("procs", "procs_offset"),
        ("proc_num", "procnum_offset"),
        ("utilization_switch", "utilization_switch_offset"),
        ("recent_kernel", "recent_kernel_offset"),
        ("priority", "priority_offset"),
    ):
        assert getattr(layout, attribute) == w.field_offset(version, name), name
    if version == 1:
        assert layout.last_kernel_time_offset == w.field_offset(1, "last_kernel_time")


def test_v1_region_all_fields() -> None:
    region = parse_region(region_bytes(two_gpu_spec(1)))
    assert region.version == 1
    assert (region.major_version, region.minor_version) == (1, 3)
    assert region.size_bytes == LAYOUT_V1.size
    assert region.owner_pid == 4242
    assert region.sm_init_flag == 1
    assert region.process_count == 3
    # slot 1 has status 0 and slot 3 lies beyond procnum: neither counts (v1/spec.go:104-117)
    assert [(p.slot, p.pid, p.host_pid, p.status) for p in region.processes] == [
        (0, 7, 7007, 1),
        (2, 9, 9009, 2),
    ]
    first, second = region.devices
    assert first.index == 0
    assert first.uuid == UUID_A
    assert first.memory_limit_bytes == 3000 << 20
    assert first.sm_limit == 50
    assert first.memory_used_bytes == 150
    assert (first.context_bytes, first.module_bytes, first.buffer_bytes) == (15, 26, 37)
    assert first.offset_bytes == 48
    assert first.sm_utilization == 35
    assert second.uuid == UUID_B
    assert (second.memory_used_bytes, second.sm_utilization) == (10, 5)
    assert second.memory_limit_bytes == 5000 << 20
    assert (region.priority, region.recent_kernel, region.utilization_switch) == (0, 2, 1)
    assert region.last_kernel_time == 1_700_000_000
    assert region.gpu_keys == (UUID_A, UUID_B)


def test_v0_region_same_values_no_last_kernel_time() -> None:
    spec = two_gpu_spec(0)
    region = parse_region(region_bytes(spec))
    assert region.version == 0
    assert (region.major_version, region.minor_version) == (0, 0)
    assert region.size_bytes == LAYOUT_V0.size
    assert [d.memory_used_bytes for d in region.devices] == [150, 10]
    assert [d.sm_utilization for d in region.devices] == [35, 5]
    assert region.devices[0].context_bytes == 15
    assert region.last_kernel_time == 0  # v0/spec.go:187-189
    assert (region.priority, region.recent_kernel, region.utilization_switch) == (0, 2, 1)


def test_v0_is_chosen_by_size_whatever_offset_4_says() -> None:
    # offset 4 of a v0 region is smInitFlag; 1 there must not make it v1 (cudevshr.go:288-291)
    region = parse_region(region_bytes(RegionSpec(version=0, sm_init_flag=1)))
    assert region.version == 0


def test_v1_needs_major_version_1() -> None:
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec(version=1, major_version=2, minor_version=5)))
    assert error.value.reason == "unknown-layout"
    assert "version 2.5" in str(error.value)


def test_larger_v1_file_is_v1() -> None:
    region = parse_region(region_bytes(RegionSpec(version=1, extra_bytes=4096)))
    assert region.version == 1
    assert region.size_bytes == LAYOUT_V1.size + 4096


def test_size_between_header_and_v0_is_unknown() -> None:
    data = region_bytes(RegionSpec(version=0))[: LAYOUT_V0.size - 1]
    with pytest.raises(RegionError) as error:
        parse_region(data)
    assert error.value.reason == "unknown-layout"


def test_v1_cut_into_the_v0_range_reads_as_v0_like_hami() -> None:
    data = region_bytes(RegionSpec(version=1))[: LAYOUT_V0.size]
    assert parse_region(data).version == 0


@pytest.mark.parametrize("size", [0, 1, 11])
def test_shorter_than_header(size: int) -> None:
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec())[:size])
    assert error.value.reason == "truncated"


def test_bad_magic() -> None:
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec(magic=0)))
    assert error.value.reason == "bad-magic"
    assert str(REGION_MAGIC) in str(error.value)


@pytest.mark.parametrize("num", [17, 1 << 63])
def test_device_count_beyond_16(num: int) -> None:
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec(num=num)))
    assert error.value.reason == "device-count"


@pytest.mark.parametrize("procnum", [-1, 1025, -(1 << 31)])
def test_process_count_out_of_range(procnum: int) -> None:
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec(procnum=procnum)))
    assert error.value.reason == "process-count"


def test_all_1024_slots_are_read() -> None:
    procs = [Proc(used=[DeviceMemory(total=1)], sm_util=[1])] * 1024
    region = parse_region(region_bytes(RegionSpec(uuids=[UUID_A], procs=procs)))
    assert region.devices[0].memory_used_bytes == 1024
    assert len(region.processes) == 1024


def test_sum_beyond_64_bits() -> None:
    big = (1 << 64) - 1
    procs = [Proc(used=[DeviceMemory(total=big)]), Proc(used=[DeviceMemory(total=1)])]
    with pytest.raises(RegionError) as error:
        parse_region(region_bytes(RegionSpec(uuids=[UUID_A], procs=procs)))
    assert error.value.reason == "overflow"


def test_uuid_labels() -> None:
    mig = "MIG-GPU-0b7e3d4c-1111-2222-3333-444455556666/1/0"
    spec = RegionSpec(uuids=[mig, "GPU-short", b"\x00GPU-hidden", b"GPU-\xff\xfe", UUID_A])
    devices = parse_region(region_bytes(spec)).devices
    assert devices[0].uuid == mig[:40]  # metrics.go:456
    assert devices[1].uuid == "GPU-short"  # cut at the NUL
    assert devices[2].uuid is None  # first byte 0: not initialised (v1/spec.go:182-184)
    assert devices[3].uuid is None  # not UTF-8 (metrics.go:457)
    assert devices[4].uuid == UUID_A


def test_gpu_keys_walk_all_16_slots() -> None:
    # feedback.go walks DeviceMax (16) slots, not num, and compares the whole 96 bytes
    spec = RegionSpec(uuids=[UUID_A, "", UUID_B], num=1)
    region = parse_region(region_bytes(spec))
    assert len(region.devices) == 1
    assert region.gpu_keys == (UUID_A, UUID_B)
    long_a = (UUID_A + "X" * 50).encode()
    keys = parse_region(region_bytes(RegionSpec(uuids=[long_a, UUID_A]))).gpu_keys
    assert keys[0] != keys[1]


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "mmap"])
def test_buffer_kinds(kind: str, tmp_path: Path) -> None:
    data = region_bytes(two_gpu_spec(1))
    if kind == "mmap":
        path = w.write_region(tmp_path / "r.cache", two_gpu_spec(1))
        with path.open("rb") as file:
            mapping = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
        region = parse_region(mapping)
        mapping.close()  # no buffer export left behind
    else:
        buffer = {"bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data)}
        region = parse_region(buffer[kind])  # type: ignore[arg-type]
    assert region.devices[0].memory_used_bytes == 150


def test_reader_short_read_is_truncated() -> None:
    data = region_bytes(two_gpu_spec(1))

    def shrinking_read(offset: int, length: int) -> bytes:
        # the file shrank to the header after its size was taken
        return data[offset : min(offset + length, LAYOUT_V1.procs_offset)]

    with pytest.raises(RegionError) as error:
        parse_region_from(shrinking_read, len(data))
    assert error.value.reason == "truncated"


# --- hostile input: only RegionError, never anything else --------------------------------------

VALID = {version: region_bytes(two_gpu_spec(version)) for version in (0, 1)}
INTERESTING_OFFSETS = [
    0,
    4,
    LAYOUT_V0.num_offset,
    LAYOUT_V1.num_offset,
    LAYOUT_V1.uuids_offset,
    LAYOUT_V1.procs_offset,
    LAYOUT_V0.procnum_offset,
    LAYOUT_V1.procnum_offset,
    LAYOUT_V1.recent_kernel_offset,
    LAYOUT_V1.last_kernel_time_offset or 0,
]


def parse_or_error(data: bytes | bytearray) -> Region | None:
    try:
        return parse_region(data)
    except RegionError as error:
        assert error.reason in {
            "truncated",
            "bad-magic",
            "unknown-layout",
            "device-count",
            "process-count",
            "overflow",
        }
        assert str(error)
        return None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_random_bytes(data: bytes, with_magic: bool) -> None:
    if with_magic:
        data = struct.pack("<i", REGION_MAGIC) + data
    parse_or_error(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([0, 1]), st.integers(min_value=0, max_value=LAYOUT_V1.size + 16))
def test_truncations(version: int, length: int) -> None:
    region = parse_or_error(VALID[version][:length])
    if length < LAYOUT_V0.size:
        assert region is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([0, 1]),
    st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(INTERESTING_OFFSETS),
                st.integers(min_value=0, max_value=LAYOUT_V1.size - 1),
                st.integers(min_value=0, max_value=LAYOUT_V1.procs_offset + 3 * 1960),
            ),
            st.integers(min_value=0, max_value=31),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_bit_flips(version: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID[version])
    for offset, bit in flips:
        position = offset + bit // 8
        if position < len(data):
            data[position] ^= 1 << (bit % 8)
    parse_or_error(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([0, 1]),
    st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.lists(st.integers(min_value=0, max_value=(1 << 64) - 1), max_size=4),
)
def test_hostile_counts_and_sums(version: int, procnum: int, num: int, totals: list[int]) -> None:
    data = bytearray(VALID[version])
    layout = LAYOUT_V0 if version == 0 else LAYOUT_V1
    struct.pack_into("<i", data, layout.procnum_offset, procnum)
    struct.pack_into("<Q", data, layout.num_offset, num)
    for slot, total in enumerate(totals):
        memory_total = layout.procs_offset + slot * layout.slot_size + 8 + 4 * 8
        struct.pack_into("<Q", data, memory_total, total)
    region = parse_or_error(data)
    if region is not None:
        assert 0 <= region.process_count <= 1024
        assert len(region.devices) <= 16
        assert all(0 <= d.memory_used_bytes < 1 << 64 for d in region.devices)
