"""`hami schedule` on a snapshot with MIG-mode nodes (dynamic MIG): the reservation it writes,
existing pods' `hami.io/vgpu-mig-allocations` counted, and what `--explain` says about the
profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.cli import main
from hami_plugin.protocol.codec import encode_node_devices
from hami_plugin.protocol.model import GpuDevice, MigPlacement, MigProfile
from hami_plugin.testing.apiserver import make_container, make_node, make_pod

A100 = "NVIDIA-A100-SXM4-40GB"


def _p(start: int, size: int) -> MigPlacement:
    return MigPlacement(start, size)


PROFILES = (
    MigProfile("1g.5gb", 5120, 14, 1, tuple(_p(i, 1) for i in range(7))),
    MigProfile("2g.10gb", 10240, 28, 2, (_p(0, 2), _p(2, 2), _p(4, 2))),
    MigProfile("3g.20gb", 20480, 42, 3, (_p(0, 4), _p(4, 4))),
)


def node(
    name: str, mode: str = "mig", profiles: tuple[MigProfile, ...] = PROFILES
) -> dict[str, Any]:
    device = GpuDevice(
        f"GPU-{name}", 0, 7, 40960, 100, A100, 0, mode, True, profiles if mode == "mig" else ()
    )
    annotations = {"hami.io/node-nvidia-register": encode_node_devices([device])}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "7"}
    return make_node(name, annotations=annotations, allocatable=allocatable)


def gpu_pod(name: str, memory: int, *, annotations: dict[str, str] | None = None) -> Any:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory)}
    pod = make_pod(
        name,
        "default",
        annotations=annotations,
        containers=[make_container("main", limits=limits)],
        uid=f"uid-{name}",
    )
    return pod


def running(name: str, node_name: str, devices: str, mig: str) -> Any:
    pod = gpu_pod(
        name,
        20480,
        annotations={
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": devices,
            "hami.io/vgpu-mig-allocations": mig,
        },
    )
    pod["spec"]["nodeName"] = node_name
    pod["status"] = {"phase": "Running"}
    return pod


def write(path: Path, objects: list[Any]) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return str(path)


def schedule(
    capsys: pytest.CaptureFixture[str], snapshot: str, pod: str, *extra: str
) -> tuple[int, dict[str, Any], str]:
    code = main(["schedule", "--snapshot", snapshot, "--pod", pod, "--now", "1767225600", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else {}, captured.err


IN_USE = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"3g.20gb",'
    '"placement":{"start":4,"size":4},"migUUID":"MIG-x","gpuInstanceID":1,'
    '"computeInstanceID":0}]'
)


@pytest.fixture
def cluster(tmp_path: Path) -> str:
    return write(
        tmp_path / "cluster.yaml",
        [
            node("a"),
            node("b", mode="hami-core"),
            running("busy", "a", "GPU-a,NVIDIA,20480,42:;", IN_USE),
        ],
    )


def test_the_reservation_and_the_explain_lines(
    cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8000 MiB on GPU-a, whose slices 4-7 are in use: 1g.5gb is too small, 2g.10gb takes
    slices 0-1 (the 2g search starts low)."""
    pod = write(tmp_path / "pod.yaml", [gpu_pod("new", 8000)])
    code, output, err = schedule(capsys, cluster, pod, "--explain", "--nodes", "a")
    assert code == 0
    assert output["node"] == "a"
    assert output["annotations"]["hami.io/vgpu-mig-allocations"] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2}}]'
    )
    assert output["annotations"]["hami.io/vgpu-devices-allocated"] == "GPU-a,NVIDIA,10240,28:;"
    assert "GPU-a 10240MiB 28% MIG 2g.10gb slices 0-1" in err
    assert (
        "  MIG a main GPU-a: 2g.10gb at slices 0-1 for 8000 MiB; "
        "not 1g.5gb: too little memory (5120 < 8000 MiB)"
    ) in err.splitlines()


def test_a_smaller_profile_without_a_free_placement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU whose 1g.10gb has one placement, in use: 8000 MiB would fit it but gets the
    2g.20gb, and `--explain` says why not the 1g.10gb."""
    profiles = (
        MigProfile("1g.10gb", 10240, 14, 1, (_p(6, 1),)),
        MigProfile("2g.20gb", 20480, 28, 2, (_p(0, 2),)),
    )
    mig = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb",'
        '"placement":{"start":6,"size":1}}]'
    )
    snapshot = write(
        tmp_path / "cluster.yaml",
        [node("a", profiles=profiles), running("busy", "a", "GPU-a,NVIDIA,10240,14:;", mig)],
    )
    pod = write(tmp_path / "pod.yaml", [gpu_pod("new", 8000)])
    code, output, err = schedule(capsys, snapshot, pod, "--explain")
    assert code == 0
    assert output["annotations"]["hami.io/vgpu-mig-allocations"] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.20gb",'
        '"placement":{"start":0,"size":2}}]'
    )
    assert (
        "  MIG a main GPU-a: 2g.20gb at slices 0-1 for 8000 MiB; "
        "not 1g.10gb: no free placement (in use: slice 6)"
    ) in err.splitlines()


def test_a_node_without_a_profile_for_the_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 2g.10gb in use at slices 2-5: 16000 MiB passes the memory check (20480 MiB left)
    but both 3g.20gb placements overlap them; the hami-core node b mismatches the mode."""
    mig = ",".join(
        f'{{"containerIndex":0,"deviceIndex":{i},"gpuUUID":"GPU-a","profile":"2g.10gb",'
        f'"placement":{{"start":{start},"size":2}}}}'
        for i, start in enumerate([2, 4])
    )
    snapshot = write(
        tmp_path / "cluster.yaml",
        [
            node("a"),
            node("b", mode="hami-core"),
            running("busy", "a", "GPU-a,NVIDIA,20480,56:;", f"[{mig}]"),
        ],
    )
    wanted = gpu_pod("new", 16000, annotations={"nvidia.com/vgpu-mode": "mig"})
    pod = write(tmp_path / "pod.yaml", [wanted])
    code, output, err = schedule(capsys, snapshot, pod, "--explain")
    assert code == 2
    assert output["failedNodes"] == {
        "a": "1/1 CardMigTopologyInfeasible",
        "b": "1/1 CardTypeMismatch",
    }
    assert "hami.io/vgpu-mig-allocations" not in output["annotations"]
    assert (
        "  MIG a GPU-a: no profile for 16000 MiB: 1g.5gb: too little memory (5120 < 16000 MiB); "
        "2g.10gb: too little memory (10240 < 16000 MiB); "
        "3g.20gb: no free placement (in use: slices 2-3, slices 4-5)"
    ) in err.splitlines()


def test_a_reservation_without_its_device_marks_the_gpu_unhealthy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod booked on the MIG GPU without a reservation (scheduler.go:760-764): the GPU is
    unhealthy, as HAMi's getNodesUsage leaves it."""
    busy = running("busy", "a", "GPU-a,NVIDIA,5120,14:;", "")
    del busy["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"]
    snapshot = write(tmp_path / "cluster.yaml", [node("a"), busy])
    pod = write(tmp_path / "pod.yaml", [gpu_pod("new", 4000)])
    code, output, _ = schedule(capsys, snapshot, pod)
    assert code == 2
    assert output["failedNodes"] == {"a": "1/1 CardNotHealth"}
