"""The fake NVML's topology model: pynvml's topology calls, constants, errors, presets."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from hami_plugin.testing.fakenvml import topology
from hami_plugin.testing.fakenvml.gpufile import FakeGpuFileError, parse_fake_gpus
from hami_plugin.testing.fakenvml.nvml import FakeNvml


def uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-0000-0000-000000000000"


def gpu_file(count: int, topology_yaml: str) -> str:
    gpus = "".join(f"  - uuid: {uuid(i)}\n" for i in range(count))
    return f"gpus:\n{gpus}topology:\n{topology_yaml}"


def started(tmp_path: Path, text: str) -> FakeNvml:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    nvml = FakeNvml(str(path))
    nvml.nvmlInit()
    return nvml


def test_constants_match_pynvml() -> None:
    for name in (
        "NVML_TOPOLOGY_INTERNAL",
        "NVML_TOPOLOGY_SINGLE",
        "NVML_TOPOLOGY_MULTIPLE",
        "NVML_TOPOLOGY_HOSTBRIDGE",
        "NVML_TOPOLOGY_NODE",
        "NVML_TOPOLOGY_SYSTEM",
        "NVML_NVLINK_MAX_LINKS",
        "NVML_FEATURE_DISABLED",
        "NVML_FEATURE_ENABLED",
    ):
        assert getattr(topology, name) == getattr(pynvml, name), name
        assert getattr(FakeNvml, name) == getattr(pynvml, name), name


def test_hgx_preset_every_pair_through_nvswitch(tmp_path: Path) -> None:
    nvml = started(tmp_path, gpu_file(8, "  preset: hgx-8-nvswitch\n"))
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[3]) == pynvml.NVML_TOPOLOGY_NODE
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[4]) == pynvml.NVML_TOPOLOGY_SYSTEM
    for link in range(18):
        assert nvml.nvmlDeviceGetNvLinkState(h[5], link) == pynvml.NVML_FEATURE_ENABLED
        assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h[5], link) == 2  # SWITCH
        bus = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[5], link).busId
        assert bus in topology.NVSWITCH_BUS_IDS
    assert nvml.nvmlDeviceGetNvLinkState(h[5], 18) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h[5], pynvml.NVML_NVLINK_MAX_LINKS)


def test_pcie_preset_two_bridges(tmp_path: Path) -> None:
    nvml = started(tmp_path, gpu_file(4, "  preset: pcie-4-nvlink-bridges\n"))
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    peer = nvml.nvmlDeviceGetPciInfo(h[1]).busId
    assert [nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], i).busId for i in range(12)] == [peer] * 12
    assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], 0) == 0  # GPU
    assert nvml.nvmlDeviceGetNvLinkState(h[0], 12) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 12)
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[2], h[3]) == pynvml.NVML_TOPOLOGY_NODE
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[1], h[2]) == pynvml.NVML_TOPOLOGY_SYSTEM


def test_no_topology_no_nvlink(tmp_path: Path) -> None:
    nvml = started(tmp_path, "gpus:\n" + "".join(f"  - uuid: {uuid(i)}\n" for i in range(2)))
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == pynvml.NVML_TOPOLOGY_SYSTEM
    with pytest.raises(nvml.NVMLError_NotSupported) as raised:
        nvml.nvmlDeviceGetNvLinkState(h[0], 0)
    assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_written_out_topology(tmp_path: Path) -> None:
    text = gpu_file(
        3,
        "  pcie_default: hostbridge\n"
        "  pcie:\n    - {gpus: [0, 2], level: single}\n"
        "  nvlink:\n    - {gpus: [1, 2], links: 2}\n",
    )
    nvml = started(tmp_path, text)
    h = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[2], h[0]) == pynvml.NVML_TOPOLOGY_SINGLE
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    assert nvml.nvmlDeviceGetNvLinkState(h[2], 1) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetNvLinkState(h[2], 2) == pynvml.NVML_FEATURE_DISABLED


@pytest.mark.parametrize(
    ("count", "section", "message"),
    [
        (4, "  preset: hgx-8-nvswitch\n", "describes 8 GPUs, the file has 4"),
        (8, "  preset: dgx\n", "preset must be one of"),
        (2, "  pcie:\n    - {gpus: [0, 5], level: node}\n", "GPU index 5 is not in 0..1"),
        (2, "  pcie:\n    - {gpus: [0, 1], level: near}\n", "level must be one of"),
        (2, "  nvlink:\n    - {gpus: [0, 0], links: 1}\n", "two different GPUs"),
        (2, "  nvlink:\n    - {gpus: [0, 1], links: 19}\n", "'links' must be an integer 1..18"),
        (
            2,
            "  nvlink:\n    - {gpus: [0, 1], links: 10}\n  nvswitch: {gpus: [0], links: 10}\n",
            "GPU 0 has 20 NVLink lanes, at most 18",
        ),
        (2, "  links: []\n", "unknown key 'links'"),
    ],
)
def test_invalid_topology(count: int, section: str, message: str) -> None:
    with pytest.raises(FakeGpuFileError, match=message):
        parse_fake_gpus(gpu_file(count, section), "f.yaml")
