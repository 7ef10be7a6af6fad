"""The scheduler's metrics over a real Ledger behind a fake view, scraped over real HTTP.

`LedgerView` and `sample_view` are reused by the Prometheus end-to-end and dashboard tests
(until the `hami scheduler` daemon serves these itself).
"""

from __future__ import annotations

import inspect
import threading
import urllib.request
from collections.abc import Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.extender.metrics import SchedulerMetrics, SchedulerUsageCollector
from hami_plugin.extender.observer import SchedulerObserver
from hami_plugin.metrics.server import MetricsServerError
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    GpuDevice,
    OperatingMode,
)
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.scheduler.ledger import Ledger, TrackedPod
from hami_plugin.scheduler.usage import NodeUsage
from hami_plugin.testing.apiserver import make_container, make_pod

NODE = "gpu-node-1"
GPU_0 = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_1 = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
MIB = 1 << 20

Series = dict[tuple[tuple[str, str], ...], float]


class LedgerView:
    """A SchedulerView over a real Ledger, as the extender's state offers it."""

    def __init__(self, ledger: Ledger, *, leader: bool = True) -> None:
        self.ledger = ledger
        self.leader = leader
        self.lock = threading.Lock()

    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        with self.lock:
            return self.ledger.usages(), self.ledger.tracked_pods()

    def is_leader(self) -> bool:
        return self.leader


def gpu(uuid: str, index: int, memory_mib: int, gpu_type: str) -> GpuDevice:
    return GpuDevice(uuid, index, 10, memory_mib, 100, gpu_type, 0, OperatingMode.HAMI_CORE, True)


def booked_pod(name: str, entries: tuple[tuple[ContainerDevice, ...], ...]) -> PodInfo:
    return read_pod(
        make_pod(
            name,
            node_name=NODE,
            phase="Running",
            annotations={
                ANNOTATION_VGPU_NODE: NODE,
                ANNOTATION_DEVICES_ALLOCATED: codec.encode_pod_devices(entries),
            },
            containers=[make_container(f"c{i}") for i in range(len(entries))],
        )
    )


def sample_view() -> LedgerView:
    """One node with an A100 and a T4; pod `trainer` books 2 x (4000 MiB, 30 %) on the A100
    from two containers and `notebook` 1000 MiB, 10 % on the T4."""
    ledger = Ledger()
    ledger.set_node(
        NODE,
        [gpu(GPU_0, 0, 81920, "NVIDIA A100-SXM4-80GB"), gpu(GPU_1, 1, 15360, "NVIDIA-Tesla T4")],
    )
    ledger.update_pod(
        booked_pod(
            "trainer",
            (
                (ContainerDevice(GPU_0, "NVIDIA", 4000, 30),),
                (ContainerDevice(GPU_0, "NVIDIA", 4000, 30),),
            ),
        )
    )
    ledger.update_pod(booked_pod("notebook", ((ContainerDevice(GPU_1, "NVIDIA", 1000, 10),),)))
    return LedgerView(ledger)


def families_of(view: LedgerView) -> dict[str, Series]:
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in SchedulerUsageCollector(view).collect()
    }


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**pairs, "zone": "vGPU"}.items()))


A100 = {"node": NODE, "device_uuid": GPU_0, "device_index": "0"}
T4 = {"node": NODE, "device_uuid": GPU_1, "device_index": "1"}


# --- HAMi's gauges ------------------------------------------------------------------------------


def test_gpu_gauges_as_hami() -> None:
    families = families_of(sample_view())
    a100 = labels(**A100, device_type="NVIDIA A100-SXM4-80GB")
    t4 = labels(**T4, device_type="NVIDIA-Tesla T4")
    assert families["hami_gpu_memory_limit_bytes"] == {a100: 81920 * MIB, t4: 15360 * MIB}
    assert families["hami_gpu_core_limit_ratio"] == {a100: 100, t4: 100}
    assert families["hami_gpu_shared_count"] == {a100: 2, t4: 1}
    assert families["hami_gpu_core_allocated_ratio"] == {a100: 60, t4: 10}
    assert families["hami_node_gpu_memory_allocated_ratio"] == {
        a100: 8000 / 81920,
        t4: 1000 / 15360,
    }
    assert families["hami_gpu_memory_allocated_bytes"] == {
        labels(**A100, device_cores="100", device_type="NVIDIA A100-SXM4-80GB"): 8000 * MIB,
        labels(**T4, device_cores="100", device_type="NVIDIA-Tesla T4"): 1000 * MIB,
    }
    assert families["hami_node_gpu_overview"] == {
        labels(
            **A100,
            device_cores="100",
            device_memory_limit="81920",
            device_type="NVIDIA A100-SXM4-80GB",
        ): 8000 * MIB,
        labels(
            **T4, device_cores="100", device_memory_limit="15360", device_type="NVIDIA-Tesla T4"
        ): 1000 * MIB,
    }


def test_pod_gauges_as_hami_collapsed_to_container_index_0() -> None:
    families = families_of(sample_view())
    trainer = labels(
        namespace="default", node=NODE, pod="trainer", container_index="0", device_uuid=GPU_0
    )
    notebook = labels(
        namespace="default", node=NODE, pod="notebook", container_index="0", device_uuid=GPU_1
    )
    assert families["hami_vgpu_memory_allocated_bytes"] == {
        trainer: 8000 * MIB,
        notebook: 1000 * MIB,
    }
    assert families["hami_vgpu_core_allocated_ratio"] == {trainer: 60, notebook: 10}


def test_gauges_follow_the_ledger_at_scrape_time() -> None:
    view = sample_view()
    collector = SchedulerUsageCollector(view)
    view.ledger.delete_pod("default/trainer")
    view.leader = False
    families = {family.name: family for family in collector.collect()}
    assert [s.value for s in families["hami_gpu_shared_count"].samples] == [0, 1]
    assert [s.labels["pod"] for s in families["hami_vgpu_memory_allocated_bytes"].samples] == [
        "notebook"
    ]
    assert [s.value for s in families["hami_scheduler_leader"].samples] == [0]


def test_a_gpu_with_no_memory_has_no_ratio() -> None:
    ledger = Ledger()
    ledger.set_node(NODE, [gpu(GPU_0, 0, 0, "NVIDIA-Tesla T4")])
    families = families_of(LedgerView(ledger))
    assert families["hami_node_gpu_memory_allocated_ratio"] == {}
    assert len(families["hami_gpu_memory_limit_bytes"]) == 1


def test_quota_gauges_are_not_usage_gauges() -> None:
    names = {family.name for family in SchedulerUsageCollector(sample_view()).describe()}
    assert not names & {"hami_resource_quota_used", "hami_resource_quota_limit"}
    assert "hami_node_gpu_mig_instance_info" in names  # tests/extender/test_mig_metrics.py


# --- the observer, over real HTTP -----------------------------------------------------------


def scrape(url: str) -> dict[str, Series]:
    """Samples by sample name (a histogram's `_bucket`, `_count`, `_sum` apart), then labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def sample(families: dict[str, Series], name: str, **pairs: str) -> float:
    return families[name][tuple(sorted(pairs.items()))]


def test_is_a_scheduler_observer() -> None:
    # mypy checks the assignment; at run time: every event of the protocol, with its
    # parameters, and an event through the protocol reaches the registry
    metrics = SchedulerMetrics(sample_view())
    observer: SchedulerObserver = metrics
    events = [name for name in vars(SchedulerObserver) if not name.startswith("_")]
    assert "leader_changed" in events
    for name in events:
        _self, *parameters = inspect.signature(getattr(SchedulerObserver, name)).parameters
        assert list(inspect.signature(getattr(metrics, name)).parameters) == parameters, name
    observer.leader_changed(True)
    changes = "hami_scheduler_leadership_changes_total"
    assert metrics.registry.get_sample_value(changes, {"to": "leader"}) == 1
    assert metrics.registry.get_sample_value(changes, {"to": "follower"}) == 0


def test_observer_events_over_http() -> None:
    metrics = SchedulerMetrics(sample_view())
    metrics.filter_done(0.003, "fit")
    metrics.filter_done(0.02, "no_fit")
    metrics.filter_failures({"CardInsufficientMemory": 3, "NodeUnregistered": 1})
    metrics.filter_failures({"CardInsufficientMemory": 2})
    metrics.bind_done(0.2, True)
    metrics.bind_done(1.5, False)
    metrics.bind_waited(4.0)
    metrics.booking_expired()
    metrics.pod_recovered("allocation_timeout")
    metrics.leader_changed(True)
    server = metrics.serve("127.0.0.1:0")
    assert server is not None
    with server:
        families = scrape(server.url)

    filter_count = "hami_scheduler_filter_duration_seconds_count"
    assert sample(families, filter_count, outcome="fit") == 1
    assert sample(families, filter_count, outcome="no_fit") == 1
    assert sample(families, filter_count, outcome="error") == 0  # known outcomes start at 0
    assert sample(
        families, "hami_scheduler_filter_duration_seconds_bucket", outcome="fit", le="0.005"
    ) == (1)
    failures = "hami_scheduler_filter_failures_total"
    assert sample(families, failures, reason="CardInsufficientMemory") == 5
    assert sample(families, failures, reason="NodeUnregistered") == 1
    assert sample(families, "hami_scheduler_bind_duration_seconds_count", outcome="ok") == 1
    assert sample(families, "hami_scheduler_bind_duration_seconds_sum", outcome="error") == 1.5
    assert sample(families, "hami_scheduler_bind_wait_seconds_bucket", le="5.0") == 1
    assert sample(families, "hami_scheduler_bind_wait_seconds_bucket", le="2.5") == 0
    assert sample(families, "hami_scheduler_bookings_expired_total") == 1
    recovered = "hami_scheduler_pods_recovered_total"
    assert sample(families, recovered, reason="allocation_timeout") == 1
    assert sample(families, recovered, reason="owner_gone") == 0
    assert sample(families, "hami_scheduler_leadership_changes_total", to="leader") == 1
    assert sample(families, "hami_scheduler_leader") == 1
    assert sample(families, "hami_scrape_collector_success", collector="scheduler") == 1
    assert families["hami_gpu_shared_count"]  # the usage gauges are on the same endpoint


def test_serve_zero_is_off_and_a_bad_address_raises() -> None:
    metrics = SchedulerMetrics(sample_view())
    assert metrics.serve("0") is None
    with pytest.raises(MetricsServerError, match="--metrics-bind-address"):
        metrics.serve("nonsense")


def test_a_view_that_fails_does_not_fail_the_scrape() -> None:
    class Broken(LedgerView):
        def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
            raise RuntimeError("state torn down")

    metrics = SchedulerMetrics(Broken(Ledger()))
    metrics.bind_done(0.1, True)
    server = metrics.serve("127.0.0.1:0")
    assert server is not None
    with server:
        families = scrape(server.url)
    assert sample(families, "hami_scrape_collector_success", collector="scheduler") == 0
    assert sample(families, "hami_scheduler_bind_duration_seconds_count", outcome="ok") == 1
