"""The ledger invariant under random event orders (hypothesis: random operation sequences).

A small cluster (3 nodes x 2 GPUs of 4 slots, 8000 MiB, 100 % cores) lives in `_Cluster`, the
API server's truth. Things happen to it as they do in a real cluster: pods are created,
scheduled (decide on the handler's current view, book, bind: annotations + nodeName),
allocated (bind-phase success and Running, or failed while Pending), finish, are deleted or
deleted and re-created under the same name (a StatefulSet pod), and nodes heartbeat, vanish and
come back, or lose and regain their register annotation. Every change becomes a watch event in a
per-object queue; the watch delivers each object's events in order, but objects interleave at
random, events are duplicated, and a relist replaces everything (pending events are lost, the
current state is delivered, objects gone are deleted).

Invariants, checked after every step:
* on every GPU, what the LIVE pods of the cluster hold (decoded from their annotations,
  independently of the ledger code) never exceeds the GPU's capacity (slots, MiB, cores):
  the scheduler never over-commits, however late or repeated its events are;
* the handler's ledger never books more than a GPU's capacity;
* once every pending event is delivered (and after every relist), the ledger books on every
  GPU exactly what the live pods hold.

A pod holds GPUs when it carries `hami.io/vgpu-node` and `-devices-allocated`, has not
finished, and is not `bind-phase: failed` while still Pending (DESIGN.md: the extender untracks
those, our Allocate never serves them).

The handler under test is `_LedgerHandler`: the Ledger plus the booking rules a scheduler's
watch handler needs on top of it (DESIGN.md "Scheduler daemon decisions"); when the daemon's
state module exposes its handlers, they replace it here. Four races are also written out as
plain tests: random search finds three of them quickly, the re-created pod rarely.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.codec import decode_pod_devices, encode_node_devices
from hami_plugin.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    BindPhase,
    GpuDevice,
)
from hami_plugin.scheduler.filter import FilterResult, assume, decide
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.objects import read_pod
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.testing.apiserver import make_container, make_node, make_pod

NODES = ("node-a", "node-b", "node-c")
GPUS_PER_NODE = 2
SLOTS = 4
MEMORY_MIB = 8000
CORES = 100
POD_NAMES = tuple(f"pod-{i}" for i in range(4))
NAMESPACE = "default"
SETTINGS = SchedulerSettings()
_T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """A pod's GPU request: `containers` app containers, each asking `gpus` GPUs."""

    containers: int
    gpus: int
    memory_mib: int
    cores: int


SHAPES = (
    Shape(1, 1, 1000, 0),
    Shape(1, 1, 3000, 25),
    Shape(1, 2, 2000, 50),
    Shape(2, 1, 2500, 30),
    Shape(1, 1, 7000, 100),
)


def _devices(node: str) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(
            uuid=f"GPU-{node}-{index}",
            index=index,
            split_count=SLOTS,
            memory_mib=MEMORY_MIB,
            cores_percent=CORES,
            type="NVIDIA-A100",
            numa_node=0,
            mode="hami-core",
            healthy=True,
        )
        for index in range(GPUS_PER_NODE)
    )


REGISTER = {node: encode_node_devices(_devices(node)) for node in NODES}
CAPACITY = {
    device.uuid: (device.split_count, device.memory_mib, device.cores_percent)
    for node in NODES
    for device in _devices(node)
}


def _pod_object(name: str, uid: str, shape: Shape, created: datetime) -> dict[str, Any]:
    limits = {
        RESOURCE_GPU: str(shape.gpus),
        RESOURCE_GPU_MEMORY: str(shape.memory_mib),
        RESOURCE_GPU_CORES: str(shape.cores),
    }
    pod = make_pod(
        name,
        NAMESPACE,
        containers=[make_container(f"c{i}", limits=limits) for i in range(shape.containers)],
    )
    pod["metadata"]["uid"] = uid
    pod["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether a live pod's GPUs are taken (see the module docstring)."""
    annotations = pod["metadata"].get("annotations") or {}
    phase = pod.get("status", {}).get("phase", "")
    if ANNOTATION_VGPU_NODE not in annotations or ANNOTATION_DEVICES_ALLOCATED not in annotations:
        return False
    if phase in ("Succeeded", "Failed"):
        return False
    return not (annotations.get(ANNOTATION_BIND_PHASE) == BindPhase.FAILED and phase == "Pending")


def held(pods: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Slots, MiB and cores per GPU UUID held by `pods`, summed from their annotations."""
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for pod in pods.values():
        if not holds_gpus(pod):
            continue
        value = pod["metadata"]["annotations"][ANNOTATION_DEVICES_ALLOCATED]
        for container in decode_pod_devices(value, ANNOTATION_DEVICES_ALLOCATED):
            for device in container:
                total = totals[device.uuid]
                total[0] += 1
                total[1] += device.used_mem_mib
                total[2] += device.used_cores
    return {uuid: (t[0], t[1], t[2]) for uuid, t in totals.items() if any(t)}


def booked(ledger: Ledger) -> dict[str, tuple[int, int, int]]:
    """Slots, MiB and cores per GPU UUID the ledger books on registered nodes."""
    result = {}
    for usage in ledger.usages():
        for position, device in enumerate(usage.devices):
            numbers = (
                usage.used[position],
                usage.used_memory_mib[position],
                usage.used_cores[position],
            )
            if any(numbers):
                result[device.uuid] = numbers
    return result


def _within_capacity(usage: Mapping[str, tuple[int, int, int]]) -> None:
    for uuid, numbers in usage.items():
        capacity = CAPACITY[uuid]
        assert all(n <= c for n, c in zip(numbers, capacity, strict=True)), (
            f"GPU {uuid} over-committed: {numbers} > {capacity}"
        )
        assert all(n >= 0 for n in numbers), f"GPU {uuid} booked below zero: {numbers}"


class _LedgerHandler:
    """The scheduler's watch handlers over a Ledger, with the booking rules around it:

    * a booking made by a decision survives events of its pod that predate the bind patch
      (no `hami.io/vgpu-node` yet: our watch can lag behind kube-scheduler's);
    * events of an older incarnation of a re-created pod (same name, other uid) never touch
      the booking of the pod that was decided for (a watch delivers one name's events in
      order, so another uid there is an older pod); a relist, though, shows the present: a
      listed pod with another uid means the pod decided for is gone;
    * a pod `bind-phase: failed` while Pending holds nothing (DESIGN.md).
    """

    def __init__(self) -> None:
        self.ledger = Ledger()
        self._decided: dict[str, str] = {}  # pod key -> uid booked by a decision, not yet seen

    def decide(self, pod: Mapping[str, Any], now: datetime) -> FilterResult:
        info = read_pod(pod)
        result = decide(self.ledger, info, list(NODES), now, SETTINGS)
        if result.node is not None:
            assume(self.ledger, info.key, result)
            self._decided[info.key] = info.uid
        return result

    def pod_upsert(self, pod: Mapping[str, Any]) -> None:
        info = read_pod(pod)
        decided = self._decided.get(info.key)
        if decided is not None:
            if info.uid != decided:
                return
            if ANNOTATION_VGPU_NODE not in info.annotations and not info.finished:
                return
            del self._decided[info.key]
        if info.annotations.get(ANNOTATION_BIND_PHASE) == BindPhase.FAILED and info.phase in (
            "Pending",
            "",
        ):
            self.ledger.untrack(info.key)
            return
        self.ledger.update_pod(info)

    def pod_delete(self, pod: Mapping[str, Any]) -> None:
        info = read_pod(pod)
        decided = self._decided.get(info.key)
        if decided is not None and decided != info.uid:
            return
        self._decided.pop(info.key, None)
        self.ledger.delete_pod(info)

    def node_upsert(self, node: Mapping[str, Any]) -> None:
        self.ledger.update_node(node)

    def node_delete(self, node: Mapping[str, Any]) -> None:
        self.ledger.remove_node(node["metadata"]["name"])

    def relist(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        listed = {f"{NAMESPACE}/{p['metadata']['name']}" for p in pods}
        for tracked in self.ledger.tracked_pods():
            if tracked.key not in listed:
                self._decided.pop(tracked.key, None)
                self.ledger.untrack(tracked.key)
        names = {n["metadata"]["name"] for n in nodes}
        for name in self.ledger.node_names():
            if name not in names:
                self.ledger.remove_node(name)
        for node in nodes:
            self.node_upsert(node)
        for pod in pods:
            info = read_pod(pod)
            if self._decided.get(info.key, info.uid) != info.uid:
                # A list is the present: the pod decided for is gone, this is its successor.
                del self._decided[info.key]
                self.ledger.untrack(info.key)
            self.pod_upsert(pod)


Event = tuple[str, str, dict[str, Any]]  # (kind "pod"|"node", type ADDED|MODIFIED|DELETED, obj)


class _Run:
    """The cluster, the watch between it and the handler, and the handler."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.queues: dict[tuple[str, str], collections.deque[Event]] = {}
        self.delivered: dict[tuple[str, str], Event] = {}
        self.handler = _LedgerHandler()
        self.version = 0
        self.uids = 0
        self.now = _T0
        for node in NODES:
            annotations = {ANNOTATION_NODE_REGISTER: REGISTER[node]}
            self._emit("node", node, "ADDED", make_node(node, annotations=annotations))

    # --- the cluster ------------------------------------------------------------------------

    def _emit(self, kind: str, key: str, event_type: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = dict(obj)
        obj["metadata"] = dict(obj["metadata"], resourceVersion=str(self.version))
        if event_type != "DELETED":
            (self.pods if kind == "pod" else self.nodes)[key] = obj
        self.queues.setdefault((kind, key), collections.deque()).append((kind, event_type, obj))

    def _change_pod(self, name: str, **changes: Any) -> None:
        pod = self.pods[name]
        metadata = dict(pod["metadata"])
        metadata["annotations"] = dict(
            metadata.get("annotations") or {}, **changes.pop("annotations", {})
        )
        spec = dict(pod["spec"], **changes.pop("spec", {}))
        status = dict(pod.get("status") or {}, **changes.pop("status", {}))
        self._emit("pod", name, "MODIFIED", dict(pod, metadata=metadata, spec=spec, status=status))

    def _change_node(self, node: str, annotations: dict[str, str]) -> None:
        obj = self.nodes[node]
        metadata = dict(obj["metadata"], annotations=annotations)
        self._emit("node", node, "MODIFIED", dict(obj, metadata=metadata))

    def create(self, name: str, shape: Shape) -> None:
        if name in self.pods:
            return
        self.uids += 1
        self.now += timedelta(seconds=1)
        self._emit("pod", name, "ADDED", _pod_object(name, f"uid-{self.uids}", shape, self.now))

    def create_and_schedule(self, name: str, shape: Shape) -> None:
        """kube-scheduler saw the new pod before our watch did: it asks at once."""
        if name not in self.pods:
            self.create(name, shape)
            self.schedule(name)

    def schedule(self, name: str) -> None:
        """Filter (decide on the handler's view, book) and bind (one annotation patch with
        bind-phase allocating, then the Binding)."""
        pod = self.pods.get(name)
        if pod is None or pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending":
            return
        if ANNOTATION_VGPU_NODE in (pod["metadata"].get("annotations") or {}):
            return
        self.now += timedelta(seconds=1)
        result = self.handler.decide(pod, self.now)
        assert result.error is None, result.error
        if result.node is None:
            return
        annotations = dict(result.annotations)
        annotations[ANNOTATION_BIND_PHASE] = BindPhase.ALLOCATING
        self._change_pod(name, annotations=annotations)
        self._change_pod(name, spec={"nodeName": result.node})

    def allocate(self, name: str, succeeded: bool) -> None:
        """The device plugin's Allocate: success (then Running) or failed (still Pending)."""
        pod = self.pods.get(name)
        annotations = (pod or {}).get("metadata", {}).get("annotations") or {}
        if pod is None or annotations.get(ANNOTATION_BIND_PHASE) != BindPhase.ALLOCATING:
            return
        if succeeded:
            self._change_pod(name, annotations={ANNOTATION_BIND_PHASE: BindPhase.SUCCESS})
            self._change_pod(name, status={"phase": "Running"})
        else:
            self._change_pod(name, annotations={ANNOTATION_BIND_PHASE: BindPhase.FAILED})

    def finish(self, name: str, succeeded: bool) -> None:
        pod = self.pods.get(name)
        if pod is not None and pod["status"].get("phase") == "Running":
            self._change_pod(name, status={"phase": "Succeeded" if succeeded else "Failed"})

    def delete(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is not None:
            self._emit("pod", name, "DELETED", pod)

    def recreate(self, name: str, shape: Shape) -> None:
        """Deleted and created again under the same name (a StatefulSet pod)."""
        if name in self.pods:
            self.delete(name)
            self.create(name, shape)

    def node_heartbeat(self, node: str) -> None:
        annotations = dict(self.nodes[node]["metadata"].get("annotations") or {})
        annotations["heartbeat"] = str(self.version)
        self._change_node(node, annotations)

    def node_comes_back(self, node: str) -> None:
        """The Node object is deleted and created again (same GPUs)."""
        obj = self.nodes[node]
        self._emit("node", node, "DELETED", obj)
        self._emit("node", node, "ADDED", obj)

    def node_plugin_restarts(self, node: str) -> None:
        """The register annotation disappears, then comes back."""
        annotations = dict(self.nodes[node]["metadata"].get("annotations") or {})
        register = annotations.pop(ANNOTATION_NODE_REGISTER)
        self._change_node(node, dict(annotations))
        self._change_node(node, dict(annotations, **{ANNOTATION_NODE_REGISTER: register}))

    # --- the watch ----------------------------------------------------------------------------

    def _deliver(self, event: Event) -> None:
        kind, event_type, obj = event
        if kind == "pod":
            if event_type == "DELETED":
                self.handler.pod_delete(obj)
            else:
                self.handler.pod_upsert(obj)
        elif event_type == "DELETED":
            self.handler.node_delete(obj)
        else:
            self.handler.node_upsert(obj)

    def _pending(self) -> list[tuple[str, str]]:
        return sorted(key for key, queue in self.queues.items() if queue)

    def deliver(self, choice: int) -> None:
        """The oldest pending event of one object (objects interleave at random)."""
        pending = self._pending()
        if pending:
            key = pending[choice % len(pending)]
            event = self.queues[key].popleft()
            self._deliver(event)
            self.delivered[key] = event

    def duplicate(self, choice: int) -> None:
        """An object's last event delivered again."""
        keys = sorted(self.delivered)
        if keys:
            self._deliver(self.delivered[keys[choice % len(keys)]])

    def relist(self) -> None:
        """The watch expired: pending events are lost, the current state is listed."""
        self.queues.clear()
        self.delivered.clear()
        self.handler.relist(list(self.pods.values()), list(self.nodes.values()))
        self.check_exact()

    def drain(self, seed: int) -> None:
        """Every pending event delivered, objects interleaved, each object's events in order."""
        order = random.Random(seed)
        while pending := self._pending():
            key = order.choice(pending)
            event = self.queues[key].popleft()
            self._deliver(event)
            self.delivered[key] = event
        self.check_exact()

    # --- invariants -----------------------------------------------------------------------------

    def check_capacity(self) -> None:
        _within_capacity(held(self.pods))  # the cluster is never over-committed
        _within_capacity(booked(self.handler.ledger))

    def check_exact(self) -> None:
        assert booked(self.handler.ledger) == held(self.pods)
        registered = {n for n, obj in self.nodes.items() if _registered(obj)}
        assert set(self.handler.ledger.node_names()) == registered


def _registered(node: Mapping[str, Any]) -> bool:
    return bool((node["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_REGISTER))


# Weighted: races need many deliveries and schedules between the rarer cluster changes.
_OPS = (
    ("create",) * 2
    + ("create_and_schedule",) * 4
    + ("schedule",) * 3
    + ("deliver",) * 6
    + ("duplicate",) * 2
    + ("allocate",) * 2
    + ("finish", "delete", "recreate", "relist", "drain")
    + ("node_heartbeat", "node_comes_back", "node_plugin_restarts")
)

Op = tuple[str, int, Shape, int, bool]

OPERATIONS = st.tuples(
    st.sampled_from(_OPS),
    st.integers(0, len(POD_NAMES) - 1),
    st.sampled_from(SHAPES),
    st.integers(0, 2**16),
    st.booleans(),
)


def _apply(run: _Run, op: Op) -> None:
    name, index, shape, choice, flag = op
    pod = POD_NAMES[index]
    node = NODES[index % len(NODES)]
    if name in ("create", "create_and_schedule", "recreate"):
        getattr(run, name)(pod, shape)
    elif name in ("schedule", "delete"):
        getattr(run, name)(pod)
    elif name in ("allocate", "finish"):
        getattr(run, name)(pod, flag)
    elif name in ("deliver", "duplicate", "drain"):
        getattr(run, name)(choice)
    elif name == "relist":
        run.relist()
    else:
        getattr(run, name)(node)


@settings(max_examples=400, deadline=None)
@given(st.lists(OPERATIONS, min_size=1, max_size=80), st.integers(0, 2**16))
def test_ledger_invariant_under_random_event_orders(ops: list[Op], seed: int) -> None:
    run = _Run()
    for op in ops:
        _apply(run, op)
        run.check_capacity()
    run.drain(seed)


# --- the races the handler must get right, one by one -------------------------------------


def test_a_booking_survives_its_pods_events_from_before_the_bind() -> None:
    run = _Run()
    run.drain(0)
    run.create_and_schedule("pod-0", SHAPES[4])  # our watch has not seen pod-0 yet
    run.deliver(0)  # pod-0 ADDED, without the decision's annotations
    run.create_and_schedule("pod-1", SHAPES[4])  # must not land on pod-0's GPU
    run.check_capacity()
    run.drain(0)


def test_events_of_a_deleted_pod_never_free_its_successors_booking() -> None:
    run = _Run()
    run.drain(0)
    run.create_and_schedule("pod-0", SHAPES[4])
    run.drain(0)
    run.delete("pod-0")
    run.create_and_schedule("pod-0", SHAPES[4])  # re-created, decided before our watch caught up
    run.deliver(0)  # the old pod-0's DELETED
    run.create_and_schedule("pod-1", SHAPES[4])
    run.create_and_schedule("pod-2", SHAPES[4])  # both GPUs of node-a are full now
    run.check_capacity()
    run.drain(0)


def test_a_pod_whose_allocation_failed_gives_its_gpus_back() -> None:
    run = _Run()
    run.create_and_schedule("pod-0", SHAPES[4])
    run.allocate("pod-0", succeeded=False)
    run.drain(0)
    assert booked(run.handler.ledger) == {}


def test_a_relist_that_shows_a_successor_drops_the_gone_pods_booking() -> None:
    run = _Run()
    run.create_and_schedule("pod-1", SHAPES[0])
    run.recreate("pod-1", SHAPES[0])  # the pod decided for is gone before our watch saw it
    run.relist()
    assert booked(run.handler.ledger) == {}
