"""`tests/benchmarks/bench_placement.py` (issue 18's topology-aware and MIG phases of `make
bench`): both phases run at a tiny size and print lines whose counts add up, `--phase` picks
one, and the clusters they build are what the benchmark says they are (pair scores measured
through the fake NVML presets, MIG GPUs registered with the A100-80GB profiles and booked with
placements that never overlap). Nothing here is timed."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.scheduler.mig import placements_overlap
from tests.benchmarks import bench_placement as bench

TINY = ["--nodes", "8", "--decisions", "6", "--full-decisions", "2"]


def lines(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    assert bench.main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_both_phases_run_and_their_counts_add_up(capsys: pytest.CaptureFixture[str]) -> None:
    rows = lines(capsys, TINY)
    topology = [row for row in rows if row["phase"] == "topology"]
    mig = [row for row in rows if row["phase"] == "mig"]
    assert len(topology) == 6  # (topology-aware, default policy) x (binpack, spread, full)
    assert len(mig) == 9  # (no mode, mig, hami-core) x (binpack, spread, full)
    for row in rows:
        assert row["nodes"] == 8
        assert 0 <= row["placed"] <= row["decisions"]
        assert row["p50_ms"] <= row["p99_ms"]
        if row["decide"] == "full":
            assert row["decisions"] == 2
            assert row["nodes_fitted_max"] == 8  # every node fitted
        else:
            assert row["decisions"] == 6
    for row in topology:
        kinds = ("hgx_placed", "pcie8_placed", "pcie4_placed")
        assert sum(row.get(kind, 0) for kind in kinds) == row["placed"]
        assert row.get("hgx_one_cpu", 0) <= row.get("hgx_placed", 0)
    for row in mig:
        assert row["placed_mig"] + row["placed_hami_core"] == row["placed"]  # 1 GPU each
        if row["pod"] == "1gpu-vgpu-mode-mig":
            assert row["placed_hami_core"] == 0
        if row["pod"] == "1gpu-vgpu-mode-hami-core":
            assert row["placed_mig"] == 0
        profiles = sum(v for k, v in row.items() if k.startswith("profile_"))
        assert profiles <= row["placed_mig"]  # one MIG instance per pod placed on MIG
        if row["placed"] < row["decisions"]:
            assert row["failure_reasons"]  # a pod left out says why
    assert mig[0]["tracked_pods"] == mig[0]["mig_pods"] + mig[0]["hami_core_pods"]
    assert mig[0]["mig_pods"] > 0


def test_the_phase_flag_runs_one_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert {row["phase"] for row in lines(capsys, [*TINY, "--phase", "mig"])} == {"mig"}
    assert {row["phase"] for row in lines(capsys, [*TINY, "--phase", "topology"])} == {"topology"}


def test_topology_nodes_carry_the_scores_the_presets_measure() -> None:
    ledger, names = bench.build_topology_cluster(4, random.Random(1))
    assert names == ["node-00000", "node-00001", "node-00002", "node-00003"]
    hgx, pcie8, pcie4 = (ledger.node(names[i]) for i in (0, 2, 3))
    assert hgx is not None and pcie8 is not None and pcie4 is not None
    assert len(hgx.devices) == 8 and len(pcie8.devices) == 8 and len(pcie4.devices) == 4

    def score(usage: Any, node: int, a: int, b: int) -> int:
        return int(usage.pair_scores[bench.gpu_uuid(node, a)][bench.gpu_uuid(node, b)])

    # NV18 through the NVSwitches (1,800) plus the PCIe level: same CPU 20, across 10
    assert score(hgx, 0, 0, 3) == 1820 and score(hgx, 0, 0, 4) == 1810
    # NV12 bridge (1,200) + same CPU (20); no bridge: same CPU 20, across CPUs 10
    assert score(pcie8, 2, 6, 7) == 1220 and score(pcie8, 2, 5, 6) == 20
    assert score(pcie8, 2, 1, 5) == 10
    assert score(pcie4, 3, 2, 3) == 1220 and score(pcie4, 3, 1, 2) == 10
    assert [d.numa_node for d in pcie4.devices] == [0, 0, 1, 1]


def test_mig_nodes_register_mixed_modes_and_book_the_running_pods() -> None:
    ledger, names, modes, counts = bench.build_mig_cluster(4, random.Random(3))
    usage = ledger.node(names[0])
    assert usage is not None
    assert [d.mode for d in usage.devices] == ["mig"] * 4 + ["hami-core"] * 4
    assert usage.devices[0].mig_profiles == bench.A100_80GB_PROFILES  # through the codec
    assert usage.devices[0].split_count == 7
    assert modes[bench.gpu_uuid(3, 4)] == "hami-core"
    assert ledger.pod_count == counts["mig_pods"] + counts["hami_core_pods"]
    assert counts["hami_core_pods"] == 4 * 4
    for name in names:  # every MIG reservation matches its pod's devices: no GPU marked bad
        node = ledger.node(name)
        assert node is not None and all(device.healthy for device in node.devices)
    odd = ledger.node(names[1])
    assert odd is not None and sum(odd.used[:4]) == 0  # only even nodes run MIG pods


@given(seed=st.integers(0, 2**32), wanted=st.integers(0, 8))
def test_booked_mig_instances_never_overlap(seed: int, wanted: int) -> None:
    placed = bench.mig_instances(random.Random(seed), wanted)
    assert len(placed) <= wanted
    for profile, placement in placed:
        assert placement in profile.placements
    spots = [placement for _, placement in placed]
    for i, first in enumerate(spots):
        for second in spots[i + 1 :]:
            assert not placements_overlap(first, second)
