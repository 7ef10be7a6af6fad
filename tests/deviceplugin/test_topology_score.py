"""GPU pair links measured through (fake) NVML and scored as HAMi v2.10 does.

Tables ported from HAMi v2.10 `pkg/device/nvidia/calculate_score_test.go`
(`Test_calculateGPUScore` "nvlink test", `Test_calculateGPUPairScore_asymmetric`) and
`links_test.go` (`Test_nvlinkCountToType`, `Test_countMatchingLinks` via `bus_id`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.topology import TopologyError, bus_id, measure_links
from hami_plugin.protocol.topology import (
    DeviceScore,
    GpuLinks,
    P2PLinkType,
    PairScoreError,
    calculate_gpu_scores,
    decode_pair_scores,
    encode_pair_scores,
    nvlink_type,
    pair_score,
)
from hami_plugin.testing.fakenvml.nvml import FakeNvml

NV1 = nvlink_type(1)
NV2 = nvlink_type(2)


@pytest.mark.parametrize(
    ("lanes", "want"),
    [(-1, 0), (0, 0), *((n, 6 + n) for n in range(1, 19)), (19, 0), (100, 0)],
)
def test_nvlink_count_to_type(lanes: int, want: int) -> None:
    """links_test.go Test_nvlinkCountToType: 1..18 lanes map to Single..EighteenNVLINKLinks."""
    assert nvlink_type(lanes) == want


def test_hami_nvlink_table() -> None:
    """calculate_score_test.go Test_calculateGPUScore "nvlink test"."""
    gpus = [
        GpuLinks("gpu0", 0, {1: [NV1], 2: [NV1], 3: [NV2]}),
        GpuLinks("gpu1", 1, {0: [NV1], 2: [NV2], 3: [NV1]}),
        GpuLinks("gpu2", 2, {0: [NV1], 1: [NV2], 3: [NV2]}),
        GpuLinks("gpu3", 3, {0: [NV2], 1: [NV1], 2: [NV2]}),
    ]
    scores, asymmetric = calculate_gpu_scores(gpus)
    assert not asymmetric
    assert scores == [
        DeviceScore("gpu0", {"gpu1": 100, "gpu2": 100, "gpu3": 200}),
        DeviceScore("gpu1", {"gpu0": 100, "gpu2": 200, "gpu3": 100}),
        DeviceScore("gpu2", {"gpu0": 100, "gpu1": 200, "gpu3": 200}),
        DeviceScore("gpu3", {"gpu0": 200, "gpu1": 100, "gpu2": 200}),
    ]


def test_hami_asymmetric_pair_scores_zero() -> None:
    """calculate_score_test.go Test_calculateGPUPairScore_asymmetric."""
    gpu0 = GpuLinks("gpu0", 0, {1: [P2PLinkType.SAME_CPU, nvlink_type(4)]})
    gpu1 = GpuLinks("gpu1", 1, {0: [P2PLinkType.SAME_CPU]})
    assert pair_score(gpu0, gpu1) == (0, True)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        (b"00000000:3B:00.0\x00\x00", "0000:3b:00.0"),
        ("0000", "0000"),
        ("0000:C0:00.0", ":c0:00.0"),
    ],
)
def test_bus_id(raw: str | bytes, want: str) -> None:
    """links.go PciInfo.BusID: lower-cased, cut at NUL, one leading "0000" dropped."""
    assert bus_id(raw) == want


def fake(tmp_path: Path, count: int, preset: str) -> tuple[FakeNvml, list[str]]:
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(count)]
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n" + "".join(f"  - uuid: {u}\n" for u in uuids) + f"topology:\n  preset: {preset}\n"
    )
    nvml = FakeNvml(str(path))
    nvml.nvmlInit()
    return nvml, uuids


def test_hgx_scores(tmp_path: Path) -> None:
    """NVSwitch lanes count as min(18, 18) -> EighteenNVLINKLinks (1800) plus the PCIe level."""
    nvml, uuids = fake(tmp_path, 8, "hgx-8-nvswitch")
    scores, asymmetric = calculate_gpu_scores(measure_links(nvml, uuids))
    assert not asymmetric
    assert scores[0].scores[uuids[1]] == 1800 + 20
    assert scores[0].scores[uuids[7]] == 1800 + 10
    assert scores[6].scores[uuids[5]] == 1820
    assert len(scores) == 8 and all(len(s.scores) == 7 for s in scores)


def test_pcie_bridge_scores(tmp_path: Path) -> None:
    """Bridged pairs: 12 direct lanes (1200) + same CPU (20); others cross CPU (10)."""
    nvml, uuids = fake(tmp_path, 4, "pcie-4-nvlink-bridges")
    scores, _ = calculate_gpu_scores(measure_links(nvml, uuids))
    by_uuid = {s.uuid: s.scores for s in scores}
    assert by_uuid[uuids[0]] == {uuids[1]: 1220, uuids[2]: 10, uuids[3]: 10}
    assert by_uuid[uuids[3]] == {uuids[0]: 10, uuids[1]: 10, uuids[2]: 1220}


def test_filter_keeps_requested_order_and_rejects_unknown(tmp_path: Path) -> None:
    nvml, uuids = fake(tmp_path, 4, "pcie-4-nvlink-bridges")
    links = measure_links(nvml, [uuids[2], uuids[0]])
    assert [(g.uuid, g.index) for g in links] == [(uuids[2], 2), (uuids[0], 0)]
    with pytest.raises(TopologyError, match="no device with uuid: GPU-x"):
        measure_links(nvml, ["GPU-x"])


def test_annotation_format_is_go_json() -> None:
    value = encode_pair_scores([DeviceScore("gpu0", {"gpu2": 10, "gpu1": 1220})])
    assert value == '[{"uuid":"gpu0","score":{"gpu1":1220,"gpu2":10}}]'
    assert decode_pair_scores(value) == {"gpu0": {"gpu1": 1220, "gpu2": 10}}


@pytest.mark.parametrize(
    "value", ["", "{", '{"uuid":"a"}', '[{"uuid":"a","score":{"b":"x"}}]', "[1]"]
)
def test_annotation_decode_errors(value: str) -> None:
    with pytest.raises(PairScoreError):
        decode_pair_scores(value)


def test_annotation_decode_first_entry_wins() -> None:
    value = json.dumps([{"uuid": "a", "score": {"b": 1}}, {"uuid": "a", "score": {"b": 2}}])
    assert decode_pair_scores(value) == {"a": {"b": 1}}
    assert decode_pair_scores("null") == {}
