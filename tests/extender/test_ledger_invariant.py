"""The ledger invariant of the scheduler's state under random event orders (hypothesis).

A small cluster (3 nodes x 2 GPUs of 4 slots, 8000 MiB, 100 % cores) lives in `_Run`, the API
server's truth. Things happen to it as in a real cluster: pods are created and scheduled as
kube-scheduler drives the extender (`SchedulerState.filter` on the state's current view, then
`plan_bind`, the one annotation patch and the Binding, `bind_succeeded`; or the bind fails and
is rolled back; or no bind follows and the filter booking expires), allocated (bind-phase
success and Running, or failed while Pending), finish, are deleted, or deleted and re-created
under the same name (a StatefulSet pod); nodes heartbeat, vanish and come back, or lose and
regain their register annotation. Every change becomes a watch event in a per-object queue.
The watch delivers each object's events in order, objects interleave at random, events are
delivered twice, and a relist replaces everything as the informer does it (pending events are
lost; the fresh list is diffed against the informer's store: keys gone get `on_delete`, changed
ones `on_upsert`; then `on_synced`).

The events reach G1's `SchedulerState` through its informer handlers (`pod_events`,
`node_events`), exactly as `hami_plugin.kube.informer.Informer` calls them.

Invariants, checked after every step:
* on every GPU, what the LIVE pods of the cluster hold (decoded from their annotations,
  independently of the scheduler's code) never exceeds the GPU's capacity: the scheduler never
  over-commits, however late or repeated its events are;
* the state's ledger never books more than a GPU's capacity;
* once every pending event is delivered and filter bookings that no bind followed have
  expired (and after every relist), the ledger books on every GPU exactly what the live pods
  hold, and the registered nodes are those with a register annotation.

A pod holds GPUs when it carries `hami.io/vgpu-node` and `-devices-allocated`, has not
finished, and is not `bind-phase: failed` while still Pending (docs/design.md 3.2: the extender
untracks those, our Allocate never serves them).

Races are also written out as plain tests, one by one.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.clock import ManualClock
from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.informer import InformerHandler
from hami_plugin.protocol.codec import decode_pod_devices, encode_node_devices
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
)
from hami_plugin.protocol.model import (
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
from hami_plugin.protocol.objects import NodeInfo, PodInfo, read_node, read_pod
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.book.bookings import BindPlan, BindRefusal
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage
from hami_plugin.testing.apiserver import make_container, make_node, make_pod

NODES = ("node-a", "node-b", "node-c")
PROTOCOLS: dict[str, dict[str, str]] = {
    "node-a": {},  # HAMi's device plugin: the node lock (not taken here: no API)
    "node-b": {ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL},
    "node-c": {ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL_V2},
}
"""Each kind of node once, so filters fan out (`--burst-look-ahead`) between kinds."""
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


def booked(usages: Iterable[NodeUsage]) -> dict[str, tuple[int, int, int]]:
    """Slots, MiB and cores per GPU UUID the ledger books on registered nodes."""
    result = {}
    for usage in usages:
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


BOOKING_TTL_SECONDS = 30.0
_T = TypeVar("_T")


class _StateUnderTest:
    """G1's `SchedulerState`, fed as the daemon feeds it: informers (a store per collection,
    the handler called only when a stored value changes, relists diffed against the store)
    and kube-scheduler's filter/bind calls."""

    def __init__(self) -> None:
        self.clock = ManualClock(_T0)
        self.state = SchedulerState(
            BookSettings(SETTINGS, booking_ttl_seconds=BOOKING_TTL_SECONDS), clock=self.clock
        )
        self.pods: dict[str, PodInfo] = {}  # the pod informer's store
        self.nodes: dict[str, NodeInfo] = {}  # the node informer's store

    def booked(self) -> dict[str, tuple[int, int, int]]:
        return booked(self.state.usage_snapshot()[0])

    def registered_nodes(self) -> list[str]:
        return self.state.registered_nodes()

    # --- kube-scheduler -----------------------------------------------------------------------

    def filter(self, pod: Mapping[str, Any]) -> str | None:
        answer = self.state.filter(read_pod(pod), list(NODES))
        assert not answer.error, answer.error
        return answer.node_names[0] if answer.node_names else None

    def plan_bind(self, pod: Mapping[str, Any], node: str) -> BindPlan | None:
        plan = self.state.plan_bind(read_pod(pod), node)
        return None if isinstance(plan, BindRefusal) else plan

    def expire_filter_bookings(self) -> None:
        self.clock.advance(BOOKING_TTL_SECONDS + 1)
        self.state.expire_bookings()

    # --- the informers ------------------------------------------------------------------------

    def deliver(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event, as `Informer._apply` hands it on."""
        if kind == "pod":
            self._apply(
                self.pods, read_pod(obj), lambda p: p.key, event_type, self.state.pod_events
            )
        else:
            self._apply(
                self.nodes, read_node(obj), lambda n: n.name, event_type, self.state.node_events
            )

    @staticmethod
    def _apply(
        store: dict[str, Any], value: Any, key: Callable[[Any], str], event_type: str, handler: Any
    ) -> None:
        name = key(value)
        old = store.get(name)
        if event_type == "DELETED":
            store.pop(name, None)
            if old is not None:
                handler.on_delete(old)
        else:
            store[name] = value
            if old is None or old != value:
                handler.on_upsert(value, old)

    def redeliver(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """An event delivered twice, straight to the handler (the informer would drop an
        unchanged upsert; the handler must not care either way)."""
        if kind == "pod":
            info = read_pod(obj)
            if event_type == "DELETED":
                self.state.pod_events.on_delete(info)
            else:
                self.state.pod_events.on_upsert(info, info)
        else:
            node = read_node(obj)
            if event_type == "DELETED":
                self.state.node_events.on_delete(node)
            else:
                self.state.node_events.on_upsert(node, node)

    def relist(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        """`Informer._relist` for both collections."""
        fresh_nodes = {n.name: n for n in map(read_node, nodes)}
        _relist(self.nodes, fresh_nodes, self.state.node_events)
        _relist(self.pods, {p.key: p for p in map(read_pod, pods)}, self.state.pod_events)


def _relist(store: dict[str, _T], fresh: dict[str, _T], handler: InformerHandler[_T]) -> None:
    """Swap the store, diff (keys gone: on_delete; new or changed: on_upsert), on_synced."""
    old_store = dict(store)
    store.clear()
    store.update(fresh)
    for name, old in old_store.items():
        if name not in fresh:
            handler.on_delete(old)
    for name, new in fresh.items():
        previous = old_store.get(name)
        if previous is None or previous != new:
            handler.on_upsert(new, previous)
    handler.on_synced()


Event = tuple[str, str, dict[str, Any]]  # (kind "pod"|"node", type ADDED|MODIFIED|DELETED, obj)


class _Run:
    """The cluster, the watch between it and the handler, and the handler."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.queues: dict[tuple[str, str], collections.deque[Event]] = {}
        self.delivered: dict[tuple[str, str], Event] = {}
        self.handler = _StateUnderTest()
        self.version = 0
        self.uids = 0
        self.now = _T0
        for node in NODES:
            annotations = {ANNOTATION_NODE_REGISTER: REGISTER[node], **PROTOCOLS[node]}
            allocatable = {"cpu": "8", "pods": "110", RESOURCE_GPU: str(GPUS_PER_NODE * SLOTS)}
            obj = make_node(node, annotations=annotations, allocatable=allocatable)
            self._emit("node", node, "ADDED", obj)
        self.relist()  # the daemon starts with its first lists

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
        metadata["labels"] = dict(metadata.get("labels") or {}, **changes.pop("labels", {}))
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
        self.now += timedelta(seconds=self.uids % 2)  # pairs of pods share a creation second
        self._emit("pod", name, "ADDED", _pod_object(name, f"uid-{self.uids}", shape, self.now))

    def create_and_schedule(self, name: str, shape: Shape) -> None:
        """kube-scheduler saw the new pod before our watch did: it asks at once."""
        if name not in self.pods:
            self.create(name, shape)
            self.schedule(name)

    def schedule(self, name: str, outcome: str = "bound") -> None:
        """kube-scheduler's filter, then (`outcome`) a bind that goes through (the one
        annotation patch, the Binding), a bind whose API calls fail (rolled back), or no bind
        at all (it gave up on the pod: the filter booking expires later)."""
        pod = self.pods.get(name)
        if pod is None or pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending":
            return
        if ANNOTATION_VGPU_NODE in (pod["metadata"].get("annotations") or {}):
            return
        node = self.handler.filter(pod)
        if node is None or outcome == "no_bind":
            return
        plan = self.handler.plan_bind(pod, node)
        if plan is None:
            return
        if outcome == "bind_fails" or (
            plan.protocol and self.handler.state.claim_in_flight(plan, deadline=0.0) is not None
        ):
            # failed, or the wait for an in-flight pod kubelet could confuse it with timed out
            self.handler.state.bind_failed(plan)
            return
        self._change_pod(name, annotations=plan.annotations, labels=plan.labels)
        self._change_pod(name, spec={"nodeName": node})
        self.handler.state.bind_succeeded(plan)

    def expire(self) -> None:
        """Time passes: filter bookings no bind followed are freed."""
        self.handler.expire_filter_bookings()

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
        self.handler.deliver(*event)

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
            self.handler.redeliver(*self.delivered[keys[choice % len(keys)]])

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
        _within_capacity(self.handler.booked())

    def check_exact(self) -> None:
        self.expire()
        assert self.handler.booked() == held(self.pods)
        registered = {n for n, obj in self.nodes.items() if _registered(obj)}
        assert set(self.handler.registered_nodes()) == registered


def _registered(node: Mapping[str, Any]) -> bool:
    return bool((node["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_REGISTER))


# Weighted: races need many deliveries and schedules between the rarer cluster changes.
_OPS = (
    ("create",) * 2
    + ("create_and_schedule",) * 4
    + ("schedule",) * 3
    + ("schedule_bind_fails", "filter_only", "expire")
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
    elif name == "schedule_bind_fails":
        run.schedule(pod, "bind_fails")
    elif name == "filter_only":
        run.schedule(pod, "no_bind")
    elif name == "expire":
        run.expire()
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
    assert run.handler.booked() == {}


def test_a_relist_that_shows_a_successor_drops_the_gone_pods_booking() -> None:
    run = _Run()
    run.create_and_schedule("pod-1", SHAPES[0])
    run.recreate("pod-1", SHAPES[0])  # the pod decided for is gone before our watch saw it
    run.relist()
    assert run.handler.booked() == {}


def test_a_pod_bound_and_deleted_while_the_watch_was_away_leaves_no_booking() -> None:
    run = _Run()
    run.drain(0)
    run.create_and_schedule("pod-0", SHAPES[4])  # the bind went through...
    run.delete("pod-0")  # ...and the pod was deleted before the watch showed any of it
    run.relist()  # the informer never stored pod-0: no on_delete, only on_synced
