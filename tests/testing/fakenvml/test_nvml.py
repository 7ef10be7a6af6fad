"""The fake NVML: pynvml's surface and semantics, driven by (and reacting to) a YAML file."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pynvml
import pytest

from hami_plugin.testing.fakenvml import errors, values
from hami_plugin.testing.fakenvml.nvml import FakeNvml

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
XID = pynvml.nvmlEventTypeXidCriticalError


def gpu_yaml(healthy_b: bool = True, xid_b: int | None = None, extra: str = "") -> str:
    lines = [
        "gpus:",
        f"  - uuid: {UUID_A}",
        "    name: NVIDIA A100-SXM4-80GB",
        "    memory_mib: 81920",
        "    numa_node: 0",
        f"  - uuid: {UUID_B}",
        "    name: Tesla T4",
        f"    healthy: {'true' if healthy_b else 'false'}",
    ]
    if xid_b is not None:
        lines.append(f"    xid: {xid_b}")
    return "\n".join(lines) + "\n" + extra


@pytest.fixture
def gpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(gpu_yaml())
    return path


@pytest.fixture
def nvml(gpus_file: Path) -> FakeNvml:
    module = FakeNvml(str(gpus_file))
    module.nvmlInit()
    return module


def rewrite(path: Path, text: str) -> None:
    """Replace the file the way editors and ConfigMap updates do: write aside, rename."""
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    os.replace(aside, path)


# --- the pynvml surface ------------------------------------------------------------------------


def test_error_classes_match_pynvml_names_and_codes() -> None:
    for code, cls in errors.ERROR_CLASSES.items():
        real = getattr(pynvml, cls.__name__)
        assert real().value == code == cls().value
        assert pynvml.nvmlExceptionClass(code) is real
        assert errors.nvmlExceptionClass(code) is cls
        assert issubclass(cls, errors.NVMLError)
        assert getattr(FakeNvml, cls.__name__) is cls


def test_error_strings_match_pynvml() -> None:
    for cls in (
        errors.NVMLError_LibraryNotFound,
        errors.NVMLError_Timeout,
        errors.NVMLError_GpuIsLost,
        errors.NVMLError_NotSupported,
        errors.NVMLError_Uninitialized,
    ):
        assert str(cls()) == str(getattr(pynvml, cls.__name__)())


def test_constants_match_pynvml() -> None:
    for name in (
        "nvmlEventTypeSingleBitEccError",
        "nvmlEventTypeDoubleBitEccError",
        "nvmlEventTypeXidCriticalError",
        "nvmlEventTypePState",
        "nvmlEventTypeClock",
        "nvmlEventTypeNone",
        "NVML_DEVICE_MIG_ENABLE",
        "NVML_DEVICE_MIG_DISABLE",
        "NVML_ERROR_TIMEOUT",
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML_ERROR_GPU_IS_LOST",
    ):
        assert getattr(FakeNvml, name) == getattr(pynvml, name), name


def test_the_calls_we_use_exist_on_both() -> None:
    calls = [name for name in dir(FakeNvml) if name.startswith("nvml") and name[4].isupper()]
    assert len(calls) > 15
    for name in calls:
        assert hasattr(pynvml, name), name


# --- init and queries -----------------------------------------------------------------------


def test_calls_before_init_raise_uninitialized(gpus_file: Path) -> None:
    module = FakeNvml(str(gpus_file))
    with pytest.raises(errors.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()
    module.nvmlInit()
    module.nvmlInit()
    module.nvmlShutdown()
    assert module.nvmlDeviceGetCount() == 2  # init is refcounted
    module.nvmlShutdown()
    with pytest.raises(errors.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()


def test_init_error_simulates_a_missing_driver_until_removed(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("init_error: LibraryNotFound\n" + gpu_yaml())
    module = FakeNvml(str(path))
    with pytest.raises(errors.NVMLError_LibraryNotFound) as caught:
        module.nvmlInit()
    assert caught.value.value == 12
    assert str(caught.value) == "NVML Shared Library Not Found"
    rewrite(path, gpu_yaml())
    module.nvmlInit()
    assert module.nvmlDeviceGetCount() == 2


def test_invalid_file_at_init_names_file_and_problem(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - name: no-uuid\n")
    module = FakeNvml(str(path))
    with pytest.raises(errors.NVMLError) as caught:
        module.nvmlInit()
    assert str(caught.value) == f"fake GPU file {path}: gpus[0]: 'uuid' is required"


def test_device_queries(nvml: FakeNvml) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetUUID(handle) == UUID_A
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA A100-SXM4-80GB"
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 81920 * 1024 * 1024
    assert nvml.nvmlDeviceGetNumaNodeId(handle) == 0
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:10:00.0"
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(UUID_B)) == 1
    with pytest.raises(errors.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumaNodeId(nvml.nvmlDeviceGetHandleByIndex(1))
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(errors.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-unknown")


def test_unhealthy_gpu_is_lost_until_flipped_back(nvml: FakeNvml, gpus_file: Path) -> None:
    handle = nvml.nvmlDeviceGetHandleByUUID(UUID_B)
    rewrite(gpus_file, gpu_yaml(healthy_b=False))
    with pytest.raises(errors.NVMLError_GpuIsLost) as caught:
        nvml.nvmlDeviceGetMemoryInfo(handle)
    assert caught.value.value == 15
    assert nvml.nvmlDeviceGetUUID(handle) == UUID_B  # still nameable, as for event matching
    rewrite(gpus_file, gpu_yaml(healthy_b=True))
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total > 0


def test_memory_null_means_not_supported(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(f"gpus:\n  - {{uuid: {UUID_A}, memory_mib: null}}\n")
    module = FakeNvml(str(path))
    module.nvmlInit()
    with pytest.raises(errors.NVMLError_NotSupported):
        module.nvmlDeviceGetMemoryInfo(module.nvmlDeviceGetHandleByIndex(0))


# --- events -----------------------------------------------------------------------------------


def registered_set(nvml: FakeNvml, *uuids: str) -> values.FakeEventSet:
    event_set = nvml.nvmlEventSetCreate()
    for uuid in uuids:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        mask = XID & nvml.nvmlDeviceGetSupportedEventTypes(handle)
        nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    return event_set


def test_wait_times_out_with_nvml_timeout(nvml: FakeNvml) -> None:
    event_set = registered_set(nvml, UUID_A, UUID_B)
    with pytest.raises(errors.NVMLError_Timeout) as caught:
        nvml.nvmlEventSetWait(event_set, 30)
    assert caught.value.value == pynvml.NVML_ERROR_TIMEOUT
    nvml.nvmlEventSetFree(event_set)


def test_flip_to_unhealthy_delivers_xid_79(nvml: FakeNvml, gpus_file: Path) -> None:
    event_set = registered_set(nvml, UUID_A, UUID_B)
    rewrite(gpus_file, gpu_yaml(healthy_b=False))
    event = nvml.nvmlEventSetWait(event_set, 1000)
    assert nvml.nvmlDeviceGetUUID(event.device) == UUID_B
    assert event.eventType == XID
    assert event.eventData == 79
    assert event.gpuInstanceId == 0xFFFFFFFF
    with pytest.raises(errors.NVMLError_Timeout):  # one event per change, not per poll
        nvml.nvmlEventSetWait(event_set, 250)


def test_new_xid_value_delivers_that_xid(nvml: FakeNvml, gpus_file: Path) -> None:
    event_set = registered_set(nvml, UUID_B)
    rewrite(gpus_file, gpu_yaml(xid_b=48))
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 48
    rewrite(gpus_file, gpu_yaml(xid_b=48, extra="# unrelated edit\n"))
    with pytest.raises(errors.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 250)
    rewrite(gpus_file, gpu_yaml(xid_b=13))
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 13


def test_events_only_reach_sets_the_gpu_is_registered_with(nvml: FakeNvml, gpus_file: Path) -> None:
    only_a = registered_set(nvml, UUID_A)
    rewrite(gpus_file, gpu_yaml(healthy_b=False))
    with pytest.raises(errors.NVMLError_Timeout):
        nvml.nvmlEventSetWait(only_a, 150)


def test_wait_wakes_up_when_the_file_changes(nvml: FakeNvml, gpus_file: Path) -> None:
    event_set = registered_set(nvml, UUID_B)
    writer = threading.Timer(0.2, lambda: gpus_file.write_text(gpu_yaml(healthy_b=False)))
    writer.start()
    try:
        event = nvml.nvmlEventSetWait(event_set, 5000)
    finally:
        writer.join()
    assert event.eventData == 79


def test_invalid_edit_keeps_last_state_and_is_logged_once(
    nvml: FakeNvml, gpus_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    event_set = registered_set(nvml, UUID_B)
    caplog.set_level(logging.ERROR, logger="hami_plugin.testing.fakenvml.nvml")
    rewrite(gpus_file, "gpus: [\n")
    with pytest.raises(errors.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 250)
    assert nvml.nvmlDeviceGetCount() == 2
    problems = [r.getMessage() for r in caplog.records]
    assert len(problems) == 1
    assert str(gpus_file) in problems[0] and "not valid YAML" in problems[0]
    rewrite(gpus_file, gpu_yaml(healthy_b=False))
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 79


def test_injected_wait_error_and_event(nvml: FakeNvml) -> None:
    event_set = registered_set(nvml, UUID_A)
    nvml.inject_wait_error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(errors.NVMLError_Unknown):
        nvml.nvmlEventSetWait(event_set, 1000)
    nvml.inject_event(UUID_A, values.nvmlEventTypeDoubleBitEccError, 0)
    with pytest.raises(errors.NVMLError_Timeout):  # registered for Xid only
        nvml.nvmlEventSetWait(event_set, 50)
    nvml.inject_event(UUID_A, XID, 31)
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 31


def test_freed_set_rejects_waits(nvml: FakeNvml) -> None:
    event_set = registered_set(nvml, UUID_A)
    nvml.nvmlEventSetFree(event_set)
    with pytest.raises(errors.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait(event_set, 10)


# --- live usage (the metrics endpoint reads it) ------------------------------------------------


def test_usage_defaults_to_an_idle_gpu(nvml: FakeNvml) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.used, memory.free) == (0, memory.total)
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (0, 0)


def test_usage_keys_are_served_and_follow_file_edits(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        f"gpus:\n  - {{uuid: {UUID_A}, memory_mib: 1024, memory_used_mib: 256,"
        " utilization_percent: 37, memory_utilization_percent: 12}\n"
    )
    module = FakeNvml(str(path))
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    memory = module.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.total, memory.used, memory.free) == (1024 << 20, 256 << 20, 768 << 20)
    rates = module.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (37, 12)
    rewrite(path, f"gpus:\n  - {{uuid: {UUID_A}, memory_used_mib: 512, utilization_percent: 90}}\n")
    assert module.nvmlDeviceGetMemoryInfo(handle).used == 512 << 20
    assert module.nvmlDeviceGetUtilizationRates(handle).gpu == 90


def test_usage_has_pynvml_field_names() -> None:
    # The adapter reads these attributes off pynvml's ctypes structures.
    assert [name for name, _ in pynvml.c_nvmlUtilization_t._fields_] == ["gpu", "memory"]
    assert {"total", "free", "used"} <= {name for name, _ in pynvml.c_nvmlMemory_t._fields_}
    assert set(values.FakeUtilization.__dataclass_fields__) == {"gpu", "memory"}
    assert set(values.FakeMemoryInfo.__dataclass_fields__) == {"total", "free", "used"}


def test_null_utilization_means_not_supported(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(f"gpus:\n  - {{uuid: {UUID_A}, memory_utilization_percent: null}}\n")
    module = FakeNvml(str(path))
    module.nvmlInit()
    with pytest.raises(errors.NVMLError_NotSupported):
        module.nvmlDeviceGetUtilizationRates(module.nvmlDeviceGetHandleByIndex(0))


def test_lost_gpu_cannot_report_usage(nvml: FakeNvml, gpus_file: Path) -> None:
    handle = nvml.nvmlDeviceGetHandleByUUID(UUID_B)
    rewrite(gpus_file, gpu_yaml(healthy_b=False))
    with pytest.raises(errors.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUtilizationRates(handle)
