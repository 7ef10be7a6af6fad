"""The CDI spec of the node's GPUs: what it holds, where it is written, and that the names
Allocate hands out are the spec's devices."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.cdi import (
    build_cdi_spec,
    cdi_kind,
    cdi_spec_file_name,
    write_cdi_spec,
)
from hami_plugin.deviceplugin.device_list import (
    DeviceListConfig,
    DeviceListStrategy,
    device_list_answer,
)
from hami_plugin.deviceplugin.inventory import PhysicalGpu

GPU_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
GPU_MIG = "GPU-9c4b0b42-6a55-4c2e-9c8a-0f3a3c4f8e21"


def gpu(uuid: str, index: int, minor: int | None, *, mig: bool = False) -> PhysicalGpu:
    return PhysicalGpu(
        uuid=uuid,
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        numa_node=0,
        mig_enabled=mig,
        pci_bus_id=f"00000000:0{index}:00.0",
        minor_number=minor,
    )


def test_the_spec_has_one_device_per_gpu_by_uuid_and_all() -> None:
    spec = build_cdi_spec([gpu(GPU_B, 1, 5), gpu(GPU_A, 0, None)])
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu" == cdi_kind()
    assert spec["devices"] == [
        {"name": GPU_A, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": GPU_B, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia5"}]}},
        {
            "name": "all",
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia5"}]},
        },
    ]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl"},
            {"path": "/dev/nvidia-uvm"},
            {"path": "/dev/nvidia-uvm-tools"},
        ],
    }


def test_mig_mode_gpus_are_left_out_and_no_gpu_gives_no_devices() -> None:
    spec = build_cdi_spec([gpu(GPU_A, 0, 0), gpu(GPU_MIG, 1, 1, mig=True)])
    assert [d["name"] for d in spec["devices"]] == [GPU_A, "all"]
    assert build_cdi_spec([])["devices"] == []


def test_allocates_names_resolve_in_the_spec() -> None:
    spec = build_cdi_spec([gpu(GPU_A, 0, 0), gpu(GPU_B, 1, 1)])
    names = {f"{spec['kind']}={device['name']}" for device in spec["devices"]}
    answer = device_list_answer(
        [GPU_B, GPU_A],
        DeviceListConfig(strategies=frozenset({DeviceListStrategy.CDI_CRI})),
        "",
    )
    assert answer.cdi_devices
    assert set(answer.cdi_devices) <= names


def test_the_spec_is_written_atomically_under_the_cdi_file_name(tmp_path: Path) -> None:
    spec_dir = tmp_path / "run" / "cdi"  # created when missing
    first = build_cdi_spec([gpu(GPU_A, 0, 0)])
    path = write_cdi_spec(first, str(spec_dir))
    assert path == str(spec_dir / "k8s.device-plugin.nvidia.com-gpu.json")
    assert cdi_spec_file_name() == "k8s.device-plugin.nvidia.com-gpu.json"
    assert json.loads(Path(path).read_text(encoding="utf-8")) == first
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    second = build_cdi_spec([gpu(GPU_A, 0, 0), gpu(GPU_B, 1, 1)])
    write_cdi_spec(second, str(spec_dir))
    assert json.loads(Path(path).read_text(encoding="utf-8")) == second
    assert os.listdir(spec_dir) == ["k8s.device-plugin.nvidia.com-gpu.json"]  # no leftovers


def test_an_unwritable_spec_dir_raises_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "cdi"
    blocker.write_text("a file, not a directory", encoding="utf-8")
    with pytest.raises(OSError):
        write_cdi_spec(build_cdi_spec([gpu(GPU_A, 0, 0)]), str(blocker))
    spec_dir = tmp_path / "ro"
    spec_dir.mkdir()
    (spec_dir / cdi_spec_file_name()).mkdir()  # the rename onto a directory fails
    with pytest.raises(OSError):
        write_cdi_spec(build_cdi_spec([gpu(GPU_A, 0, 0)]), str(spec_dir))
    assert os.listdir(spec_dir) == [cdi_spec_file_name()]
