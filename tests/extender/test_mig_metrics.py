"""`hami_node_gpu_mig_instance_info` as HAMi v2.10 exports it (cmd/scheduler/metrics.go:142-146,
205-231): one series per runtime-ready MIG reservation on a MIG-mode GPU, from the ledger."""

from __future__ import annotations

from hami_plugin.extender.metrics import SchedulerUsageCollector
from hami_plugin.protocol.mig import MigAllocation, encode_mig_allocations
from hami_plugin.protocol.model import GpuDevice, MigPlacement, MigProfile
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.testing.apiserver import make_container, make_pod
from tests.extender.test_metrics import LedgerView

PROFILES = (MigProfile("1g.5gb", 5120, 14, 1, tuple(MigPlacement(i, 1) for i in range(7))),)


def mig_pod(name: str, allocations: list[MigAllocation]) -> PodInfo:
    return read_pod(
        make_pod(
            name,
            node_name="n1",
            phase="Running",
            annotations={
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,10240,28:;",
                "hami.io/vgpu-mig-allocations": encode_mig_allocations(allocations),
            },
            containers=[make_container("c")],
        )
    )


def test_only_runtime_ready_instances_of_mig_gpus() -> None:
    ledger = Ledger()
    ledger.set_node(
        "n1",
        [
            GpuDevice("GPU-a", 2, 7, 40960, 100, "NVIDIA-A100", 0, "mig", True, PROFILES),
            GpuDevice("GPU-h", 3, 10, 40960, 100, "NVIDIA-A100", 0, "hami-core", True),
        ],
    )
    ready = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1), "MIG-6", 13, 0)
    pending = MigAllocation(0, 1, "GPU-a", "1g.5gb", MigPlacement(5, 1))
    ledger.update_pod(mig_pod("p", [ready, pending]))
    families = {f.name: f for f in SchedulerUsageCollector(LedgerView(ledger)).collect()}
    samples = families["hami_node_gpu_mig_instance_info"].samples
    assert [(s.labels, s.value) for s in samples] == [
        (
            {
                "node": "n1",
                "device_uuid": "GPU-a",
                "device_index": "2",
                "mig_uuid": "MIG-6",
                "profile": "1g.5gb",
                "gpu_instance_id": "13",
                "compute_instance_id": "0",
                "placement_start": "6",
                "placement_size": "1",
                "zone": "vGPU",
            },
            1,
        )
    ]
    ledger.delete_pod("default/p")
    families = {f.name: f for f in SchedulerUsageCollector(LedgerView(ledger)).collect()}
    assert families["hami_node_gpu_mig_instance_info"].samples == []
