"""Benchmark of `hami scheduler` over HTTP, as kube-scheduler drives it (run by `make bench`).

Three processes on this machine: the API server double (`hami_plugin.testing.apiserver`,
preloaded with N nodes of 8 GPUs about half used by Running pods, and the Pending pods to
schedule), `hami scheduler` (a subprocess, its kubeconfig pointing at the double), and this
driver playing kube-scheduler (persistent HTTP connections, `NodeNames` listing every node;
`drive()` is kube-scheduler's loop: filter one pod at a time, up to 16 binds in flight, a bind
error sends the pod back to the queue after a 0.2 s backoff). Per cluster size it prints one
JSON line per figure:

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

The burst of 300 identical pods (a user's measurement through a real kube-scheduler v1.24: 500
nodes of 8 x A100, 300 single-GPU pods created at once, binpack) is replayed in three parts:

* `burst300` (`--burst300-sizes`, 500 nodes): the preloaded cluster (about half used, so
  binpack fills the fullest GPUs of many nodes, as on a cluster in use), `NodeNames` every node,
  300 pods of 1 GPU / 10,000 MiB / 10 % cores (`--burst300-pods`) created in the double over
  3 s (`--burst300-spread-seconds`; their creationTimestamps, in whole seconds, span 3-4
  seconds), each handed to the loop once created. So pods/s is at most 100 here: a line near
  that kept up with the creation; 0 s shows the scheduler's own pace. One fresh cluster per
  line. The nodes' kubelets are `kubelets.SerialKubelets`: a node sees a bound pod 50 ms after
  its Binding (`--burst300-watch-delay-ms`), admits one pod at a time, 30 ms each
  (`--burst300-admission-ms`), and "allocates" by one merge patch; the lines:
  - `kube-scheduler-alone`: the same loop, no extender: the driver picks the node itself
    (binpack on free `nvidia.com/gpu`) and POSTs a plain Binding to the double. This harness's
    stand-in for kube-scheduler without extender, not kube-scheduler: it has no scheduling
    cycle of its own, so it is the ceiling of this harness (the double's Binding round trip),
    and `vs_baseline` (ours / it) is lower than the user's ratio against kube-scheduler;
  - `allocate-protocol`: every node annotated `hami-plugin.io/allocate-protocol` with the
    newest protocol the scheduler under test knows (`ALLOCATE_PROTOCOL_V2`, in-flight/v2, read
    from its `protocol/inflight.py`; a checkout without it gets its in-flight/v1, which is what
    its device plugin wrote: a scheduler that predates v2 would take a v2 node for one with
    HAMi's device plugin; `--burst300-protocol` forces a value);
  - `hami-lock`: no protocol annotation (HAMi's device plugin): the scheduler takes HAMi's
    node lock, and the kubelet double deletes it when it admits the pod holding it, as HAMi's
    device plugin does at the end of Allocate.
  Figures: pods/s (first pod created to last bind answered), create->bound and
  create->Running p50/p99, bind errors (and how many were HAMi's "node lock contention"), the
  distinct nodes the burst landed on against the nodes spread would use (one per pod, up to
  N: binpack kept), GPUs over-committed after the burst (every node's bookings summed from the
  pods' `hami.io/vgpu-devices-allocated` against 80 GiB / 100 % / 10 slots: must be 0) and
  node locks left.
* `burst300-admitter` (`--burst300-admitter-nodes`, 8): the same 300 pods onto a cluster of K
  nodes (`NodeNames` = those K) that each run `hami device-plugin --nvml fake` (8 GPUs, split
  10) with the test kubelet and its `PodAdmitter`, in both modes (allocate-protocol: what the
  plugin announces itself, in-flight/v2 when it has `--pod-resources-socket` and the test
  kubelet serves PodResources; hami-lock: the annotation removed after it registered). Also
  the containers whose `NVIDIA_VISIBLE_DEVICES` is not their own pod's booked GPUs (must be 0)
  and the PodAdmitter's failures (must be 0).
* `job40` (`--no-job40` for none): 40 identical pods (one creation second) onto ONE node with
  a device plugin, as `burst` does, both modes; pods/s until all are allocated, next to the
  PodAdmitter's own pace (each admission timed: GetPreferredAllocation, Allocate, status
  patch) so "allocated at the admission double's rate, not one per round trip" can be read.

`--scheduler-source DIR` / `--plugin-source DIR` run `hami scheduler` / `hami device-plugin`
from another checkout (A/B): `python -m hami_plugin` with that directory as working directory,
which comes first on `sys.path` (the venv's editable install of this checkout is found after
it). For "before": `git -C <repo> archive <commit> | tar -x -C /tmp/bench-base` (HEAD while
the change is not committed), then both flags `/tmp/bench-base`. The driver, the test kubelet
and the doubles always run from this checkout.

Only correctness is asserted (every bind answered, every pod bound where filter said, no
container with another pod's GPUs, no over-commit); the figures are printed, not judged.

    python tests/benchmarks/bench_extender.py [--sizes 1000,5000] [--filters 300] ...
    python tests/benchmarks/bench_extender.py --sizes '' --burst-sizes '' \\
        --burst300-sizes 100 --burst300-pods 60 --burst300-admitter-nodes 4
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
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    LABEL_VGPU_NODE,
    ContainerDevice,
    GpuDevice,
)
from hami_plugin.protocol.nodelock import CONTENTION_SUFFIX
from hami_plugin.testing.apiserver import make_container, make_pod
from hami_plugin.testing.hamicore import install_fake_hamicore

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `make bench` runs this file as a script

from tests.benchmarks.kubelets import ApiHttp, Kubelets, SerialKubelets  # noqa: E402
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
BURST300_MEMORY_MIB = 10_000  # 8 per GPU: 64 per idle node, fewer on a half-used one
BURST300_CORES = 10
JOB_PODS = 40
JOB_MEMORY_MIB = 1000
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
    created: datetime | None = _T0,
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
        # None: a pod to create, the double sets both (the creation time is its clock's)
        uid=f"uid-{name}" if created is not None else "",
        creation_timestamp=_stamp(created) if created is not None else "",
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


def cluster_objects(
    size: int,
    pending: int,
    rng: random.Random,
    *,
    protocol: str | None = ALLOCATE_PROTOCOL,
    burst_nodes: bool = True,
) -> list[dict[str, Any]]:
    """`size` nodes of 8 GPUs, each with 4 Running pods of 2 GPUs (20-80 % of their memory and
    cores: about half used) and annotated with allocate `protocol` (None: no annotation, HAMi's
    device plugin), `pending` Pending 1-GPU pods `bench-<i>`, and unless `burst_nodes` is False
    the two burst nodes (no annotations: their device plugins register them) and their pods."""
    objects: list[dict[str, Any]] = []
    for index in range(size):
        name = node_name(index)
        devices = [_gpu(gpu_uuid(index, gpu), gpu, SPLIT) for gpu in range(GPUS_PER_NODE)]
        annotations = {
            ANNOTATION_NODE_REGISTER: codec.encode_node_devices(devices),
            # a cluster the scheduler has run on before: an old `Requesting_` handshake (the
            # node stays healthy while kubelet advertises GPUs); without it a fresh leader
            # first writes one handshake per node, as HAMi does
            ANNOTATION_NODE_HANDSHAKE: HANDSHAKE,
        }
        if protocol is not None:
            annotations[ANNOTATION_ALLOCATE_PROTOCOL] = protocol
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
    for mode in ("inflight", "lock") if burst_nodes else ():
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


@dataclass(slots=True)
class Driven:
    """What one `drive()` saw, times from `time.perf_counter()`."""

    seconds: float
    """From the start (the first pod created, with `create`) until every pod was bound."""
    bind_errors: list[str] = field(default_factory=list)
    released_at: dict[str, float] = field(default_factory=dict)
    """When each pod was handed to the loop (created in the double, with `create`)."""
    bound_at: dict[str, float] = field(default_factory=dict)
    """When each pod's bind answered no error."""
    nodes: dict[str, str] = field(default_factory=dict)
    """Where each pod was bound."""

    @property
    def failures(self) -> int:
        return len(self.bind_errors)

    def to_bound(self) -> list[float]:
        return [self.bound_at[name] - self.released_at[name] for name in self.bound_at]


Place = Callable[[dict[str, Any]], str | None]
"""The node for a pod, None when none fits now (kube-scheduler's filter and score)."""
Bind = Callable[[dict[str, Any], str], str]
"""Bind a pod to a node: the error text, "" for success."""


def drive(
    extender: Extender | None,
    pods: Sequence[dict[str, Any]],
    in_flight: int,
    names: bytes | None = None,
    retry_delay: float = 0.2,
    on_bound: Callable[[str], None] | None = None,
    *,
    create: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    spread_seconds: float = 0.0,
    place: Place | None = None,
    bind: Bind | None = None,
    timeout: float = 900.0,
) -> Driven:
    """kube-scheduler's loop: filter one pod at a time, hand the bind to up to `in_flight`
    binding goroutines; a bind Error sends the pod back to the queue (filtered again).

    `create`: the pods are created first, one every `spread_seconds / len(pods)` from a thread
    of their own (a controller's burst), and what `create` returns (the stored pod: uid,
    creation time) joins the queue; else every pod is queued at the start. `place` and `bind`
    replace the extender's /filter (over `names`, default every node) and /bind. AssertionError
    when not every pod is bound within `timeout` s."""
    if place is None or bind is None:
        assert extender is not None, "drive() needs the extender or both place and bind"
    todo: queue.Queue[dict[str, Any]] = queue.Queue()
    slots = threading.Semaphore(in_flight)
    done = threading.Semaphore(0)
    lock = threading.Lock()
    feed_errors: list[BaseException] = []
    started = time.perf_counter()
    result = Driven(seconds=0.0)

    def filtered(pod: dict[str, Any]) -> str | None:
        assert extender is not None
        answer, _ = extender.filter(pod, names)
        return chosen(answer) if answer["NodeNames"] else None

    def extender_bind(pod: dict[str, Any], node: str) -> str:
        assert extender is not None
        return extender.bind(pod, node)[0]

    choose = place or filtered
    send = bind or extender_bind

    def feed() -> None:
        gap = spread_seconds / max(len(pods), 1)
        try:
            for index, pod in enumerate(pods):
                delay = started + index * gap - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                stored = create(pod) if create is not None else pod
                with lock:
                    result.released_at[stored["metadata"]["name"]] = time.perf_counter()
                todo.put(stored)
        except BaseException as error:  # the loop below raises it
            feed_errors.append(error)

    def bind_one(pod: dict[str, Any], node: str) -> None:
        try:
            error = send(pod, node)
        finally:
            slots.release()
        name = pod["metadata"]["name"]
        if error:
            with lock:
                result.bind_errors.append(error)
            time.sleep(retry_delay)  # kube-scheduler's backoff before the pod is tried again
            todo.put(pod)
        else:
            with lock:
                result.bound_at[name] = time.perf_counter()
                result.nodes[name] = node
            if on_bound is not None:
                on_bound(name)
            done.release()

    if create is None and spread_seconds <= 0:
        feed()
    else:
        threading.Thread(target=feed, name="drive-create", daemon=True).start()
    bound = 0
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        while bound < len(pods):
            if feed_errors:
                raise feed_errors[0]
            if time.perf_counter() - started > timeout:
                raise AssertionError(f"{len(pods) - bound} pods not bound within {timeout} s")
            try:
                pod = todo.get(timeout=0.05)
            except queue.Empty:
                while done.acquire(blocking=False):
                    bound += 1
                continue
            node = choose(pod)
            if node is None:
                time.sleep(retry_delay)  # unschedulable for now: back to the queue
                todo.put(pod)
                continue
            slots.acquire()
            pool.submit(bind_one, pod, node)
            while done.acquire(blocking=False):
                bound += 1
    result.seconds = time.perf_counter() - started
    return result


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
        driven = drive(extender, pods, in_flight, on_bound=kubelets.admit)
    seconds = driven.seconds
    used = {name: round(cpu - before[name], 2) for name, cpu in cpu_seconds(pids).items()}
    check_bound(api, pods)
    emit(
        "sustained",
        nodes=size,
        pods=len(pods),
        binds_in_flight=in_flight,
        seconds=round(seconds, 3),
        pods_per_second=round(len(pods) / seconds, 1),
        bind_errors=driven.failures,
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


# --- clusters -------------------------------------------------------------------------------


@dataclass(slots=True)
class Cluster:
    """The API server double (a process of its own, preloaded) and, unless left out, `hami
    scheduler` (from `--scheduler-source`) with this driver's `Extender` over `node_names`."""

    workdir: Path
    kubeconfig: Path
    api: KubeClient
    http: ApiHttp
    apiserver: LoggedProcess
    scheduler: LoggedProcess | None
    extender: Extender | None
    seconds_to_ready: float


@contextmanager
def cluster(
    label: str,
    objects: list[dict[str, Any]],
    node_names: list[str],
    args: argparse.Namespace,
    *,
    scheduler: bool = True,
) -> Iterator[Cluster]:
    """A fresh cluster; its processes' logs go to a work directory kept with `--keep`."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-extender-{label}-"))
    load = workdir / "objects.json"
    load.write_text(json.dumps(objects), encoding="utf-8")
    kubeconfig = workdir / "kubeconfig"
    apiserver = LoggedProcess(
        "apiserver",
        [sys.executable, "-m", "hami_plugin.testing.apiserver", "--load", str(load),
         "--kubeconfig", str(kubeconfig)],
        workdir,
    )  # fmt: skip
    daemon: LoggedProcess | None = None
    api: KubeClient | None = None
    http: ApiHttp | None = None
    try:
        served = apiserver.wait_for_log(r"serving on (http://\S+)", timeout=600)
        api = KubeClient.from_config(str(kubeconfig), RetryPolicy(timeout_seconds=60))
        http = ApiHttp(served.group(1))
        extender = None
        started = time.perf_counter()
        if scheduler:
            daemon = LoggedProcess(
                "scheduler",
                hami_command("scheduler", "--kubeconfig", str(kubeconfig),
                             "--http-bind", "127.0.0.1:0", "--metrics-bind-address", "0",
                             "--log-level", "warning"),
                workdir,
                cwd=args.scheduler_source,
            )  # fmt: skip
            extender = Extender(f"http://127.0.0.1:{_listening_port(daemon.pid)}", node_names)
            wait_until(extender.ready, "the scheduler is ready", timeout=600)
        yield Cluster(
            workdir, kubeconfig, api, http, apiserver, daemon, extender,
            time.perf_counter() - started,
        )  # fmt: skip
    finally:
        if daemon is not None:
            daemon.stop(60)
        if api is not None:
            api.close()
        if http is not None:
            http.close()
        apiserver.stop(60)
        if args.keep:
            print(f"# logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --- nodes with a device plugin -------------------------------------------------------------


def _timed_admitter(admissions: list[tuple[float, float]]) -> type[PodAdmitter]:
    """PodAdmitter that also appends to `admissions` when each admission began and ended (its
    `_admit`: GetPreferredAllocation, Allocate, the status patch): the test kubelet's own pace."""
    from hami_plugin.testing.admission import PodAdmitter

    class TimedAdmitter(PodAdmitter):
        def _admit(self, pod: Any) -> None:
            began = time.perf_counter()
            super()._admit(pod)
            admissions.append((began, time.perf_counter()))

    return TimedAdmitter


def _plugin_has_pod_resources(source: Path) -> bool:
    """Whether the device plugin of checkout `source` has `--pod-resources-socket` (kubelet's
    PodResources API, what in-flight/v2 needs), so that an older checkout runs unchanged."""
    settings = source / "hami_plugin" / "deviceplugin" / "settings.py"
    return "pod-resources-socket" in settings.read_text(encoding="utf-8")


@contextmanager
def device_plugin_nodes(
    names: Sequence[str],
    mode: str,
    kube: Cluster,
    args: argparse.Namespace,
    *,
    split: int,
    admissions: list[tuple[float, float]] | None = None,
) -> Iterator[dict[str, PodAdmitter]]:
    """For each node of `names`: `hami device-plugin --nvml fake` (8 GPUs of 80 GiB, `split`
    slots each, from `--plugin-source`) with the test kubelet and its PodAdmitter (recording
    into `admissions` when given, see `_timed_admitter`). Mode `inflight`: the plugin announces
    its protocol itself (pointed at the test kubelet's PodResources socket when it has the
    flag). Mode `lock`: PodResources
    off, and the allocate-protocol annotation is taken away after the plugin registered (it
    re-checks only hourly here), so the scheduler uses HAMi's node lock. The plugins start
    together and are waited for together."""
    # grpc: after main's env
    from hami_plugin.testing.admission import PodAdmitter
    from hami_plugin.testing.kubelet import FakeKubelet

    pod_resources = _plugin_has_pod_resources(args.plugin_source)
    workdir = kube.workdir
    with ExitStack() as stack:
        kubelets: dict[str, FakeKubelet] = {}
        for name in names:
            gpus_file = workdir / f"{name}-gpus.yaml"
            gpus_file.write_text(
                yaml.safe_dump(
                    {
                        "gpus": [
                            {"uuid": gpu_uuid(zlib.crc32(name.encode()), i), "name": GPU_TYPE,
                             "memory_mib": MEMORY_MIB}
                            for i in range(GPUS_PER_NODE)
                        ]
                    }
                ),
                encoding="utf-8",
            )  # fmt: skip
            sock_dir = tempfile.mkdtemp(prefix=f"hami-bench-{name}-", dir="/tmp")
            stack.callback(shutil.rmtree, sock_dir, ignore_errors=True)
            kubelet = FakeKubelet(sock_dir).start()
            stack.callback(kubelet.stop)
            flags = []
            if pod_resources:
                socket_path = kubelet.pod_resources_socket if mode == "inflight" else ""
                flags = ["--pod-resources-socket", socket_path]
            install_fake_hamicore(workdir / f"{name}-hook")
            plugin = LoggedProcess(
                f"device-plugin-{name}",
                hami_command(
                    "device-plugin", "--nvml", "fake", "--fake-gpus", str(gpus_file),
                    "--node-name", name, "--kubeconfig", str(kube.kubeconfig),
                    "--device-plugin-path", sock_dir, "--device-split-count", str(split),
                    "--hook-path", str(workdir / f"{name}-hook"), "--metrics-bind-address", "0",
                    "--register-interval-seconds", "3600", *flags,
                ),
                workdir,
                cwd=args.plugin_source,
            )  # fmt: skip
            stack.callback(plugin.stop, 60)
            kubelets[name] = kubelet
        for name, kubelet in kubelets.items():
            kubelet.wait_for_registrations(1, timeout=WAIT_SECONDS)
            wait_until(
                partial(_registered, kube.api, name),
                f"{name}'s plugin registers its GPUs",
                WAIT_SECONDS,
            )
            if mode == "lock":
                kube.api.patch_node_annotations(name, {ANNOTATION_ALLOCATE_PROTOCOL: None})
        admitter_class = _timed_admitter(admissions) if admissions is not None else PodAdmitter
        admitters = {}
        for name, kubelet in kubelets.items():
            admitter = admitter_class(kubelet, kube.http.url, name, seed=7).start()
            stack.callback(admitter.stop)
            admitters[name] = admitter
        yield admitters


def _registered(api: KubeClient, node: str) -> bool:
    return ANNOTATION_NODE_REGISTER in api.get_node(node).annotations


def wait_registered(extender: Extender, node: str) -> None:
    """Until the scheduler's watch has `node`'s GPUs."""
    names = json.dumps([node]).encode()
    probe = _pod("register-probe", gpus=GPUS_PER_NODE + 1, memory_mib=1)  # never fits

    def registered() -> bool:
        answer, _ = extender.filter(probe, names)
        return bool(answer["FailedNodes"][node] != "node unregistered")

    wait_until(registered, f"the scheduler registers {node}", WAIT_SECONDS)


def wait_allocated(http: ApiHttp, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Until every pod of `names` is bind-phase success; the stored pods by name."""
    found: dict[str, dict[str, Any]] = {}
    wanted = set(names)

    def allocated() -> bool:
        found.clear()
        for pod in http.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
            if pod["metadata"]["name"] in wanted:
                found[pod["metadata"]["name"]] = pod
        return len(found) == len(wanted) and all(
            (pod["metadata"].get("annotations") or {}).get(ANNOTATION_BIND_PHASE) == "success"
            for pod in found.values()
        )

    wait_until(allocated, "every pod ends bind-phase success", WAIT_SECONDS, interval=0.2)
    return found


# --- the burst ------------------------------------------------------------------------------


def bench_burst(kube: Cluster, size: int, args: argparse.Namespace) -> None:
    assert kube.extender is not None
    for mode in ("inflight", "lock"):
        name = f"burst-{mode}"
        with device_plugin_nodes([name], mode, kube, args, split=BURST_SPLIT) as admitters:
            burst(kube.extender, kube.api, admitters[name], mode, size, args.binds_in_flight)


def burst(
    extender: Extender, api: KubeClient, admitter: PodAdmitter, mode: str, size: int, in_flight: int
) -> None:
    name = f"burst-{mode}"
    pods = [api_pod(api, f"burst-{mode}-{i}", memory_mib=1000 + i) for i in range(BURST_PODS)]
    names = json.dumps([name]).encode()

    def allocated() -> bool:
        return all(
            api.get_pod(NAMESPACE, p["metadata"]["name"]).annotations.get(ANNOTATION_BIND_PHASE)
            == "success"
            for p in pods
        )

    wait_registered(extender, name)
    started = time.perf_counter()
    driven = drive(extender, pods, in_flight, names)
    admitter.wait_for([(NAMESPACE, p["metadata"]["name"]) for p in pods], timeout=600)
    seconds = time.perf_counter() - started
    wait_until(allocated, "every burst pod ends bind-phase success", WAIT_SECONDS)
    stored = {p["metadata"]["name"]: api.get_pod(NAMESPACE, p["metadata"]["name"]) for p in pods}
    wrong = wrong_gpus(
        {k: v.annotations for k, v in stored.items()}, admitter.responses, pods, check_memory=True
    )
    assert admitter.failures == {}, admitter.failures
    emit(
        "burst",
        nodes=size,
        mode="allocate-protocol" if mode == "inflight" else "hami-lock",
        pods=len(pods),
        seconds=round(seconds, 3),
        pods_per_second=round(len(pods) / seconds, 1),
        bind_phase_seconds=round(driven.seconds, 3),
        bind_errors=driven.failures,
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


def wrong_gpus(
    annotations: Mapping[str, Mapping[str, str]],
    responses: Mapping[tuple[str, str, str], Any],
    pods: Sequence[dict[str, Any]],
    *,
    check_memory: bool,
) -> int:
    """Containers whose Allocate answer (`responses`, the PodAdmitters') is not their own pod's
    booking (`annotations` of the stored pods by name): the GPU UUIDs, and with `check_memory`
    the memory limit too (when every pod asks a different size, another pod's booking shows
    there; identical pods can only be told apart by their GPUs)."""
    wrong = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        booked = codec.decode_pod_devices(
            annotations[name][ANNOTATION_DEVICES_ALLOCATED], ANNOTATION_DEVICES_ALLOCATED
        )[0]
        envs = dict(responses[(NAMESPACE, name, "c0")].envs)
        asked = pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"]
        if envs.get("NVIDIA_VISIBLE_DEVICES") != ",".join(d.uuid for d in booked) or (
            check_memory and envs.get("CUDA_DEVICE_MEMORY_LIMIT_0") != f"{asked}m"
        ):
            wrong += 1
    return wrong


# --- 300 identical pods at once -------------------------------------------------------------


def allocate_protocol(args: argparse.Namespace) -> str:
    """The allocate protocol the `allocate-protocol` nodes announce (module docstring): the
    newest one the scheduler under test defines, unless `--burst300-protocol` says."""
    if args.burst300_protocol != "auto":
        return str(args.burst300_protocol)
    path = args.scheduler_source / "hami_plugin" / "protocol" / "inflight.py"
    text = path.read_text(encoding="utf-8")
    for constant in ("ALLOCATE_PROTOCOL_V2", "ALLOCATE_PROTOCOL"):
        match = re.search(rf'^{constant} = "([^"]+)"', text, re.M)
        if match is not None:
            return match.group(1)
    raise AssertionError(f"no allocate protocol defined in {path}")


def identical_pods(prefix: str, count: int, memory_mib: int, cores: int) -> list[dict[str, Any]]:
    """Pods to create (the double sets uid and creation time): 1 GPU each, all alike."""
    return [
        _pod(f"{prefix}-{i:03d}", gpus=1, memory_mib=memory_mib, cores=cores, created=None)
        for i in range(count)
    ]


def creator(
    http: ApiHttp, creation_timestamp: str | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """POST a pod to the double; the stored pod. With `creation_timestamp` every pod gets that
    one (a Job's pods created within one second), else the double's clock sets it."""

    def create(pod: dict[str, Any]) -> dict[str, Any]:
        if creation_timestamp is not None:
            pod = {**pod, "metadata": {**pod["metadata"], "creationTimestamp": creation_timestamp}}
        stored: dict[str, Any] = http.ok("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        return stored

    return create


class Binpack:
    """This harness's stand-in for kube-scheduler's own filter and score: the node with the
    fewest free `nvidia.com/gpu` that still has one (NodeResourcesFit, MostAllocated), counted
    here, not read from the cluster (a failed Binding does not give its GPU back)."""

    def __init__(self, free: Mapping[str, int]) -> None:
        self._free = dict(free)
        self._lock = threading.Lock()

    def __call__(self, pod: dict[str, Any]) -> str | None:
        with self._lock:
            fitting = [(free, name) for name, free in self._free.items() if free > 0]
            if not fitting:
                return None
            _, name = min(fitting)
            self._free[name] -= 1
            return name


def plain_binding(http: ApiHttp) -> Bind:
    """kube-scheduler's DefaultBinder: POST pods/<name>/binding (the pod's UID as
    precondition); the error text, "" for success."""

    def bind(pod: dict[str, Any], node: str) -> str:
        metadata = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": metadata["name"], "namespace": NAMESPACE, "uid": metadata["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = http.pod_path(NAMESPACE, metadata["name"]) + "/binding"
        status, answer = http.request("POST", path, body)
        return "" if status == 201 else f"HTTP {status}: {answer}"

    return bind


def over_committed_gpus(pods: Sequence[dict[str, Any]], split: int) -> int:
    """GPUs whose bookings, summed over every live bound pod's `hami.io/vgpu-devices-allocated`,
    exceed `split` slots, 80 GiB or 100 % of cores."""
    slots: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    cores: Counter[str] = Counter()
    for pod in pods:
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") in ("Failed", "Succeeded"):
            continue
        value = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_DEVICES_ALLOCATED)
        for container in (
            codec.decode_pod_devices(value, ANNOTATION_DEVICES_ALLOCATED) if value else ()
        ):
            for device in container:
                slots[device.uuid] += 1
                memory[device.uuid] += device.used_mem_mib
                cores[device.uuid] += device.used_cores
    return sum(
        1 for uuid in slots if slots[uuid] > split or memory[uuid] > MEMORY_MIB or cores[uuid] > 100
    )


def burst_checks(http: ApiHttp, driven: Driven, *, split: int, booked: bool) -> dict[str, Any]:
    """The figures every burst300 line has, after asserting that each pod is bound where its
    bind said (and, `booked`, where its booking says), no GPU is over-committed and no node
    lock is left: bind errors by kind, nodes used (and, `booked`, over-commits and locks)."""
    pods = http.ok("GET", "/api/v1/pods")["items"]
    stored = {p["metadata"]["name"]: p for p in pods if p["metadata"]["name"] in driven.nodes}
    assert len(stored) == len(driven.nodes), "a bound pod is missing"
    for name, pod in stored.items():
        assert pod["spec"].get("nodeName") == driven.nodes[name], (name, pod["spec"])
        if booked:
            annotations = pod["metadata"].get("annotations") or {}
            assert annotations.get(ANNOTATION_VGPU_NODE) == driven.nodes[name], name
    over = over_committed_gpus(pods, split)
    locked = [
        n["metadata"]["name"]
        for n in http.ok("GET", "/api/v1/nodes")["items"]
        if ANNOTATION_NODE_LOCK in (n["metadata"].get("annotations") or {})
    ]
    figures: dict[str, Any] = {
        "bind_errors": driven.failures,
        "lock_contention_errors": sum(CONTENTION_SUFFIX in e for e in driven.bind_errors),
        "other_bind_errors": Counter(
            e for e in driven.bind_errors if CONTENTION_SUFFIX not in e
        ).most_common(3),
        "nodes_used": len(set(driven.nodes.values())),
    }
    if booked:
        figures |= {"over_commits": over, "locks_left": len(locked)}
    assert over == 0, f"{over} GPUs over-committed"
    assert not locked, f"node locks left on {locked[:5]}"
    return figures


def bench_burst300(size: int, args: argparse.Namespace) -> None:
    """The three burst300 lines at `size` nodes (module docstring)."""
    protocol = allocate_protocol(args)
    baseline = burst300(size, "baseline", args, None, None)
    for mode in ("inflight", "lock"):
        burst300(size, mode, args, protocol if mode == "inflight" else None, baseline)


MODE_NAMES = {
    "baseline": "kube-scheduler-alone",
    "inflight": "allocate-protocol",
    "lock": "hami-lock",
}


def burst300(
    size: int,
    mode: str,
    args: argparse.Namespace,
    protocol: str | None,
    baseline_pods_per_second: float | None,
) -> float:
    """One burst300 line on a fresh cluster of `size` preloaded nodes; its pods/s."""
    names = [node_name(i) for i in range(size)]
    objects = cluster_objects(size, 0, random.Random(size), protocol=protocol, burst_nodes=False)
    pods = identical_pods("b300", args.burst300_pods, BURST300_MEMORY_MIB, BURST300_CORES)
    with cluster(
        f"burst300-{mode}-{size}", objects, names, args, scheduler=mode != "baseline"
    ) as kube:
        kubelets = SerialKubelets(
            kube.http,
            names,
            watch_delay_seconds=args.burst300_watch_delay_ms / 1000,
            admission_seconds=args.burst300_admission_ms / 1000,
            release_node_lock=mode == "lock",
        ).start()
        try:
            place: Place | None = None
            bind: Bind | None = None
            if mode == "baseline":
                # the preloaded pods hold 2 GPUs each, 4 per node
                place = Binpack({n: GPUS_PER_NODE * SPLIT - GPUS_PER_NODE for n in names})
                bind = plain_binding(kube.http)
            driven = drive(
                kube.extender, pods, args.binds_in_flight, create=creator(kube.http),
                spread_seconds=args.burst300_spread_seconds, place=place, bind=bind,
            )  # fmt: skip
            kubelets.wait_for(driven.nodes, timeout=WAIT_SECONDS)
        finally:
            kubelets.close()
        assert not kubelets.errors, kubelets.errors[:3]
        figures = burst_checks(kube.http, driven, split=SPLIT, booked=mode != "baseline")
    pods_per_second = len(pods) / driven.seconds
    running = [kubelets.running_at[n] - driven.released_at[n] for n in driven.nodes]
    emit(
        "burst300",
        nodes=size,
        mode=MODE_NAMES[mode],
        protocol=protocol,
        pods=len(pods),
        seconds=round(driven.seconds, 3),
        pods_per_second=round(pods_per_second, 1),
        vs_baseline=(
            round(pods_per_second / baseline_pods_per_second, 2)
            if baseline_pods_per_second
            else None
        ),
        create_to_bound=millis(driven.to_bound()),
        create_to_running=millis(running),
        nodes_spread_would_use=min(len(pods), size),
        **figures,
        **({"lock_releases": kubelets.lock_releases} if mode == "lock" else {}),
        watch_delay_ms=args.burst300_watch_delay_ms,
        admission_ms=args.burst300_admission_ms,
    )
    return pods_per_second


def bench_burst300_admitter(args: argparse.Namespace) -> None:
    """The same burst onto K nodes with device plugins and PodAdmitters, both modes."""
    count = args.burst300_admitter_nodes
    for mode in ("inflight", "lock"):
        names = [f"gpu-{mode}-{i}" for i in range(count)]
        objects = [_node(n, {}, GPUS_PER_NODE * SPLIT) for n in names]
        pods = identical_pods("b300", args.burst300_pods, BURST300_MEMORY_MIB, BURST300_CORES)
        with (
            cluster(f"burst300-admitter-{mode}", objects, names, args) as kube,
            device_plugin_nodes(names, mode, kube, args, split=SPLIT) as admitters,
        ):
            assert kube.extender is not None
            for name in names:
                wait_registered(kube.extender, name)
            protocol = kube.api.get_node(names[0]).annotations.get(ANNOTATION_ALLOCATE_PROTOCOL)
            started = time.perf_counter()
            driven = drive(
                kube.extender, pods, args.binds_in_flight, create=creator(kube.http),
                spread_seconds=args.burst300_spread_seconds,
            )  # fmt: skip
            by_node: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
            for pod, node in driven.nodes.items():
                by_node[node].append((NAMESPACE, pod))
            for node, keys in by_node.items():
                admitters[node].wait_for(keys, timeout=600)
            allocated_seconds = time.perf_counter() - started
            stored = wait_allocated(kube.http, list(driven.nodes))
            figures = burst_checks(kube.http, driven, split=SPLIT, booked=True)
            responses = {k: v for a in admitters.values() for k, v in a.responses.items()}
            failures = {k: v for a in admitters.values() for k, v in a.failures.items()}
            annotations = {n: p["metadata"]["annotations"] for n, p in stored.items()}
            wrong = wrong_gpus(annotations, responses, list(stored.values()), check_memory=False)
        emit(
            "burst300-admitter",
            nodes=count,
            mode=MODE_NAMES[mode],
            protocol=protocol,
            pods=len(pods),
            seconds=round(driven.seconds, 3),
            pods_per_second=round(len(pods) / driven.seconds, 1),
            allocated_seconds=round(allocated_seconds, 3),
            allocated_pods_per_second=round(len(pods) / allocated_seconds, 1),
            create_to_bound=millis(driven.to_bound()),
            nodes_spread_would_use=min(len(pods), count),
            **figures,
            containers_with_another_pods_gpus=wrong,
            admitter_failures=len(failures),
        )
        assert wrong == 0 and not failures, (wrong, list(failures.items())[:3])


def bench_job40(args: argparse.Namespace) -> None:
    """40 identical pods of one creation second onto one node with a device plugin."""
    for mode in ("inflight", "lock"):
        name = f"job-{mode}"
        objects = [_node(name, {}, GPUS_PER_NODE * BURST_SPLIT)]
        admissions: list[tuple[float, float]] = []
        with (
            cluster(f"job40-{mode}", objects, [name], args) as kube,
            device_plugin_nodes(
                [name], mode, kube, args, split=BURST_SPLIT, admissions=admissions
            ) as nodes,
        ):
            assert kube.extender is not None
            admitter = nodes[name]
            wait_registered(kube.extender, name)
            protocol = kube.api.get_node(name).annotations.get(ANNOTATION_ALLOCATE_PROTOCOL)
            pods = identical_pods("job", JOB_PODS, JOB_MEMORY_MIB, 0)
            second = _stamp(datetime.now(UTC))
            started = time.perf_counter()
            driven = drive(
                kube.extender, pods, args.binds_in_flight, create=creator(kube.http, second)
            )
            admitter.wait_for([(NAMESPACE, p) for p in driven.nodes], timeout=600)
            seconds = time.perf_counter() - started
            stored = wait_allocated(kube.http, list(driven.nodes))
            annotations = {n: p["metadata"]["annotations"] for n, p in stored.items()}
            wrong = wrong_gpus(
                annotations, admitter.responses, list(stored.values()), check_memory=False
            )
            failures = admitter.failures
        admissions.sort()
        busy = sum(end - began for began, end in admissions) / len(admissions)
        span = admissions[-1][1] - admissions[0][1]
        emit(
            "job40",
            mode=MODE_NAMES[mode],
            protocol=protocol,
            pods=len(pods),
            seconds=round(seconds, 3),
            pods_per_second=round(len(pods) / seconds, 1),
            bind_seconds=round(driven.seconds, 3),
            bind_errors=driven.failures,
            admitter_ms_per_pod=round(busy * 1000, 2),
            admitter_pods_per_second=round(1 / busy, 1),
            first_to_last_admission_pods_per_second=(
                round((len(admissions) - 1) / span, 1) if span > 0 else None
            ),
            containers_with_another_pods_gpus=wrong,
            admitter_failures=len(failures),
        )
        assert wrong == 0 and not failures, (wrong, list(failures.items())[:3])


# --- one cluster size -----------------------------------------------------------------------


def run_size(size: int, args: argparse.Namespace, *, phases: bool, burst: bool) -> None:
    """One cluster of `size` nodes: the latency/throughput phases and/or the bursts."""
    pending = args.binds + args.sustained if phases else 0
    objects = cluster_objects(size, pending, random.Random(size))
    names = [node_name(i) for i in range(size)]
    with cluster(str(size), objects, names, args) as kube:
        assert kube.scheduler is not None and kube.extender is not None
        emit(
            "startup",
            nodes=size,
            pods=sum(1 for o in objects if o["kind"] == "Pod"),
            seconds_to_ready=round(kube.seconds_to_ready, 2),
            **kube.scheduler.memory_kib(),
        )
        if phases:
            run_phases(kube, size, args)
        if burst:
            bench_burst(kube, size, args)


def run_phases(kube: Cluster, size: int, args: argparse.Namespace) -> None:
    """filter, bind, sustained, watch, memory."""
    extender, api, scheduler = kube.extender, kube.api, kube.scheduler
    assert extender is not None and scheduler is not None
    bench_filter(extender, size, args.filters)
    kubelets = Kubelets(kube.http, NAMESPACE)
    try:
        bind_pods = [api_pod(api, f"bench-{i}", cores=10) for i in range(args.binds)]
        bench_bind(extender, api, kubelets, size, bind_pods)
        sustained = [
            api_pod(api, f"bench-{i}", cores=10)
            for i in range(args.binds, args.binds + args.sustained)
        ]
        profile = Profiler(args.py_spy, scheduler.pid, kube.workdir) if args.py_spy else None
        pids = {"scheduler": scheduler.pid, "apiserver": kube.apiserver.pid, "driver": os.getpid()}
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
        "--plugin-source",
        type=Path,
        default=REPO,
        metavar="DIR",
        help="run `hami device-plugin` from this checkout (A/B a change; default: this one)",
    )
    parser.add_argument(
        "--burst300-sizes",
        default="500",
        help="cluster sizes for the burst of identical pods through serial kubelets, '' for "
        "none (500)",
    )
    parser.add_argument("--burst300-pods", type=int, default=300, help="(300)")
    parser.add_argument(
        "--burst300-spread-seconds",
        type=float,
        default=3.0,
        help="the burst's pods are created over this time (3; 0: all at once)",
    )
    parser.add_argument(
        "--burst300-admitter-nodes",
        type=int,
        default=8,
        help="nodes with a device plugin and the test kubelet for the same burst, 0 for none (8)",
    )
    parser.add_argument(
        "--burst300-watch-delay-ms",
        type=float,
        default=50.0,
        help="Binding to a serial kubelet seeing the pod (50)",
    )
    parser.add_argument(
        "--burst300-admission-ms",
        type=float,
        default=30.0,
        help="one admission by a serial kubelet, before its Allocate patch (30)",
    )
    parser.add_argument(
        "--burst300-protocol",
        default="auto",
        help="allocate-protocol annotation of the in-flight nodes (auto: the newest the "
        "scheduler under test defines)",
    )
    parser.add_argument(
        "--job40",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="40 identical pods onto one node with a device plugin (on)",
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
    for size in sorted({int(s) for s in args.burst300_sizes.split(",") if s}):
        bench_burst300(size, args)
    if args.burst300_admitter_nodes > 0:
        bench_burst300_admitter(args)
    if args.job40:
        bench_job40(args)


if __name__ == "__main__":
    main()
