"""Per-container vGPU usage from HAMi-core's regions, as HAMi's monitor exports it.

A prometheus_client collector that scans the regions at scrape time (`ContainerScanner.scan`).
Names, help texts, labels and values follow `cmd/vGPUmonitor/metrics.go` (v2.10):

* labels namespace, pod, container, vdevice_index, device_uuid (metrics.go:76-123), plus the
  const label zone="vGPU" HAMi adds with a wrapping registerer (metrics.go:615, main.go:145);
* only pods labelled `hami.io/vgpu-node=<node>` (metrics.go:389) and only their
  `spec.containers` (not init containers) are matched to directories (metrics.go:425-433);
* per device index < num with a valid UTF-8 UUID (metrics.go:451-460): used and container
  memory = sum of used.total, limit = limit[i], utilization = sum of smUtil, context / module /
  buffer sums (metrics.go:463-510); last-kernel elapsed = max(now - lastKernelTime, 0) in whole
  seconds, only when lastKernelTime > 0 (metrics.go:412,512-519).

Deliberate difference: only devices whose UUID the container's booking holds are exported
(`monitor.booked`; HAMi exports every UUID the workload's file names), so a workload cannot
publish series for GPUs it was not given.

Register it in a registry passed in: `registry.register(VgpuCollector(scanner, node_name))`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner
from hami_plugin.metrics.families import GaugeMetricFamily, Metric
from hami_plugin.protocol.model import LABEL_VGPU_NODE

ZONE = "vGPU"
LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid", "zone")


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    documentation: str


MEMORY_USED = _Family("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes")
MEMORY_LIMIT = _Family("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes")
CONTAINER_MEMORY = _Family(
    "hami_container_device_memory_bytes", "Container device memory usage in bytes"
)
CONTAINER_UTILIZATION = _Family(
    "hami_container_device_utilization_ratio", "Container device SM utilization ratio"
)
LAST_KERNEL = _Family(
    "hami_container_last_kernel_elapsed_seconds",
    "Seconds since last kernel execution in container",
)
MEMORY_CONTEXT = _Family(
    "hami_vgpu_memory_context_bytes", "Container device memory context size in bytes"
)
MEMORY_MODULE = _Family(
    "hami_vgpu_memory_module_bytes", "Container device memory module size in bytes"
)
MEMORY_BUFFER = _Family(
    "hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes"
)
FAMILIES = (
    MEMORY_USED,
    MEMORY_LIMIT,
    CONTAINER_MEMORY,
    CONTAINER_UTILIZATION,
    LAST_KERNEL,
    MEMORY_CONTEXT,
    MEMORY_MODULE,
    MEMORY_BUFFER,
)


def _empty_families() -> dict[str, GaugeMetricFamily]:
    return {
        family.name: GaugeMetricFamily(family.name, family.documentation, labels=LABELS)
        for family in FAMILIES
    }


class VgpuCollector:
    """Collector of the per-container vGPU gauges of this node.

    `scanner` reads the regions, `node_name` selects the pods HAMi would (label
    `hami.io/vgpu-node`), `clock.now()` is the time the last-kernel age is measured to (the
    system clock when None).
    """

    def __init__(
        self,
        scanner: ContainerScanner,
        node_name: str,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._scanner = scanner
        self._node_name = node_name
        self._clock: Clock = clock or SystemClock()

    def describe(self) -> Iterator[Metric]:
        """The metric names, without reading anything (the registry checks clashes)."""
        yield from _empty_families().values()

    def collect(self) -> Iterator[Metric]:
        """Scan the regions now and yield the gauges."""
        families = _empty_families()
        now_seconds = int(self._clock.now().timestamp())
        for usage in self._scanner.scan():
            pod = usage.pod
            if pod is None or pod.labels.get(LABEL_VGPU_NODE) != self._node_name:
                continue
            if all(container.name != usage.container_name for container in pod.containers):
                continue
            region = usage.region
            for device in usage.booked_devices():  # only GPUs the booking holds
                if device.uuid is None:
                    continue
                # One label dict shared by the device's samples (no per-sample dict(zip)).
                labels = dict(
                    zip(
                        LABELS,
                        (
                            pod.namespace,
                            pod.name,
                            usage.container_name,
                            str(device.index),
                            device.uuid,
                            ZONE,
                        ),
                        strict=True,
                    )
                )
                for family, value in (
                    (MEMORY_USED, device.memory_used_bytes),
                    (MEMORY_LIMIT, device.memory_limit_bytes),
                    (CONTAINER_MEMORY, device.memory_used_bytes),
                    (CONTAINER_UTILIZATION, device.sm_utilization),
                    (MEMORY_CONTEXT, device.context_bytes),
                    (MEMORY_MODULE, device.module_bytes),
                    (MEMORY_BUFFER, device.buffer_bytes),
                ):
                    families[family.name].add_sample(family.name, labels, float(value))
                if region.last_kernel_time > 0:
                    families[LAST_KERNEL.name].add_sample(
                        LAST_KERNEL.name,
                        labels,
                        float(max(now_seconds - region.last_kernel_time, 0)),
                    )
        yield from families.values()
