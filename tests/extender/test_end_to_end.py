"""End to end, in one process over real wires: the API server double, `hami scheduler`
(SchedulerDaemon on a loopback port), `hami device-plugin` (DevicePluginDaemon, fake NVML) and
the test kubelet admitting pods (PodAdmitter: it lists the pods bound to its node and calls
GetPreferredAllocation/Allocate over the plugin's unix socket, as kubelet does).

A pod goes through POST /filter, POST /bind and Allocate: the container gets the booked GPU's
environment, the pod ends `bind-phase: success`, no lock is left. Then a burst onto the one
node goes through with several pods in flight at once, and every container gets its own
booking."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_NODE_LOCK,
    ContainerDevice,
)
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.extender.cluster import FAST_RETRY, Scheduler, running_scheduler
from tests.extender.helpers import gpu_pod
from tests.processes import wait_until

NODE = "gpu-node"
SPLIT = 4
MEMORY_MIB = 40960
UUIDS = (
    "GPU-03f69c50-207a-2038-9b45-23cac89cb67a",
    "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae",
)


@dataclass
class Cluster:
    api: FakeApiServer
    scheduler: Scheduler
    admitter: PodAdmitter
    hook: Path

    def annotations(self, name: str) -> dict[str, str]:
        pod = self.api.get_pod("default", name)
        assert pod is not None
        return dict(pod["metadata"].get("annotations") or {})


@pytest.fixture
def cluster(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[Cluster]:
    apiserver.add_node(NODE, allocatable={"cpu": "8", "memory": "32Gi", "pods": "110"})
    gpus_file = tmp_path / "gpus.yaml"
    gpus_file.write_text(
        yaml.safe_dump(
            {"gpus": [{"uuid": u, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": MEMORY_MIB}
                      for u in UUIDS]}
        ),
        encoding="utf-8",
    )  # fmt: skip
    sock_dir = tempfile.mkdtemp(prefix="hami-g1-", dir="/tmp")  # unix socket paths stay short
    install_fake_hamicore(tmp_path / "hook")
    settings = DevicePluginSettings(
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=SPLIT,
        hook_path=str(tmp_path / "hook"),
        register_interval_seconds=0.3,
        metrics_bind_address="0",
    )
    plugin_kube = KubeClient(apiserver.api_client(), FAST_RETRY)
    plugin = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=plugin_kube, vgpulock_path=str(tmp_path / "lock")
    )
    kubelet = FakeKubelet(sock_dir).start()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(plugin.run()), name="device-plugin")
    thread.start()
    try:
        assert plugin.started.wait(10)
        kubelet.wait_for_registrations(1)
        # kubelet advertises what the plugin lists (the double does not do it by itself)
        apiserver.update_object(
            "nodes",
            "",
            NODE,
            lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": str(2 * SPLIT)}),
        )
        with (
            running_scheduler(apiserver, node_lock_retry_timeout_seconds=20) as scheduler,
            PodAdmitter(kubelet, apiserver.url, NODE) as admitter,
        ):
            wait_until(
                lambda: scheduler.state.node_usage(NODE) is not None,
                what="the scheduler registers the node from the plugin's annotation",
            )
            yield Cluster(apiserver, scheduler, admitter, tmp_path / "hook")
    finally:
        plugin.stop()
        thread.join(10)
        kubelet.stop()
        plugin_kube.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert codes == [0]


def booking(cluster: Cluster, name: str) -> tuple[ContainerDevice, ...]:
    """The GPUs the scheduler booked for the pod's only container."""
    value = cluster.annotations(name)[ANNOTATION_DEVICES_ALLOCATED]
    return codec.decode_pod_devices(value, ANNOTATION_DEVICES_ALLOCATED)[0]


def test_a_pod_goes_from_filter_to_allocate(cluster: Cluster) -> None:
    node = cluster.api.get_node(NODE)
    assert node is not None
    assert node["metadata"]["annotations"][ANNOTATION_ALLOCATE_PROTOCOL] == ALLOCATE_PROTOCOL
    pod = cluster.api.add_object(gpu_pod("train", memory=3000))
    assert cluster.scheduler.schedule(pod, [NODE, "cpu-only"]) == NODE
    cluster.admitter.wait_for([("default", "train")])
    assert cluster.admitter.failures == {}
    envs = dict(cluster.admitter.responses[("default", "train", "c0")].envs)
    booked = booking(cluster, "train")
    assert envs["NVIDIA_VISIBLE_DEVICES"] == booked[0].uuid
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    wait_until(lambda: cluster.annotations("train").get(ANNOTATION_BIND_PHASE) == "success")
    stored = cluster.api.get_node(NODE)
    assert stored is not None and ANNOTATION_NODE_LOCK not in stored["metadata"]["annotations"]
    # the scheduler keeps counting the running pod's GPU
    usage = cluster.scheduler.state.node_usage(NODE)
    assert usage is not None and sum(usage.used) == 1


def test_a_burst_onto_one_node_gets_every_container_its_own_booking(cluster: Cluster) -> None:
    pods = [
        cluster.api.add_object(
            gpu_pod(f"job-{i}", memory=1000 + i, created=f"2026-01-01T00:00:{i:02d}Z")
        )
        for i in range(6)
    ]
    for pod in pods:
        assert cluster.scheduler.schedule(pod, [NODE]) == NODE
    keys = [("default", p["metadata"]["name"]) for p in pods]
    cluster.admitter.wait_for(keys, timeout=30)
    assert cluster.admitter.failures == {}
    for pod in pods:
        name = pod["metadata"]["name"]
        booked = booking(cluster, name)
        envs = dict(cluster.admitter.responses[("default", name, "c0")].envs)
        # each memory size is unique: a container with another pod's booking would show it
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{booked[0].used_mem_mib}m"
        assert booked[0].used_mem_mib == 1000 + int(name.split("-")[1])
        assert envs["NVIDIA_VISIBLE_DEVICES"] == booked[0].uuid

        def bound(name: str = name) -> bool:
            return cluster.annotations(name).get(ANNOTATION_BIND_PHASE) == "success"

        wait_until(bound, f"{name} bound")
