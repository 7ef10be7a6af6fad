"""Benchmark of the device-plugin daemon (run by `make bench`; prints figures, asserts nothing).

Figures, each printed as one JSON line:

* `start_to_register`: `hami device-plugin --nvml fake` started as a process (8 GPUs) until the
  test kubelet records its Register call (target < 1.5 s), with the bare interpreter start for
  reference;
* `reregister_after_kubelet_restart`: kubelet restart (sockets deleted, new kubelet.sock) until
  the daemon has registered again (target < 1 s);
* `allocate_*`: Allocate latency through the unix socket over N calls, p50/p99/max in ms:
  `allocate_no_api` with an in-memory cluster (the API server time left out; target p99 < 5 ms),
  `allocate_api_double` with the real client against the HTTP API server double, and
  `allocate_decision` for the pure decision alone;
* `listandwatch_health_flip`: a GPU marked unhealthy in the fake NVML file until kubelet's
  ListAndWatch reader has the new list;
* `daemon_rss`: resident memory of the daemon process with 8 GPUs x 10 splits, registered,
  after Allocate calls (target < 80 MiB).

    python tests/benchmarks/bench_deviceplugin.py [--allocations 1000] [--starts 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# grpc core logs every GOAWAY of the test kubelet's channels at INFO; keep the figures readable.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

from hami_plugin.deviceplugin.allocate import AllocateConfig, decide_allocation  # noqa: E402
from hami_plugin.deviceplugin.allocator import PodAllocator  # noqa: E402
from hami_plugin.deviceplugin.api import api_pb2  # noqa: E402
from hami_plugin.deviceplugin.board import DeviceBoard  # noqa: E402
from hami_plugin.deviceplugin.inventory import VgpuDevice  # noqa: E402
from hami_plugin.deviceplugin.server import DevicePluginService, PluginServer  # noqa: E402
from hami_plugin.kube.api import AllocateApi  # noqa: E402
from hami_plugin.kube.client import KubeClient  # noqa: E402
from hami_plugin.kube.fake import FakeKube  # noqa: E402
from hami_plugin.kube.retry import RetryPolicy  # noqa: E402
from hami_plugin.protocol import codec  # noqa: E402
from hami_plugin.protocol.model import (  # noqa: E402
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.protocol.objects import read_pod  # noqa: E402
from hami_plugin.testing.apiserver import (  # noqa: E402
    FakeApiServer,
    make_container,
    make_node,
    make_pod,
)
from hami_plugin.testing.hamicore import install_fake_hamicore  # noqa: E402
from hami_plugin.testing.kubelet import DeviceState, FakeKubelet  # noqa: E402
from tests.processes import LoggedProcess  # noqa: E402

NODE = "bench-node"
GPUS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab" for i in range(8)]
SPLIT = 10


def emit(name: str, **figures: object) -> None:
    print(json.dumps({"bench": name, **figures}), flush=True)


def percentiles_ms(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "n": len(ordered),
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def write_gpus(path: Path, unhealthy: int | None = None) -> None:
    gpus = [
        {"uuid": uuid, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
         "numa_node": i // 4, "healthy": i != unhealthy}
        for i, uuid in enumerate(GPUS)
    ]  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")
    tmp.replace(path)


# --- the daemon as a process ------------------------------------------------------------------


def daemon_command(gpus_file: Path, kubeconfig: Path, plugin_dir: str, hook: str) -> list[str]:
    return [
        sys.executable, "-m", "hami_plugin", "device-plugin", "--nvml", "fake",
        "--fake-gpus", str(gpus_file), "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--device-plugin-path", plugin_dir, "--hook-path", hook,
        "--health-recovery-seconds", "0.2",
    ]  # fmt: skip


def bench_daemon_process(starts: int, work: Path) -> None:
    interpreter = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        interpreter.append(time.perf_counter() - began)

    with FakeApiServer() as apiserver:
        apiserver.add_node(NODE)
        kubeconfig = apiserver.write_kubeconfig(work / "kubeconfig")
        gpus_file = work / "gpus.yaml"
        write_gpus(gpus_file)
        hook = str(work / "hook")
        install_fake_hamicore(hook)
        samples = []
        restart_samples = []
        for attempt in range(starts):
            plugin_dir = tempfile.mkdtemp(prefix="hami-bench-", dir="/tmp")
            kubelet = FakeKubelet(plugin_dir).start()
            began = time.perf_counter()
            process = LoggedProcess(
                "device-plugin", daemon_command(gpus_file, kubeconfig, plugin_dir, hook), work
            )
            try:
                kubelet.wait_for_registrations(1, timeout=30)
                samples.append(time.perf_counter() - began)
                kubelet.wait_for_list(lambda s: len(s) == len(GPUS) * SPLIT, timeout=10)
                for restart in range(3):
                    began = time.perf_counter()
                    kubelet.restart()
                    kubelet.wait_for_registrations(restart + 2, timeout=10)
                    restart_samples.append(time.perf_counter() - began)
                if attempt == starts - 1:
                    bench_health_and_rss(process, kubelet, gpus_file, apiserver)
            finally:
                process.stop(10)
                kubelet.stop()
                shutil.rmtree(plugin_dir, ignore_errors=True)
    emit(
        "start_to_register",
        runs=len(samples),
        median_s=round(statistics.median(samples), 3),
        min_s=round(min(samples), 3),
        max_s=round(max(samples), 3),
        python_startup_median_s=round(statistics.median(interpreter), 3),
        target_s=1.5,
    )
    emit(
        "reregister_after_kubelet_restart",
        runs=len(restart_samples),
        median_s=round(statistics.median(restart_samples), 3),
        max_s=round(max(restart_samples), 3),
        target_s=1.0,
    )


def bench_health_and_rss(
    process: LoggedProcess,
    kubelet: FakeKubelet,
    gpus_file: Path,
    apiserver: FakeApiServer,
) -> None:
    flips = []
    recoveries = []
    for round_ in range(5):
        sick = GPUS[round_ % len(GPUS)]
        began = time.perf_counter()
        write_gpus(gpus_file, unhealthy=round_ % len(GPUS))

        def is_sick(states: tuple[DeviceState, ...], sick: str = sick) -> bool:
            return any(d.health == "Unhealthy" and d.id.startswith(sick) for d in states)

        kubelet.wait_for_list(is_sick, timeout=10)
        flips.append(time.perf_counter() - began)
        began = time.perf_counter()
        write_gpus(gpus_file)
        kubelet.wait_for_list(lambda s: all(d.health == "Healthy" for d in s), timeout=10)
        recoveries.append(time.perf_counter() - began)
    emit(
        "listandwatch_health_flip",
        runs=len(flips),
        unhealthy_median_s=round(statistics.median(flips), 3),
        unhealthy_max_s=round(max(flips), 3),
        recovered_median_s=round(statistics.median(recoveries), 3),
        recovery_window_s=0.2,
        target_s=2.0,
    )
    # Memory after the process has served lists and allocations (in-cluster shaped load).
    for index in range(100):
        # a pod per Allocate, each gone once served (as pods come and go on a node)
        rss_pod = pending_pod(f"rss-pod-{index}")
        rss_pod["metadata"]["uid"] = f"0a1b2c3d-0000-4000-8000-{index + 2:012d}"
        apiserver.add_pod(rss_pod)
        allocate_when_seen(kubelet)
        apiserver.delete_object("pods", "default", f"rss-pod-{index}")
    time.sleep(1.0)
    emit(
        "daemon_rss",
        gpus=len(GPUS),
        split=SPLIT,
        devices=len(GPUS) * SPLIT,
        rss_mib=round(process.memory_kib()["VmRSS"] / 1024, 1),
        target_mib=80,
    )


def allocate_when_seen(kubelet: FakeKubelet, tries: int = 50) -> None:
    """Allocate for the pod just marked pending again, once the plugin sees it so (its reads
    may come from its node watch, a moment behind the API server)."""
    for attempt in range(tries):
        try:
            kubelet.allocate([f"{GPUS[3]}-1"])
            return
        except grpc.RpcError:
            if attempt == tries - 1:
                raise
            time.sleep(0.02)


# --- Allocate through the socket -----------------------------------------------------------------


TO_ALLOCATE = codec.encode_pod_devices(((ContainerDevice(GPUS[3], "NVIDIA", 4000, 30),),))
PENDING = {
    ANNOTATION_DEVICES_TO_ALLOCATE: TO_ALLOCATE,
    ANNOTATION_VGPU_NODE: NODE,
    ANNOTATION_BIND_TIME: "1705054797",
    ANNOTATION_BIND_PHASE: "allocating",
}
LOCK = {ANNOTATION_NODE_LOCK: "2026-07-03T15:35:10Z,default,bench-pod"}


def pending_pod(name: str = "bench-pod") -> dict[str, Any]:
    return make_pod(
        name,
        uid="0a1b2c3d-0000-4000-8000-000000000001",
        node_name=NODE,
        annotations=PENDING,
        containers=[make_container("cuda")],
    )


def time_allocates(
    kube: AllocateApi, reset: Callable[[], None], calls: int, hook: str, plugin_dir: str
) -> list[float]:
    devices = [VgpuDevice(f"{g}-{i}", g, True, None) for g in GPUS for i in range(SPLIT)]
    board = DeviceBoard(devices)
    allocator = PodAllocator(
        kube, NODE, AllocateConfig(hook_path=hook, vgpulock_host_path=f"{hook}/vgpulock")
    )
    server = PluginServer(DevicePluginService(board, allocator), f"{plugin_dir}/bench.sock")
    server.start()
    samples = []
    import grpc

    from hami_plugin.deviceplugin.api import api_pb2_grpc

    try:
        with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=[f"{GPUS[3]}-7"])
            for call in range(calls + 20):
                reset()
                began = time.perf_counter()
                stub.Allocate(request, timeout=10)
                if call >= 20:  # warm-up left out
                    samples.append(time.perf_counter() - began)
    finally:
        server.stop()
        board.close()
    return samples


def bench_allocate(calls: int, work: Path) -> None:
    hook = str(work / "hook-alloc")
    install_fake_hamicore(hook)
    plugin_dir = tempfile.mkdtemp(prefix="hami-bench-", dir="/tmp")
    try:
        memory = FakeKube(nodes=[make_node(NODE, annotations=LOCK)], pods=[pending_pod()])

        def reset_memory() -> None:
            memory.put_node(make_node(NODE, annotations=LOCK))
            memory.put_pod(pending_pod())

        emit(
            "allocate_no_api",
            transport="unix socket gRPC",
            cluster="in memory",
            **percentiles_ms(time_allocates(memory, reset_memory, calls, hook, plugin_dir)),
            target_p99_ms=5,
        )

        with FakeApiServer() as apiserver:
            apiserver.add_node(NODE)
            apiserver.add_pod("bench-pod", node_name=NODE, annotations=PENDING)
            # Other pods on the node, as a busy node would have.
            for index in range(30):
                apiserver.add_pod(f"other-{index}", node_name=NODE, phase="Running")

            def reset_api() -> None:
                apiserver.update_object(
                    "pods", "default", "bench-pod",
                    lambda pod: pod["metadata"]["annotations"].update(PENDING),
                )  # fmt: skip
                apiserver.update_object(
                    "nodes", "", NODE, lambda node: node["metadata"]["annotations"].update(LOCK)
                )

            retry = RetryPolicy(attempts=3, initial_backoff_seconds=0.01, timeout_seconds=5)
            with KubeClient(apiserver.api_client(), retry) as kube:
                samples = time_allocates(kube, reset_api, calls, hook, plugin_dir)
            emit(
                "allocate_api_double",
                transport="unix socket gRPC",
                cluster="HTTP API server double (4 API calls per Allocate)",
                pods_on_node=31,
                **percentiles_ms(samples),
            )
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)

    pod = read_pod(pending_pod())
    config = AllocateConfig(hook_path=hook)
    decision_samples = []
    for _ in range(calls):
        began = time.perf_counter()
        decide_allocation(pod, [[f"{GPUS[3]}-7"]], config, lambda: "cache-id")
        decision_samples.append(time.perf_counter() - began)
    emit("allocate_decision", **percentiles_ms(decision_samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hami-bench-work-"))
    try:
        bench_allocate(args.allocations, work)
        bench_daemon_process(args.starts, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
