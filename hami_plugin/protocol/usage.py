"""What one pod books on each GPU: its per-container devices collapsed as HAMi collapses them
(docs/hami-reference.md 3.3). The scheduler's ledger and quotas count it; the device plugin's
metrics report it. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_plugin.protocol.model import PodDevices

__all__ = ["DeviceTally", "collapse_pod_devices"]


@dataclass(frozen=True, slots=True)
class DeviceTally:
    """What one pod books on one GPU: slots (vGPUs), MiB and percent of cores."""

    uuid: str
    slots: int
    memory_mib: int
    cores: int


def collapse_pod_devices(
    devices: PodDevices, init_count: int, app_only: bool = False
) -> tuple[DeviceTally, ...]:
    """Collapse a pod's per-container devices into one tally per GPU (sorted by UUID).

    Init containers run one after another, so they count with their peak (largest memory,
    largest cores, one slot); app containers run together and add up (one slot each). A GPU
    books the larger of the two, component-wise, and at least one slot. With `app_only` (all
    init containers have finished) only the app containers count.
    """
    init_peak: dict[str, list[int]] = {}
    app_sum: dict[str, list[int]] = {}
    for position, container in enumerate(devices):
        is_init = position < init_count
        if is_init and app_only:
            continue
        for device in container:
            if is_init:
                peak = init_peak.setdefault(device.uuid, [0, 0, 0])
                peak[0] = 1
                peak[1] = max(peak[1], device.used_mem_mib)
                peak[2] = max(peak[2], device.used_cores)
            else:
                total = app_sum.setdefault(device.uuid, [0, 0, 0])
                total[0] += 1
                total[1] += device.used_mem_mib
                total[2] += device.used_cores
    tallies = []
    for uuid in sorted(init_peak.keys() | app_sum.keys()):
        peak = init_peak.get(uuid, [0, 0, 0])
        total = app_sum.get(uuid, [0, 0, 0])
        tallies.append(
            DeviceTally(
                uuid,
                max(peak[0], total[0], 1),
                max(peak[1], total[1]),
                max(peak[2], total[2]),
            )
        )
    return tuple(tallies)
