"""`NvmlMig`, the MIG NVML adapter, over the fake NVML: go-nvlib's profile names, NVML's
placements, creation as HAMi's EnsureAllocation (with its rollback), destruction as
destroyMigInstance / destroyAllMigInstances, busy as deviceHasProcesses, and NVML's errors
carried as `NvmlError` with `.code`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from hami_plugin.deviceplugin.mig.devices import MigModeState, MigNvml
from hami_plugin.deviceplugin.mig.naming import mig_memory_size_gb, profile_name
from hami_plugin.deviceplugin.mig.nvml import MigNvmlError, NvmlMig
from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.protocol.model import MigPlacement
from hami_plugin.testing.fakenvml.errors import nvml_error
from hami_plugin.testing.fakenvml.migstate import derived_mig_uuid
from hami_plugin.testing.fakenvml.nvml import FakeNvml

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
UUID_C = "GPU-2b5c8d1e-6f7a-4b3c-9d2e-1a0f3e4d5c6b"
MIG_UUID = "MIG-5c8e2a3b-1d4f-4e6a-9b7c-2f1e0d3c4b5a"

FILE = f"""gpus:
  - uuid: {UUID_A}
    name: NVIDIA A100-SXM4-80GB
    mig: true
    mig_devices:
      - {{profile: 3g.40gb, start: 4}}
      - {{profile: 1g.10gb, start: 0, uuid: {MIG_UUID}}}
  - uuid: {UUID_B}
    name: NVIDIA H100-SXM5-80GB
    mig: false
  - uuid: {UUID_C}
    name: Tesla T4
"""


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    path = tmp_path / "gpus.yaml"
    path.write_text(FILE)
    module = FakeNvml(str(path))
    module.nvmlInit()
    return module


@pytest.fixture
def mig(fake: FakeNvml) -> NvmlMig:
    return NvmlMig(fake)


def test_it_is_a_mig_nvml(mig: NvmlMig) -> None:
    interface: MigNvml = mig
    assert interface.mig_mode(0).current


def test_names_as_go_nvlib_rounds_them() -> None:
    gib = 1024**3
    # An A100-40GB (40960 MiB): 4864 MiB is 0.119 of it -> 1/8 -> 5 GB.
    assert mig_memory_size_gb(40 * gib, 4864) == 5
    assert mig_memory_size_gb(40 * gib, 9856) == 10
    # An H100-80GB reports 81559 MiB: 80 GB rounded up, 20096 MiB -> 2/8 -> 20 GB.
    assert mig_memory_size_gb(81559 * 1024 * 1024, 20096) == 20
    assert profile_name(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0, 4864, 40 * gib) == (
        "1g.5gb+me"
    )
    assert profile_name(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 0, 9856, 40 * gib) == (
        "1c.2g.10gb"
    )
    assert profile_name(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 0, 4864, 40 * gib) == (
        "1g.5gb-me"
    )
    assert profile_name(0x11, 0, 4864, 40 * gib) is None


def test_mig_mode(fake: FakeNvml, mig: NvmlMig) -> None:
    assert mig.mig_mode(0) == MigModeState(current=True, pending=True)
    assert mig.mig_mode(1) == MigModeState(current=False, pending=False)
    assert mig.mig_mode(2) == MigModeState(current=False, pending=False, supported=False)
    mig.set_mig_mode(1, True)
    assert mig.mig_mode(1) == MigModeState(current=True, pending=True)
    with pytest.raises(MigNvmlError) as caught:
        mig.set_mig_mode(2, True)
    assert caught.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert str(caught.value) == "gpu 2 set mig mode: Not Supported"
    with pytest.raises(MigNvmlError) as caught:
        mig.mig_mode(9)
    assert isinstance(caught.value, NvmlError)
    assert caught.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert str(caught.value) == "nvml get handle by index 9: Invalid Argument"


def test_profiles_are_hamis_with_their_placements(mig: NvmlMig) -> None:
    profiles = mig.profiles(0)
    assert [(p.name, p.gi_profile_id, p.instance_count) for p in profiles] == [
        ("1g.10gb", pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 7),
        ("2g.20gb", pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 3),
        ("3g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 2),
        ("4g.40gb", pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 1),
        ("7g.80gb", pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 1),
    ]
    three = profiles[2]
    assert (three.slice_count, three.memory_mib, three.multiprocessor_count) == (3, 40192, 42)
    assert three.placements == (MigPlacement(0, 4), MigPlacement(4, 4))
    assert profiles[0].placements == tuple(MigPlacement(s, 1) for s in range(7))
    # MIG disabled: NVML offers no profiles; no MIG: none either.
    assert mig.profiles(1) == []
    assert mig.profiles(2) == []


def test_static_mig_devices_listed(mig: NvmlMig) -> None:
    devices = mig.mig_devices(0)
    assert [(d.profile, d.placement, d.mig_index) for d in devices] == [
        ("3g.40gb", MigPlacement(4, 4), 0),
        ("1g.10gb", MigPlacement(0, 1), 1),
    ]
    first, second = devices
    assert first.uuid == derived_mig_uuid(UUID_A, first.gpu_instance_id, 0)
    assert second.uuid == MIG_UUID
    assert (second.parent_uuid, second.parent_index, second.memory_mib) == (UUID_A, 0, 9728)
    assert (second.gpu_instance_id, second.compute_instance_id) == (2, 0)
    assert mig.mig_devices(1) == []
    assert mig.mig_devices(2) == []


def test_create_lists_the_device_with_its_uuid(mig: NvmlMig) -> None:
    created = mig.create_instance(0, "2g.20gb", MigPlacement(2, 2))
    assert created.profile == "2g.20gb"
    assert created.placement == MigPlacement(2, 2)
    assert created.memory_mib == 19968
    assert created.uuid.startswith("MIG-")
    assert created in mig.mig_devices(0)
    # The HAMi slice key picks the profile: the memory part of the name is not consulted.
    other = mig.create_instance(0, "1g.whatever", MigPlacement(1, 1))
    assert other.profile == "1g.10gb"


def test_create_refusals(mig: NvmlMig) -> None:
    with pytest.raises(MigNvmlError) as caught:
        mig.create_instance(0, "5g.50gb", MigPlacement(0, 5))
    assert str(caught.value) == 'unsupported MIG profile "5g.50gb"'
    assert caught.value.code is None
    with pytest.raises(MigNvmlError) as caught:
        mig.create_instance(0, "2g.20gb", MigPlacement(1, 2))
    assert str(caught.value) == (
        "scheduler selected invalid placement {Start:1 Size:2} for profile 2g.20gb"
    )
    with pytest.raises(MigNvmlError) as caught:
        mig.create_instance(0, "2g.20gb", MigPlacement(4, 2))  # the 3g.40gb holds slices 4-7
    assert caught.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert str(caught.value) == (
        "create GI profile=2g.20gb placement={Start:4 Size:2}: Insufficient Resources"
    )
    with pytest.raises(MigNvmlError) as caught:
        mig.create_instance(1, "1g.10gb", MigPlacement(0, 1))  # MIG disabled
    assert caught.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert str(caught.value) == "get GI profile 1g.10gb: Not Supported"


class _FailingCreateCi:
    """The fake NVML, but creating a compute instance fails (as NVML can, e.g. out of
    resources on a misbehaving driver)."""

    def __init__(self, inner: FakeNvml, code: int) -> None:
        self._inner = inner
        self._code = code

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, profile_id: int) -> Any:
        raise nvml_error(self._code)


def test_a_compute_instance_failure_rolls_the_gpu_instance_back(fake: FakeNvml) -> None:
    mig = NvmlMig(_FailingCreateCi(fake, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES))
    before = mig.mig_devices(0)
    with pytest.raises(MigNvmlError) as caught:
        mig.create_instance(0, "2g.20gb", MigPlacement(2, 2))
    assert str(caught.value) == "create CI: Insufficient Resources"
    assert caught.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert mig.mig_devices(0) == before
    # The GPU instance is gone: the placement is free again.
    assert NvmlMig(fake).create_instance(0, "2g.20gb", MigPlacement(2, 2)).profile == "2g.20gb"


class _Unprivileged:
    """The fake NVML as an unprivileged container sees it: MIG changes are refused."""

    def __init__(self, inner: FakeNvml) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, *args: Any) -> Any:
        raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)


def test_missing_permissions_say_what_to_change(fake: FakeNvml) -> None:
    with pytest.raises(MigNvmlError) as caught:
        NvmlMig(_Unprivileged(fake)).create_instance(0, "2g.20gb", MigPlacement(2, 2))
    assert caught.value.code == pynvml.NVML_ERROR_NO_PERMISSION
    assert str(caught.value).endswith(
        "Insufficient Permissions (MIG management needs CAP_SYS_ADMIN and the MIG capability "
        "devices: run the device plugin privileged, chart value devicePlugin.securityContext)"
    )


def test_destroy_is_idempotent(mig: NvmlMig) -> None:
    created = mig.create_instance(0, "1g.10gb", MigPlacement(1, 1))
    mig.destroy_instance(0, created.gpu_instance_id, created.compute_instance_id)
    assert created not in mig.mig_devices(0)
    mig.destroy_instance(0, created.gpu_instance_id, created.compute_instance_id)
    assert len(mig.mig_devices(0)) == 2


def test_destroy_refused_while_a_process_runs(fake: FakeNvml, mig: NvmlMig) -> None:
    device = mig.mig_devices(0)[1]
    fake.set_running_processes(device.uuid, (4242,))
    with pytest.raises(MigNvmlError) as caught:
        mig.destroy_instance(0, device.gpu_instance_id, device.compute_instance_id)
    assert caught.value.code == pynvml.NVML_ERROR_IN_USE
    assert str(caught.value) == (f"destroy CI {device.compute_instance_id} on gpu 0: In Use")
    with pytest.raises(MigNvmlError) as caught:
        mig.destroy_all(0)
    assert str(caught.value) == "destroy compute instance: In Use"


def test_destroy_all_empties_the_gpu(mig: NvmlMig) -> None:
    mig.create_instance(0, "1g.10gb", MigPlacement(2, 1))
    assert len(mig.mig_devices(0)) == 3
    mig.destroy_all(0)
    assert mig.mig_devices(0) == []
    assert mig.create_instance(0, "7g.80gb", MigPlacement(0, 8)).profile == "7g.80gb"


def test_destroy_all_also_takes_profiles_hami_does_not_list(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        f"gpus:\n  - uuid: {UUID_A}\n    name: NVIDIA A100-SXM4-40GB\n    mig: true\n"
        "    mig_devices:\n      - {profile: 1g.10gb, start: 6}\n"
        "      - {profile: 1g.5gb+me, start: 0}\n"
    )
    fake = FakeNvml(str(path))
    fake.nvmlInit()
    mig = NvmlMig(fake)
    assert sorted(d.profile for d in mig.mig_devices(0)) == ["1g.10gb", "1g.5gb+me"]
    mig.destroy_all(0)
    assert mig.mig_devices(0) == []


def test_has_processes(fake: FakeNvml, mig: NvmlMig) -> None:
    assert not mig.has_processes(0)
    fake.set_running_processes(mig.mig_devices(0)[0].uuid, (7,))
    assert mig.has_processes(0)
    # A GPU without MIG: its own processes.
    assert not mig.has_processes(2)
    fake.set_running_processes(UUID_C, (8,))
    assert mig.has_processes(2)


def test_a_failed_process_query_counts_as_busy(fake: FakeNvml) -> None:
    class _Failing(_FailingCreateCi):
        def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any:
            raise nvml_error(self._code)

    assert NvmlMig(_Failing(fake, pynvml.NVML_ERROR_UNKNOWN)).has_processes(0)


# --- the real pynvml module, its C library stood in for ------------------------------------------


class _FakeLibrary:
    """The C functions pynvml calls, checking what pynvml hands them (the argument shapes the
    NVML C API wants) and recording the calls; the MIG calls succeed on a two-profile GPU and
    compute-instance creation fails with NVML_ERROR_INSUFFICIENT_RESOURCES."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def function(self, name: str) -> Any:
        method = getattr(self, name, None)
        if method is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return method

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> Any:
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, device: Any, memory: Any) -> Any:
        memory._obj.total = 40960 * 1024 * 1024
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, device: Any, profile: int, info: Any) -> Any:
        rows = {
            pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 7, 14, 4864),
            pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 2, 42, 19968),
        }
        if profile not in rows:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        target = info._obj
        assert isinstance(target, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
        assert target.version == pynvml.nvmlGpuInstanceProfileInfo_v2
        (target.id, target.sliceCount, target.instanceCount, target.multiprocessorCount,
         target.memorySizeMB) = rows[profile]  # fmt: skip
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, device: Any, profile_id: int, placements: Any, count: Any
    ) -> Any:
        starts = {19: [(s, 1) for s in range(7)], 9: [(0, 4), (4, 4)]}[profile_id]
        if placements is None:
            count._obj.value = len(starts)
            return pynvml.NVML_SUCCESS
        assert placements._type_ is pynvml.c_nvmlGpuInstancePlacement_t
        assert count._obj.value >= len(starts) and len(placements) >= len(starts)
        for i, (start, size) in enumerate(starts):
            placements[i].start, placements[i].size = start, size
        count._obj.value = len(starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profile_id: int, placement: Any, instance: Any
    ) -> Any:
        wanted = placement._obj  # passed by reference, as the C API's const pointer
        assert isinstance(wanted, pynvml.c_nvmlGpuInstancePlacement_t)
        self.calls.append(("create GI", profile_id, wanted.start, wanted.size))
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any, info: Any) -> Any:
        info._obj.id, info._obj.profileId = 2, 9
        info._obj.placement.start, info._obj.placement.size = 4, 4
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gpu_instance: Any, profile: int, engine: int, info: Any
    ) -> Any:
        self.calls.append(("CI profile", profile, engine))
        info._obj.id = profile
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: Any, profile_id: int, instance: Any
    ) -> Any:
        self.calls.append(("create CI", profile_id))
        return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> Any:
        self.calls.append(("destroy GI",))
        return pynvml.NVML_SUCCESS


@pytest.fixture
def real_pynvml(monkeypatch: pytest.MonkeyPatch) -> _FakeLibrary:
    library = _FakeLibrary()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", library.function)
    return library


def test_profiles_through_the_real_pynvml(real_pynvml: _FakeLibrary) -> None:
    profiles = NvmlMig(pynvml).profiles(0)
    assert [(p.name, p.gi_profile_id, p.placements) for p in profiles] == [
        ("1g.5gb", 0, tuple(MigPlacement(s, 1) for s in range(7))),
        ("3g.20gb", 2, (MigPlacement(0, 4), MigPlacement(4, 4))),
    ]


def test_create_through_the_real_pynvml_rolls_back(real_pynvml: _FakeLibrary) -> None:
    with pytest.raises(MigNvmlError) as caught:
        NvmlMig(pynvml).create_instance(0, "3g.20gb", MigPlacement(4, 4))
    assert caught.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert str(caught.value).startswith("create CI: ")
    shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    assert real_pynvml.calls == [
        ("create GI", 9, 4, 4),
        ("CI profile", pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, shared),
        ("create CI", pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE),
        ("destroy GI",),
    ]
