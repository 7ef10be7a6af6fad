"""The per-container collector's exposition, parsed with Prometheus' text parser."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner
from hami_plugin.deviceplugin.monitor.vgpu import FAMILIES, VgpuCollector
from hami_plugin.protocol.hostpaths import containers_dir
from hami_plugin.protocol.objects import PodInfo
from tests.deviceplugin.monitor.helpers import NODE, pod, region_file
from tests.deviceplugin.monitor.region_writer import DeviceMemory, Proc, RegionSpec

UUID_A = "GPU-0b7e3d4c-1111-2222-3333-444455556666"
UUID_B = "GPU-9f00aa11-7777-8888-9999-aaaabbbbcccc"
BOTH = {"main": [UUID_A, UUID_B]}
NOW = 1_700_000_100.0
NAMES = {family.name for family in FAMILIES}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
RegistryFor = Callable[[list[PodInfo]], CollectorRegistry]


def two_gpus(version: int = 1, last_kernel_time: int = 1_700_000_000) -> RegionSpec:
    return RegionSpec(
        version=version,
        uuids=[UUID_A, UUID_B],
        limits=[3000 << 20, 5000 << 20],
        procs=[
            Proc(
                used=[DeviceMemory(10, 20, 30, 40, 100), DeviceMemory(1, 2, 3, 4, 10)],
                sm_util=[25, 5],
            ),
            Proc(used=[DeviceMemory(5, 6, 7, 8, 50)], sm_util=[10]),
        ],
        last_kernel_time=last_kernel_time,
    )


def scrape(registry: CollectorRegistry) -> Samples:
    text = generate_latest(registry).decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge"
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples
            samples[key] = sample.value
    return samples


def labels(
    container: str,
    index: int,
    uuid: str,
    pod_name: str = "train",
    namespace: str = "ml",
) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            {
                "namespace": namespace,
                "pod": pod_name,
                "container": container,
                "vdevice_index": str(index),
                "device_uuid": uuid,
                "zone": "vGPU",
            }.items()
        )
    )


@pytest.fixture
def registry_for(tmp_path: Path) -> Iterator[RegistryFor]:
    """A fresh registry with a VgpuCollector over tmp_path and these pods."""
    scanners: list[ContainerScanner] = []

    def build(pods: list[PodInfo]) -> CollectorRegistry:
        clock = ManualClock(datetime.fromtimestamp(NOW, UTC))
        scanner = ContainerScanner(containers_dir(str(tmp_path)), lambda: pods, clock=clock)
        scanners.append(scanner)
        registry = CollectorRegistry()
        registry.register(VgpuCollector(scanner, NODE, clock=clock))
        return registry

    yield build
    for scanner in scanners:
        scanner.close()


def test_every_gauge_with_hamis_labels_and_values(
    tmp_path: Path, registry_for: RegistryFor
) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus())
    samples = scrape(registry_for([pod("uid-1", "train", namespace="ml", booked=BOTH)]))
    first = labels("main", 0, UUID_A)
    second = labels("main", 1, UUID_B)
    assert samples == {
        ("hami_vgpu_memory_used_bytes", first): 150.0,
        ("hami_vgpu_memory_limit_bytes", first): float(3000 << 20),
        ("hami_container_device_memory_bytes", first): 150.0,
        ("hami_container_device_utilization_ratio", first): 35.0,
        ("hami_vgpu_memory_context_bytes", first): 15.0,
        ("hami_vgpu_memory_module_bytes", first): 26.0,
        ("hami_vgpu_memory_buffer_bytes", first): 37.0,
        ("hami_container_last_kernel_elapsed_seconds", first): 100.0,
        ("hami_vgpu_memory_used_bytes", second): 10.0,
        ("hami_vgpu_memory_limit_bytes", second): float(5000 << 20),
        ("hami_container_device_memory_bytes", second): 10.0,
        ("hami_container_device_utilization_ratio", second): 5.0,
        ("hami_vgpu_memory_context_bytes", second): 1.0,
        ("hami_vgpu_memory_module_bytes", second): 2.0,
        ("hami_vgpu_memory_buffer_bytes", second): 3.0,
        ("hami_container_last_kernel_elapsed_seconds", second): 100.0,
    }


@pytest.mark.parametrize(("version", "last_kernel_time"), [(0, 1_700_000_000), (1, 0), (1, -5)])
def test_last_kernel_only_when_known(
    tmp_path: Path,
    registry_for: RegistryFor,
    version: int,
    last_kernel_time: int,
) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus(version, last_kernel_time))
    samples = scrape(registry_for([pod("uid-1", "train", namespace="ml", booked=BOTH)]))
    names = {name for name, _ in samples}
    assert names == NAMES - {"hami_container_last_kernel_elapsed_seconds"}


def test_last_kernel_in_the_future_is_zero(tmp_path: Path, registry_for: RegistryFor) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus(1, int(NOW) + 60))
    samples = scrape(registry_for([pod("uid-1", "train", namespace="ml", booked=BOTH)]))
    key = ("hami_container_last_kernel_elapsed_seconds", labels("main", 0, UUID_A))
    assert samples[key] == 0.0


def test_only_this_nodes_pods_and_their_app_containers(
    tmp_path: Path, registry_for: RegistryFor
) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus())
    region_file(tmp_path, "uid-1", "init", two_gpus())  # init containers: HAMi skips them
    region_file(tmp_path, "uid-2", "main", two_gpus())  # labelled for another node
    region_file(tmp_path, "uid-3", "main", two_gpus())  # no vgpu-node label
    region_file(tmp_path, "uid-4", "main", two_gpus())  # no such pod
    region_file(tmp_path, "uid-1", "gone", two_gpus())  # no such container in the pod
    pods = [
        pod(
            "uid-1",
            "train",
            namespace="ml",
            init_containers=["init"],
            booked={"main": [UUID_A, UUID_B], "init": [UUID_A]},
        ),
        pod("uid-2", "b", node_label="other-node", booked=BOTH),
        pod("uid-3", "c", node_label=None, booked=BOTH),
    ]
    samples = scrape(registry_for(pods))
    assert {dict(key)["pod"] for _, key in samples} == {"train"}
    assert {dict(key)["container"] for _, key in samples} == {"main"}


def test_devices_without_a_usable_uuid_are_skipped(
    tmp_path: Path, registry_for: RegistryFor
) -> None:
    spec = two_gpus()
    spec.uuids = [b"\x00not-yet", UUID_B]
    region_file(tmp_path, "uid-1", "main", spec)
    samples = scrape(registry_for([pod("uid-1", "train", namespace="ml", booked=BOTH)]))
    assert {dict(key)["vdevice_index"] for _, key in samples} == {"1"}


def test_a_hostile_region_does_not_stop_the_scrape(
    tmp_path: Path, registry_for: RegistryFor
) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus())
    region_file(tmp_path, "uid-2", "main", RegionSpec(procnum=-3, uuids=[UUID_A]))
    pods = [pod("uid-1", "train", namespace="ml", booked=BOTH), pod("uid-2", "bad", booked=BOTH)]
    samples = scrape(registry_for(pods))
    assert {dict(key)["pod"] for _, key in samples} == {"train"}


def test_register_reads_nothing_and_names_clash(tmp_path: Path) -> None:
    class Exploding(ContainerScanner):
        def scan(self) -> list[object]:  # type: ignore[override]
            raise AssertionError("registration must not scan")

    registry = CollectorRegistry()
    scanner = Exploding(str(tmp_path), list)
    registry.register(VgpuCollector(scanner, NODE))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(VgpuCollector(scanner, NODE))


def test_over_real_http(tmp_path: Path, registry_for: RegistryFor) -> None:
    region_file(tmp_path, "uid-1", "main", two_gpus())
    registry = registry_for([pod("uid-1", "train", namespace="ml", booked=BOTH)])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    used = families["hami_vgpu_memory_used_bytes"]
    assert {s.labels["device_uuid"]: s.value for s in used.samples} == {
        UUID_A: 150.0,
        UUID_B: 10.0,
    }
