"""The fake GPU file: defaults, ordering and one clear error per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_plugin.testing.fakenvml.gpufile import (
    FakeGpuFileError,
    load_fake_gpus,
    parse_fake_gpus,
)

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"


def test_defaults_are_filled_in(tmp_path: Path) -> None:
    parsed = parse_fake_gpus(f"gpus:\n  - uuid: {UUID_A}\n  - uuid: {UUID_B}\n", "f.yaml")
    first, second = parsed.gpus
    assert (first.name, first.memory_mib, first.numa_node, first.healthy) == (
        "NVIDIA Fake GPU",
        16384,
        None,
        True,
    )
    assert (first.index, second.index) == (0, 1)
    assert (first.minor_number, second.minor_number) == (0, 1)
    assert first.pci_bus_id == "00000000:10:00.0"
    assert second.pci_bus_id == "00000000:11:00.0"
    assert first.xid is None and not first.mig
    assert parsed.init_error is None


def test_explicit_indexes_order_the_gpus() -> None:
    parsed = parse_fake_gpus(
        f"gpus:\n  - {{uuid: {UUID_A}, index: 1}}\n  - {{uuid: {UUID_B}, index: 0}}\n", "f"
    )
    assert [gpu.uuid for gpu in parsed.gpus] == [UUID_B, UUID_A]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("gpus:\n  - name: x\n", "gpus[0]: 'uuid' is required"),
        ("gpus:\n  - uuid: 12\n", "gpus[0]: 'uuid' must be an NVML GPU UUID"),
        ("gpus:\n  - uuid: 'GPU-a,b'\n", "gpus[0]: 'uuid' must be an NVML GPU UUID"),
        ("gpus:\n  - uuid: GPU-a100-0\n", "gpus[0]: 'uuid' must be an NVML GPU UUID"),
        (f"gpus:\n  - uuid: {UUID_A}\n  - uuid: {UUID_A}\n", f"uuid {UUID_A} appears twice"),
        (f"gpus:\n  - uuid: {UUID_A}\n    memroy_mib: 1\n", "gpus[0]: unknown key 'memroy_mib'"),
        (f"gpus:\n  - uuid: {UUID_A}\n    memory_mib: lots\n", "'memory_mib' must be an integer"),
        (f"gpus:\n  - uuid: {UUID_A}\n    memory_mib: 0\n", "'memory_mib' must be >= 1"),
        (f"gpus:\n  - uuid: {UUID_A}\n    healthy: 'no'\n", "'healthy' must be true or false"),
        (f"gpus:\n  - uuid: {UUID_A}\n    xid: true\n", "'xid' must be an integer"),
        (f"gpus:\n  - uuid: {UUID_A}\n    index: 3\n", "GPU indexes must be 0..0, each once"),
        (f"gpus:\n  - uuid: {UUID_A}\n    pci_bus_id: 3b\n", "'pci_bus_id' must look like"),
        ("gpus: {}\n", "'gpus' must be a list"),
        ("gpus:\n  - just-a-string\n", "gpus[0]: expected a mapping"),
        ("gpu: []\n", "unknown key 'gpu'"),
        ("init_error: Boom\ngpus: []\n", "'init_error' must be an NVML error name"),
        ("[1, 2]\n", "expected a mapping with a 'gpus' list"),
        (
            f"gpus:\n  - {{uuid: {UUID_A}, memory_mib: 10, memory_used_mib: 11}}\n",
            "'memory_used_mib' (11) exceeds 'memory_mib' (10)",
        ),
        (f"gpus:\n  - {{uuid: {UUID_A}, memory_used_mib: -1}}\n", "'memory_used_mib' must be >="),
        (f"gpus:\n  - {{uuid: {UUID_A}, utilization_percent: 101}}\n", "must be <= 100, got 101"),
        (f"gpus:\n  - {{uuid: {UUID_A}, memory_utilization_percent: x}}\n", "must be an integer"),
        ("gpus: [\n", "not valid YAML at line 2"),
    ],
)
def test_bad_files_give_one_clear_error(content: str, problem: str) -> None:
    with pytest.raises(FakeGpuFileError) as caught:
        parse_fake_gpus(content, "/etc/gpus.yaml")
    message = str(caught.value)
    assert message.startswith("fake GPU file /etc/gpus.yaml: ")
    assert problem in message
    assert "\n" not in message


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FakeGpuFileError, match=r"fake GPU file .*nope.yaml: cannot read"):
        load_fake_gpus(str(tmp_path / "nope.yaml"))
