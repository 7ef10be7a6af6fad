"""The whole daemon over real wire: fake NVML file, test kubelet, API server double.

In-process runs (`DevicePluginDaemon` on a thread) cover the end-to-end path and health; the
`hami device-plugin` sub-process covers signals, exit codes and the one-line start errors.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_container
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import DeviceState, FakeKubelet
from tests.processes import LoggedProcess, hami_command, wait_until

NODE = "gpu-node-1"
GPU_0 = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_1 = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
SPLIT = 3


def write_gpus(path: Path, *, healthy_1: bool = True, init_error: str | None = None) -> None:
    document: dict[str, object] = {
        "gpus": [
            {"uuid": GPU_0, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0},
            {"uuid": GPU_1, "name": "Tesla V100", "memory_mib": 16384, "numa_node": 1,
             "healthy": healthy_1},
        ]
    }  # fmt: skip
    if init_error:
        document["init_error"] = init_error
    # Replace the file (new inode), as an editor would, so the change is always seen.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(document), encoding="utf-8")
    tmp.replace(path)


@dataclass
class Running:
    daemon: DevicePluginDaemon
    kubelet: FakeKubelet
    apiserver: FakeApiServer
    gpus_file: Path
    hook_path: str
    thread: threading.Thread
    clock: ManualClock


@pytest.fixture
def running(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Running]:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    hook = str(tmp_path / "hook")
    install_fake_hamicore(hook)
    settings = DevicePluginSettings(
        metrics_bind_address="0",  # no /metrics port in wire tests
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=SPLIT,
        hook_path=hook,
        health_recovery_seconds=30.0,  # of the daemon's clock: passes when a test moves it
        register_interval_seconds=0.3,
    )
    clock = ManualClock()
    daemon = DevicePluginDaemon(
        settings,
        load_nvml=load_nvml_module,
        kube=kube,
        vgpulock_path=str(tmp_path / "vgpulock"),
        clock=clock,
    )
    kubelet = FakeKubelet(sock_dir).start()
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    try:
        assert daemon.started.wait(10)
        yield Running(daemon, kubelet, apiserver, gpus_file, hook, thread, clock)
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
    assert exit_codes == [0]
    assert not os.path.exists(os.path.join(sock_dir, settings.socket_name))


def healthy_ids(states: tuple[DeviceState, ...]) -> list[str]:
    return [s.id for s in states if s.health == "Healthy"]


def register_value(apiserver: FakeApiServer) -> str | None:
    node = apiserver.get_node(NODE)
    assert node is not None
    value = node["metadata"]["annotations"].get(ANNOTATION_NODE_REGISTER)
    return None if value is None else str(value)


def registered_health(apiserver: FakeApiServer) -> list[bool]:
    """The health of each GPU the register annotation lists; none before it is written (a
    wait's predicate must answer False then, not raise)."""
    value = register_value(apiserver)
    return [] if value is None else [d.healthy for d in codec.decode_node_devices(value)]


def bind_as_the_scheduler_would(
    apiserver: FakeApiServer, name: str, entries: tuple[tuple[ContainerDevice, ...], ...]
) -> None:
    value = codec.encode_pod_devices(entries)
    apiserver.add_pod(
        name,
        node_name=NODE,
        annotations={
            ANNOTATION_DEVICES_TO_ALLOCATE: value,
            ANNOTATION_DEVICES_ALLOCATED: value,
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_VGPU_TIME: "1705054796",
            ANNOTATION_BIND_TIME: "1705054797",
            ANNOTATION_BIND_PHASE: "allocating",
        },
        labels={LABEL_VGPU_NODE: NODE},
        containers=[make_container("cuda", limits={"nvidia.com/gpu": str(len(entries[0]))})],
    )
    apiserver.update_object(
        "nodes",
        "",
        NODE,
        lambda node: node["metadata"]["annotations"].update(
            {ANNOTATION_NODE_LOCK: f"2026-07-03T15:35:10+08:00,default,{name}"}
        ),
    )


def test_end_to_end_from_scheduler_annotations_to_bind_success(running: Running) -> None:
    kubelet, apiserver = running.kubelet, running.apiserver
    (connection,) = kubelet.wait_for_registrations(1)
    assert connection.request.resource_name == "nvidia.com/gpu"
    listed = kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == 2 * SPLIT)
    assert [s.id for s in listed] == [f"{g}-{i}" for g in (GPU_0, GPU_1) for i in range(SPLIT)]

    wait_until(lambda: register_value(apiserver) is not None, timeout=30.0)
    registered = codec.decode_node_devices(register_value(apiserver) or "")
    assert [(d.uuid, d.type, d.memory_mib, d.split_count, d.numa_node) for d in registered] == [
        (GPU_0, "NVIDIA A100-SXM4-80GB", 81920, SPLIT, 0),
        (GPU_1, "NVIDIA-Tesla V100", 16384, SPLIT, 1),
    ]

    bind_as_the_scheduler_would(
        apiserver,
        "trainer",
        ((ContainerDevice(GPU_1, "NVIDIA", 4000, 25), ContainerDevice(GPU_0, "NVIDIA", 8000, 25)),),
    )
    available = [s.id for s in listed]
    chosen = kubelet.preferred(available, size=2)
    assert chosen == [f"{GPU_1}-0", f"{GPU_0}-0"]
    answer = kubelet.allocate(chosen).container_responses[0]

    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_1},{GPU_0}"
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8000m"
    assert answer.envs["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert answer.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(f"{running.hook_path}/vgpu/")
    pod = apiserver.get_pod("default", "trainer")
    assert pod is not None
    uid = pod["metadata"]["uid"]
    assert [m.container_path for m in answer.mounts] == [
        f"{running.hook_path}/vgpu/libvgpu.so",
        f"{running.hook_path}/vgpu",
        "/tmp/vgpulock",
        "/etc/ld.so.preload",
    ]
    assert answer.mounts[1].host_path == f"{running.hook_path}/vgpu/containers/{uid}_cuda"
    assert pod["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "success"
    assert pod["metadata"]["annotations"][ANNOTATION_DEVICES_TO_ALLOCATE] == ";;"
    node = apiserver.get_node(NODE)
    assert node is not None
    assert ANNOTATION_NODE_LOCK not in node["metadata"]["annotations"]


def node_annotation(apiserver: FakeApiServer, key: str) -> str | None:
    node = apiserver.get_node(NODE)
    assert node is not None
    value = node["metadata"]["annotations"].get(key)
    return None if value is None else str(value)


def test_the_in_flight_protocol_is_claimed_while_serving_and_withdrawn_on_stop(
    running: Running,
) -> None:
    apiserver = running.apiserver
    wait_until(
        lambda: node_annotation(apiserver, ANNOTATION_ALLOCATE_PROTOCOL) == "in-flight/v1",
        timeout=30.0,
    )
    # Lost (a Node object re-created, someone's edit): the next round writes it again.
    apiserver.update_object(
        "nodes", "", NODE, lambda n: n["metadata"]["annotations"].pop(ANNOTATION_ALLOCATE_PROTOCOL)
    )
    wait_until(
        lambda: node_annotation(apiserver, ANNOTATION_ALLOCATE_PROTOCOL) is not None, timeout=5.0
    )
    running.daemon.stop()
    running.thread.join(10)
    assert node_annotation(apiserver, ANNOTATION_ALLOCATE_PROTOCOL) is None
    assert node_annotation(apiserver, ANNOTATION_NODE_REGISTER) is not None


def test_a_bad_pod_fails_while_the_daemon_keeps_serving(running: Running) -> None:
    import grpc

    kubelet, apiserver = running.kubelet, running.apiserver
    kubelet.wait_for_registrations(1)
    apiserver.add_pod(
        "broken",
        node_name=NODE,
        annotations={
            ANNOTATION_DEVICES_TO_ALLOCATE: "GPU-x,NVIDIA,notanumber,0:;",
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_TIME: "1",
            ANNOTATION_BIND_PHASE: "allocating",
        },
    )
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.allocate([f"{GPU_0}-0"])
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert ANNOTATION_DEVICES_TO_ALLOCATE in caught.value.details()
    broken = apiserver.get_pod("default", "broken")
    assert broken is not None
    assert broken["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "failed"

    bind_as_the_scheduler_would(apiserver, "next", ((ContainerDevice(GPU_0, "NVIDIA", 1000, 10),),))
    answer = kubelet.allocate([f"{GPU_0}-2"]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_0


def test_a_health_flip_reaches_kubelet_and_recovers(running: Running) -> None:
    kubelet, apiserver = running.kubelet, running.apiserver
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == 2 * SPLIT)

    write_gpus(running.gpus_file, healthy_1=False)
    sick = kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == SPLIT, timeout=30.0)
    assert {s.id for s in sick if s.health == "Unhealthy"} == {f"{GPU_1}-{i}" for i in range(3)}
    wait_until(
        lambda: registered_health(apiserver) == [True, False],
        timeout=30.0,
    )

    write_gpus(running.gpus_file, healthy_1=True)
    running.clock.advance(30.0)  # the recovery window passes on the clock the daemon was given
    kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == 2 * SPLIT, timeout=30.0)
    wait_until(
        lambda: registered_health(apiserver) == [True, True],
        timeout=30.0,
    )


def test_the_daemon_follows_a_kubelet_restart(running: Running) -> None:
    kubelet = running.kubelet
    kubelet.wait_for_registrations(1)
    kubelet.restart()
    second = kubelet.wait_for_registrations(2)[1]
    kubelet.wait_for_list(lambda s: len(healthy_ids(s)) == 2 * SPLIT, connection=second)


# --- the sub-command as a process ---------------------------------------------------------------


def start_cli(log_dir: Path, *args: str, env: dict[str, str] | None = None) -> LoggedProcess:
    """`hami device-plugin <args>`, logging to `<log_dir>/device-plugin.log`."""
    return LoggedProcess("device-plugin", hami_command("device-plugin", *args), log_dir, env)


def _sigterm_another_thread(process: LoggedProcess) -> int:
    """SIGTERM to one of the process's threads other than the main one (the kernel may hand a
    process's signal to any thread; only the main thread runs Python's handlers)."""
    threads = [int(t) for t in os.listdir(f"/proc/{process.pid}/task")]
    other = next(t for t in threads if t != process.pid)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.tgkill(process.pid, other, signal.SIGTERM) == 0, ctypes.get_errno()
    return process.wait(30)


@pytest.mark.parametrize("delivered_to", ["the process", "another thread"])
def test_sigterm_stops_serving_removes_the_socket_and_exits_zero(
    delivered_to: str, sock_dir: str, tmp_path: Path, apiserver: FakeApiServer
) -> None:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with FakeKubelet(sock_dir) as kubelet:
        process = start_cli(
            tmp_path, "--nvml", "fake", "--fake-gpus", str(gpus_file), "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--device-plugin-path", sock_dir,
            "--hook-path", str(tmp_path / "hook"),
        )  # fmt: skip
        try:
            kubelet.wait_for_registrations(1, timeout=15)
            kubelet.wait_for_list(lambda s: len(s) == 20, timeout=30.0)
            wait_until(lambda: register_value(apiserver) is not None, timeout=30.0)
            if delivered_to == "the process":
                code = process.stop(15)
            else:  # the main thread must not sleep in an untimed wait
                code = _sigterm_another_thread(process)
        finally:
            process.kill()  # only when something above failed: the exit status is kept
        output = process.log()
        assert code == 0, output
        assert not os.path.exists(os.path.join(sock_dir, "nvidia-gpu.sock"))
        assert "received SIGTERM" in output
        node = apiserver.get_node(NODE)
        assert node is not None
        assert ANNOTATION_ALLOCATE_PROTOCOL not in node["metadata"]["annotations"]
        assert kubelet.latest().stream_ended.wait(5)


def test_nvml_failure_at_start_is_one_line_and_exit_one(tmp_path: Path, sock_dir: str) -> None:
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file, init_error="LibraryNotFound")
    process = start_cli(
        tmp_path, "--nvml", "fake", "--fake-gpus", str(gpus_file), "--device-plugin-path",
        sock_dir, env={"NODE_NAME": NODE},
    )  # fmt: skip
    code, output = process.wait(), process.log()
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "ERROR" in lines[0] and "NVML" in lines[0]
    assert os.listdir(sock_dir) == []


def test_without_fail_on_init_error_the_daemon_waits_for_nvml(
    tmp_path: Path, sock_dir: str
) -> None:
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file, init_error="DriverNotLoaded")
    process = start_cli(
        tmp_path, "--nvml", "fake", "--fake-gpus", str(gpus_file), "--device-plugin-path",
        sock_dir, "--fail-on-init-error=false", env={"NODE_NAME": NODE},
    )  # fmt: skip
    try:
        wait_until(
            lambda: (
                "advertising no GPUs and retrying" in process.log()
                or process.process.poll() is not None
            ),
            "the daemon to wait for NVML",
            timeout=30,
        )
        assert process.process.poll() is None  # still up, its SIGTERM handler in place
        code = process.stop(15)
    finally:
        process.kill()  # only when something above failed: the exit status is kept
    output = process.log()
    assert code == 0, output
    assert "advertising no GPUs and retrying" in output
    assert os.listdir(sock_dir) == []


def test_a_settings_error_is_one_line_and_exit_two(tmp_path: Path) -> None:
    process = start_cli(tmp_path, "--nvml", "fake")
    code, output = process.wait(), process.log()
    assert code == 2
    (line,) = output.strip().splitlines()
    assert "node name is required" in line
