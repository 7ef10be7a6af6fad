"""The fake NVML's MIG model: the real profile tables and placements per GPU model, pynvml's
call shapes (ctypes structures and handle arrays), NVML's error codes, the fake GPU file's
`mig_devices`, and the state file that carries instances across a restart."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_plugin.testing.fakenvml import errors, migvalues
from hami_plugin.testing.fakenvml.gpufile import FakeGpuFileError, parse_fake_gpus
from hami_plugin.testing.fakenvml.migstate import derived_mig_uuid, state_path
from hami_plugin.testing.fakenvml.migtables import model_profiles, profile_display_name
from hami_plugin.testing.fakenvml.nvml import FakeNvml

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
MIG_UUID = "MIG-5c8e2a3b-1d4f-4e6a-9b7c-2f1e0d3c4b5a"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    return path


def a100(name: str = "NVIDIA A100-SXM4-40GB", mig: bool = True, extra: str = "") -> str:
    return (
        f"gpus:\n  - uuid: {UUID_A}\n    name: {name}\n    mig: {'true' if mig else 'false'}\n"
        + extra
    )


def start(path: Path) -> FakeNvml:
    module = FakeNvml(str(path))
    module.nvmlInit()
    return module


def placements(nvml: FakeNvml, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    array = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(array[i].start, array[i].size) for i in range(count.value)]


def create_gi(nvml: FakeNvml, handle: Any, constant: int, start_slice: int) -> Any:
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
    wanted = nvml.c_nvmlGpuInstancePlacement_t(start_slice, placements(nvml, handle, info.id)[0][1])
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(wanted))


def full_ci(nvml: FakeNvml, gi: Any, constant: int) -> Any:
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, constant, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


# --- the tables -------------------------------------------------------------------------------

EXPECTED_TABLES = {
    # model: [(name, profile id, slices, memory MiB, SMs, instances, placements)]
    "NVIDIA A100-SXM4-40GB": [
        ("1g.5gb", 19, 1, 4864, 14, 7, [(s, 1) for s in range(7)]),
        ("1g.5gb+me", 20, 1, 4864, 14, 1, [(s, 1) for s in range(7)]),
        ("1g.10gb", 15, 1, 9856, 14, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        ("2g.10gb", 14, 2, 9856, 28, 3, [(0, 2), (2, 2), (4, 2)]),
        ("3g.20gb", 9, 3, 19968, 42, 2, [(0, 4), (4, 4)]),
        ("4g.20gb", 5, 4, 19968, 56, 1, [(0, 4)]),
        ("7g.40gb", 0, 7, 40192, 98, 1, [(0, 8)]),
    ],
    "NVIDIA A100-SXM4-80GB": [
        ("1g.10gb", 19, 1, 9728, 14, 7, [(s, 1) for s in range(7)]),
        ("1g.10gb+me", 20, 1, 9728, 14, 1, [(s, 1) for s in range(7)]),
        ("1g.20gb", 15, 1, 19968, 14, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        ("2g.20gb", 14, 2, 19968, 28, 3, [(0, 2), (2, 2), (4, 2)]),
        ("3g.40gb", 9, 3, 40192, 42, 2, [(0, 4), (4, 4)]),
        ("4g.40gb", 5, 4, 40192, 56, 1, [(0, 4)]),
        ("7g.80gb", 0, 7, 80640, 98, 1, [(0, 8)]),
    ],
    "NVIDIA H100-SXM5-80GB": [
        ("1g.10gb", 19, 1, 9984, 16, 7, [(s, 1) for s in range(7)]),
        ("1g.10gb+me", 20, 1, 9984, 16, 1, [(s, 1) for s in range(7)]),
        ("1g.20gb", 15, 1, 20096, 26, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        ("2g.20gb", 14, 2, 20096, 32, 3, [(0, 2), (2, 2), (4, 2)]),
        ("3g.40gb", 9, 3, 40448, 60, 2, [(0, 4), (4, 4)]),
        ("4g.40gb", 5, 4, 40448, 64, 1, [(0, 4)]),
        ("7g.80gb", 0, 7, 81152, 132, 1, [(0, 8)]),
    ],
}
CONSTANTS = [
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
]


@pytest.mark.parametrize("model", sorted(EXPECTED_TABLES))
def test_profile_tables_and_placements_per_model(tmp_path: Path, model: str) -> None:
    nvml = start(write(tmp_path, a100(model)))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    total = nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
    got = []
    for constant in CONSTANTS:
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        assert info.version == pynvml.nvmlGpuInstanceProfileInfo_v2
        name = next(
            profile_display_name(p, total) for p in model_profiles(model) if p.constant == constant
        )
        assert info.name == f"MIG {name}".encode()
        got.append(
            (
                name,
                info.id,
                info.sliceCount,
                info.memorySizeMB,
                info.multiprocessorCount,
                info.instanceCount,
                placements(nvml, handle, info.id),
            )
        )
    assert got == EXPECTED_TABLES[model]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7


def test_structures_have_pynvml_field_names() -> None:
    for name in (
        "c_nvmlGpuInstancePlacement_t",
        "c_nvmlGpuInstanceProfileInfo_t",
        "c_nvmlGpuInstanceProfileInfo_v2_t",
        "c_nvmlComputeInstancePlacement_t",
        "c_nvmlComputeInstanceProfileInfo_t",
        "c_nvmlComputeInstanceProfileInfo_v2_t",
    ):
        fake = [field[0] for field in getattr(migvalues, name)._fields_]
        real = [field[0] for field in getattr(pynvml, name)._fields_]
        assert fake == real, name
    real_gi_info = [field[0] for field in pynvml.c_nvmlGpuInstanceInfo_t._fields_]
    assert real_gi_info == list(migvalues.FakeGpuInstanceInfo.__dataclass_fields__)
    real_ci_info = [field[0] for field in pynvml.c_nvmlComputeInstanceInfo_t._fields_]
    assert real_ci_info == list(migvalues.FakeComputeInstanceInfo.__dataclass_fields__)
    for constant in (
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
        "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
        "NVML_GPU_INSTANCE_PROFILE_COUNT",
        "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
        "NVML_COMPUTE_INSTANCE_PROFILE_COUNT",
        "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        "NVML_ERROR_IN_USE",
        "NVML_ERROR_NOT_FOUND",
        "NVML_DEVICE_MIG_ENABLE",
    ):
        assert getattr(FakeNvml, constant) == getattr(pynvml, constant), constant


def test_mig_mode_not_supported_on_a_gpu_without_mig(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, f"gpus:\n  - uuid: {UUID_A}\n    name: Tesla T4\n"))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(handle)
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceSetMigMode(handle, 1)
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0


def test_mig_disabled_then_enabled(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100(mig=False)))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    assert nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE) == 0
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0).id == 19
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetMigMode(handle, 7)


def test_pending_mode_from_the_file(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100(mig=False, extra="    mig_pending: true\n")))
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0)) == [0, 1]


def test_create_describe_and_destroy(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100()))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    gi = create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4)
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
    assert nvml.nvmlDeviceGetUUID(info.device) == UUID_A
    ci = full_ci(nvml, gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
    assert (ci_info.profileId, ci_info.placement.start, ci_info.placement.size) == (2, 0, 3)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == info.id
    assert nvml.nvmlDeviceGetComputeInstanceId(mig) == ci_info.id
    assert nvml.nvmlDeviceGetUUID(mig) == derived_mig_uuid(UUID_A, info.id, ci_info.id)
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert nvml.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 1024 * 1024
    assert nvml.nvmlDeviceIsMigDeviceHandle(mig) == 1
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == UUID_A
    with pytest.raises(errors.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 7)
    # The GPU instance still holds its compute instance.
    with pytest.raises(errors.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)
    assert nvml.nvmlComputeInstanceDestroy(ci) == 0
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlComputeInstanceDestroy(ci)  # a stale handle
    assert nvml.nvmlGpuInstanceDestroy(gi) == 0
    with pytest.raises(errors.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(handle, info.id)
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlGpuInstanceGetInfo(gi)


def test_placement_errors(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100()))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 0)
    with pytest.raises(errors.NVMLError_InsufficientResources) as overlap:
        create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2)
    assert overlap.value.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    bad = nvml.c_nvmlGpuInstancePlacement_t(1, 2)  # 2g starts at 0, 2 or 4 only
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 14, ctypes.byref(bad))
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 99, ctypes.byref(bad))
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    # The other half takes a 3g; then the GPU is full.
    create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19) == 0
    with pytest.raises(errors.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(handle, 19)


def test_one_media_extension_instance_only(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100()))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0)
    with pytest.raises(errors.NVMLError_InsufficientResources):
        create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1)


def test_compute_instances_share_their_gpu_instance(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100()))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    gi = create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 0)
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    one = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, shared)
    assert (one.sliceCount, one.instanceCount, one.multiprocessorCount) == (1, 2, 14)
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, shared)  # 3 slices > 2
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    with pytest.raises(errors.NVMLError_InsufficientResources):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    array = (nvml.c_nvmlComputeInstance_t * 2)()
    count = ctypes.c_uint(2)
    nvml.nvmlGpuInstanceGetComputeInstances(gi, one.id, array, ctypes.byref(count))
    assert count.value == 2
    assert [nvml.nvmlComputeInstanceGetInfo(array[i]).id for i in range(2)] == [0, 1]
    small = (nvml.c_nvmlComputeInstance_t * 1)()
    with pytest.raises(errors.NVMLError_InsufficientSize):
        nvml.nvmlGpuInstanceGetComputeInstances(gi, one.id, small, ctypes.byref(count))


def test_gpu_instances_listed_into_a_handle_array(tmp_path: Path) -> None:
    nvml = start(write(tmp_path, a100()))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for slot in (0, 3, 6):
        create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, slot)
    array = (nvml.c_nvmlGpuInstance_t * 7)()
    count = ctypes.c_uint(7)
    nvml.nvmlDeviceGetGpuInstances(handle, 19, array, ctypes.byref(count))
    starts = [nvml.nvmlGpuInstanceGetInfo(array[i]).placement.start for i in range(count.value)]
    assert starts == [0, 3, 6]


def test_processes_block_destroy_and_show_on_the_parent(tmp_path: Path) -> None:
    extra = "    mig_devices:\n      - {profile: 1g.5gb, start: 0, processes: [4242]}\n"
    nvml = start(write(tmp_path, a100(extra=extra)))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [4242]
    parent = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.gpuInstanceId) for p in parent] == [(4242, 1)]
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, 1)
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    with pytest.raises(errors.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    nvml.set_running_processes(nvml.nvmlDeviceGetUUID(mig), ())
    assert nvml.nvmlDeviceGetComputeRunningProcesses(mig) == []
    assert nvml.nvmlComputeInstanceDestroy(ci) == 0
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []


# --- the fake GPU file's mig_devices ------------------------------------------------------------


def test_mig_devices_seed_the_gpu(tmp_path: Path) -> None:
    extra = (
        "    mig_devices:\n"
        "      - {profile: 3g.40gb, start: 4}\n"
        f"      - {{profile: 1g.10gb, start: 0, uuid: {MIG_UUID}}}\n"
    )
    nvml = start(write(tmp_path, a100("NVIDIA A100-SXM4-80GB", extra=extra)))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 81920 * 1024 * 1024  # model default
    names = [
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        for i in range(2)
    ]
    assert names == ["NVIDIA A100-SXM4-80GB MIG 3g.40gb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
    uuids = [
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)) for i in (0, 1)
    ]
    assert uuids == [derived_mig_uuid(UUID_A, 1, 0), MIG_UUID]
    # Seeding alone writes no state file.
    assert not Path(state_path(str(tmp_path / "gpus.yaml"))).exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "    mig_devices:\n      - {profile: 2g.10gb, start: 0}\n"
            "      - {profile: 1g.5gb, start: 1}\n",
            "gpus[0]: mig_devices[1]: 1g.5gb at start 1 overlaps 2g.10gb at start 0 "
            "(memory slice 1)",
        ),
        (
            "    mig_devices:\n      - {profile: 1g.20gb, start: 0}\n",
            "gpus[0]: mig_devices[0]: unknown profile '1g.20gb' for NVIDIA A100-SXM4-40GB (known: "
            "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)",
        ),
        (
            "    mig_devices:\n      - {profile: 3g.20gb, start: 2}\n",
            "gpus[0]: mig_devices[0]: 'start' of 3g.20gb must be one of its placements (0, 4), "
            "got 2",
        ),
        (
            "    mig_devices:\n      - {profile: 1g.5gb+me, start: 0}\n"
            "      - {profile: 1g.5gb+me, start: 1}\n",
            "gpus[0]: mig_devices[1]: at most 1 1g.5gb+me instance(s) fit on NVIDIA A100-SXM4-40GB",
        ),
        (
            "    mig_devices:\n      - {profile: 1g.5gb, start: 0, uuid: GPU-x}\n",
            "gpus[0]: mig_devices[0]: 'uuid' must be a MIG UUID "
            "(MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hex), got 'GPU-x'",
        ),
        (
            "    mig_devices:\n      - {profile: 1g.5gb, begin: 0}\n",
            "gpus[0]: mig_devices[0]: unknown key 'begin' (known: profile, start, uuid, processes)",
        ),
    ],
)
def test_invalid_mig_devices_are_named(extra: str, message: str) -> None:
    with pytest.raises(FakeGpuFileError) as caught:
        parse_fake_gpus(a100(extra=extra), "f.yaml")
    assert str(caught.value) == f"fake GPU file f.yaml: {message}"


def test_mig_devices_need_mig_mode_and_a_mig_model() -> None:
    devices = "    mig_devices:\n      - {profile: 1g.5gb, start: 0}\n"
    with pytest.raises(FakeGpuFileError, match=r"'mig_devices' needs 'mig: true'"):
        parse_fake_gpus(a100(mig=False, extra=devices), "f.yaml")
    with pytest.raises(FakeGpuFileError, match=r"'mig_devices' needs a MIG-capable model"):
        parse_fake_gpus(a100("Tesla T4", extra=devices), "f.yaml")
    with pytest.raises(FakeGpuFileError, match=r"'mig_pending' needs a MIG-capable model"):
        parse_fake_gpus(a100("Tesla T4", extra="    mig_pending: true\n"), "f.yaml")
    twice = (
        f"    mig_devices:\n      - {{profile: 1g.5gb, start: 0, uuid: {MIG_UUID}}}\n"
        f"  - uuid: {UUID_B}\n    name: NVIDIA A100-SXM4-40GB\n    mig: true\n"
        f"    mig_devices:\n      - {{profile: 1g.5gb, start: 0, uuid: {MIG_UUID}}}\n"
    )
    with pytest.raises(FakeGpuFileError, match=rf"uuid {MIG_UUID} appears twice"):
        parse_fake_gpus(a100(extra=twice), "f.yaml")


# --- the state file -----------------------------------------------------------------------------


def test_instances_survive_a_restart(tmp_path: Path) -> None:
    path = write(tmp_path, a100(extra="    mig_devices:\n      - {profile: 1g.5gb, start: 6}\n"))
    first = start(path)
    handle = first.nvmlDeviceGetHandleByIndex(0)
    gi = create_gi(first, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 0)
    full_ci(first, gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    state = json.loads(Path(state_path(str(path))).read_text())
    assert len(state["gpus"][UUID_A]["gpu_instances"]) == 2
    before = [
        first.nvmlDeviceGetUUID(first.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        for i in range(2)
    ]
    # A new process loading the same file finds both instances (the seeded one, the created one).
    second = start(path)
    handle2 = second.nvmlDeviceGetHandleByIndex(0)
    after = [
        second.nvmlDeviceGetUUID(second.nvmlDeviceGetMigDeviceHandleByIndex(handle2, i))
        for i in range(2)
    ]
    assert after == before
    # ... and what one destroys, the other no longer sees.
    gi2 = second.nvmlDeviceGetGpuInstanceById(handle2, 2)
    second.nvmlComputeInstanceDestroy(second.nvmlGpuInstanceGetComputeInstanceById(gi2, 0))
    second.nvmlGpuInstanceDestroy(gi2)
    with pytest.raises(errors.NVMLError_NotFound):
        first.nvmlDeviceGetGpuInstanceById(handle, 2)


def test_editing_the_seed_reseeds_the_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, a100())
    nvml = start(path)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    create_gi(nvml, handle, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0)
    path.write_text(a100(extra="    mig_devices:\n      - {profile: 2g.10gb, start: 4}\n"))
    fresh = start(path)
    array = (fresh.c_nvmlGpuInstance_t * 3)()
    count = ctypes.c_uint(3)
    handle = fresh.nvmlDeviceGetHandleByIndex(0)
    fresh.nvmlDeviceGetGpuInstances(handle, 0, array, ctypes.byref(count))
    assert count.value == 0  # the 7g created before the edit is gone
    fresh.nvmlDeviceGetGpuInstances(handle, 14, array, ctypes.byref(count))
    assert count.value == 1


def test_a_corrupt_state_file_is_reported_and_reseeded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, a100(extra="    mig_devices:\n      - {profile: 1g.5gb, start: 0}\n"))
    Path(state_path(str(path))).write_text("{not json")
    nvml = start(path)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    assert nvml.nvmlDeviceGetGpuInstanceId(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)) == 1
    assert "re-seeding from the fake GPU file" in caplog.text


# --- random sequences against a simple model ----------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "destroy"]),
        st.sampled_from(CONSTANTS),
        st.integers(min_value=0, max_value=7),
    ),
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_random_create_destroy_never_overlaps(
    tmp_path: Path, ops: list[tuple[str, int, int]]
) -> None:
    path = tmp_path / "random.yaml"
    path.write_text(a100())
    state = Path(state_path(str(path)))
    state.unlink(missing_ok=True)
    nvml = start(path)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    table = {p.constant: p for p in model_profiles("NVIDIA A100-SXM4-40GB")}
    model: dict[int, tuple[int, int, int]] = {}  # GI id -> (profile id, start, size)
    for op, constant, where in ops:
        profile = table[constant]
        if op == "create":
            size = profile.size
            used = {s for _p, st_, sz in model.values() for s in range(st_, st_ + sz)}
            held = sum(1 for p, _s, _z in model.values() if p == profile.id)
            valid = where in profile.starts
            fits = (
                valid
                and not used & set(range(where, where + size))
                and held < profile.instance_count
            )
            wanted = nvml.c_nvmlGpuInstancePlacement_t(where, size)
            try:
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, profile.id, ctypes.byref(wanted)
                )
            except errors.NVMLError as error:
                expected = 23 if valid else 2
                assert not fits and error.value == expected
            else:
                assert fits
                model[nvml.nvmlGpuInstanceGetInfo(gi).id] = (profile.id, where, size)
        elif model:
            gi_id = sorted(model)[where % len(model)]
            nvml.nvmlGpuInstanceDestroy(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
            del model[gi_id]
        listed = {}
        for p in table.values():
            array = (nvml.c_nvmlGpuInstance_t * 7)()
            count = ctypes.c_uint(7)
            nvml.nvmlDeviceGetGpuInstances(handle, p.id, array, ctypes.byref(count))
            for i in range(count.value):
                info = nvml.nvmlGpuInstanceGetInfo(array[i])
                listed[info.id] = (info.profileId, info.placement.start, info.placement.size)
        assert listed == model
        slices = [s for _p, st_, sz in listed.values() for s in range(st_, st_ + sz)]
        assert len(slices) == len(set(slices))
    # The state file agrees with what the fake answers.
    if state.exists():
        again = start(path)
        h = again.nvmlDeviceGetHandleByIndex(0)
        for gi_id, (profile_id, where, _size) in model.items():
            info = again.nvmlGpuInstanceGetInfo(again.nvmlDeviceGetGpuInstanceById(h, gi_id))
            assert (info.profileId, info.placement.start) == (profile_id, where)
