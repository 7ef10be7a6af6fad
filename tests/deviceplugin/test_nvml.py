"""The NVML adapter over the fake (and over the real pynvml where no driver is installed)."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.nvml import (
    EventsNotSupportedError,
    GpuEvent,
    GpuUsage,
    NvmlBackend,
    NvmlError,
    NvmlUnavailable,
    PhysicalGpu,
    load_pynvml,
    sysfs_pci_address,
)
from hami_plugin.testing.fakenvml import errors, values
from hami_plugin.testing.fakenvml.nvml import FakeNvml

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
UUID_C = "GPU-9b45d1ae-4e70-2174-49af-23cac89cb67a"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "deviceplugin"


def write(path: Path, text: str) -> None:
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    os.replace(aside, path)


def backend_for(tmp_path: Path, text: str, **kwargs: int) -> tuple[NvmlBackend, Path]:
    path = tmp_path / "gpus.yaml"
    write(path, text)
    sysfs = tmp_path / "sys"
    backend = NvmlBackend(FakeNvml(str(path)), str(sysfs), **kwargs)
    backend.start()
    return backend, path


def make_gpu(name: str) -> PhysicalGpu:
    return PhysicalGpu(UUID_A, 0, name, 1, -1, False, "00000000:10:00.0", 0)


@pytest.mark.parametrize(
    ("name", "card_type"),
    [
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
        ("Tesla T4", "NVIDIA-Tesla T4"),
        ("NVIDIA-H100", "NVIDIA-H100"),
        ("A10", "NVIDIA-A10"),
    ],
)
def test_card_type_as_hami_writes_it(name: str, card_type: str) -> None:
    assert make_gpu(name).card_type == card_type


@pytest.mark.parametrize(
    ("bus_id", "sysfs"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("00000001:AF:00.1", "0001:af:00.1"),
        ("0000:3B:00.0", "0000:3b:00.0"),
    ],
)
def test_sysfs_pci_address(bus_id: str, sysfs: str) -> None:
    assert sysfs_pci_address(bus_id) == sysfs


def test_scan_reads_every_field(tmp_path: Path) -> None:
    backend, _ = backend_for(tmp_path, (FIXTURES / "two-gpus.yaml").read_text())
    gpus = backend.scan()
    assert gpus == [
        PhysicalGpu(
            uuid=UUID_A,
            index=0,
            name="NVIDIA A100-SXM4-80GB",
            memory_mib=81920,
            numa_node=0,
            mig_enabled=False,
            pci_bus_id="00000000:10:00.0",
            minor_number=0,
        ),
        PhysicalGpu(
            uuid="GPU-1afede84-4e70-2174-49af-f07ebb94d1ae",
            index=1,
            name="Tesla T4",
            memory_mib=15360,
            numa_node=1,
            mig_enabled=False,
            pci_bus_id="00000000:3B:00.0",
            minor_number=1,
        ),
    ]
    assert gpus[1].card_type == "NVIDIA-Tesla T4"
    backend.shutdown()


def test_numa_falls_back_to_sysfs(tmp_path: Path) -> None:
    text = (
        f"gpus:\n  - {{uuid: {UUID_A}, pci_bus_id: '00000000:3B:00.0'}}\n"
        f"  - {{uuid: {UUID_B}, pci_bus_id: '00000000:AF:00.0'}}\n"
        f"  - {{uuid: {UUID_C}, pci_bus_id: '00000000:D8:00.0'}}\n"
    )
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    (devices / "0000:3b:00.0").mkdir(parents=True)
    (devices / "0000:3b:00.0" / "numa_node").write_text("1\n")
    (devices / "0000:af:00.0").mkdir(parents=True)
    (devices / "0000:af:00.0" / "numa_node").write_text("-1\n")
    backend, _ = backend_for(tmp_path, text)  # no sysfs entry at all for the third GPU
    assert [gpu.numa_node for gpu in backend.scan()] == [1, -1, -1]


def test_mig_enabled_gpus_are_reported_flagged(tmp_path: Path) -> None:
    backend, _ = backend_for(
        tmp_path, f"gpus:\n  - {{uuid: {UUID_A}, mig: true}}\n  - {{uuid: {UUID_B}}}\n"
    )
    assert [(gpu.uuid, gpu.mig_enabled) for gpu in backend.scan()] == [
        (UUID_A, True),
        (UUID_B, False),
    ]


def test_memory_not_supported_uses_preconfigured_or_skips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = f"gpus:\n  - {{uuid: {UUID_A}, memory_mib: null}}\n  - {{uuid: {UUID_B}}}\n"
    backend, _ = backend_for(tmp_path, text)
    assert [gpu.uuid for gpu in backend.scan()] == [UUID_B]
    assert "cannot report its memory" in caplog.text
    configured, _ = backend_for(tmp_path, text, preconfigured_memory_mib=4096)
    assert [gpu.memory_mib for gpu in configured.scan()] == [4096, 16384]


def test_lost_gpu_is_skipped_at_first_scan_but_kept_once_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = f"gpus:\n  - {{uuid: {UUID_A}, healthy: false}}\n  - {{uuid: {UUID_B}}}\n"
    backend, path = backend_for(tmp_path, text)
    assert [gpu.uuid for gpu in backend.scan()] == [UUID_B]
    assert f"GPU {UUID_A} (NVML index 0) skipped: NVML query failed: GPU is lost" in caplog.text

    write(path, f"gpus:\n  - {{uuid: {UUID_A}}}\n  - {{uuid: {UUID_B}}}\n")
    first = backend.scan()
    write(path, f"gpus:\n  - {{uuid: {UUID_A}, healthy: false}}\n  - {{uuid: {UUID_B}}}\n")
    assert backend.scan() == first  # a known GPU going dark keeps its record


def test_known_gpu_whose_handle_fails_keeps_its_record(tmp_path: Path) -> None:
    class LostHandles(FakeNvml):
        lost = False

        def nvmlDeviceGetHandleByIndex(self, index: int) -> values.FakeDeviceHandle:
            if self.lost and index == 1:
                raise errors.NVMLError_GpuIsLost()
            return super().nvmlDeviceGetHandleByIndex(index)

    path = tmp_path / "gpus.yaml"
    write(path, f"gpus:\n  - {{uuid: {UUID_A}}}\n  - {{uuid: {UUID_B}}}\n")
    module = LostHandles(str(path))
    backend = NvmlBackend(module)
    backend.start()
    first = backend.scan()
    module.lost = True
    assert backend.scan() == first
    fresh = NvmlBackend(module)  # never saw the GPU: it is skipped
    assert [gpu.uuid for gpu in fresh.scan()] == [UUID_A]


def test_is_responsive(tmp_path: Path) -> None:
    backend, path = backend_for(tmp_path, f"gpus:\n  - {{uuid: {UUID_A}}}\n")
    assert backend.is_responsive(UUID_A)
    assert not backend.is_responsive(UUID_B)
    write(path, f"gpus:\n  - {{uuid: {UUID_A}, healthy: false}}\n")
    assert not backend.is_responsive(UUID_A)


def test_init_error_becomes_nvml_unavailable_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("init_error: LibraryNotFound\ngpus: []\n")
    backend = NvmlBackend(FakeNvml(str(path)))
    with pytest.raises(NvmlUnavailable) as caught:
        backend.start()
    message = str(caught.value)
    assert message.startswith(
        "NVML init failed: NVML Shared Library Not Found (is the NVIDIA driver mounted?"
    )
    assert "\n" not in message


def test_bad_fake_file_becomes_nvml_unavailable_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - {uuid: GPU-00000000-0000-0000-0000-00000000000a, memory_mib: -3}\n")
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlBackend(FakeNvml(str(path))).start()
    assert str(caught.value) == (
        f"NVML init failed: fake GPU file {path}: gpus[0]: 'memory_mib' must be >= 1, got -3"
    )


def test_real_pynvml_without_a_driver_is_a_clear_nvml_unavailable() -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("libnvidia-ml is installed here; this test is for machines without it")
    backend = NvmlBackend(load_pynvml())
    with pytest.raises(NvmlUnavailable) as caught:
        backend.start()
    assert str(caught.value).startswith(
        "NVML init failed: NVML Shared Library Not Found (is the NVIDIA driver mounted?"
    )


def test_count_failure_is_an_nvml_error(tmp_path: Path) -> None:
    backend = NvmlBackend(FakeNvml(str(tmp_path / "gpus.yaml")))  # never initialised
    with pytest.raises(NvmlError, match="NVML device count failed: Uninitialized"):
        backend.scan()


def test_event_helpers(tmp_path: Path) -> None:
    backend, path = backend_for(tmp_path, f"gpus:\n  - {{uuid: {UUID_A}}}\n")
    event_set = backend.create_event_set()
    backend.register_events(event_set, UUID_A)
    assert backend.wait_event(event_set, 20) is None
    write(path, f"gpus:\n  - {{uuid: {UUID_A}, xid: 48}}\n")
    event = backend.wait_event(event_set, 2000)
    assert event == GpuEvent(uuid=UUID_A, event_type=0x8, data=48)
    assert event.is_xid_critical and event.xid == 48
    assert GpuEvent(UUID_A, 0x2, 0).xid is None
    backend.free_event_set(event_set)
    with pytest.raises(NvmlError, match="NVML event wait failed"):
        backend.wait_event(event_set, 10)


def test_register_events_failures(tmp_path: Path) -> None:
    backend, path = backend_for(tmp_path, f"gpus:\n  - {{uuid: {UUID_A}, healthy: false}}\n")
    event_set = backend.create_event_set()
    with pytest.raises(NvmlError, match=f"GPU {UUID_A}: event registration failed: GPU is lost"):
        backend.register_events(event_set, UUID_A)

    class NoEvents(FakeNvml):
        def nvmlDeviceGetSupportedEventTypes(self, handle: values.FakeDeviceHandle) -> int:
            return values.nvmlEventTypePState

    old = NvmlBackend(NoEvents(str(path)))
    write(path, f"gpus:\n  - {{uuid: {UUID_A}}}\n")
    old.start()
    with pytest.raises(EventsNotSupportedError):
        old.register_events(old.create_event_set(), UUID_A)


# --- live usage -------------------------------------------------------------------------------


def test_read_usage_reports_every_gpu_in_index_order(tmp_path: Path) -> None:
    backend, _ = backend_for(
        tmp_path,
        f"gpus:\n  - {{uuid: {UUID_B}, index: 1, name: Tesla T4, memory_used_mib: 3}}\n"
        f"  - {{uuid: {UUID_A}, index: 0, name: NVIDIA A100, utilization_percent: 55,"
        " memory_utilization_percent: 20}\n",
    )
    assert backend.read_usage() == [
        GpuUsage(0, UUID_A, "NVIDIA A100", 0, 55, 20),
        GpuUsage(1, UUID_B, "Tesla T4", 3 << 20, 0, 0),
    ]


def test_read_usage_leaves_out_what_the_gpu_cannot_report(tmp_path: Path) -> None:
    backend, _ = backend_for(
        tmp_path,
        f"gpus:\n  - {{uuid: {UUID_A}, memory_mib: null, utilization_percent: null}}\n",
    )
    assert backend.read_usage() == [GpuUsage(0, UUID_A, "NVIDIA Fake GPU", None, None, None)]


def test_read_usage_skips_a_failing_gpu_logging_once_until_it_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    healthy = f"gpus:\n  - {{uuid: {UUID_A}}}\n  - {{uuid: {UUID_B}}}\n"
    backend, path = backend_for(tmp_path, healthy)
    write(path, f"gpus:\n  - {{uuid: {UUID_A}}}\n  - {{uuid: {UUID_B}, healthy: false}}\n")
    caplog.set_level("INFO", logger="hami_plugin.deviceplugin.nvml")
    for _ in range(3):
        assert [usage.uuid for usage in backend.read_usage()] == [UUID_A]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["GPU at NVML index 1 left out of the metrics: GPU is lost"]
    write(path, healthy)
    assert [usage.uuid for usage in backend.read_usage()] == [UUID_A, UUID_B]
    assert f"GPU {UUID_B} (NVML index 1) reports its usage again" in caplog.text


def test_read_usage_raises_when_the_count_fails(tmp_path: Path) -> None:
    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise errors.NVMLError_Unknown()

    path = tmp_path / "gpus.yaml"
    write(path, "gpus: []\n")
    backend = NvmlBackend(NoCount(str(path)))
    backend.start()
    with pytest.raises(NvmlError, match="NVML device count failed: Unknown Error"):
        backend.read_usage()
