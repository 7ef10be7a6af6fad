"""The pure book (`scheduler.book.book.Book`) driven directly by random transition sequences.

A small cluster (a node with HAMi's lock and one with our allocate protocol, 2 GPUs each) and
four pod names. Each step is one transition with the time passed in: a pod created, filtered,
bound (the plan, the in-flight claim, the Binding, or a rollback), its patch shown by a late
watch, allocated, finished, deleted, a forged booking written by its author, a node lock taken
or released, time passing. Checked after every step:

* the book is a value: a twin fed the same transitions answers the same, transition by
  transition (no clock, key file or other input read behind the caller's back);
* the `Change` says what the owner must act on: `wake_binds` whenever an in-flight view, a node
  lock or an allocate protocol changed, `lock_releases` exactly when a deleted pod's node lock
  was queued, `expired` the filter bookings freed by their time;
* no GPU is booked beyond its capacity or below zero;
* and at the end, every patch delivered and every filter booking expired, no booking stands
  and the ledger is what a fresh book counts from the same pods and nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    BindPhase,
    ContainerDevice,
    GpuDevice,
)
from hami_plugin.protocol.nodelock import lock_value
from hami_plugin.protocol.objects import ContainerSpec, NodeInfo, PodInfo
from hami_plugin.protocol.signature import BookingKeys
from hami_plugin.scheduler.book.book import Book, BookSettings, Change
from hami_plugin.scheduler.book.bookings import BindPlan, BookingPhase
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage
from tests.bookings import keys_from

SETTINGS = BookSettings(SchedulerSettings(), booking_ttl_seconds=30.0)
KEYS = keys_from(b"k" * 32)
NODES = ("lock-node", "protocol-node")
SLOTS, MEMORY_MIB = 4, 8000
NAMES = tuple(f"pod-{i}" for i in range(4))
MEMORIES = (1000, 3000, 7000)
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)


def _gpus(node: str) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(f"GPU-{node}-{i}", i, SLOTS, MEMORY_MIB, 100, "NVIDIA-A100", 0, "hami-core", True)
        for i in range(2)
    )


CAPACITY = {gpu.uuid: (SLOTS, MEMORY_MIB, 100) for node in NODES for gpu in _gpus(node)}


def node_info(name: str, lock: str | None = None) -> NodeInfo:
    annotations = {ANNOTATION_NODE_REGISTER: codec.encode_node_devices(_gpus(name))}
    if name == "protocol-node":
        annotations[ANNOTATION_ALLOCATE_PROTOCOL] = ALLOCATE_PROTOCOL
    if lock is not None:
        annotations[ANNOTATION_NODE_LOCK] = lock
    return NodeInfo(name, annotations=annotations)


def new_pod(name: str, uid: str, memory_mib: int, created: datetime) -> PodInfo:
    limits = {RESOURCE_GPU: "1", RESOURCE_GPU_MEMORY: str(memory_mib)}
    return PodInfo(
        "default",
        name,
        uid=uid,
        containers=(ContainerSpec("c", limits=limits),),
        phase="Pending",
        creation_timestamp=created,
        resource_version="1",
    )


@dataclasses.dataclass
class Run:
    """One book and its twin, the pods as the API server has them, the patches the watch has
    not shown yet, and the time."""

    keys: BookingKeys | None
    book: Book = dataclasses.field(default_factory=lambda: Book(SETTINGS))
    twin: Book = dataclasses.field(default_factory=lambda: Book(SETTINGS))
    pods: dict[str, PodInfo] = dataclasses.field(default_factory=dict)
    unseen: dict[str, PodInfo] = dataclasses.field(default_factory=dict)
    uids: int = 0
    monotonic: float = 0.0

    @property
    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.monotonic)

    # --- transitions, each applied to both books --------------------------------------------

    def step(self, transition: str, *args: Any) -> Any:
        """Run `transition` on the book and its twin; they must answer alike."""
        before = self.observed()
        answer = getattr(self.book, transition)(*args)
        assert getattr(self.twin, transition)(*args) == answer, transition
        after = self.observed()
        assert after == self.observed(self.twin), transition
        change = _change_of(answer)
        if change is not None:
            self.check_change(transition, change, before, after)
        return answer

    def observed(self, book: Book | None = None) -> Any:
        book = book or self.book
        return (
            book.usages(),
            book.tracked_pods(),
            book.bookings(),
            {node: book.in_flight(node) for node in NODES},
            [(n.name, dict(n.annotations)) for n in book.locked_nodes()],
            {node: _protocol(book.node(node)) for node in NODES},
        )

    def check_change(self, transition: str, change: Change, before: Any, after: Any) -> None:
        binds_see = (3, 4, 5)  # in-flight views, node locks, allocate protocols
        if any(before[i] != after[i] for i in binds_see):
            assert change.wake_binds, f"{transition}: a bind waiting here was not woken"
        released = self.book.take_lock_releases()
        assert self.twin.take_lock_releases() == released
        assert change.lock_releases == bool(released), transition
        gone_filtered = {
            key
            for key, (_, phase) in before[2].items()
            if phase is BookingPhase.FILTERED and key not in after[2]
        }
        if transition == "expire":
            assert change.expired == len(gone_filtered)
        else:
            assert change.expired == 0 or transition == "filter"

    # --- the cluster ----------------------------------------------------------------------------

    def show(self, pod: PodInfo) -> None:
        self.pods[pod.key] = pod
        self.step("apply_pod", pod, self.keys, self.monotonic)

    def create(self, name: str, memory_mib: int) -> None:
        if f"default/{name}" in self.pods:
            return
        self.uids += 1
        self.show(new_pod(name, f"uid-{self.uids}", memory_mib, self.now))

    def schedule(self, name: str, outcome: str) -> None:
        pod = self.pods.get(f"default/{name}")
        if pod is None or pod.node_name or pod.booking is not None or pod.key in self.unseen:
            return
        requests = pod_requests(pod, SETTINGS.scheduler)
        result, _ = self.step("filter", pod, requests, list(NODES), self.now, self.monotonic)
        if result.node is None or outcome == "no_bind":
            return
        plan, _ = self.step("plan_bind", pod, result.node, self.keys, self.now, self.monotonic)
        if not isinstance(plan, BindPlan):
            return
        if outcome == "fails" or self.step("claim_in_flight", plan) is not None:
            self.step("bind_failed", plan)
            return
        patched = dataclasses.replace(
            pod, annotations={**pod.annotations, **plan.annotations}, node_name=plan.node
        )
        self.pods[pod.key] = patched
        self.unseen[pod.key] = patched  # the watch shows it later (`deliver`)
        self.step("bind_succeeded", plan)

    def deliver(self, name: str) -> None:
        patched = self.unseen.pop(f"default/{name}", None)
        if patched is not None:
            self.step("apply_pod", patched, self.keys, self.monotonic)

    def allocate(self, name: str, succeeded: bool) -> None:
        pod = self.pods.get(f"default/{name}")
        if pod is None or pod.key in self.unseen or pod.booking is None:
            return
        if pod.booking.allocating:
            phase = BindPhase.SUCCESS if succeeded else BindPhase.FAILED
            annotations = {**pod.annotations, ANNOTATION_BIND_PHASE: phase.value}
            self.show(
                dataclasses.replace(
                    pod, annotations=annotations, phase="Running" if succeeded else "Pending"
                )
            )

    def tamper(self, name: str) -> None:
        """The pod's author writes `hami.io/bind-phase: failed` on its bound, Pending pod
        (after Allocate served it: bind-phase is not signed, issue 25)."""
        pod = self.pods.get(f"default/{name}")
        if pod is None or not pod.node_name or pod.booking is None or pod.key in self.unseen:
            return
        if pod.phase == "Pending" and not pod.booking.failed:
            annotations = {**pod.annotations, ANNOTATION_BIND_PHASE: BindPhase.FAILED.value}
            self.show(dataclasses.replace(pod, annotations=annotations))

    def finish(self, name: str) -> None:
        pod = self.pods.get(f"default/{name}")
        if pod is not None and pod.phase == "Running" and pod.key not in self.unseen:
            self.show(dataclasses.replace(pod, phase="Succeeded"))

    def delete(self, name: str) -> None:
        pod = self.pods.pop(f"default/{name}", None)
        if pod is not None:
            self.unseen.pop(pod.key, None)
            self.step("delete_pod", pod)

    def forge(self, name: str, memory_mib: int) -> None:
        """The pod's author writes a booking of every GPU of the lock node (no signature)."""
        pod = self.pods.get(f"default/{name}")
        if pod is None or pod.node_name or pod.booking is not None or self.keys is None:
            return
        devices = ((ContainerDevice("GPU-lock-node-0", "NVIDIA", memory_mib, 0),),)
        text = codec.encode_pod_devices(devices)
        forged = {
            ANNOTATION_VGPU_NODE: "lock-node",
            ANNOTATION_DEVICES_ALLOCATED: text,
            ANNOTATION_DEVICES_TO_ALLOCATE: text,
            ANNOTATION_BIND_PHASE: "allocating",
        }
        self.show(dataclasses.replace(pod, annotations={**pod.annotations, **forged}))

    def lock(self, name: str, held: bool) -> None:
        """HAMi's node lock taken by a pod (maybe a deleted one) or released."""
        value = lock_value(self.now, "default", name) if held else None
        self.step("apply_node", node_info("lock-node", value), self.now)

    def expire(self, seconds: float) -> None:
        self.monotonic += seconds
        self.step("expire", self.monotonic)

    # --- invariants -----------------------------------------------------------------------------

    def check_capacity(self) -> None:
        for usage in self.book.usages():
            for position, gpu in enumerate(usage.devices):
                numbers = (
                    usage.used[position],
                    usage.used_memory_mib[position],
                    usage.used_cores[position],
                )
                assert all(0 <= n <= c for n, c in zip(numbers, CAPACITY[gpu.uuid], strict=True))

    def check_signed_bound_counted(self) -> None:
        """With a key, a pod bound with this book's signed booking counts until it ends,
        whatever its bind-phase says (the watch has shown it: nothing unseen)."""
        if self.keys is None:
            return
        tracked = {pod.key for pod in self.book.tracked_pods()}
        for pod in self.pods.values():
            booking = pod.booking
            if (
                pod.key not in self.unseen
                and pod.node_name
                and pod.phase in ("Pending", "Running")
                and booking is not None
                and booking.verifies(self.keys, pod.uid)
            ):
                assert pod.key in tracked, f"{pod.key} bound with a signed booking, not counted"

    def settle(self) -> None:
        for key in list(self.unseen):
            self.deliver(key.split("/", 1)[1])
        self.expire(SETTINGS.booking_ttl_seconds + 1)
        assert self.book.bookings() == {}
        fresh = Book(SETTINGS)
        for node in NODES:
            fresh.apply_node(self.book.node(node) or node_info(node), self.now)
        for pod in self.pods.values():
            fresh.apply_pod(pod, self.keys, self.monotonic)
        assert _usage(fresh.usages()) == _usage(self.book.usages())


def _change_of(answer: Any) -> Change | None:
    if isinstance(answer, Change):
        return answer
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], Change):
        return answer[1]
    return None


def _protocol(node: NodeInfo | None) -> str | None:
    return None if node is None else node.annotations.get(ANNOTATION_ALLOCATE_PROTOCOL)


def _usage(usages: Iterable[NodeUsage]) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    return [(u.name, u.used, u.used_memory_mib) for u in usages]


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ("create",) * 3
            + ("schedule",) * 4
            + ("deliver",) * 3
            + ("allocate",) * 2
            + ("finish", "delete", "forge", "lock", "expire", "tamper")
        ),
        st.sampled_from(NAMES),
        st.sampled_from(MEMORIES),
        st.sampled_from(("bound", "bound", "fails", "no_bind")),
        st.booleans(),
    ),
    min_size=20,
    max_size=80,
)


def _run(run: Run, operation: tuple[str, str, int, str, bool]) -> None:
    name, memory, outcome, flag = operation[1:]
    match operation[0]:
        case "create":
            run.create(name, memory)
        case "schedule":
            run.schedule(name, outcome)
        case "deliver":
            run.deliver(name)
        case "allocate":
            run.allocate(name, flag)
        case "finish":
            run.finish(name)
        case "delete":
            run.delete(name)
        case "forge":
            run.forge(name, memory)
        case "tamper":
            run.tamper(name)
        case "lock":
            run.lock(name, flag)
        case "expire":
            run.expire(5.0 if flag else 31.0)


@settings(max_examples=200, deadline=None)
@given(operations=OPERATIONS, signed=st.booleans())
def test_property_the_book_is_a_value_whose_changes_say_what_to_do(
    operations: list[tuple[str, str, int, str, bool]], signed: bool
) -> None:
    run = Run(keys=KEYS if signed else None)
    for node in NODES:
        run.step("apply_node", node_info(node), run.now)
    for operation in operations:
        _run(run, operation)
        run.check_capacity()
        run.check_signed_bound_counted()
    run.settle()
