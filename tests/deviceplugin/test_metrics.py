"""The node collector over the fake NVML: HAMi's hami_host_gpu_* exactly, plus health and slots."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.metrics_core import Metric

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.hamicore import inspect_hamicore
from hami_plugin.deviceplugin.inventory import PhysicalGpu, VgpuDevice
from hami_plugin.deviceplugin.metrics import (
    HAMICORE_READY,
    NodeCollector,
    NodePods,
    booked_slots,
    monitor_device_type,
)
from hami_plugin.deviceplugin.nvml import GpuUsage, NvmlBackend
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.testing.fakenvml import errors
from hami_plugin.testing.fakenvml.nvml import FakeNvml
from hami_plugin.testing.hamicore import install_fake_hamicore
from tests.deviceplugin.records import KEYS, signed

NODE = "gpu-node-1"
GPU_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
GIB = 1 << 30

GPUS_YAML = f"""
gpus:
  - uuid: {GPU_A}
    name: NVIDIA A100-SXM4-80GB
    memory_mib: 81920
    memory_used_mib: 2048
    utilization_percent: 37
    memory_utilization_percent: 12
  - uuid: {GPU_B}
    name: Tesla T4
    memory_mib: 15360
    utilization_percent: 90
"""


def write(path: Path, text: str) -> None:
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    os.replace(aside, path)


def physical(uuid: str, index: int, name: str) -> PhysicalGpu:
    return PhysicalGpu(uuid, index, name, 1024, 0, False, f"00000000:1{index}:00.0", index)


INVENTORY = (physical(GPU_A, 0, "NVIDIA A100-SXM4-80GB"), physical(GPU_B, 1, "Tesla T4"))


def slots(uuid: str, count: int, healthy: bool = True) -> list[VgpuDevice]:
    return [VgpuDevice(f"{uuid}-{i}", uuid, healthy, None) for i in range(count)]


def pod_info(
    name: str,
    entries: Sequence[Sequence[ContainerDevice]],
    *,
    node: str = NODE,
    phase: str = "Running",
    init_containers: int = 0,
    raw: str | None = None,
) -> PodInfo:
    value = raw if raw is not None else codec.encode_pod_devices(tuple(tuple(e) for e in entries))
    count = max(len(entries) - init_containers, 0)
    return PodInfo(
        namespace="default",
        name=name,
        uid=f"uid-{name}",
        phase=phase,
        node_name=node,
        annotations={ANNOTATION_DEVICES_ALLOCATED: value, ANNOTATION_VGPU_NODE: node},
        labels={},
        init_containers=tuple(ContainerSpec(f"init-{i}") for i in range(init_containers)),
        containers=tuple(ContainerSpec(f"c-{i}") for i in range(count)),
        resource_version="1",
        creation_timestamp=None,
    )


def dev(uuid: str, mem: int = 1000, cores: int = 10) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


@pytest.fixture
def gpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.yaml"
    write(path, GPUS_YAML)
    return path


@pytest.fixture
def backend(gpus_file: Path) -> NvmlBackend:
    nvml = NvmlBackend(FakeNvml(str(gpus_file)))
    nvml.start()
    return nvml


def families_of(collector: NodeCollector) -> dict[str, Metric]:
    return {family.name: family for family in collector.collect()}


def series(family: Metric) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def host(
    index: int, uuid: str, device_type: str, *, zone: bool = True, node: bool = True
) -> tuple[tuple[str, str], ...]:
    labels = {"device_index": str(index), "device_uuid": uuid, "device_type": device_type}
    if node:
        labels["node"] = NODE
    if zone:
        labels["zone"] = "vGPU"
    return tuple(sorted(labels.items()))


A100 = "NVIDIA-NVIDIA A100-SXM4-80GB"
T4 = "NVIDIA-Tesla T4"


def collector(
    backend: NvmlBackend,
    devices: Sequence[VgpuDevice] = (),
    pods: Sequence[PodInfo] | None = (),
) -> NodeCollector:
    return NodeCollector(
        NODE,
        read_usage=backend.read_usage,
        gpus=lambda: INVENTORY,
        devices=lambda: devices,
        pods=None if pods is None else (lambda: pods),
    )


# --- HAMi's names, labels and values -----------------------------------------------------------


def test_device_type_is_always_prefixed_as_hamis_monitor_does() -> None:
    # cmd/vGPUmonitor/metrics.go (v2.10): deviceName = "NVIDIA-" + deviceName, unconditionally.
    assert monitor_device_type("NVIDIA A100-SXM4-80GB") == A100
    assert monitor_device_type("Tesla T4") == T4


def test_host_gpu_series_as_hami(backend: NvmlBackend) -> None:
    families = families_of(collector(backend))
    assert series(families["hami_host_gpu_memory_used_bytes"]) == {
        host(0, GPU_A, A100): 2 * GIB,
        host(1, GPU_B, T4): 0.0,
    }
    assert series(families["hami_host_gpu_utilization_ratio"]) == {
        host(0, GPU_A, A100): 37.0,
        host(1, GPU_B, T4): 90.0,
    }
    # HAMi gives the memory controller gauge no node label.
    assert series(families["hami_host_gpu_memory_controller_utilization_ratio"]) == {
        host(0, GPU_A, A100, node=False): 12.0,
        host(1, GPU_B, T4, node=False): 0.0,
    }
    for name in ("hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio"):
        assert families[name].type == "gauge"


def test_values_are_read_at_scrape_time(backend: NvmlBackend, gpus_file: Path) -> None:
    node = collector(backend)
    write(gpus_file, GPUS_YAML.replace("memory_used_mib: 2048", "memory_used_mib: 4096"))
    used = series(families_of(node)["hami_host_gpu_memory_used_bytes"])
    assert used[host(0, GPU_A, A100)] == 4 * GIB


def test_a_figure_nvml_cannot_report_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write(path, f"gpus:\n  - {{uuid: {GPU_A}, memory_mib: null, utilization_percent: null}}\n")
    nvml = NvmlBackend(FakeNvml(str(path)))
    nvml.start()
    families = families_of(collector(nvml))
    assert families["hami_host_gpu_memory_used_bytes"].samples == []
    assert families["hami_host_gpu_utilization_ratio"].samples == []


def test_a_lost_gpu_is_skipped_and_the_others_still_reported(
    backend: NvmlBackend, gpus_file: Path
) -> None:
    write(gpus_file, GPUS_YAML.replace("name: Tesla T4", "name: Tesla T4\n    healthy: false"))
    used = series(families_of(collector(backend))["hami_host_gpu_memory_used_bytes"])
    assert list(used) == [host(0, GPU_A, A100)]


def test_nvml_failing_as_a_whole_leaves_out_only_host_usage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> list[GpuUsage]:
        raise errors.NVMLError_Unknown()

    node = NodeCollector(
        NODE, read_usage=broken, gpus=lambda: INVENTORY, devices=lambda: slots(GPU_A, 2)
    )
    with caplog.at_level(logging.DEBUG, logger="hami_plugin.deviceplugin.metrics"):
        for _ in range(3):
            families = families_of(node)
    assert families["hami_host_gpu_utilization_ratio"].samples == []
    assert series(families["hami_host_gpu_vgpu_slots"]) == {host(0, GPU_A, A100, zone=False): 2}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["GPU usage left out of the metrics: Unknown Error"]


# --- health and slots (not in HAMi) ---------------------------------------------------------------


def test_health_and_slots_follow_what_kubelet_is_told(backend: NvmlBackend) -> None:
    devices = [*slots(GPU_A, 4), *slots(GPU_B, 4, healthy=False)]
    families = families_of(collector(backend, devices))
    assert series(families["hami_host_gpu_healthy"]) == {
        host(0, GPU_A, A100, zone=False): 1,
        host(1, GPU_B, T4, zone=False): 0,
    }
    assert series(families["hami_host_gpu_vgpu_slots"]) == {
        host(0, GPU_A, A100, zone=False): 4,
        host(1, GPU_B, T4, zone=False): 4,
    }


def test_allocated_slots_come_from_the_pods_bookings(backend: NvmlBackend) -> None:
    pods = [
        pod_info("two-containers", [[dev(GPU_A)], [dev(GPU_A), dev(GPU_B)]]),
        pod_info("one", [[dev(GPU_A)]]),
    ]
    families = families_of(collector(backend, [*slots(GPU_A, 4), *slots(GPU_B, 4)], pods))
    assert series(families["hami_host_gpu_vgpu_slots_allocated"]) == {
        host(0, GPU_A, A100, zone=False): 3,
        host(1, GPU_B, T4, zone=False): 1,
    }


def test_pods_failing_to_list_leave_out_only_allocated_slots(
    backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    def unreachable() -> list[PodInfo]:
        raise ConnectionError("API server unreachable")

    node = NodeCollector(
        NODE,
        read_usage=backend.read_usage,
        gpus=lambda: INVENTORY,
        devices=lambda: slots(GPU_A, 2),
        pods=unreachable,
    )
    families = families_of(node)
    assert families["hami_host_gpu_vgpu_slots_allocated"].samples == []
    assert series(families["hami_host_gpu_vgpu_slots"]) == {host(0, GPU_A, A100, zone=False): 2}
    assert "allocated vGPU slots left out of the metrics: API server unreachable" in caplog.text


def test_describe_names_every_family_without_reading(backend: NvmlBackend) -> None:
    def never() -> list[GpuUsage]:
        raise AssertionError("describe must not read NVML")

    node = NodeCollector(NODE, read_usage=never, gpus=lambda: (), devices=lambda: ())
    assert [family.name for family in node.describe()] == [
        family.name for family in collector(backend).collect()
    ]


@pytest.mark.parametrize("installed", [True, False])
def test_hami_core_readiness_is_read_at_scrape_time(
    backend: NvmlBackend, tmp_path: Path, installed: bool
) -> None:
    hook = tmp_path / "hook"
    if installed:
        install_fake_hamicore(hook)
    node = NodeCollector(
        NODE,
        read_usage=backend.read_usage,
        gpus=lambda: INVENTORY,
        devices=lambda: (),
        hamicore=lambda: inspect_hamicore(str(hook)),
    )
    assert series(families_of(node)[HAMICORE_READY]) == {(("node", NODE),): 1 if installed else 0}
    assert HAMICORE_READY in {family.name for family in node.describe()}
    install_fake_hamicore(hook)
    assert series(families_of(node)[HAMICORE_READY]) == {(("node", NODE),): 1}


# --- the slot-count rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (pod_info("app", [[dev(GPU_A)], [dev(GPU_A)]]), {GPU_A: 2}),
        # Init containers run one after another: their peak is one slot.
        (pod_info("init", [[dev(GPU_A)], [dev(GPU_A)], []], init_containers=2), {GPU_A: 1}),
        (pod_info("init+app", [[dev(GPU_A)], [dev(GPU_A)]], init_containers=1), {GPU_A: 1}),
        (pod_info("done", [[dev(GPU_A)]], phase="Succeeded"), {}),
        (pod_info("failed", [[dev(GPU_A)]], phase="Failed"), {}),
        (pod_info("pending", [[dev(GPU_A)]], phase="Pending"), {GPU_A: 1}),
        (pod_info("elsewhere", [[dev(GPU_A)]], node="other-node"), {}),
        (pod_info("garbled", [], raw="GPU-x,NVIDIA,notanumber,10:;"), {}),
    ],
    ids=lambda value: value.name if isinstance(value, PodInfo) else "",
)
def test_booked_slots_rule(pod: PodInfo, expected: dict[str, int]) -> None:
    assert booked_slots([pod], NODE) == expected


def test_a_pod_without_an_allocation_books_nothing() -> None:
    booked = pod_info("bare", [[dev(GPU_A)]])
    annotations = {k: v for k, v in booked.annotations.items() if k != ANNOTATION_DEVICES_ALLOCATED}
    bare = dataclasses.replace(booked, annotations=annotations)
    assert booked_slots([bare], NODE) == {}


def bound(pod: PodInfo) -> PodInfo:
    return dataclasses.replace(pod, annotations={**pod.annotations, ANNOTATION_BIND_TIME: "100"})


def test_with_a_key_only_signed_bookings_count(backend: NvmlBackend) -> None:
    tenant = signed(bound(pod_info("tenant", [[dev(GPU_A)]])))
    forged = bound(pod_info("forged", [[dev(GPU_A), dev(GPU_B)], [dev(GPU_B)]]))
    copied = dataclasses.replace(tenant, name="copied", uid="uid-copied")
    pods = [tenant, forged, copied]
    assert booked_slots(pods, NODE) == {GPU_A: 3, GPU_B: 2}  # without a key: as HAMi counts
    assert booked_slots(pods, NODE, KEYS) == {GPU_A: 1}
    node = NodeCollector(
        NODE,
        read_usage=backend.read_usage,
        gpus=lambda: INVENTORY,
        devices=lambda: [*slots(GPU_A, 4), *slots(GPU_B, 4)],
        pods=lambda: pods,
        booking_keys=lambda: KEYS,
    )
    assert series(families_of(node)["hami_host_gpu_vgpu_slots_allocated"]) == {
        host(0, GPU_A, A100, zone=False): 1,
        host(1, GPU_B, T4, zone=False): 0,
    }


@given(
    st.lists(
        st.lists(st.lists(st.sampled_from([GPU_A, GPU_B]), max_size=2), min_size=1, max_size=4),
        max_size=5,
    )
)
def test_app_containers_book_one_slot_per_entry(pods: list[list[list[str]]]) -> None:
    records = [
        pod_info(f"p{i}", [[dev(uuid) for uuid in container] for container in containers])
        for i, containers in enumerate(pods)
    ]
    expected: dict[str, int] = {}
    for containers in pods:
        uuids = [uuid for container in containers for uuid in container]
        for uuid in set(uuids):
            expected[uuid] = expected.get(uuid, 0) + uuids.count(uuid)
    assert booked_slots(records, NODE) == expected


# --- one pod list per scrape ---------------------------------------------------------------------


def test_node_pods_lists_at_most_once_per_max_age() -> None:
    clock = ManualClock()
    calls: list[float] = []

    def list_pods() -> list[PodInfo]:
        calls.append(clock.monotonic())
        return [pod_info(f"p{len(calls)}", [[dev(GPU_A)]])]

    pods = NodePods(list_pods, max_age_seconds=5, clock=clock)
    start = clock.monotonic()
    first = pods()
    clock.advance(4.5)
    assert pods() is first
    clock.advance(0.5)
    assert [p.name for p in pods()] == ["p2"]
    assert calls == [start, start + 5.0]


def test_node_pods_retries_after_a_failed_list() -> None:
    outcomes: list[BaseException | list[PodInfo]] = [ConnectionError("down"), []]

    def list_pods() -> list[PodInfo]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    pods = NodePods(list_pods, max_age_seconds=60, clock=ManualClock())
    with pytest.raises(ConnectionError):
        pods()
    assert pods() == ()


def test_node_pods_from_kube_bounds_the_list_with_the_clients_deadline() -> None:
    budgets: list[float] = []

    class Client:
        def deadline(self, seconds: float) -> object:
            budgets.append(seconds)
            return contextlib.nullcontext()

        def list_pods_on_node(self, node: str) -> list[PodInfo]:
            assert node == NODE
            return []

    assert NodePods.from_kube(Client(), NODE, timeout_seconds=2.5)() == ()
    assert budgets == [2.5]
