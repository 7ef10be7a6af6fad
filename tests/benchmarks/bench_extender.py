"""Benchmark of `hami scheduler` over HTTP, as kube-scheduler drives it (run by `make bench`).

Three processes on this machine: the API server double (`hami_plugin.testing.apiserver`,
preloaded with N nodes of 8 GPUs about half used by Running pods, and the Pending pods to
schedule), `hami scheduler` (a subprocess, its kubeconfig pointing at the double), and this
driver playing kube-scheduler (persistent HTTP connections, `NodeNames` listing every node).
Per cluster size it prints one JSON line per figure:

* `startup`: seconds from the scheduler's start to /readyz 200 (the first pod and node lists);
* `filter`: POST /filter round trip, p50/p99 (a 1-GPU pod, every node a candidate);
* `bind`: POST /bind round trip, p50/p99 (the filter before it is not timed);
* `sustained`: pods/s through filter + bind in kube-scheduler's pattern: filter calls one at a
  time, up to 16 binds in flight (`--binds-in-flight`);
* `watch`: a node annotation change (the register annotation removed, then restored) until
  /filter answers differently for that node, p50/p99: watch event to ledger updated, measured
  from outside;
* `memory`: the scheduler's VmRSS and VmHWM (/proc/<pid>/status) after all of the above;
* `burst` (`--burst-sizes`, 100 and 5,000 nodes): 100 single-GPU pods onto one node, through
  filter, bind and the device plugin's Allocate: `hami device-plugin --nvml fake` as a
  subprocess, the test kubelet and its `PodAdmitter` admitting pods in its own order; pods/s and
  the number of containers that got another pod's GPUs (must be 0), once on a node with our
  allocate protocol (several pods in flight) and once on a node without it (HAMi's node lock:
  one pod per bind-to-Allocate round trip). `NodeNames` is that node alone here (binpack would
  send the burst to the fullest node, which is one of the preloaded ones). At 5,000 nodes the
  double answers the `spec.nodeName` lists of the device plugin and the test kubelet by
  scanning every stored pod (~40 ms each), which then bounds the burst, not the scheduler.

The preloaded nodes carry an old `Requesting_` handshake, as in a cluster the scheduler ran
on before (steady state). On a fresh cluster a new leader first writes one handshake per node
(HAMi does too): 5,000 node patches competing with the first minute of filters and binds.

The preloaded nodes have no kubelet: the driver admits every pod it bound at once (one merge
patch: bind-phase success, Running), so the in-flight rules see pods start as in a cluster.

Only correctness is asserted (every bind answered, every pod bound where filter said, no
container with another pod's GPUs); the figures are printed, not judged.

    python tests/benchmarks/bench_extender.py [--sizes 1000,5000] [--filters 300] ...
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3
import yaml

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    ContainerDevice,
    GpuDevice,
)
from hami_plugin.testing.apiserver import make_container, make_pod

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `make bench` runs this file as a script

from tests.processes import LoggedProcess, hami_command, wait_until  # noqa: E402

if TYPE_CHECKING:
    from hami_plugin.testing.admission import PodAdmitter
GPUS_PER_NODE = 8
SPLIT = 10
MEMORY_MIB = 81920
NAMESPACE = "default"
GPU_TYPE = "NVIDIA A100-SXM4-80GB"
BURST_PODS = 100
BURST_SPLIT = 16  # 8 GPUs x 16 = 128 slots: room for the whole burst on one node
_T0 = datetime(2026, 11, 30, 8, tzinfo=UTC)
HANDSHAKE = codec.format_handshake_requesting(_T0)
WAIT_SECONDS = 120.0
"""Bound for a wait: room for 5,000-node clusters on 2 shared cores."""


def emit(name: str, **figures: object) -> None:
    print(json.dumps({"bench": name, **figures}), flush=True)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def millis(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 0.5) * 1000, 3),
        "p99_ms": round(percentile(samples, 0.99) * 1000, 3),
        "max_ms": round(max(samples) * 1000, 3),
    }


# --- the cluster's objects ------------------------------------------------------------------


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{index:012x}"


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(
    name: str,
    *,
    gpus: int,
    memory_mib: int,
    cores: int = 0,
    created: datetime = _T0,
    node: str = "",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(memory_mib)}
    if cores:
        limits["nvidia.com/gpucores"] = str(cores)
    return make_pod(
        name,
        NAMESPACE,
        node_name=node,
        phase=phase,
        annotations=annotations,
        labels=labels,
        containers=[make_container("c0", limits=limits, image="cuda")],
        scheduler_name="hami-scheduler",
        uid=f"uid-{name}",
        creation_timestamp=_stamp(created),
    )


def _node(name: str, annotations: Mapping[str, str], gpu_slots: int) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpu_slots)}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "annotations": dict(annotations),
            "labels": {"kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def _gpu(uuid: str, index: int, split: int) -> GpuDevice:
    numa = index // 4
    return GpuDevice(uuid, index, split, MEMORY_MIB, 100, GPU_TYPE, numa, "hami-core", True)


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def cluster_objects(size: int, pending: int, rng: random.Random) -> list[dict[str, Any]]:
    """`size` nodes of 8 GPUs, each with 4 Running pods of 2 GPUs (20-80 % of their memory and
    cores: about half used), `pending` Pending 1-GPU pods `bench-<i>`, and the two burst
    nodes (no annotations: their device plugins register them)."""
    objects: list[dict[str, Any]] = []
    for index in range(size):
        name = node_name(index)
        devices = [_gpu(gpu_uuid(index, gpu), gpu, SPLIT) for gpu in range(GPUS_PER_NODE)]
        annotations = {
            ANNOTATION_NODE_REGISTER: codec.encode_node_devices(devices),
            ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL,
            # a cluster the scheduler has run on before: an old `Requesting_` handshake (the
            # node stays healthy while kubelet advertises GPUs); without it a fresh leader
            # first writes one handshake per node, as HAMi does
            ANNOTATION_NODE_HANDSHAKE: HANDSHAKE,
        }
        objects.append(_node(name, annotations, GPUS_PER_NODE * SPLIT))
        for pair in range(GPUS_PER_NODE // 2):
            fill = rng.uniform(0.2, 0.8)
            memory = int(fill * MEMORY_MIB)
            cores = int(fill * 100)
            booking = codec.encode_pod_devices(
                (
                    tuple(
                        ContainerDevice(gpu_uuid(index, gpu), "NVIDIA", memory, cores)
                        for gpu in (2 * pair, 2 * pair + 1)
                    ),
                )
            )
            objects.append(
                _pod(
                    f"run-{index}-{pair}",
                    gpus=2,
                    memory_mib=memory,
                    cores=cores,
                    node=name,
                    phase="Running",
                    annotations={
                        ANNOTATION_VGPU_NODE: name,
                        ANNOTATION_VGPU_TIME: "1764489600",
                        ANNOTATION_DEVICES_ALLOCATED: booking,
                        ANNOTATION_DEVICES_TO_ALLOCATE: ";",
                        ANNOTATION_BIND_PHASE: "success",
                        ANNOTATION_BIND_TIME: "1764489600",
                    },
                    labels={LABEL_VGPU_NODE: name},
                )
            )
    for index in range(pending):
        # created a second apart: a backlog, so the in-flight rules never need to wait
        created = _T0 + timedelta(seconds=index)
        objects.append(_pod(f"bench-{index}", gpus=1, memory_mib=1000, cores=10, created=created))
    for mode in ("inflight", "lock"):
        objects.append(_node(f"burst-{mode}", {}, GPUS_PER_NODE * BURST_SPLIT))
        for index in range(BURST_PODS):
            created = _T0 + timedelta(seconds=index // 10)  # a Job: ten pods per second
            objects.append(
                _pod(f"burst-{mode}-{index}", gpus=1, memory_mib=1000 + index, created=created)
            )
    return objects


# --- processes ------------------------------------------------------------------------------


class Extender:
    """kube-scheduler's side of the extender protocol, one keep-alive connection per thread."""

    def __init__(self, url: str, node_names: list[str]) -> None:
        match = re.fullmatch(r"http://([^:/]+):(\d+)", url)
        assert match is not None, url
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = url
        self._local = threading.local()
        self.set_nodes(node_names)

    def set_nodes(self, node_names: list[str]) -> None:
        self._names = json.dumps(node_names).encode()

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
            connection.connect()
            # Go's net/http (kube-scheduler) sets TCP_NODELAY; http.client does not.
            assert connection.sock is not None
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.connection = connection
        return connection

    def post(self, path: str, body: bytes) -> tuple[dict[str, Any], float]:
        """The answer and the round trip in seconds (reconnects once if the server closed)."""
        for attempt in (1, 2):
            connection = self._connection()
            started = time.perf_counter()
            try:
                connection.request("POST", path, body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                data = response.read()
            except (http.client.HTTPException, ConnectionError):
                connection.close()
                self._local.connection = None
                if attempt == 2:
                    raise
                continue
            elapsed = time.perf_counter() - started
            assert response.status == 200, (path, response.status, data[:300])
            answer = json.loads(data)
            assert isinstance(answer, dict)
            return answer, elapsed
        raise AssertionError("unreachable")

    def filter(
        self, pod: Mapping[str, Any], names: bytes | None = None
    ) -> tuple[dict[str, Any], float]:
        body = b'{"Pod":%s,"Nodes":null,"NodeNames":%s}' % (
            json.dumps(pod).encode(),
            names if names is not None else self._names,
        )
        return self.post("/filter", body)

    def bind(self, pod: Mapping[str, Any], node: str) -> tuple[str, float]:
        metadata = pod["metadata"]
        body = json.dumps(
            {
                "PodName": metadata["name"],
                "PodNamespace": metadata["namespace"],
                "PodUID": metadata["uid"],
                "Node": node,
            }
        ).encode()
        answer, elapsed = self.post("/bind", body)
        return str(answer["Error"]), elapsed

    def ready(self) -> bool:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except (http.client.HTTPException, ConnectionError):
            return False
        finally:
            connection.close()


def chosen(answer: Mapping[str, Any]) -> str:
    assert not answer["Error"], answer["Error"]
    names = answer["NodeNames"]
    assert names and len(names) == 1, answer
    return str(names[0])


class Kubelets:
    """The kubelets and device plugins of the preloaded nodes, reduced to what the scheduler
    sees of them: a pod bound there is admitted right away (bind-phase success, its GPU entries
    consumed, Running), so the in-flight rules see it start as they would in a cluster. One
    thread, one merge patch per pod, against the API server double."""

    def __init__(self, api_url: str) -> None:
        self._api_url = api_url
        self._http = urllib3.PoolManager(retries=urllib3.Retry(total=3, backoff_factor=0.05))
        self._todo: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kubelets", daemon=True)
        self._thread.start()

    def admit(self, name: str) -> None:
        self._todo.put(name)

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join(60)
        self._http.clear()

    def _run(self) -> None:
        patch = {
            "metadata": {
                "annotations": {
                    ANNOTATION_BIND_PHASE: "success",
                    ANNOTATION_DEVICES_TO_ALLOCATE: ";",
                }
            },
            "status": {"phase": "Running"},
        }
        body = json.dumps(patch).encode()
        while (name := self._todo.get()) is not None:
            response = self._http.request(
                "PATCH",
                f"{self._api_url}/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                body=body,
                headers={
                    "Content-Type": "application/merge-patch+json",
                    "Authorization": "Bearer fake-token",
                },
            )
            assert response.status == 200, (name, response.status)


class Profiler:
    """`py-spy record` on the scheduler process around a phase (`--py-spy PATH`): collapsed
    stacks of the thread holding the GIL, one file per phase, in the kept work directory."""

    def __init__(self, py_spy: str, pid: int, workdir: Path) -> None:
        self.py_spy, self.pid, self.workdir = py_spy, pid, workdir


@contextmanager
def profiled(profile: Profiler | None, phase: str) -> Iterator[None]:
    if profile is None:
        yield
        return
    output = profile.workdir / f"profile-{phase}.txt"
    recorder = subprocess.Popen(
        [profile.py_spy, "record", "--pid", str(profile.pid), "--gil", "--rate", "250",
         "--format", "raw", "--output", str(output), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)
        print(f"# py-spy profile of {phase}: {output}", flush=True)


# --- phases ---------------------------------------------------------------------------------


def probe_pod(index: int) -> dict[str, Any]:
    return _pod(f"probe-{index}", gpus=1, memory_mib=1000, cores=10)


def bench_filter(extender: Extender, size: int, count: int) -> None:
    for index in range(20):  # warm-up: connections, caches
        extender.filter(probe_pod(1_000_000 + index))
    samples = []
    for index in range(count):
        answer, elapsed = extender.filter(probe_pod(index))
        chosen(answer)
        samples.append(elapsed)
    emit("filter", nodes=size, **millis(samples))


def bench_bind(
    extender: Extender,
    api: KubeClient,
    kubelets: Kubelets,
    size: int,
    pods: list[dict[str, Any]],
) -> None:
    samples = []
    for pod in pods:
        node = chosen(extender.filter(pod)[0])
        error, elapsed = extender.bind(pod, node)
        assert error == "", error
        samples.append(elapsed)
        kubelets.admit(pod["metadata"]["name"])
    check_bound(api, pods)
    emit("bind", nodes=size, **millis(samples))


def drive(
    extender: Extender,
    pods: list[dict[str, Any]],
    in_flight: int,
    names: bytes | None = None,
    retry_delay: float = 0.2,
    on_bound: Callable[[str], None] | None = None,
) -> tuple[float, int]:
    """kube-scheduler's loop: filter one pod at a time, hand the bind to up to `in_flight`
    binding goroutines; a bind Error sends the pod back to the queue (filtered again). Returns
    the seconds until every pod is bound, and how many binds failed on the way."""
    todo: queue.Queue[dict[str, Any]] = queue.Queue()
    for pod in pods:
        todo.put(pod)
    slots = threading.Semaphore(in_flight)
    done = threading.Semaphore(0)
    failures = [0]
    lock = threading.Lock()

    def bind(pod: dict[str, Any], node: str) -> None:
        try:
            error, _ = extender.bind(pod, node)
        finally:
            slots.release()
        if error:
            with lock:
                failures[0] += 1
            time.sleep(retry_delay)  # kube-scheduler's backoff before the pod is tried again
            todo.put(pod)
        else:
            if on_bound is not None:
                on_bound(pod["metadata"]["name"])
            done.release()

    started = time.perf_counter()
    bound = 0
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        while bound < len(pods):
            try:
                pod = todo.get(timeout=0.05)
            except queue.Empty:
                while done.acquire(blocking=False):
                    bound += 1
                continue
            answer, _ = extender.filter(pod, names)
            if not answer["NodeNames"]:
                time.sleep(retry_delay)  # unschedulable for now: back to the queue
                todo.put(pod)
                continue
            slots.acquire()
            pool.submit(bind, pod, chosen(answer))
            while done.acquire(blocking=False):
                bound += 1
    return time.perf_counter() - started, failures[0]


def check_bound(api: KubeClient, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        stored = api.get_pod(NAMESPACE, pod["metadata"]["name"])
        assert stored.node_name, f"{stored.name} not bound"
        assert stored.annotations.get(ANNOTATION_VGPU_NODE) == stored.node_name, stored.name


def bench_sustained(
    extender: Extender,
    api: KubeClient,
    kubelets: Kubelets,
    size: int,
    pods: list[dict[str, Any]],
    in_flight: int,
    pids: Mapping[str, int],
    profile: Profiler | None = None,
) -> None:
    before = cpu_seconds(pids)
    with profiled(profile, "sustained"):
        seconds, failures = drive(extender, pods, in_flight, on_bound=kubelets.admit)
    used = {name: round(cpu - before[name], 2) for name, cpu in cpu_seconds(pids).items()}
    check_bound(api, pods)
    emit(
        "sustained",
        nodes=size,
        pods=len(pods),
        binds_in_flight=in_flight,
        seconds=round(seconds, 3),
        pods_per_second=round(len(pods) / seconds, 1),
        bind_errors=failures,
        cpu_seconds=used,
        scheduler_cpu_ms_per_pod=round(used["scheduler"] / len(pods) * 1000, 2),
    )


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process used so far (/proc/<pid>/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    result = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        result[name] = (int(fields[11]) + int(fields[12])) / ticks
    return result


def bench_watch(extender: Extender, api: KubeClient, size: int, samples: int) -> None:
    """Toggle one idle node's register annotation; time until /filter answers for it change."""
    target = node_name(size - 1)
    register = api.get_node(target).annotations[ANNOTATION_NODE_REGISTER]
    names = json.dumps([target]).encode()
    too_big = _pod("watch-probe", gpus=GPUS_PER_NODE + 1, memory_mib=1000)  # never fits: no booking

    def reason() -> str:
        answer, _ = extender.filter(too_big, names)
        assert answer["NodeNames"] is None, answer
        return str(answer["FailedNodes"][target])

    registered = reason()
    assert registered != "node unregistered", registered
    latencies = []
    for index in range(samples):
        present = index % 2 == 1
        before = "node unregistered" if present else registered
        api.patch_node_annotations(
            target, {ANNOTATION_NODE_REGISTER: register if present else None}
        )
        written = time.perf_counter()
        while reason() == before:
            if time.perf_counter() - written > 30:
                raise AssertionError(f"node {target}: the change never reached /filter")
        latencies.append(time.perf_counter() - written)
    if samples % 2 == 1:
        api.patch_node_annotations(target, {ANNOTATION_NODE_REGISTER: register})
    emit("watch", nodes=size, **millis(latencies))


# --- the burst ------------------------------------------------------------------------------


@contextmanager
def burst_node(
    mode: str, kubeconfig: Path, api: KubeClient, workdir: Path
) -> Iterator[PodAdmitter]:
    """`hami device-plugin --nvml fake` for node `burst-<mode>` with the test kubelet and its
    PodAdmitter. Mode `lock`: the allocate-protocol annotation is taken away after the plugin
    registered (it re-checks only hourly here), so the scheduler uses HAMi's node lock."""
    # grpc: after main's env
    from hami_plugin.testing.admission import PodAdmitter
    from hami_plugin.testing.kubelet import FakeKubelet

    name = f"burst-{mode}"
    gpus_file = workdir / f"{name}-gpus.yaml"
    gpus_file.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"uuid": gpu_uuid(0xB000 + (mode == "lock"), i), "name": GPU_TYPE,
                     "memory_mib": MEMORY_MIB}
                    for i in range(GPUS_PER_NODE)
                ]
            }
        ),
        encoding="utf-8",
    )  # fmt: skip
    sock_dir = tempfile.mkdtemp(prefix=f"hami-bench-{mode}-", dir="/tmp")
    kubelet = FakeKubelet(sock_dir).start()
    plugin = LoggedProcess(
        f"device-plugin-{name}",
        hami_command(
            "device-plugin", "--nvml", "fake", "--fake-gpus", str(gpus_file), "--node-name", name,
            "--kubeconfig", str(kubeconfig), "--device-plugin-path", sock_dir,
            "--device-split-count", str(BURST_SPLIT), "--hook-path", str(workdir / f"{name}-hook"),
            "--metrics-bind-address", "0", "--register-interval-seconds", "3600",
        ),
        workdir,
    )  # fmt: skip
    admitter = None
    try:
        kubelet.wait_for_registrations(1, timeout=60)
        wait_until(
            lambda: ANNOTATION_NODE_REGISTER in api.get_node(name).annotations,
            f"{name}'s plugin registers its GPUs",
            WAIT_SECONDS,
        )
        if mode == "lock":
            api.patch_node_annotations(name, {ANNOTATION_ALLOCATE_PROTOCOL: None})
        admitter = PodAdmitter(kubelet, _api_url(kubeconfig), name, seed=7).start()
        yield admitter
    finally:
        if admitter is not None:
            admitter.stop()
        plugin.stop(60)
        kubelet.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _api_url(kubeconfig: Path) -> str:
    document = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    return str(document["clusters"][0]["cluster"]["server"])


def bench_burst(
    extender: Extender,
    api: KubeClient,
    kubeconfig: Path,
    workdir: Path,
    size: int,
    in_flight: int,
) -> None:
    for mode in ("inflight", "lock"):
        with burst_node(mode, kubeconfig, api, workdir) as admitter:
            burst(extender, api, admitter, mode, size, in_flight)


def burst(
    extender: Extender, api: KubeClient, admitter: PodAdmitter, mode: str, size: int, in_flight: int
) -> None:
    name = f"burst-{mode}"
    pods = [api_pod(api, f"burst-{mode}-{i}", memory_mib=1000 + i) for i in range(BURST_PODS)]
    names = json.dumps([name]).encode()
    probe = _pod("burst-probe", gpus=GPUS_PER_NODE + 1, memory_mib=1)  # never fits: no booking

    def registered() -> bool:
        answer, _ = extender.filter(probe, names)
        return bool(answer["FailedNodes"][name] != "node unregistered")

    def allocated() -> bool:
        return all(
            api.get_pod(NAMESPACE, p["metadata"]["name"]).annotations.get(ANNOTATION_BIND_PHASE)
            == "success"
            for p in pods
        )

    wait_until(registered, f"the scheduler registers {name}", WAIT_SECONDS)
    started = time.perf_counter()
    bind_seconds, failures = drive(extender, pods, in_flight, names)
    admitter.wait_for([(NAMESPACE, p["metadata"]["name"]) for p in pods], timeout=600)
    seconds = time.perf_counter() - started
    wait_until(allocated, "every burst pod ends bind-phase success", WAIT_SECONDS)
    wrong = wrong_gpus(api, admitter, pods)
    assert admitter.failures == {}, admitter.failures
    emit(
        "burst",
        nodes=size,
        mode="allocate-protocol" if mode == "inflight" else "hami-lock",
        pods=len(pods),
        seconds=round(seconds, 3),
        pods_per_second=round(len(pods) / seconds, 1),
        bind_phase_seconds=round(bind_seconds, 3),
        bind_errors=failures,
        containers_with_another_pods_gpus=wrong,
    )
    assert wrong == 0


def api_pod(
    api: KubeClient, name: str, *, memory_mib: int = 1000, cores: int = 0
) -> dict[str, Any]:
    """The pod as kube-scheduler would send it (uid and creation time as the server has them)."""
    stored = api.get_pod(NAMESPACE, name)
    created = stored.creation_timestamp or _T0
    pod = _pod(name, gpus=1, memory_mib=memory_mib, cores=cores, created=created)
    pod["metadata"]["uid"] = stored.uid
    return pod


def wrong_gpus(api: KubeClient, admitter: PodAdmitter, pods: list[dict[str, Any]]) -> int:
    """Containers whose Allocate answer is not their own pod's booking (GPU and memory: every
    burst pod asks a different memory size, so another pod's booking shows)."""
    wrong = 0
    responses = admitter.responses
    for pod in pods:
        name = pod["metadata"]["name"]
        stored = api.get_pod(NAMESPACE, name)
        booked = codec.decode_pod_devices(
            stored.annotations[ANNOTATION_DEVICES_ALLOCATED], ANNOTATION_DEVICES_ALLOCATED
        )[0]
        envs = dict(responses[(NAMESPACE, name, "c0")].envs)
        asked = pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"]
        if (
            envs.get("NVIDIA_VISIBLE_DEVICES") != ",".join(d.uuid for d in booked)
            or envs.get("CUDA_DEVICE_MEMORY_LIMIT_0") != f"{asked}m"
        ):
            wrong += 1
    return wrong


# --- one cluster size -----------------------------------------------------------------------


def run_size(size: int, args: argparse.Namespace, *, phases: bool, burst: bool) -> None:
    """One cluster of `size` nodes: the latency/throughput phases and/or the bursts."""
    rng = random.Random(size)
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-extender-{size}-"))
    pending = args.binds + args.sustained if phases else 0
    objects = cluster_objects(size, pending, rng)
    load = workdir / "objects.json"
    load.write_text(json.dumps(objects), encoding="utf-8")
    kubeconfig = workdir / "kubeconfig"
    apiserver = LoggedProcess(
        "apiserver",
        [sys.executable, "-m", "hami_plugin.testing.apiserver", "--load", str(load),
         "--kubeconfig", str(kubeconfig)],
        workdir,
    )  # fmt: skip
    scheduler: LoggedProcess | None = None
    api: KubeClient | None = None
    try:
        apiserver.wait_for_log(r"serving on (http://\S+)", timeout=600)
        api = KubeClient.from_config(str(kubeconfig), RetryPolicy(timeout_seconds=60))
        started = time.perf_counter()
        scheduler = LoggedProcess(
            "scheduler",
            hami_command("scheduler", "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
                  "--metrics-bind-address", "0", "--log-level", "warning"),
            workdir,
            cwd=args.scheduler_source,
        )  # fmt: skip
        url = f"http://127.0.0.1:{_listening_port(scheduler.pid)}"
        names = [node_name(i) for i in range(size)]
        extender = Extender(url, names)
        wait_until(extender.ready, "the scheduler is ready", timeout=600)
        emit(
            "startup",
            nodes=size,
            pods=sum(1 for o in objects if o["kind"] == "Pod"),
            seconds_to_ready=round(time.perf_counter() - started, 2),
            **scheduler.memory_kib(),
        )
        if phases:
            run_phases(extender, api, scheduler, apiserver, kubeconfig, workdir, size, args)
        if burst:
            bench_burst(extender, api, kubeconfig, workdir, size, args.binds_in_flight)
    finally:
        if scheduler is not None:
            scheduler.stop(60)
        if api is not None:
            api.close()
        apiserver.stop(60)
        if args.keep:
            print(f"# logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_phases(
    extender: Extender,
    api: KubeClient,
    scheduler: LoggedProcess,
    apiserver: LoggedProcess,
    kubeconfig: Path,
    workdir: Path,
    size: int,
    args: argparse.Namespace,
) -> None:
    """filter, bind, sustained, watch, memory."""
    bench_filter(extender, size, args.filters)
    kubelets = Kubelets(_api_url(kubeconfig))
    try:
        bind_pods = [api_pod(api, f"bench-{i}", cores=10) for i in range(args.binds)]
        bench_bind(extender, api, kubelets, size, bind_pods)
        sustained = [
            api_pod(api, f"bench-{i}", cores=10)
            for i in range(args.binds, args.binds + args.sustained)
        ]
        profile = Profiler(args.py_spy, scheduler.pid, workdir) if args.py_spy else None
        pids = {"scheduler": scheduler.pid, "apiserver": apiserver.pid, "driver": os.getpid()}
        bench_sustained(
            extender, api, kubelets, size, sustained, args.binds_in_flight, pids, profile
        )
    finally:
        kubelets.close()
    bench_watch(extender, api, size, args.watch_samples)
    emit("memory", nodes=size, **scheduler.memory_kib())


def _listening_port(pid: int, timeout: float = 120.0) -> int:
    """The TCP port process `pid` listens on (the scheduler was told to pick one: port 0; its
    log level is `warning` here, so the port is read from /proc, not from its log)."""
    found: list[int] = []

    def listening() -> bool:
        inodes = set()
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text(encoding="utf-8").splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(int(fields[1].rsplit(":", 1)[1], 16))
        return bool(found)

    wait_until(listening, f"process {pid} listens", timeout)
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000", help="node counts (1000,5000)")
    parser.add_argument("--filters", type=int, default=300, help="timed filter calls (300)")
    parser.add_argument("--binds", type=int, default=200, help="timed bind calls (200)")
    parser.add_argument("--sustained", type=int, default=600, help="pods for pods/s (600)")
    parser.add_argument("--binds-in-flight", type=int, default=16, help="(16)")
    parser.add_argument("--watch-samples", type=int, default=40, help="(40)")
    parser.add_argument(
        "--burst-sizes",
        default="100,5000",
        help="cluster sizes for the 100-pod bursts, '' for none (100,5000: at 5,000 nodes the "
        "double's O(pods) field-selector lists, not the scheduler, bound the rate)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    parser.add_argument(
        "--scheduler-source",
        type=Path,
        default=REPO,
        metavar="DIR",
        help="run `hami scheduler` from this checkout (A/B a change; default: this one)",
    )
    parser.add_argument(
        "--py-spy", metavar="PATH", help="profile the sustained phase (implies --keep)"
    )
    args = parser.parse_args()
    args.keep = args.keep or bool(args.py_spy)
    # grpc's core logs every closed kubelet connection at INFO otherwise
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sizes = {int(s) for s in args.sizes.split(",") if s}
    bursts = {int(s) for s in args.burst_sizes.split(",") if s}
    for size in sorted(sizes | bursts):
        run_size(size, args, phases=size in sizes, burst=size in bursts)


if __name__ == "__main__":
    main()
