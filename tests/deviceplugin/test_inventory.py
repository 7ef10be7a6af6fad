"""Physical GPUs -> kubelet vGPU devices and node register devices."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.deviceplugin.inventory import (
    InventoryConfig,
    PhysicalGpu,
    VgpuDevice,
    build_register_devices,
    build_vgpu_devices,
    physical_uuid_of,
    vgpu_device_ids,
)
from hami_plugin.protocol.model import GpuDevice

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
UUID_MIG = "GPU-9b45d1ae-4e70-2174-49af-23cac89cb67a"

A100 = PhysicalGpu(UUID_A, 0, "NVIDIA A100-SXM4-80GB", 81920, 1, False, "00000000:10:00.0", 0)
T4 = PhysicalGpu(UUID_B, 1, "Tesla T4", 15360, -1, False, "00000000:3B:00.0", 1)
MIG = PhysicalGpu(UUID_MIG, 2, "NVIDIA A30", 24576, 0, True, "00000000:AF:00.0", 2)
SETTINGS = InventoryConfig(split_count=3)


def test_vgpu_device_ids_are_hamis_form() -> None:
    assert vgpu_device_ids(UUID_A, 3) == [f"{UUID_A}-0", f"{UUID_A}-1", f"{UUID_A}-2"]
    assert vgpu_device_ids(UUID_A, 1) == [f"{UUID_A}-0"]


@pytest.mark.parametrize(
    ("device_id", "uuid"),
    [
        (f"{UUID_A}-3", UUID_A),
        (f"{UUID_A}-12", UUID_A),
        (UUID_A, UUID_A),
        (f"{UUID_A}::4", UUID_A),
        (f"MIG-{UUID_A}", f"MIG-{UUID_A}"),
        (f"MIG-{UUID_A}/1/0", f"MIG-{UUID_A}/1/0"),
        (f"{UUID_A}-x", f"{UUID_A}-x"),
        ("GPU-short-1", "GPU-short-1"),
    ],
)
def test_physical_uuid_of(device_id: str, uuid: str) -> None:
    assert physical_uuid_of(device_id) == uuid


@given(st.uuids(), st.integers(min_value=1, max_value=64))
def test_physical_uuid_of_inverts_vgpu_device_ids(raw: object, split_count: int) -> None:
    gpu_uuid = f"GPU-{raw}"
    assert {physical_uuid_of(i) for i in vgpu_device_ids(gpu_uuid, split_count)} == {gpu_uuid}


def test_build_vgpu_devices_marks_every_slot_of_an_unhealthy_gpu() -> None:
    devices = build_vgpu_devices([A100, T4], {UUID_B}, SETTINGS)
    assert devices == [
        VgpuDevice(f"{UUID_A}-0", UUID_A, True, None),
        VgpuDevice(f"{UUID_A}-1", UUID_A, True, None),
        VgpuDevice(f"{UUID_A}-2", UUID_A, True, None),
        VgpuDevice(f"{UUID_B}-0", UUID_B, False, None),
        VgpuDevice(f"{UUID_B}-1", UUID_B, False, None),
        VgpuDevice(f"{UUID_B}-2", UUID_B, False, None),
    ]


def test_numa_attached_only_when_enabled_and_known() -> None:
    settings = replace(SETTINGS, enable_numa_topology=True, split_count=1)
    assert [d.numa_node for d in build_vgpu_devices([A100, T4], (), settings)] == [1, None]


def test_mig_and_filtered_gpus_are_not_advertised() -> None:
    by_uuid = replace(SETTINGS, filter_uuids=frozenset({UUID_A}))
    assert {d.gpu_uuid for d in build_vgpu_devices([A100, T4, MIG], (), by_uuid)} == {UUID_B}
    by_index = replace(SETTINGS, filter_indexes=frozenset({1}))
    assert {d.gpu_uuid for d in build_vgpu_devices([A100, T4, MIG], (), by_index)} == {UUID_A}
    assert build_register_devices([MIG], (), SETTINGS) == []


def test_build_register_devices_scales_as_hami() -> None:
    settings = replace(SETTINGS, split_count=10, memory_scaling=1.5, cores_scaling=0.29)
    devices = build_register_devices([A100, T4], {UUID_B}, settings)
    assert devices == [
        GpuDevice(
            uuid=UUID_A,
            index=0,
            split_count=10,
            memory_mib=122880,
            cores_percent=28,  # int32(0.29 * 100) truncates, as in HAMi
            type="NVIDIA A100-SXM4-80GB",
            numa_node=1,
            mode="hami-core",
            healthy=True,
        ),
        GpuDevice(
            uuid=UUID_B,
            index=1,
            split_count=10,
            memory_mib=23040,
            cores_percent=28,
            type="NVIDIA-Tesla T4",
            numa_node=0,  # unknown NUMA registers as 0
            mode="hami-core",
            healthy=False,
        ),
    ]


def test_memory_scaling_truncates() -> None:
    settings = replace(SETTINGS, memory_scaling=0.3333)
    (device,) = build_register_devices([replace(T4, memory_mib=100)], (), settings)
    assert device.memory_mib == 33
    assert device.cores_percent == 100


def test_without_hami_core_every_gpu_registers_unhealthy() -> None:
    ready = build_register_devices([A100, T4], {UUID_B}, SETTINGS)
    missing = build_register_devices([A100, T4], {UUID_B}, SETTINGS, hamicore_ready=False)
    assert [d.healthy for d in ready] == [True, False]
    assert [d.healthy for d in missing] == [False, False]
    # only the health differs: the scheduler still sees the GPUs it may not place on
    assert [replace(d, healthy=True) for d in missing] == [replace(d, healthy=True) for d in ready]
