"""The scheduler daemon's metrics: HAMi's usage gauges read from the ledger at scrape time, and
the daemon's events (filter, bind, bookings, recovery, leadership) as histograms and counters.

Entry point for the daemon (`hami_plugin.extender.daemon`); the Prometheus types come from
`hami_plugin.metrics.families`, the one importer of prometheus_client:

    metrics = SchedulerMetrics(view)           # view: extender.observer.SchedulerView
    state.attach_observer(metrics)             # it is the SchedulerObserver
    server = metrics.serve(settings.metrics_bind_address)   # None when "0"; .stop() at exit

HAMi's gauges (`cmd/scheduler/metrics.go`, v2.10), same names, labels and values, const label
`zone="vGPU"`, one series per registered GPU and per booked GPU of a tracked pod:

* GPU labels {node, device_uuid, device_index, device_type}: `hami_gpu_memory_limit_bytes`
  (registered MiB x 2^20), `hami_gpu_core_limit_ratio` (registered cores, percent),
  `hami_gpu_shared_count` (booked slots), `hami_gpu_core_allocated_ratio` (booked cores),
  `hami_node_gpu_memory_allocated_ratio` (booked / registered memory, when registered > 0);
* `hami_gpu_memory_allocated_bytes` {node, device_uuid, device_index, device_cores,
  device_type}: booked MiB x 2^20;
* `hami_node_gpu_overview` {node, device_uuid, device_index, device_cores,
  device_memory_limit (MiB), device_type}: booked MiB x 2^20;
* pod labels {namespace, node, pod, container_index, device_uuid}:
  `hami_vgpu_memory_allocated_bytes` (the pod's MiB on the GPU x 2^20),
  `hami_vgpu_core_allocated_ratio` (the pod's cores on the GPU).

`container_index` is always "0": HAMi (and our ledger) keeps a pod's usage collapsed into one
entry per GPU (docs/hami-reference.md 3.3).

The namespace GPU quotas (`collectQuotaMetrics`, metrics.go:284-318), read from the state's
`QuotaBook` at scrape time, one series per namespace and resource name it holds:
`hami_resource_quota_used` {namespace, quota_name, limit (the limit as a number, "0" when
none)} and, only for a limit that is set, `hami_resource_quota_limit` {namespace, quota_name}.

Dynamic MIG (metrics.go:142-146, 205-231): `hami_node_gpu_mig_instance_info` {node,
device_uuid, device_index, mig_uuid, profile, gpu_instance_id, compute_instance_id,
placement_start, placement_size} = 1 for each MIG reservation in use on a MIG-mode GPU whose
runtime identity the device plugin filled in (`RuntimeReady`; a reservation not realised yet is
not exported). AMD core normalisation does not apply (NVIDIA only).

What HAMi lacks (no zone label):

* `hami_scheduler_filter_duration_seconds{outcome}` histogram; outcome fit/no_fit/error/no_gpu
* `hami_scheduler_filter_failures_total{reason}`: nodes rejected by a filter that found no node,
  per reason (HAMi's fit reason names such as `CardInsufficientMemory`, `NodeUnregistered`)
* `hami_scheduler_bind_duration_seconds{outcome}` histogram; outcome ok/error
* `hami_scheduler_bind_wait_seconds` histogram: time a bind waited for a node lock or for an
  in-flight pod of its node
* `hami_scheduler_bookings_expired_total`: filter bookings no bind followed
* `hami_scheduler_filter_fanned_out_total`: filters that answered past the policy's first node
  (the bind would have waited there)
* `hami_scheduler_pods_recovered_total{reason}`: allocation_timeout / owner_gone / lock_expired
* `hami_scheduler_leader` (1/0, read at scrape time) and
  `hami_scheduler_leadership_changes_total{to}` (to="leader" / "follower")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hami_plugin.extender.observer import (
    FILTER_OUTCOMES,
    PREEMPTION_OUTCOMES,
    RECOVERY_REASONS,
    SchedulerView,
)
from hami_plugin.metrics.buildinfo import BuildInfoCollector
from hami_plugin.metrics.families import (
    CollectorRegistry,
    Counter,
    GaugeMetricFamily,
    Histogram,
    Metric,
)
from hami_plugin.metrics.server import MetricsServer, ScrapeGuard, start_metrics_server
from hami_plugin.protocol.model import OperatingMode

if TYPE_CHECKING:
    from hami_plugin.clock import Clock
    from hami_plugin.scheduler.ledger import TrackedPod
    from hami_plugin.scheduler.quota import QuotaEntry
    from hami_plugin.scheduler.usage import NodeUsage

logger = logging.getLogger(__name__)

ZONE = "vGPU"
_MIB = 1024 * 1024

MEMORY_LIMIT = "hami_gpu_memory_limit_bytes"
CORE_LIMIT = "hami_gpu_core_limit_ratio"
MEMORY_ALLOCATED = "hami_gpu_memory_allocated_bytes"
SHARED_COUNT = "hami_gpu_shared_count"
CORE_ALLOCATED = "hami_gpu_core_allocated_ratio"
NODE_OVERVIEW = "hami_node_gpu_overview"
NODE_MEMORY_RATIO = "hami_node_gpu_memory_allocated_ratio"
VGPU_MEMORY_ALLOCATED = "hami_vgpu_memory_allocated_bytes"
VGPU_CORE_ALLOCATED = "hami_vgpu_core_allocated_ratio"
LEADER = "hami_scheduler_leader"
QUOTA_USED = "hami_resource_quota_used"
QUOTA_LIMIT = "hami_resource_quota_limit"
MIG_INSTANCE = "hami_node_gpu_mig_instance_info"

_GPU = ["node", "device_uuid", "device_index", "device_type", "zone"]
_GPU_CORES = ["node", "device_uuid", "device_index", "device_cores", "device_type", "zone"]
_OVERVIEW = [
    "node",
    "device_uuid",
    "device_index",
    "device_cores",
    "device_memory_limit",
    "device_type",
    "zone",
]
_POD = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
_MIG = [
    "node",
    "device_uuid",
    "device_index",
    "mig_uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
    "placement_start",
    "placement_size",
    "zone",
]

# Filter answers take milliseconds; binds include API calls; bind waits last up to
# --node-lock-retry-timeout (28 s).
FILTER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BIND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)
BIND_OUTCOMES = ("ok", "error")


def _usage_families() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(MEMORY_LIMIT, "Device memory limit for a certain GPU", labels=_GPU),
        GaugeMetricFamily(CORE_LIMIT, "Device core limit for a certain GPU", labels=_GPU),
        GaugeMetricFamily(
            MEMORY_ALLOCATED, "Device memory allocated for a certain GPU", labels=_GPU_CORES
        ),
        GaugeMetricFamily(SHARED_COUNT, "Number of containers sharing this GPU", labels=_GPU),
        GaugeMetricFamily(CORE_ALLOCATED, "Device core allocated for a certain GPU", labels=_GPU),
        GaugeMetricFamily(NODE_OVERVIEW, "GPU overview on a certain node", labels=_OVERVIEW),
        GaugeMetricFamily(
            NODE_MEMORY_RATIO, "GPU Memory Allocated Percentage on a certain GPU", labels=_GPU
        ),
        GaugeMetricFamily(
            VGPU_MEMORY_ALLOCATED, "vGPU memory allocated from a container", labels=_POD
        ),
        GaugeMetricFamily(VGPU_CORE_ALLOCATED, "vGPU core allocated from a container", labels=_POD),
        GaugeMetricFamily(LEADER, "1 when this scheduler replica leads (serves filter and bind)"),
        GaugeMetricFamily(
            MIG_INSTANCE, "Realized MIG instance identity and scheduler placement", labels=_MIG
        ),
    )


class SchedulerUsageCollector:
    """HAMi's scheduler gauges from one `SchedulerView.usage_snapshot()` per scrape."""

    def __init__(self, view: SchedulerView) -> None:
        self._view = view

    def describe(self) -> Iterator[Metric]:
        """The families this collector produces (no samples), for the registry."""
        return iter(_usage_families())

    def collect(self) -> Iterator[Metric]:
        """Read the ledger snapshot and the leadership now; yield the gauges."""
        families = _usage_families()
        (
            memory_limit,
            core_limit,
            memory_allocated,
            shared,
            core_allocated,
            overview,
            memory_ratio,
            pod_memory,
            pod_cores,
            leader,
            mig_instance,
        ) = families
        nodes, pods = self._view.usage_snapshot()
        for node in nodes:
            _add_node(node, memory_limit, core_limit, memory_allocated, shared, core_allocated)
            _add_overview(node, overview, memory_ratio)
            _add_mig(node, mig_instance)
        _add_pods(pods, pod_memory, pod_cores)
        leader.add_metric([], 1 if self._view.is_leader() else 0)
        return iter(families)


def _add_node(
    node: NodeUsage,
    memory_limit: GaugeMetricFamily,
    core_limit: GaugeMetricFamily,
    memory_allocated: GaugeMetricFamily,
    shared: GaugeMetricFamily,
    core_allocated: GaugeMetricFamily,
) -> None:
    for position, device in enumerate(node.devices):
        labels = [node.name, device.uuid, str(device.index), device.type, ZONE]
        cores_labels = [*labels[:3], str(device.cores_percent), device.type, ZONE]
        memory_limit.add_metric(labels, device.memory_mib * _MIB)
        core_limit.add_metric(labels, device.cores_percent)
        memory_allocated.add_metric(cores_labels, node.used_memory_mib[position] * _MIB)
        shared.add_metric(labels, node.used[position])
        core_allocated.add_metric(labels, node.used_cores[position])


def _add_overview(
    node: NodeUsage, overview: GaugeMetricFamily, memory_ratio: GaugeMetricFamily
) -> None:
    for position, device in enumerate(node.devices):
        used_mib = node.used_memory_mib[position]
        overview.add_metric(
            [
                node.name,
                device.uuid,
                str(device.index),
                str(device.cores_percent),
                str(device.memory_mib),
                device.type,
                ZONE,
            ],
            used_mib * _MIB,
        )
        if device.memory_mib > 0:
            memory_ratio.add_metric(
                [node.name, device.uuid, str(device.index), device.type, ZONE],
                used_mib / device.memory_mib,
            )


def _add_mig(node: NodeUsage, mig_instance: GaugeMetricFamily) -> None:
    """HAMi metrics.go:205-231: the runtime-ready reservations of MIG-mode GPUs."""
    for position, allocations in enumerate(node.mig_in_use):
        device = node.devices[position]
        if device.mode != OperatingMode.MIG:
            continue
        for allocation in allocations:
            if not allocation.runtime_ready:
                continue
            mig_instance.add_metric(
                [
                    node.name,
                    device.uuid,
                    str(device.index),
                    allocation.mig_uuid,
                    allocation.profile,
                    str(allocation.gpu_instance_id),
                    str(allocation.compute_instance_id),
                    str(allocation.placement.start),
                    str(allocation.placement.size),
                    ZONE,
                ],
                1,
            )


def _add_pods(
    pods: Sequence[TrackedPod], pod_memory: GaugeMetricFamily, pod_cores: GaugeMetricFamily
) -> None:
    for pod in pods:
        namespace, _, name = pod.key.partition("/")
        for tally in pod.tallies:
            # HAMi skips a booking without a UUID (metrics.go); ours always has one.
            labels = [namespace, pod.node, name, "0", tally.uuid, ZONE]
            pod_memory.add_metric(labels, tally.memory_mib * _MIB)
            pod_cores.add_metric(labels, tally.cores)


QuotaView = Callable[[], "Sequence[QuotaEntry]"]
"""Every namespace's quota figures now (`SchedulerState.quota_entries`)."""


def _quota_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            QUOTA_USED,
            "resourcequota usage for a certain device",
            labels=["namespace", "quota_name", "limit", "zone"],
        ),
        GaugeMetricFamily(
            QUOTA_LIMIT,
            "resourcequota limit for a certain device",
            labels=["namespace", "quota_name", "zone"],
        ),
    )


class QuotaCollector:
    """HAMi's quota gauges from one `QuotaView` call per scrape."""

    def __init__(self, view: QuotaView) -> None:
        self._view = view

    def describe(self) -> Iterator[Metric]:
        """The families this collector produces (no samples), for the registry."""
        return iter(_quota_families())

    def collect(self) -> Iterator[Metric]:
        """Read the quota figures now; yield the gauges."""
        used, limit = _quota_families()
        for entry in self._view():
            used.add_metric([entry.namespace, entry.resource, str(entry.limit), ZONE], entry.used)
            if entry.limit_set:
                limit.add_metric([entry.namespace, entry.resource, ZONE], entry.limit)
        return iter((used, limit))


class SchedulerMetrics:
    """The scheduler's registry: usage gauges over `view` and the `SchedulerObserver` events.

    Thread-safe (prometheus_client's metrics lock internally); observer calls never block.
    `registry`: a fresh one when None (never prometheus_client's global registry); `clock` times
    the scrapes (the system clock when None); `quotas` adds the quota gauges.
    """

    def __init__(
        self,
        view: SchedulerView,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        quotas: QuotaView | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        collectors: dict[str, Any] = {"scheduler": SchedulerUsageCollector(view)}
        if quotas is not None:
            collectors["quotas"] = QuotaCollector(quotas)
        guard = ScrapeGuard(collectors, clock=clock)
        self.registry.register(guard)
        self.registry.register(BuildInfoCollector())
        self._filter_seconds = Histogram(
            "hami_scheduler_filter_duration_seconds",
            "Seconds a /filter call took, by outcome (fit, no_fit, error, no_gpu)",
            ["outcome"],
            buckets=FILTER_BUCKETS,
            registry=self.registry,
        )
        self._filter_failures = Counter(
            "hami_scheduler_filter_failures",
            "Nodes rejected by /filter calls that found no node, by HAMi's fit reason",
            ["reason"],
            registry=self.registry,
        )
        self._bind_seconds = Histogram(
            "hami_scheduler_bind_duration_seconds",
            "Seconds a /bind call took, by outcome (ok, error)",
            ["outcome"],
            buckets=BIND_BUCKETS,
            registry=self.registry,
        )
        self._bind_wait_seconds = Histogram(
            "hami_scheduler_bind_wait_seconds",
            "Seconds a bind waited for a node lock or an in-flight pod of its node",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self._bookings_expired = Counter(
            "hami_scheduler_bookings_expired",
            "Filter bookings freed because no bind followed within --filter-booking-ttl",
            registry=self.registry,
        )
        self._filters_fanned_out = Counter(
            "hami_scheduler_filter_fanned_out",
            "Filters that answered a later node than the policy's first because the bind would "
            "have waited there (--burst-look-ahead)",
            registry=self.registry,
        )
        self._pods_recovered = Counter(
            "hami_scheduler_pods_recovered",
            "Stuck allocations and node locks the recovery loop undid, by reason",
            ["reason"],
            registry=self.registry,
        )
        self._leadership_changes = Counter(
            "hami_scheduler_leadership_changes",
            "Times this replica started (to=leader) or stopped (to=follower) leading",
            ["to"],
            registry=self.registry,
        )
        self._preemption_attempts = Counter(
            "hami_scheduler_preemption_attempts",
            "GPU pods that fit nowhere considered for preemption, by outcome (preempted, "
            "no_victims, waiting, never, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self._preemption_victims = Histogram(
            "hami_scheduler_preemption_victims",
            "Pods evicted by one preemption (kube-scheduler's preemption_victims, for GPUs)",
            buckets=(1, 2, 3, 4, 5, 8, 16, 32, 64),
            registry=self.registry,
        )
        self._preemptor_running_seconds = Histogram(
            "hami_scheduler_preemptor_seconds_to_running",
            "Seconds from a preempting pod's creation to its start (status.startTime)",
            buckets=(1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600),
            registry=self.registry,
        )
        # Known label values start at 0, so rate() and dashboards see them before the first event.
        for outcome in PREEMPTION_OUTCOMES:
            self._preemption_attempts.labels(outcome)
        for outcome in FILTER_OUTCOMES:
            self._filter_seconds.labels(outcome)
        for outcome in BIND_OUTCOMES:
            self._bind_seconds.labels(outcome)
        for reason in RECOVERY_REASONS:
            self._pods_recovered.labels(reason)
        for to in ("leader", "follower"):
            self._leadership_changes.labels(to)

    def serve(self, bind_address: str) -> MetricsServer | None:
        """Start `/metrics` on `bind_address` (`:9395`, `host:port`; `0`: off, returns None).

        Raises MetricsServerError naming the address when it does not parse or cannot be bound.
        """
        return start_metrics_server(bind_address, self.registry)

    # --- SchedulerObserver ----------------------------------------------------------------------

    def filter_done(self, seconds: float, outcome: str) -> None:
        """A /filter call answered."""
        self._filter_seconds.labels(outcome).observe(seconds)

    def filter_failures(self, reasons: Mapping[str, int]) -> None:
        """Nodes that failed one /filter call, per reason."""
        for reason, nodes in reasons.items():
            self._filter_failures.labels(reason).inc(nodes)

    def bind_done(self, seconds: float, ok: bool) -> None:
        """A /bind call answered."""
        self._bind_seconds.labels(BIND_OUTCOMES[0] if ok else BIND_OUTCOMES[1]).observe(seconds)

    def bind_waited(self, seconds: float) -> None:
        """A bind waited for a node lock or an in-flight pod."""
        self._bind_wait_seconds.observe(seconds)

    def booking_expired(self) -> None:
        """A filter booking no bind followed was freed."""
        self._bookings_expired.inc()

    def filter_fanned_out(self) -> None:
        """A filter sent the pod past the policy's first node, where it would have waited."""
        self._filters_fanned_out.inc()

    def pod_recovered(self, reason: str) -> None:
        """The recovery loop undid something stuck."""
        self._pods_recovered.labels(reason).inc()

    def leader_changed(self, is_leader: bool) -> None:
        """This replica started or stopped leading."""
        self._leadership_changes.labels("leader" if is_leader else "follower").inc()
        logger.debug("leadership changed: leader=%s", is_leader)

    def preemption_attempted(self, outcome: str) -> None:
        """A GPU pod that fit nowhere was considered for preemption."""
        self._preemption_attempts.labels(outcome).inc()

    def preemption_victims(self, count: int) -> None:
        """A preemption evicted `count` pods."""
        self._preemption_victims.observe(count)

    def preemptor_running(self, seconds: float) -> None:
        """A preempting pod started, `seconds` after its creation."""
        self._preemptor_running_seconds.observe(seconds)
