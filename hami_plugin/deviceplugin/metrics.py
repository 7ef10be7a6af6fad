"""The device plugin daemon's node collector: the GPUs of this node, read at scrape time.

HAMi's vGPU monitor names (`cmd/vGPUmonitor/metrics.go`, v2.10), same labels, const label
`zone="vGPU"`, values straight from NVML on every scrape:

* `hami_host_gpu_memory_used_bytes{node, device_index, device_uuid, device_type}`
* `hami_host_gpu_utilization_ratio{node, device_index, device_uuid, device_type}` (0-100)
* `hami_host_gpu_memory_controller_utilization_ratio{device_index, device_uuid, device_type}`
  (0-100; HAMi gives this one no `node` label)

`device_type` is `"NVIDIA-" + NVML name`, always prefixed, as HAMi's monitor builds it (so an
A100 reads `NVIDIA-NVIDIA A100-SXM4-80GB`; the register annotation's type is prefixed only when
the name lacks `NVIDIA`). Kept as HAMi has it so existing dashboards keep matching.

What HAMi lacks, same `hami_` prefix and labels, no zone (they are not HAMi's):

* `hami_host_gpu_healthy` 1/0: the health the daemon reports to kubelet for the GPU's slots.
* `hami_host_gpu_vgpu_slots`: kubelet devices advertised for the GPU (the split count).
* `hami_host_gpu_vgpu_slots_allocated`: slots booked on the GPU by pods bound to this node,
  counted as the scheduler counts its `hami_gpu_shared_count` (docs/hami-reference.md 3.3): every
  pod on the node with `hami.io/vgpu-node` = this node that has not finished (Failed/Succeeded),
  its `hami.io/vgpu-devices-allocated` collapsed per GPU (init containers by their peak, app
  containers one slot each). Pods still `allocating` count: their slots are taken. Kubelet's
  device IDs are not used: HAMi's Allocate serves the scheduler's booking, not the ID kubelet
  picked, so the ID says nothing about which GPU a container got. With booking keys
  (`--booking-key-file`) only pods whose booking signature verifies count: any pod author can
  write the annotation, and our Allocate serves no other booking.
* `hami_device_plugin_hamicore_ready{node}` 1/0: whether HAMi-core (`libvgpu.so` and its
  `ld.so.preload`) is installed under the hook path (`deviceplugin.hamicore`); while it is 0,
  Allocate fails and the register annotation marks every GPU unhealthy.

With static MIG (`--mig-strategy single|mixed`), HAMi's MIG family, zone `vGPU` as HAMi's:

* `hami_mig_device_info{namespace, pod, container, vdevice_index, device_uuid, mig_uuid, profile,
  gpu_instance_id, compute_instance_id}` 1 per MIG device a container holds (HAMi's
  cmd/vGPUmonitor/metrics.go:102-106, 526-571, which reads dynamic MIG's
  `hami.io/vgpu-mig-allocations`). For pre-made MIG devices the holder comes from kubelet's
  PodResources `List` (the devices kubelet allocated per container), never from an annotation;
  `vdevice_index` is the device's position in the container's list, `device_uuid` the parent
  GPU (`migserve.StaticMigServers.device_info`).

A GPU that fails an NVML query is left out of the scrape (the adapter logs it); NVML failing as
a whole, or the pod list failing, leaves out only the metrics that need it, with one log line.
The scrape's duration is exported by `server.ScrapeGuard`, which runs this collector.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.inventory import PhysicalGpu, VgpuDevice
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner
from hami_plugin.deviceplugin.monitor.vgpu import VgpuCollector
from hami_plugin.metrics.buildinfo import BuildInfoCollector
from hami_plugin.metrics.families import GaugeMetricFamily, Metric
from hami_plugin.metrics.server import (
    MetricsServer,
    MetricsServerError,
    guarded_registry,
    start_metrics_server,
)
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.hostpaths import containers_dir
from hami_plugin.protocol.signature import BookingKeys
from hami_plugin.protocol.usage import collapse_pod_devices

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.hamicore import HamiCoreCheck
    from hami_plugin.deviceplugin.nodecache import NodeCache
    from hami_plugin.deviceplugin.nvml import GpuUsage, NvmlBackend
    from hami_plugin.metrics.families import Collector
    from hami_plugin.protocol.objects import PodInfo

logger = logging.getLogger(__name__)

ZONE = "vGPU"
"""HAMi registers its collectors with this const label (`zone`)."""

_FINISHED_PHASES = frozenset({"Failed", "Succeeded"})
_HOST_LABELS = ["node", "device_index", "device_uuid", "device_type"]

MEMORY_USED = "hami_host_gpu_memory_used_bytes"
UTILIZATION = "hami_host_gpu_utilization_ratio"
MEMORY_CONTROLLER_UTILIZATION = "hami_host_gpu_memory_controller_utilization_ratio"
HEALTHY = "hami_host_gpu_healthy"
SLOTS = "hami_host_gpu_vgpu_slots"
SLOTS_ALLOCATED = "hami_host_gpu_vgpu_slots_allocated"
HAMICORE_READY = "hami_device_plugin_hamicore_ready"
MIG_DEVICE_INFO = "hami_mig_device_info"
MIG_DEVICE_INFO_LABELS = [
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
    "mig_uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
]
"""HAMi's labels (cmd/vGPUmonitor/metrics.go:105), then `zone`."""


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    """One MIG device held by one container: a `hami_mig_device_info` sample."""

    namespace: str
    pod: str
    container: str
    vdevice_index: int
    device_uuid: str
    """The parent GPU's UUID."""
    mig_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


def mig_device_info_family(rows: Sequence[MigDeviceInfo]) -> GaugeMetricFamily:
    """`hami_mig_device_info` with one sample (1) per row, zone `vGPU` as HAMi's."""
    family = GaugeMetricFamily(
        MIG_DEVICE_INFO,
        "MIG runtime identity for a container allocation",
        labels=[*MIG_DEVICE_INFO_LABELS, "zone"],
    )
    for row in rows:
        family.add_metric(
            [
                row.namespace,
                row.pod,
                row.container,
                str(row.vdevice_index),
                row.device_uuid,
                row.mig_uuid,
                row.profile,
                str(row.gpu_instance_id),
                str(row.compute_instance_id),
                ZONE,
            ],
            1,
        )
    return family


class MigInfoCollector:
    """`hami_mig_device_info`, its rows read at scrape time; a failing source is one log line
    per distinct message and an empty family."""

    def __init__(self, rows: Callable[[], Sequence[MigDeviceInfo]]) -> None:
        self._rows = rows
        self._last_problem: str | None = None

    def describe(self) -> Iterator[Metric]:
        return iter([mig_device_info_family([])])

    def collect(self) -> Iterator[Metric]:
        try:
            rows = self._rows()
        except Exception as error:  # a scrape never fails for one source
            message = str(error)
            if message != self._last_problem:
                logger.warning("hami_mig_device_info left empty: %s", message)
                self._last_problem = message
            rows = []
        else:
            self._last_problem = None
        return iter([mig_device_info_family(rows)])


def monitor_device_type(nvml_name: str) -> str:
    """`device_type` as HAMi's monitor writes it: `NVIDIA-` + the NVML name, always."""
    return f"NVIDIA-{nvml_name}"


def booked_slots(
    pods: Sequence[PodInfo], node_name: str, keys: BookingKeys | None = None
) -> dict[str, int]:
    """Slots booked per GPU UUID by the pods of `node_name` (see the module docstring); with
    `keys`, by the pods whose booking signature verifies only.

    A pod whose allocation annotation does not decode is left out (logged at debug level: the
    scheduler reports it where the user sees it).
    """
    slots: dict[str, int] = {}
    for pod in pods:
        booking = pod.booking
        if (
            booking is None
            or booking.allocated_text is None
            or booking.node != node_name
            or pod.phase in _FINISHED_PHASES
        ):
            continue
        if keys is not None and not booking.verifies(keys, pod.uid):
            logger.debug("pod %s/%s left out of the slot count: unsigned", pod.namespace, pod.name)
            continue
        try:
            devices = booking.allocated or ()
        except AnnotationError as error:
            logger.debug("pod %s/%s left out of the slot count: %s", pod.namespace, pod.name, error)
            continue
        for tally in collapse_pod_devices(devices, len(pod.init_containers)):
            slots[tally.uuid] = slots.get(tally.uuid, 0) + tally.slots
    return slots


class NodePods:
    """The pods bound to this node, listed at most once per `max_age_seconds`.

    Shared by the collectors of one scrape (and by scrapes from several Prometheus servers),
    so a scrape costs the API server one list at most. Thread-safe; a failed list is raised to
    the caller and retried on the next call.
    """

    def __init__(
        self,
        list_pods: Callable[[], Sequence[PodInfo]],
        *,
        max_age_seconds: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self._list_pods = list_pods
        self._max_age = max_age_seconds
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._pods: Sequence[PodInfo] = ()
        self._listed_at: float | None = None

    @classmethod
    def from_kube(
        cls,
        kube: Any,
        node_name: str,
        *,
        timeout_seconds: float = 3.0,
        clock: Clock | None = None,
    ) -> NodePods:
        """Pods of `node_name` from a `KubeClient` (or any object with `list_pods_on_node`).

        With `KubeClient.deadline` the list is bounded to `timeout_seconds`, retries included,
        so an unreachable API server delays a scrape by that much at most.
        """
        deadline = getattr(kube, "deadline", None)

        def list_pods() -> Sequence[PodInfo]:
            if deadline is None:
                pods: Sequence[PodInfo] = kube.list_pods_on_node(node_name)
                return pods
            with deadline(timeout_seconds):
                pods = kube.list_pods_on_node(node_name)
                return pods

        return cls(list_pods, clock=clock)

    @classmethod
    def from_cache(cls, cache: NodeCache, *, clock: Clock | None = None) -> NodePods:
        """Pods of the cache's node from its watch (`deviceplugin.nodecache`): always current,
        and one watch per node (shared with Allocate) instead of a list per scrape and per
        feedback round. Until the first list is in, reading raises (so the directory clean-up
        keeps everything)."""
        return cls(cache.pods, max_age_seconds=0.0, clock=clock)

    def __call__(self) -> Sequence[PodInfo]:
        """The pods, listed now unless a list younger than `max_age_seconds` is at hand."""
        with self._lock:
            now = self._clock.monotonic()
            if self._listed_at is None or now - self._listed_at >= self._max_age:
                self._pods = tuple(self._list_pods())
                self._listed_at = now
            return self._pods


class NodeCollector:
    """`hami_host_gpu_*` for this node, read at scrape time (see the module docstring).

    Sources, all called on every scrape and all thread-safe:
    `read_usage` (NvmlBackend.read_usage; may raise), `gpus` (the daemon's inventory, for the
    index and name of a GPU that no longer answers NVML), `devices` (the kubelet devices as
    advertised, with their health), `pods` (the pods bound to this node, may raise; None: no
    allocated-slots metric), `booking_keys` (the current booking keys: only signed bookings
    count; None: every booking counts, as in HAMi), `hamicore` (the daemon's
    `HamiCoreWatch.current`; None: no HAMi-core metric).
    """

    def __init__(
        self,
        node_name: str,
        *,
        read_usage: Callable[[], Sequence[GpuUsage]],
        gpus: Callable[[], Sequence[PhysicalGpu]],
        devices: Callable[[], Sequence[VgpuDevice]],
        pods: Callable[[], Sequence[PodInfo]] | None = None,
        booking_keys: Callable[[], BookingKeys] | None = None,
        hamicore: Callable[[], HamiCoreCheck] | None = None,
    ) -> None:
        self._node = node_name
        self._read_usage = read_usage
        self._gpus = gpus
        self._devices = devices
        self._pods = pods
        self._booking_keys = booking_keys
        self._hamicore = hamicore
        # Log a failing source once per distinct message, not on every scrape.
        self._last_problem: dict[str, str] = {}
        self._problem_lock = threading.Lock()

    def describe(self) -> Iterator[Metric]:
        """The families this collector produces (no samples), for the registry."""
        families = _families()
        return iter((*families, _hamicore_family()) if self._hamicore is not None else families)

    def collect(self) -> Iterator[Metric]:
        """Read NVML, the daemon's devices and the node's pods now; yield the gauges."""
        gauges = _families()
        memory_used, utilization, memory_controller, healthy, slots, allocated = gauges
        families: list[Metric] = list(gauges)
        zone = [ZONE]
        try:
            usages = self._read_usage()
        except Exception as error:
            self._problem("nvml", f"GPU usage left out of the metrics: {error}")
            usages = ()
        else:
            self._solved("nvml", "GPU usage is read again")
        for usage in usages:
            device_type = monitor_device_type(usage.name)
            labels = [self._node, str(usage.index), usage.uuid, device_type]
            if usage.memory_used_bytes is not None:
                memory_used.add_metric([*labels, *zone], usage.memory_used_bytes)
            if usage.utilization_percent is not None:
                utilization.add_metric([*labels, *zone], usage.utilization_percent)
            if usage.memory_utilization_percent is not None:
                memory_controller.add_metric(
                    [str(usage.index), usage.uuid, device_type, *zone],
                    usage.memory_utilization_percent,
                )

        booked = self._booked()
        known = {gpu.uuid: gpu for gpu in self._gpus()}
        per_gpu: dict[str, list[bool]] = {}
        for device in self._devices():
            per_gpu.setdefault(device.gpu_uuid, []).append(device.healthy)
        for uuid, health in per_gpu.items():
            gpu = known.get(uuid)
            if gpu is None:
                continue  # advertised before the inventory caught up; next scrape has it
            labels = [self._node, str(gpu.index), uuid, monitor_device_type(gpu.name)]
            healthy.add_metric(labels, 1 if all(health) else 0)
            slots.add_metric(labels, len(health))
            if booked is not None:
                allocated.add_metric(labels, booked.get(uuid, 0))
        if self._hamicore is not None:
            ready = _hamicore_family()
            ready.add_metric([self._node], 1 if self._hamicore().ready else 0)
            families.append(ready)
        return iter(families)

    def _booked(self) -> dict[str, int] | None:
        if self._pods is None:
            return None
        try:
            pods = self._pods()
        except Exception as error:
            self._problem("pods", f"allocated vGPU slots left out of the metrics: {error}")
            return None
        self._solved("pods", "allocated vGPU slots are counted again")
        keys = self._booking_keys() if self._booking_keys is not None else None
        return booked_slots(pods, self._node, keys)

    def _problem(self, source: str, message: str) -> None:
        with self._problem_lock:
            repeated = self._last_problem.get(source) == message
            self._last_problem[source] = message
        logger.log(logging.DEBUG if repeated else logging.WARNING, "%s", message)

    def _solved(self, source: str, message: str) -> None:
        if source not in self._last_problem:
            return
        with self._problem_lock:
            had = self._last_problem.pop(source, None)
        if had is not None:
            logger.info("%s", message)


def _families() -> tuple[GaugeMetricFamily, ...]:
    zoned = [*_HOST_LABELS, "zone"]
    return (
        GaugeMetricFamily(MEMORY_USED, "GPU device memory usage in bytes", labels=zoned),
        GaugeMetricFamily(UTILIZATION, "GPU core utilization ratio (0-100)", labels=zoned),
        GaugeMetricFamily(
            MEMORY_CONTROLLER_UTILIZATION,
            "GPU memory controller utilization ratio (0-100)",
            labels=["device_index", "device_uuid", "device_type", "zone"],
        ),
        GaugeMetricFamily(
            HEALTHY,
            "1 when the device plugin reports the GPU healthy to kubelet, else 0",
            labels=_HOST_LABELS,
        ),
        GaugeMetricFamily(
            SLOTS,
            "vGPU slots (kubelet devices) the device plugin advertises for the GPU",
            labels=_HOST_LABELS,
        ),
        GaugeMetricFamily(
            SLOTS_ALLOCATED,
            "vGPU slots booked on the GPU by unfinished pods bound to this node "
            "(hami.io/vgpu-devices-allocated, counted as the scheduler counts them)",
            labels=_HOST_LABELS,
        ),
    )


def _hamicore_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        HAMICORE_READY,
        "1 when HAMi-core (libvgpu.so and its ld.so.preload) is installed under the hook path, "
        "else 0 (Allocate fails, the node registers its GPUs unhealthy)",
        labels=["node"],
    )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """What the device plugin's `/metrics` is configured with: the node it reports, HAMi-core's
    hook directory (the containers' shared regions) and `--metrics-bind-address`."""

    node_name: str
    hook_path: str
    bind_address: str


class DevicePluginMetrics:
    """The device plugin daemon's running `/metrics` endpoint and the region scanner it reads.

    `stop()` stops the endpoint and, when it created the scanner, closes the scanner's files.
    """

    def __init__(
        self, server: MetricsServer, scanner: ContainerScanner, *, owns_scanner: bool
    ) -> None:
        self.server = server
        self.scanner = scanner
        self._owns_scanner = owns_scanner

    @property
    def url(self) -> str:
        """`http://<host>:<port>/metrics` (see `MetricsServer.url`)."""
        return self.server.url

    def stop(self) -> None:
        """Stop serving; close the scanner's descriptors if this object opened them."""
        self.server.stop()
        if self._owns_scanner:
            self.scanner.close()


def start_device_plugin_metrics(
    config: MetricsConfig,
    *,
    backend: NvmlBackend,
    gpus: Callable[[], Sequence[PhysicalGpu]],
    devices: Callable[[], Sequence[VgpuDevice]],
    kube: Any,
    scanner: ContainerScanner | None = None,
    pods: NodePods | None = None,
    clock: Clock | None = None,
    booking_keys: Callable[[], BookingKeys] | None = None,
    hamicore: Callable[[], HamiCoreCheck] | None = None,
    mig_device_info: Callable[[], Sequence[MigDeviceInfo]] | None = None,
) -> DevicePluginMetrics | None:
    """Serve the device plugin daemon's `/metrics` on `config.bind_address`.

    One fresh registry, one `ScrapeGuard` over two collectors: `node` (this module) and `vgpu`
    (per-container usage from HAMi-core's regions, `deviceplugin.monitor.vgpu`). Both share one
    pod list (`NodePods`). `scanner`: the daemon's region scanner when it runs the priority feedback
    loop too (pass it so both read one set of open files); None creates one for the metrics
    alone, closed by `stop()`. `pods`: the pod list the scanner already reads, so that the
    node collector shares it (None lists them here). `clock`: the daemon's clock, read by the
    pod list, the collectors and the scrape timing (the system clock when None).
    `booking_keys`: the daemon's booking keys, so that only signed bookings count as allocated
    slots (None: every booking counts). `hamicore`: the daemon's `HamiCoreWatch.current`, for
    `hami_device_plugin_hamicore_ready` (None: not exported). `mig_device_info`: the MIG
    devices containers hold, for `hami_mig_device_info` (None: not exported).

    Returns None when the address is `0`, does not parse, or cannot be bound: a metrics problem
    is one error line and never stops the daemon from serving GPUs.
    """
    if pods is None:
        pods = NodePods.from_kube(kube, config.node_name, clock=clock)
    owns_scanner = scanner is None
    if scanner is None:
        scanner = ContainerScanner(
            containers_dir(config.hook_path), pods, clock=clock, booking_keys=booking_keys
        )
    collectors: dict[str, Collector] = {
        "node": NodeCollector(
            config.node_name,
            read_usage=backend.read_usage,
            gpus=gpus,
            devices=devices,
            pods=pods,
            booking_keys=booking_keys,
            hamicore=hamicore,
        ),
        "vgpu": VgpuCollector(scanner, config.node_name, clock=clock),
    }
    if mig_device_info is not None:
        collectors["mig"] = MigInfoCollector(mig_device_info)
    try:
        registry = guarded_registry(collectors, clock)
        registry.register(BuildInfoCollector())
        server = start_metrics_server(config.bind_address, registry)
    except MetricsServerError as error:
        logger.error("%s; running without metrics", error)
        server = None
    if server is None:
        if owns_scanner:
            scanner.close()
        return None
    return DevicePluginMetrics(server, scanner, owns_scanner=owns_scanner)
