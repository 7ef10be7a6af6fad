"""`hami device-plugin`'s /metrics over real wires: the daemon with the fake NVML, the test
kubelet, the API server double and a HAMi-core region file, scraped over HTTP.

`running_device_plugin` is reused by the Prometheus end-to-end test.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.monitor.feedback import BLOCKED
from hami_plugin.deviceplugin.monitor.region import parse_region
from hami_plugin.deviceplugin.settings import (
    DevicePluginSettings,
    NvmlSource,
    add_arguments,
    resolve_settings,
)
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_container
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.deviceplugin.monitor.helpers import region_file
from tests.deviceplugin.monitor.region_writer import DeviceMemory, Proc, RegionSpec
from tests.processes import wait_until

NODE = "gpu-node-1"
GPU_0 = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_1 = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
SPLIT = 4
MIB = 1 << 20
FAST = RetryPolicy(
    attempts=2, initial_backoff_seconds=0.01, max_backoff_seconds=0.05, timeout_seconds=5.0
)


def gpus_yaml(*, healthy_1: bool = True, used_0_mib: int = 2048) -> str:
    return f"""gpus:
  - uuid: {GPU_0}
    name: NVIDIA A100-SXM4-80GB
    memory_mib: 81920
    memory_used_mib: {used_0_mib}
    utilization_percent: 37
    memory_utilization_percent: 12
  - uuid: {GPU_1}
    name: Tesla V100
    memory_mib: 16384
    utilization_percent: 5
    healthy: {"true" if healthy_1 else "false"}
"""


def write(path: Path, text: str) -> None:
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    aside.replace(path)


@dataclass
class RunningPlugin:
    daemon: DevicePluginDaemon
    apiserver: FakeApiServer
    gpus_file: Path
    hook: Path
    kubelet: FakeKubelet

    @property
    def url(self) -> str:
        assert self.daemon.metrics is not None
        return self.daemon.metrics.url


@contextlib.contextmanager
def running_device_plugin(
    tmp_path: Path, apiserver: FakeApiServer, *, bind: str = "127.0.0.1:0", hamicore: bool = True
) -> Iterator[RunningPlugin]:
    """The real daemon, in-process, as tests/deviceplugin/test_daemon.py runs it; with the
    fake HAMi-core in its hook directory unless `hamicore` is False."""
    apiserver.add_node(NODE)
    tmp_path.mkdir(parents=True, exist_ok=True)
    gpus_file = tmp_path / "gpus.yaml"
    write(gpus_file, gpus_yaml())
    hook = tmp_path / "hook"
    if hamicore:
        install_fake_hamicore(hook)
    sock_dir = tempfile.mkdtemp(prefix="hami-metrics-", dir="/tmp")  # short unix socket paths
    settings = DevicePluginSettings(
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=SPLIT,
        hook_path=str(hook),
        health_recovery_seconds=0.5,
        register_interval_seconds=0.3,
        metrics_bind_address=bind,
    )
    kube = KubeClient(apiserver.api_client(), FAST)
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    kubelet = FakeKubelet(sock_dir).start()
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    try:
        assert daemon.started.wait(10)
        # Steady state: stopping while the registration is still under way can hang the
        # registrar (a known race in deviceplugin/kubelet.py).
        kubelet.wait_for_registrations(1)
        yield RunningPlugin(daemon, apiserver, gpus_file, hook, kubelet)
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
        kube.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert exit_codes == [0]


def add_booked_pod(
    apiserver: FakeApiServer,
    name: str,
    entries: tuple[tuple[ContainerDevice, ...], ...],
    priority: int | None = None,
) -> str:
    """A pod the scheduler bound here (annotations and label as its bind patch writes them);
    returns its UID. `priority`: `CUDA_TASK_PRIORITY` in every container's env, as the webhook
    writes it from `nvidia.com/priority`."""
    env = None if priority is None else {"CUDA_TASK_PRIORITY": str(priority)}
    value = codec.encode_pod_devices(entries)
    pod = apiserver.add_pod(
        name,
        node_name=NODE,
        phase="Running",
        annotations={
            ANNOTATION_DEVICES_TO_ALLOCATE: codec.encode_pod_devices(tuple(() for _ in entries)),
            ANNOTATION_DEVICES_ALLOCATED: value,
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_PHASE: "success",
        },
        labels={LABEL_VGPU_NODE: NODE},
        containers=[make_container(f"c{i}", env=env) for i in range(len(entries))],
    )
    return str(pod["metadata"]["uid"])


def write_usage_region(hook: Path, pod_uid: str, container: str, used_mib: int) -> None:
    """HAMi-core's region as the workload's library would leave it: GPU_0, 4 GiB limit."""
    region_file(
        hook,
        pod_uid,
        container,
        RegionSpec(
            uuids=[GPU_0],
            limits=[4096 * MIB],
            procs=[Proc(used=[DeviceMemory(context=MIB, total=used_mib * MIB)], sm_util=[21])],
            last_kernel_time=int(time.time()) - 3,
        ),
    )


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def value(
    families: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str
) -> float | None:
    """The one sample of `name` whose labels include `labels`, or None."""
    found = [
        sample
        for key, sample in families.get(name, {}).items()
        if labels.items() <= dict(key).items()
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


# --- tests -------------------------------------------------------------------------------------


def test_the_daemon_serves_node_and_container_metrics(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    booked = (
        (ContainerDevice(GPU_0, "NVIDIA", 4096, 30),),
        (ContainerDevice(GPU_0, "NVIDIA", 2048, 20),),
    )
    with running_device_plugin(tmp_path, apiserver) as plugin:
        uid = add_booked_pod(apiserver, "trainer", booked)
        write_usage_region(plugin.hook, uid, "c0", used_mib=1500)
        a100 = {"device_uuid": GPU_0, "device_index": "0", "node": NODE}
        # The node's pod list is shared with the feedback loop and refreshed every 5 s.
        slots = "hami_host_gpu_vgpu_slots_allocated"
        wait_until(lambda: value(scrape(plugin.url), slots, **a100) == 2, timeout=10.0)
        families = scrape(plugin.url)

        assert value(families, "hami_host_gpu_memory_used_bytes", **a100, zone="vGPU") == (
            2048 * MIB
        )
        assert value(families, "hami_host_gpu_utilization_ratio", **a100) == 37
        controller = "hami_host_gpu_memory_controller_utilization_ratio"
        assert value(families, controller, device_uuid=GPU_0) == 12
        assert value(families, "hami_host_gpu_healthy", **a100) == 1
        assert value(families, "hami_host_gpu_vgpu_slots", **a100) == SPLIT
        assert value(families, "hami_host_gpu_vgpu_slots_allocated", **a100) == 2
        assert value(families, "hami_host_gpu_vgpu_slots_allocated", device_uuid=GPU_1) == 0

        container = {"namespace": "default", "pod": "trainer", "container": "c0"}
        assert value(families, "hami_vgpu_memory_used_bytes", **container, zone="vGPU") == (
            1500 * MIB
        )
        assert value(families, "hami_vgpu_memory_limit_bytes", **container) == 4096 * MIB
        assert value(families, "hami_container_device_utilization_ratio", **container) == 21

        for collector in ("node", "vgpu"):
            assert value(families, "hami_scrape_collector_success", collector=collector) == 1
            duration = value(
                families, "hami_scrape_collector_duration_seconds", collector=collector
            )
            assert duration is not None and duration >= 0


def test_metrics_follow_the_gpus_at_scrape_time(tmp_path: Path, apiserver: FakeApiServer) -> None:
    with running_device_plugin(tmp_path, apiserver) as plugin:
        write(plugin.gpus_file, gpus_yaml(healthy_1=False, used_0_mib=8192))
        used = value(scrape(plugin.url), "hami_host_gpu_memory_used_bytes", device_uuid=GPU_0)
        assert used == 8192 * MIB  # read from NVML at this scrape, not cached
        # The Xid event reaches the health monitor, and kubelet's devices turn unhealthy.
        wait_until(
            lambda: value(scrape(plugin.url), "hami_host_gpu_healthy", device_uuid=GPU_1) == 0,
            timeout=10.0,
        )
        # A lost GPU answers no NVML query: its usage is left out, its health stays reported.
        families = scrape(plugin.url)
        assert value(families, "hami_host_gpu_utilization_ratio", device_uuid=GPU_1) is None
        assert value(families, "hami_host_gpu_vgpu_slots", device_uuid=GPU_1) == SPLIT


def _recent_kernel(path: Path) -> int:
    return parse_region(path.read_bytes()).recent_kernel


def _utilization_switch(path: Path) -> int:
    return parse_region(path.read_bytes()).utilization_switch


def test_the_daemon_runs_the_priority_feedback_loop(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    # Two containers share GPU_0 and both launched kernels lately: HAMi's monitor holds the
    # lower-priority one (recentKernel -1) while the higher-priority one is active.
    # The priorities come from the pods' specs (CUDA_TASK_PRIORITY), not from the files.
    on_gpu_0 = ((ContainerDevice(GPU_0, "NVIDIA", 1000, 10),),)
    with running_device_plugin(tmp_path, apiserver) as plugin:
        high_uid = add_booked_pod(apiserver, "high", on_gpu_0, priority=0)
        low_uid = add_booked_pod(apiserver, "low", on_gpu_0, priority=1)
        high = region_file(
            plugin.hook, high_uid, "c0", RegionSpec(uuids=[GPU_0], priority=1, recent_kernel=3)
        )
        low = region_file(
            plugin.hook, low_uid, "c0", RegionSpec(uuids=[GPU_0], priority=0, recent_kernel=3)
        )
        wait_until(lambda: _recent_kernel(low) == BLOCKED, timeout=20.0)
        assert _recent_kernel(high) >= 0


def test_a_region_cannot_steer_other_gpus_nor_invent_series(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    """Issue 25 item 5: a workload booked on GPU_1 writes GPU_0 (the victim's) and an invented
    UUID into its region, with priority 0 and 80 GiB used. The victim on GPU_0 (priority 1,
    active) is neither blocked nor switched, and the attacker's series name only GPU_1."""
    invented = "GPU-00000000-dead-beef-0000-000000000000"
    with running_device_plugin(tmp_path, apiserver) as plugin:
        victim_uid = add_booked_pod(
            apiserver, "victim", ((ContainerDevice(GPU_0, "NVIDIA", 1000, 10),),), priority=1
        )
        attacker_uid = add_booked_pod(
            apiserver, "attacker", ((ContainerDevice(GPU_1, "NVIDIA", 1000, 10),),), priority=1
        )
        victim = region_file(
            plugin.hook, victim_uid, "c0", RegionSpec(uuids=[GPU_0], recent_kernel=1000)
        )
        big = DeviceMemory(total=80 << 30)
        attacker = region_file(
            plugin.hook,
            attacker_uid,
            "c0",
            RegionSpec(
                uuids=[GPU_0, invented, GPU_1],
                priority=0,
                recent_kernel=1000,
                procs=[Proc(used=[big, big, DeviceMemory(total=MIB)], sm_util=[1, 1, 1])],
            ),
        )
        # Both are fed back (their recentKernel counts down) once the pods are listed.
        wait_until(
            lambda: _recent_kernel(victim) < 1000 and _recent_kernel(attacker) < 1000, timeout=20.0
        )
        assert _recent_kernel(victim) > 0  # not blocked
        assert _utilization_switch(victim) == 0  # nobody else is active on GPU_0
        used = scrape(plugin.url)["hami_vgpu_memory_used_bytes"]
        attacker_series = {
            dict(key)["device_uuid"]: sample
            for key, sample in used.items()
            if dict(key)["pod"] == "attacker"
        }
        assert attacker_series == {GPU_1: float(MIB)}


def test_priority_feedback_can_be_switched_off(tmp_path: Path) -> None:
    assert resolve([]).priority_feedback is True
    assert resolve(["--priority-feedback=false"]).priority_feedback is False
    assert resolve([]).vgpu_resync_interval_seconds == 300.0
    assert resolve(["--vgpu-resync-interval", "90s"]).vgpu_resync_interval_seconds == 90.0
    assert resolve([], {"HAMI_RESYNC_INTERVAL": "1m30s"}).vgpu_resync_interval_seconds == 90.0


def test_zero_turns_the_endpoint_off(tmp_path: Path, apiserver: FakeApiServer) -> None:
    with running_device_plugin(tmp_path, apiserver, bind="0") as plugin:
        assert plugin.daemon.metrics is None
        assert not any(t.name == "metrics-http" for t in threading.enumerate())


def test_an_unusable_address_leaves_the_gpus_served(
    tmp_path: Path, apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.ERROR),
        running_device_plugin(tmp_path, apiserver, bind="9394") as plugin,
    ):
        assert plugin.daemon.metrics is None
        assert plugin.daemon.board is not None and plugin.daemon.board.devices
    assert (
        "--metrics-bind-address: expected host:port, :port or 0 (off), got '9394'; "
        "running without metrics" in caplog.text
    )


def test_stop_closes_the_endpoint(tmp_path: Path, apiserver: FakeApiServer) -> None:
    with running_device_plugin(tmp_path, apiserver) as plugin:
        url = plugin.url
        scrape(url)
    assert not any(t.name == "metrics-http" for t in threading.enumerate())
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


# --- the flag ---------------------------------------------------------------------------------


def resolve(argv: list[str], env: dict[str, str] | None = None) -> DevicePluginSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve_settings(parser.parse_args(["--node-name", NODE, *argv]), env or {})


def test_flag_default_env_and_file(tmp_path: Path) -> None:
    assert resolve([]).metrics_bind_address == ":9394"  # HAMi's vGPU monitor port
    assert resolve(["--metrics-bind-address", "0"]).metrics_bind_address == "0"
    assert resolve([], {"METRICS_BIND_ADDRESS": "127.0.0.1:9400"}).metrics_bind_address == (
        "127.0.0.1:9400"
    )
    config = tmp_path / "config.yaml"
    config.write_text("metrics_bind_address: ':9500'\n")
    assert resolve(["--config-file", str(config)]).metrics_bind_address == ":9500"
    flag_wins = resolve(["--metrics-bind-address", ":1"], {"METRICS_BIND_ADDRESS": ":2"})
    assert flag_wins.metrics_bind_address == ":1"
