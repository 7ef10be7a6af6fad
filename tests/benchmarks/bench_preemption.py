"""Benchmark of GPU preemption (docs/design.md 11; run by `make bench`).

The cluster: N nodes of 4 x A100 80 GB (split 10) registered as HAMi's device plugin registers
them, every GPU full with two low-priority pods of 40,960 MiB, bound, booked and Running
(`spec.terminationGracePeriodSeconds: 0`: a victim is removed as soon as it is deleted). A
preemptor asks one GPU of 40,960 MiB at priority 100,000: it fits nowhere, and one victim makes
room. Prints one JSON line per case:

* `book-filter` (no wire): `Book.filter` over the N full nodes, p50/p99, for the preemptor (the
  victim search on every node, then its hold; the hold is dropped after each sample so every
  sample sees the same cluster), for a pod of the victims' own priority (every node searched,
  no victim) and for a pod with `preemptionPolicy: Never` (the plain no-fit filter, no search).
  The extender's fit cache is warm after the first sample, as it is for retries;
* `wire`: the API server double (`hami_plugin.testing.apiserver`), an in-process
  `SchedulerDaemon` (metrics off) and the kube-scheduler stand-in
  (`hami_plugin.testing.kubescheduler.KubeSchedulerStandIn`: kube-scheduler's queue, its own
  PostFilter preemption, the extender's filter, preempt and bind verbs) in this one process.
  K preemptors are created one after the other (each waits for its bind: `sequential`) or all
  at once (`burst`). Per preemptor, from its creation (the object added) to: its preempting
  filter answered (`hami_scheduler_filter_duration_seconds` as the scheduler observes it, the
  filter whose preemption outcome was `preempted`), its `status.nominatedNodeName` set (the
  eviction loop's first write), its victims deleted, `spec.nodeName` set; p50/p99/max. Each
  bound preemptor is admitted at once (bind-phase success, Running), as kubelet and the device
  plugin would.

  kube-scheduler retries a pod that failed only after its backoff (`initial_backoff_seconds`,
  1 s, doubling) once the victims' deletions (`AssignedPodDelete`) moved it out of the
  unschedulable pool: the `backoff_s: 1.0` lines are what a cluster sees; kube-scheduler
  refuses a `podInitialBackoffSeconds` under 1 (`pkg/scheduler/apis/config/validation/
  validation.go` `ValidateKubeSchedulerConfiguration`, "must be greater than 0", whole
  seconds). The `backoff_s: 0.0` lines (the stand-in's constructor takes 0) show the
  scheduler's part without the queue's wait. Watch events reach the informers through the
  double's HTTP watch, as in a cluster; all of it shares one interpreter (and its GIL) on
  this machine's cores.

  `vm_rss_mib` / `vm_hwm_mib`: this process's resident memory after the case and its peak
  (the double, the scheduler, the stand-in and the driver together; the 1,000-node cluster is
  8,000 pods).

    python tests/benchmarks/bench_preemption.py [--sizes 100,1000] [--preemptors 20,10]
        [--backoffs 1,0] [--burst 10] [--book-samples 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hami_plugin.extender.daemon import SchedulerDaemon
from hami_plugin.extender.observer import NullObserver
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.informer import Informer, ListWatchOptions
from hami_plugin.protocol.booking import booking_annotations
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ContainerDevice,
)
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `make bench` runs this file as a script

from tests.extender.cluster import BASE_CONFIG, FAST_RETRY  # noqa: E402
from tests.extender.helpers import gpu_node, gpu_pod  # noqa: E402
from tests.scheduler.preemption_cluster import Cluster, node_info, pod, running  # noqa: E402

GPUS_PER_NODE = 4
A100_MIB = 81920
POD_MIB = A100_MIB // 2
"""Two low pods fill a GPU; the preemptor asks as much as one of them."""
HIGH = 100_000
NAMESPACE = "default"
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)
WAIT_SECONDS = 60.0
"""How long one preemptor may take to be bound before it counts as `not_bound`."""


def emit(name: str, **figures: object) -> None:
    print(json.dumps({"bench": name, **figures}), flush=True)


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def millis(samples: Sequence[float]) -> dict[str, float | int]:
    """p50/p99/max in milliseconds of `samples` in seconds (empty: only the count)."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 0.5) * 1000, 2),
        "p99_ms": round(percentile(samples, 0.99) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 2),
    }


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def memory_status() -> dict[str, float]:
    """This process's VmRSS and VmHWM in MiB (Linux `/proc/self/status`)."""
    figures = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            figures[f"{name.lower()[:2]}_{name.lower()[2:]}_mib"] = round(
                int(value.split()[0]) / 1024, 1
            )
    return figures


# --- Book.filter without the wire ----------------------------------------------------------


def book_cluster(nodes: int) -> Cluster:
    """The benchmark's cluster as a book: every GPU of every node holds two low pods."""
    cluster = Cluster(*(node_info(node_name(i), GPUS_PER_NODE, A100_MIB) for i in range(nodes)))
    for index in range(nodes):
        name = node_name(index)
        for gpu in range(GPUS_PER_NODE):
            for half in range(2):
                low = pod(f"low-{index}-{gpu}-{half}", POD_MIB)
                started = (index * GPUS_PER_NODE + gpu) * 2 + half
                cluster.add(running(low, name, (f"GPU-{name}-{gpu}",), started))
    return cluster


def time_book_filters(cluster: Cluster, probe: str, samples: int) -> dict[str, object]:
    """`samples` filters of a fresh pod of kind `probe` over every node; what each decided."""
    durations = []
    outcomes: dict[str, int] = {}
    victims = 0
    for number in range(samples):
        if probe == "preemptor":
            info = pod(f"high-{number}", POD_MIB, priority=HIGH)
        elif probe == "equal-priority":
            info = pod(f"peer-{number}", POD_MIB, priority=0)
        else:
            info = pod(f"polite-{number}", POD_MIB, priority=HIGH, policy="Never")
        start = time.perf_counter()
        result, change = cluster.filter(info)
        durations.append(time.perf_counter() - start)
        assert result.node is None, "every GPU is full: nothing fits without preemption"
        outcomes[change.preemption_outcome] = outcomes.get(change.preemption_outcome, 0) + 1
        if change.preemption is not None:
            victims += len(change.preemption.victims)
            # drop the hold: the next sample sees the same full cluster
            cluster.book.preemption.failed(info.key, info.uid)
    return {"pod": probe, **millis(durations), "outcomes": outcomes, "victims": victims}


def bench_book(nodes: int, samples: int) -> None:
    gc.collect()
    tracemalloc.start()
    start = time.perf_counter()
    cluster = book_cluster(nodes)
    build_s = time.perf_counter() - start
    book_mib = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    common = {
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "pods": cluster.book.pod_count,
        "book_build_s": round(build_s, 2),
        "book_mib": round(book_mib, 1),
    }
    for probe in ("never", "equal-priority", "preemptor"):
        emit("book-filter", **common, **time_book_filters(cluster, probe, samples))


# --- over the wire ---------------------------------------------------------------------------


class TimingObserver(NullObserver):
    """The scheduler's observer: each /filter's duration with the preemption outcome it had
    (`preemption_attempted` is called on the request's thread before `filter_done`)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.filters: list[tuple[float, str, str]] = []
        """(seconds, filter outcome, preemption outcome or "") per /filter call."""

    def preemption_attempted(self, outcome: str) -> None:
        self._local.preemption = outcome

    def filter_done(self, seconds: float, outcome: str) -> None:
        preemption = getattr(self._local, "preemption", "")
        self._local.preemption = ""
        with self._lock:
            self.filters.append((seconds, outcome, preemption))

    def taken(self) -> list[tuple[float, str, str]]:
        with self._lock:
            taken, self.filters = self.filters, []
            return taken


@dataclass(slots=True)
class Timeline:
    """One preemptor's moments (`time.monotonic()`), as the API server's watch shows them."""

    created: float
    nominated: float | None = None
    bound: float | None = None
    node: str = ""


@dataclass(slots=True)
class Clocks:
    """What a pod watch of the bench sees: preemptors nominated and bound (each bound one is
    admitted at once), victims deleted."""

    api: FakeApiServer
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)
    preemptors: dict[str, Timeline] = field(default_factory=dict)
    deleted: list[tuple[float, str]] = field(default_factory=list)
    """(when, node) of each low pod deleted."""

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def on_upsert(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        now = time.monotonic()
        name = str(new["metadata"]["name"])
        with self.lock:
            timeline = self.preemptors.get(name)
            if timeline is None:
                return
            if timeline.nominated is None and (new.get("status") or {}).get("nominatedNodeName"):
                timeline.nominated = now
            node = str((new.get("spec") or {}).get("nodeName") or "")
            if not node or timeline.bound is not None:
                return
            timeline.bound, timeline.node = now, node
            self.changed.notify_all()
        # kubelet and the device plugin: admitted (the in-flight rules see it start)
        self.api.update_object("pods", NAMESPACE, name, _admitted)

    def on_delete(self, old: dict[str, Any]) -> None:
        if str(old["metadata"]["name"]).startswith("low-"):
            with self.lock:
                self.deleted.append((time.monotonic(), str(old["spec"].get("nodeName") or "")))

    def on_synced(self) -> None:
        return None

    def created(self, name: str) -> None:
        with self.lock:
            self.preemptors[name] = Timeline(time.monotonic())

    def wait_bound(self, names: Sequence[str], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(
                lambda: all(self.preemptors[name].bound is not None for name in names), timeout
            )


def _admitted(pod: dict[str, Any]) -> None:
    annotations = pod["metadata"].setdefault("annotations", {})
    annotations[ANNOTATION_BIND_PHASE] = "success"
    annotations[ANNOTATION_DEVICES_TO_ALLOCATE] = ";"
    pod.setdefault("status", {})["phase"] = "Running"


def low_pod(node: str, gpu: int, half: int, started: int) -> dict[str, Any]:
    """A Running pod of priority 0 holding half of GPU `gpu` of `node`, grace period 0."""
    devices = ((ContainerDevice(f"GPU-{node}-{gpu}", "NVIDIA", POD_MIB, 0),),)
    annotations = booking_annotations(node, devices, (), T0)
    annotations[ANNOTATION_BIND_PHASE] = "success"
    low = gpu_pod(f"low-{node}-{gpu}-{half}", memory=POD_MIB, annotations=annotations)
    low["spec"].update(nodeName=node, priority=0, terminationGracePeriodSeconds=0)
    start = (T0 + timedelta(seconds=started)).isoformat().replace("+00:00", "Z")
    low["status"] = {"phase": "Running", "startTime": start}
    return low


def preemptor(name: str) -> dict[str, Any]:
    high = gpu_pod(name, memory=POD_MIB, created="")  # the double's clock sets it
    high["spec"].update(priority=HIGH, schedulerName="hami-scheduler")
    return high


def fill(api: FakeApiServer, nodes: int) -> None:
    protocol = {ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL}
    for index in range(nodes):
        name = node_name(index)
        api.add_object(
            gpu_node(name, GPUS_PER_NODE, split=10, memory=A100_MIB, annotations=protocol)
        )
        for gpu in range(GPUS_PER_NODE):
            for half in range(2):
                api.add_object(low_pod(name, gpu, half, (index * GPUS_PER_NODE + gpu) * 2 + half))


@contextmanager
def scheduler(api: FakeApiServer, observer: TimingObserver) -> Iterator[SchedulerDaemon]:
    """An in-process `hami scheduler` against `api` (as tests/extender/cluster.py runs it)."""
    client = KubeClient(api.api_client(), FAST_RETRY)
    daemon = SchedulerDaemon(BASE_CONFIG, kube=client, observer=observer, watch_timeout_seconds=300)
    thread = threading.Thread(target=daemon.run, name="scheduler")
    thread.start()
    try:
        if not daemon.started.wait(60) or not daemon.ready.wait(120):
            raise AssertionError("the scheduler did not get ready")
        yield daemon
    finally:
        daemon.stop()
        thread.join(60)
        client.close()


@contextmanager
def watching(api: FakeApiServer, clocks: Clocks) -> Iterator[None]:
    client = KubeClient(api.api_client(), FAST_RETRY)
    informer: Informer[dict[str, Any]] = Informer(
        client, "/api/v1/pods", dict, lambda p: f"{p['metadata']['name']}", clocks,
        name="bench-pods", options=ListWatchOptions(watch_timeout_seconds=300),
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), name="bench-pods")
    thread.start()
    try:
        if not informer.synced.wait(120):
            raise AssertionError("the bench's pod watch did not sync")
        yield
    finally:
        stop.set()
        thread.join(60)
        client.close()


@contextmanager
def standin(api: FakeApiServer, url: str, backoff_s: float) -> Iterator[KubeSchedulerStandIn]:
    client = KubeClient(api.api_client(), FAST_RETRY)
    kube_scheduler = KubeSchedulerStandIn(
        client,
        url,
        initial_backoff_seconds=backoff_s,
        max_backoff_seconds=max(backoff_s, 10.0) if backoff_s else 0.0,
    )
    kube_scheduler.start()
    try:
        deadline = time.monotonic() + 120
        while not kube_scheduler.synced:
            if time.monotonic() > deadline:
                raise AssertionError("the stand-in did not sync")
            time.sleep(0.05)
        yield kube_scheduler
    finally:
        kube_scheduler.stop()
        client.close()


@dataclass(slots=True)
class WireCase:
    nodes: int
    mode: str
    backoff_s: float
    count: int
    first: int
    """The number of the case's first preemptor (names stay unique across cases)."""


def run_wire_case(
    api: FakeApiServer, daemon: SchedulerDaemon, observer: TimingObserver, case: WireCase
) -> bool:
    """Run one case and print its line; False when a preemptor was not bound in time or the
    victims deleted were not one per preemptor (each needs exactly one)."""
    clocks = Clocks(api)
    names = [f"high-{case.first + number}" for number in range(case.count)]
    with watching(api, clocks), standin(api, daemon.url, case.backoff_s) as kube_scheduler:
        observer.taken()
        start = time.monotonic()
        if case.mode == "burst":
            for name in names:
                clocks.created(name)
                api.add_object(preemptor(name))
            clocks.wait_bound(names, WAIT_SECONDS * 2)
        else:
            for name in names:
                clocks.created(name)
                api.add_object(preemptor(name))
                clocks.wait_bound([name], WAIT_SECONDS)
        elapsed = time.monotonic() - start
        standin_preemptions = len(kube_scheduler.preemptions)
    with clocks.lock:
        timelines = [clocks.preemptors[name] for name in names]
        deleted = list(clocks.deleted)
    filters = observer.taken()
    bound = [t.bound - t.created for t in timelines if t.bound is not None]
    nominated = [t.nominated - t.created for t in timelines if t.nominated is not None]
    after_eviction = [t.bound - t.nominated for t in timelines if t.bound and t.nominated]
    preempting = [seconds for seconds, _, outcome in filters if outcome == "preempted"]
    others = [seconds for seconds, outcome, p in filters if outcome == "no_fit" and not p]
    waiting = [seconds for seconds, _, outcome in filters if outcome == "waiting"]
    fitted = [seconds for seconds, outcome, _ in filters if outcome == "fit"]
    emit(
        "wire",
        nodes=case.nodes,
        pods=case.nodes * GPUS_PER_NODE * 2,
        mode=case.mode,
        backoff_s=case.backoff_s,
        preemptors=case.count,
        not_bound=case.count - len(bound),
        victims_deleted=len(deleted),
        create_to_bound=millis(bound),
        create_to_nominated=millis(nominated),
        nominated_to_bound=millis(after_eviction),
        filter_preempting=millis(preempting),
        filter_victims_terminating=millis(waiting),
        filter_no_fit_other=millis(others),
        filter_fit=millis(fitted),
        filters_per_preemptor=round(len(filters) / max(case.count, 1), 2),
        standin_preemptions=standin_preemptions,
        preemptors_per_s=round(len(bound) / elapsed, 2) if case.mode == "burst" else None,
        **memory_status(),
    )
    return len(bound) == case.count and len(deleted) == case.count


def bench_wire(nodes: int, preemptors: int, backoffs: Sequence[float], burst: int) -> bool:
    """Every wire case on one cluster of `nodes`; False when one of them failed."""
    observer = TimingObserver()
    with FakeApiServer(history_size=100_000) as api:
        start = time.monotonic()
        fill(api, nodes)
        filled_s = time.monotonic() - start
        with scheduler(api, observer) as daemon:
            ready_s = time.monotonic() - start - filled_s
            emit("wire-setup", nodes=nodes, fill_s=round(filled_s, 2), ready_s=round(ready_s, 2))
            first = 0
            passed = True
            cases = [WireCase(nodes, "sequential", b, preemptors, 0) for b in backoffs]
            if burst:
                cases += [WireCase(nodes, "burst", b, burst, 0) for b in backoffs]
            for case in cases:
                passed &= run_wire_case(api, daemon, observer, replace(case, first=first))
                first += case.count
    return passed


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="node counts")
    parser.add_argument(
        "--preemptors", default="20,10", help="sequential preemptors per size (last repeats)"
    )
    parser.add_argument("--backoffs", default="1,0", help="the stand-in's initial backoffs (s)")
    parser.add_argument("--burst", type=int, default=10, help="preemptors created at once (0: no)")
    parser.add_argument("--book-samples", type=int, default=20)
    parser.add_argument("--no-wire", action="store_true", help="the book benchmark only")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    counts = [int(count) for count in args.preemptors.split(",") if count]
    for nodes in sizes:
        bench_book(nodes, args.book_samples)
    if args.no_wire:
        return 0
    passed = True
    for position, nodes in enumerate(sizes):
        count = counts[min(position, len(counts) - 1)]
        passed &= bench_wire(nodes, count, _floats(args.backoffs), args.burst)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
