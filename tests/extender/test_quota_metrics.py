"""`hami_resource_quota_used` / `hami_resource_quota_limit` as HAMi's `collectQuotaMetrics`
exports them (`cmd/scheduler/metrics.go:284-318`), read from the scheduler state at scrape
time and parsed with the Prometheus text parser."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.extender.metrics import SchedulerMetrics
from hami_plugin.extender.state import SchedulerState
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.quota import ResourceQuotaInfo
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage


class EmptyView:
    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        return [], []

    def is_leader(self) -> bool:
        return True


def quota_samples(metrics: SchedulerMetrics) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        if family.name.startswith("hami_resource_quota")
        for sample in family.samples
    }


def test_quota_gauges_follow_the_state_at_scrape_time() -> None:
    state = SchedulerState(BookSettings(SchedulerSettings()))
    metrics = SchedulerMetrics(EmptyView(), quotas=state.quota_entries)
    assert quota_samples(metrics) == set()
    hard = (("limits.nvidia.com/gpumem", "8000"), ("limits.nvidia.com/gpucores", "200"))
    state.quota_upserted(ResourceQuotaInfo("team", "gpu", hard), None)
    state.pod_upserted(
        PodInfo(
            namespace="team",
            name="a",
            annotations={
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;",
            },
        )
    )
    zone = ("zone", "vGPU")
    assert quota_samples(metrics) == {
        (
            "hami_resource_quota_used",
            (("limit", "8000"), ("namespace", "team"), ("quota_name", "nvidia.com/gpumem"), zone),
            3000.0,
        ),
        (
            "hami_resource_quota_used",
            (("limit", "200"), ("namespace", "team"), ("quota_name", "nvidia.com/gpucores"), zone),
            30.0,
        ),
        (
            "hami_resource_quota_limit",
            (("namespace", "team"), ("quota_name", "nvidia.com/gpumem"), zone),
            8000.0,
        ),
        (
            "hami_resource_quota_limit",
            (("namespace", "team"), ("quota_name", "nvidia.com/gpucores"), zone),
            200.0,
        ),
    }
    # the quota deleted: usage stays, with limit "0" and no limit series (LimitSet false)
    state.quota_deleted(ResourceQuotaInfo("team", "gpu", hard))
    assert {(name, value) for name, _, value in quota_samples(metrics)} == {
        ("hami_resource_quota_used", 3000.0),
        ("hami_resource_quota_used", 30.0),
    }
