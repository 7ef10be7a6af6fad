"""The in-flight protocol: several `allocating` pods per node, told apart as kubelet admits them.

Table tests for each rule, then a property test that plays the whole interleaving: a scheduler
binding pods (only when `must_wait_for` allows), kubelet's pod watch cutting them into batches,
kubelet admitting one pod at a time (each batch sorted by creation second, ties in any order)
and calling GetPreferredAllocation then Allocate per GPU container, and the device plugin's pure
decisions answering from the pods' annotations alone, or (in-flight/v2) from them and kubelet's
PodResources list: kubelet's pod manager (the pods admitted, the one being admitted, the pods
rejected) with the devices each app container holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_plugin.deviceplugin.allocate import AllocateConfig, AllocateFailure, decide_allocation
from hami_plugin.deviceplugin.pending import select_pending_pod
from hami_plugin.deviceplugin.preferred import PreferredRequest, decide_preferred
from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
    InFlightPod,
    choose,
    choose_pod,
    confusable,
    created_seconds_of,
    in_flight_pod,
    must_wait_for,
)
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    ContainerDevices,
    PodDevices,
)
from hami_plugin.protocol.nodelock import releasable_by
from hami_plugin.protocol.objects import ContainerSpec, PodInfo

NODE = "gpu-node"
GPUS = (
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
    "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4",
    "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76",
)
SPLIT = 16
ADVERTISED = tuple(f"{gpu}-{slot}" for gpu in GPUS for slot in range(SPLIT))
EPOCH = 1_767_225_600


def entry(count: int, mem: int = 1000) -> ContainerDevices:
    return tuple(ContainerDevice(GPUS[i], "NVIDIA", mem + i, 10) for i in range(count))


def view(
    name: str,
    *counts: int,
    created: int = 0,
    consumed: int = 0,
    bound: bool = True,
    shape: Hashable | None = None,
) -> InFlightPod:
    """An in-flight pod with one entry per count, the first `consumed` entries allocated."""
    booked = tuple(entry(c) for c in counts)
    left = tuple(() if i < consumed else e for i, e in enumerate(booked))
    return InFlightPod("default", name, created, booked, left, bound, shape=shape)


def test_the_protocol_names() -> None:
    assert ANNOTATION_ALLOCATE_PROTOCOL == "hami-plugin.io/allocate-protocol"
    assert ALLOCATE_PROTOCOL == "in-flight/v1"
    assert ALLOCATE_PROTOCOL_V2 == "in-flight/v2"


# --- the view of a pod ---------------------------------------------------------------------------


def test_in_flight_pod_reads_the_booking_and_what_is_left() -> None:
    booked = (entry(1), (), entry(2))
    annotations = {
        ANNOTATION_DEVICES_ALLOCATED: codec.encode_pod_devices(booked),
        ANNOTATION_DEVICES_TO_ALLOCATE: codec.encode_pod_devices(((), (), entry(2))),
    }
    created = datetime(2026, 1, 1, 0, 0, 7, 900_000, tzinfo=UTC)
    pod = in_flight_pod(
        PodInfo("ns", "p", annotations=annotations, creation_timestamp=created), bound=False
    )
    assert pod is not None
    assert (pod.key, pod.created_seconds, pod.bound) == (("ns", "p"), EPOCH + 7, False)
    assert pod.allocated == codec.decode_pod_devices(annotations[ANNOTATION_DEVICES_ALLOCATED])
    assert pod.allocated[:3] == booked
    assert pod.started
    assert pod.next_devices == entry(2)
    assert pod.remaining_counts == (2,)
    assert not pod.finished


def test_a_pod_with_nothing_consumed_has_not_started() -> None:
    value = codec.encode_pod_devices(((), entry(1)))
    pod = in_flight_pod(PodInfo("ns", "p", annotations={ANNOTATION_DEVICES_TO_ALLOCATE: value}))
    assert pod is not None
    assert not pod.started  # no -allocated annotation: read as equal to to-allocate
    assert pod.created_seconds == 0
    assert pod.remaining_counts == (1,)


@pytest.mark.parametrize("value", [None, "GPU-x,NVIDIA,notanumber,0:;"])
def test_no_usable_to_allocate_is_no_in_flight_pod(value: str | None) -> None:
    annotations = {} if value is None else {ANNOTATION_DEVICES_TO_ALLOCATE: value}
    assert in_flight_pod(PodInfo("ns", "p", annotations=annotations)) is None


def test_every_entry_consumed_is_finished() -> None:
    pod = view("p", 1, 2, consumed=2)
    assert pod.started and pod.finished and pod.next_devices is None


def test_created_seconds_reads_naive_times_as_utc() -> None:
    assert created_seconds_of(datetime(2026, 1, 1)) == EPOCH


# --- choose_pod ---------------------------------------------------------------------------------


def test_choose_prefers_the_started_pod_kubelet_is_in_the_middle_of() -> None:
    started = view("started", 1, 1, created=9, consumed=1)
    assert choose_pod([view("older", 1, created=1), started], 1) is started


def test_choose_skips_a_started_pod_asking_another_count() -> None:
    older = view("older", 1, created=1)
    assert choose_pod([view("s", 1, 2, consumed=1), older], 1) is older


def test_choose_takes_the_oldest_not_started_pod_with_the_count() -> None:
    pods = [view("c", 1, created=5), view("b", 2, created=1), view("a", 1, created=3)]
    assert choose_pod(pods, 1) == pods[2]
    assert choose_pod(pods, 2) == pods[1]


@pytest.mark.parametrize(
    ("pods", "count", "reason"),
    [
        ([view("a", 1), view("b", 1)], 1, "same second"),
        ([view("a", 1, 1, consumed=1), view("b", 2, 1, consumed=1)], 1, "several started"),
        ([view("a", 1)], 2, "no pod in flight asks 2"),
        ([view("a", 1, consumed=1)], 1, "no pod in flight asks 1"),
        ([], 1, "in flight: none"),
    ],
)
def test_choose_refuses_what_it_cannot_tell(
    pods: list[InFlightPod], count: int, reason: str
) -> None:
    choice = choose(pods, count)
    assert choice.pod is None
    assert reason in choice.reason


def listed(*names: str) -> frozenset[tuple[str, str]]:
    """What kubelet's PodResources list shows without devices: these pods of `default`."""
    return frozenset(("default", name) for name in names)


@pytest.mark.parametrize(
    ("pods", "admitting", "chosen"),
    [
        # same second: kubelet lists only the one it is admitting (the other comes later)
        ([view("a", 1), view("b", 1)], listed("b"), "b"),
        ([view("a", 1), view("b", 1)], listed("a", "other"), "a"),
        # the one listed wins over an older one kubelet is not admitting (yet)
        ([view("old", 1, created=1), view("new", 1, created=5)], listed("new"), "new"),
        # several listed (one rejected earlier, still shown): the oldest second among them
        (
            [view("a", 1, created=1), view("b", 1, created=3), view("c", 1, created=2)],
            listed("b", "c"),
            "c",
        ),
        # one not-started pod asking the count: chosen as without the list
        ([view("a", 1), view("b", 2)], listed(), "a"),
        # a started pod is kubelet's, whatever the list shows
        ([view("s", 1, 1, created=9, consumed=1), view("a", 1), view("b", 1)], listed("a"), "s"),
        ([view("s", 1, 1, created=9, consumed=1), view("a", 1), view("b", 1)], listed("s"), "s"),
        # pods asking another count do not count, listed or not
        ([view("a", 1), view("b", 2), view("c", 1, created=4)], listed("b", "c"), "c"),
    ],
)
def test_choose_with_kubelets_list(
    pods: list[InFlightPod], admitting: frozenset[tuple[str, str]], chosen: str
) -> None:
    choice = choose(pods, 1, admitting)
    assert choice.pod is not None, choice.reason
    assert choice.pod.name == chosen
    assert choose_pod(pods, 1, admitting) is choice.pod


@pytest.mark.parametrize(
    ("pods", "admitting", "reason"),
    [
        (
            [view("a", 1), view("b", 1, created=3)],
            listed(),
            "shows none of them without devices (kubelet is admitting none of them)",
        ),
        ([view("a", 1), view("b", 1)], listed("x"), "admitting none of them"),
        (
            [view("a", 1), view("b", 1), view("c", 1)],
            listed("a", "b"),
            "same second, each listed by kubelet without devices,",
        ),
    ],
)
def test_choose_with_kubelets_list_refuses_what_it_cannot_tell(
    pods: list[InFlightPod], admitting: frozenset[tuple[str, str]], reason: str
) -> None:
    choice = choose(pods, 1, admitting)
    assert choice.pod is None
    assert reason in choice.reason
    assert "default/a" in choice.reason


def test_without_kubelets_list_the_v1_rule_is_unchanged() -> None:
    pods = [view("a", 1), view("b", 1)]
    assert choose(pods, 1).pod is None
    assert choose(pods, 1, None) == choose(pods, 1)
    older = [view("a", 1, created=1), view("b", 1, created=2)]
    assert choose_pod(older, 1) is older[0]


# --- must_wait_for ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "pod", "blocks"),
    [
        # kubelet admits the older, bound, not-started pod first: same first count is fine.
        (view("q", 1, created=1), view("p", 1, created=2), False),
        # same second: kubelet's order is random.
        (view("q", 1, created=2), view("p", 1, created=2), True),
        # the new pod is older: in one batch kubelet would take it first.
        (view("q", 1, created=3), view("p", 1, created=2), True),
        # not bound yet: kubelet may get it after the new pod.
        (view("q", 1, created=1, bound=False), view("p", 1, created=2), True),
        # started with the same count left: wait until it has finished.
        (view("q", 1, 1, created=1, consumed=1), view("p", 1, created=2), True),
        (view("q", 2, 1, created=5, consumed=1), view("p", 2, created=2), False),
        # different counts can never be confused.
        (view("q", 2, created=5, bound=False), view("p", 1, created=2), False),
        # a later entry of the older pod with the new pod's count: kubelet could give up on
        # the older pod half-way.
        (view("q", 1, 2, created=1), view("p", 2, created=2), True),
        (view("q", 1, 2, created=1), view("p", 3, 2, created=2), True),
        (view("q", 1, 2, created=1), view("p", 1, 3, created=2), False),
        # finished pods, or the pod itself, never block.
        (view("q", 1, created=9, consumed=1), view("p", 1, created=2), False),
        (view("p", 1, created=9), view("p", 1, created=2), False),
    ],
)
def test_must_wait_for(other: InFlightPod, pod: InFlightPod, blocks: bool) -> None:
    assert confusable(pod, other) is blocks
    assert (must_wait_for(pod, [other]) is other) is blocks


def test_must_wait_for_names_the_first_blocker() -> None:
    pod = view("p", 1, created=2)
    blockers = [view("a", 1, created=2), view("b", 1, created=3)]
    assert must_wait_for(pod, [view("ok", 1, created=1), *blockers]) is blockers[0]
    assert must_wait_for(pod, []) is None


# --- the whole interleaving, as kubelet does it ---------------------------------------------


@dataclass
class SimPod:
    """One pod of the model: its spec, booking and the state the API server holds."""

    name: str
    created: int
    init_count: int
    entries: PodDevices  # one per container, init containers first; () = no GPU
    shape: Hashable | None = None  # the scheduler's reading of the pod's GPU requests
    stage: str = "new"  # new -> annotated (in flight, Binding pending) -> bound
    annotations: dict[str, str] = field(default_factory=dict)
    phase: str = "Pending"

    def record(self) -> PodInfo:
        names = [f"c{i}" for i in range(len(self.entries))]
        return PodInfo(
            namespace="default",
            name=self.name,
            uid="uid-" + self.name,
            phase=self.phase,
            node_name=NODE if self.stage == "bound" else "",
            annotations=dict(self.annotations),
            labels={},
            init_containers=tuple(ContainerSpec(n) for n in names[: self.init_count]),
            containers=tuple(ContainerSpec(n) for n in names[self.init_count :]),
            resource_version="1",
            creation_timestamp=datetime.fromtimestamp(EPOCH + self.created, UTC),
        )

    def view(self) -> InFlightPod | None:
        pod = in_flight_pod(self.record(), bound=self.stage == "bound")
        return None if pod is None else replace(pod, shape=self.shape)

    @property
    def allocating(self) -> bool:
        return self.annotations.get(ANNOTATION_BIND_PHASE) == "allocating"


@dataclass
class Cluster:
    """Scheduler, kubelet and device plugin over one node, stepped by the test."""

    pods: list[SimPod]
    with_lock: bool
    level: int = 1  # the node's protocol_level: 2 lets pods of one shape fly together
    ask_kubelet: bool = False  # the device plugin reads kubelet's PodResources list
    lock: str | None = None
    watch: list[SimPod] = field(default_factory=list)  # bound, not yet in a kubelet batch
    batches: list[list[SimPod]] = field(default_factory=list)
    admitting: SimPod | None = None
    next_container: int = 0
    used: dict[str, set[str]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    max_allocating: int = 0
    pod_manager: list[SimPod] = field(default_factory=list)  # kubelet's, in the order added
    app_devices: dict[str, set[int]] = field(default_factory=dict)  # app containers allocated
    rejected: list[SimPod] = field(default_factory=list)

    # --- scheduler ------------------------------------------------------------------------

    def in_flight(self) -> list[InFlightPod]:
        views = []
        for pod in self.pods:
            if pod.stage != "new" and pod.allocating and pod.phase == "Pending":
                current = pod.view()
                assert current is not None
                views.append(current)
        return views

    def may_annotate(self, pod: SimPod) -> bool:
        if pod.stage != "new":
            return False
        if self.with_lock:
            return self.lock is None
        created = EPOCH + pod.created
        candidate = InFlightPod(
            "default", pod.name, created, pod.entries, pod.entries, shape=pod.shape
        )
        return must_wait_for(candidate, self.in_flight(), level=self.level) is None

    @staticmethod
    def booking(pod: SimPod) -> str:
        return codec.encode_pod_devices(pod.entries)

    def annotate(self, pod: SimPod) -> None:
        """Bind's pod patch (the Binding follows in `bind`)."""
        value = self.booking(pod)
        if self.with_lock:
            self.lock = f"2026-01-01T00:00:00Z,default,{pod.name}"
        pod.annotations = {
            ANNOTATION_DEVICES_TO_ALLOCATE: value,
            ANNOTATION_DEVICES_ALLOCATED: value,
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_TIME: "1705054797",
            ANNOTATION_BIND_PHASE: "allocating",
        }
        pod.stage = "annotated"
        self.log.append(f"annotate {pod.name}")
        self.max_allocating = max(self.max_allocating, sum(p.allocating for p in self.pods))

    def bind(self, pod: SimPod) -> None:
        pod.stage = "bound"
        self.watch.append(pod)  # kubelet's watch sees Bindings in resourceVersion order
        self.log.append(f"bind {pod.name}")

    # --- kubelet ---------------------------------------------------------------------------

    def cut_batch(self, size: int) -> None:
        batch, self.watch = self.watch[:size], self.watch[size:]
        self.batches.append(batch)
        self.log.append(f"batch {[p.name for p in batch]}")

    def take_pod(self, tie_order: Sequence[int]) -> None:
        """Sort the head batch by creation second, ties in the drawn order; admit its first."""
        batch = self.batches[0]
        if len(batch) > 1:
            ranked = sorted(
                range(len(batch)), key=lambda i: (batch[i].created, tie_order[i % len(tie_order)])
            )
            self.batches[0] = batch = [batch[i] for i in ranked]
        self.admitting = batch.pop(0)
        if not batch:
            self.batches.pop(0)
        self.next_container = 0
        self.pod_manager.append(self.admitting)  # podManager.AddPod, then admission
        self.log.append(f"admit {self.admitting.name}")

    def reject(self) -> None:
        """An earlier admit handler (eviction, sysctl) rejects the pod before its first
        Allocate. It stays in kubelet's pod manager; its Failed status is taken to reach the API
        server at once (while it lags, 5.5's residual risk applies)."""
        pod = self.admitting
        assert pod is not None and self.next_container == 0
        pod.phase = "Failed"
        self.rejected.append(pod)
        self.admitting = None
        self.log.append(f"reject {pod.name}")

    def kubelet_list(self) -> frozenset[tuple[str, str]] | None:
        """What the device plugin reads from kubelet's PodResources list: the pods of the pod
        manager none of whose app containers holds a device (init containers are not listed)."""
        if not self.ask_kubelet:
            return None
        return frozenset(
            ("default", pod.name) for pod in self.pod_manager if not self.app_devices.get(pod.name)
        )

    def allocate_next_container(self) -> None:
        pod = self.admitting
        assert pod is not None
        while self.next_container < len(pod.entries) and not pod.entries[self.next_container]:
            self.next_container += 1  # kubelet calls nothing for a container without GPUs
        index = self.next_container
        count = len(pod.entries[index])
        records = [p.record() for p in self.pods if p.stage == "bound"]
        taken = set().union(*self.used.values()) if self.used else set()
        available = [i for i in ADVERTISED if i not in taken]
        # GetPreferredAllocation, then Allocate with its answer (the device plugin's logic).
        admitting = self.kubelet_list()
        try:
            hint = select_pending_pod(NODE, self.lock, records, count, admitting=admitting).pod
        except AllocateFailure:
            hint = None
        (answer,) = decide_preferred(hint, [PreferredRequest(available, (), count)])
        ids = list(answer.device_ids)
        assert len(ids) == count
        chosen = select_pending_pod(NODE, self.lock, records, count, admitting=admitting)
        decision = decide_allocation(
            chosen.pod, [ids], AllocateConfig(), lambda: "cache", ADVERTISED
        )
        self.log.append(f"allocate {pod.name}[{index}] -> {chosen.pod.name}")
        # The safety property: this container got exactly its own pod's booking.
        assert chosen.pod.name == pod.name, self.log
        (container,) = decision.containers
        assert container.entry_index == index, self.log
        assert container.devices == pod.entries[index], self.log
        envs = container.envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in pod.entries[index])
        for position, device in enumerate(pod.entries[index]):
            assert envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] == f"{device.used_mem_mib}m"
        self.used.setdefault(pod.name, set()).update(ids)
        if index >= pod.init_count:  # the device manager records the container's devices
            self.app_devices.setdefault(pod.name, set()).add(index)
        pod.annotations[ANNOTATION_DEVICES_TO_ALLOCATE] = decision.remaining_to_allocate
        if decision.complete:
            pod.annotations[ANNOTATION_BIND_PHASE] = "success"
            if releasable_by(self.lock, "default", pod.name):
                self.lock = None
        self.next_container = index + 1
        if not any(pod.entries[self.next_container :]):
            assert decision.complete, self.log
            pod.phase = "Running"
            self.admitting = None
            self.next_container = 0

    # --- stepping --------------------------------------------------------------------------

    def actions(self) -> list[tuple[str, SimPod | None]]:
        """Every step that may happen next, kubelet's first (the drain order)."""
        enabled: list[tuple[str, SimPod | None]] = []
        if self.admitting is not None:
            enabled.append(("allocate", None))
            if self.next_container == 0 and not self.with_lock:  # HAMi's lock would expire
                enabled.append(("reject", None))
        elif self.batches:
            enabled.append(("take", None))
        if self.watch:
            enabled.append(("cut", None))
        enabled += [("bind", p) for p in self.pods if p.stage == "annotated"]
        enabled += [("annotate", p) for p in self.pods if self.may_annotate(p)]
        return enabled

    def run(self, action: str, pod: SimPod | None, size: int, ties: Sequence[int]) -> None:
        if action == "allocate":
            self.allocate_next_container()
        elif action == "reject":
            self.reject()
        elif action == "take":
            self.take_pod(ties)
        elif action == "cut":
            self.cut_batch(max(1, size % (len(self.watch) + 1)))
        elif action == "bind":
            assert pod is not None
            self.bind(pod)
        else:
            assert pod is not None
            self.annotate(pod)


@st.composite
def sim_pods(draw: st.DrawFn) -> list[SimPod]:
    """Up to 6 pods, each from one of up to 3 request templates (init containers, device
    counts). Pods of one template and variant have one shape: interchangeable for the scheduler
    at level 2. Booked memory differs per pod, so a container served another pod's booking is
    seen."""
    templates: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(draw(st.integers(1, 3))):
        init_count = draw(st.integers(0, 1))
        drawn = draw(
            st.lists(st.integers(0, 2), min_size=init_count + 1, max_size=init_count + 2).filter(
                any
            )
        )
        templates.append((init_count, tuple(drawn)))
    pods = []
    for number in range(draw(st.integers(1, 6))):
        template = draw(st.integers(0, len(templates) - 1))
        variant = draw(st.integers(0, 1))  # same counts, another request (memory, type)
        init_count, counts = templates[template]
        entries = tuple(
            tuple(
                ContainerDevice(
                    GPUS[(number + i) % len(GPUS)], "NVIDIA", 100 * number + 10 * k + i, 5
                )
                for i in range(count)
            )
            for k, count in enumerate(counts)
        )
        created = draw(st.integers(0, 2))
        pods.append(SimPod(f"pod-{number}", created, init_count, entries, (template, variant)))
    return pods


def play(cluster: Cluster, data: st.DataObject) -> None:
    """A random interleaving, then a drain that must leave nothing waiting."""
    for _ in range(data.draw(st.integers(0, 60), label="random steps")):
        enabled = cluster.actions()
        if not enabled:
            break
        action, pod = enabled[data.draw(st.integers(0, len(enabled) - 1), label="step")]
        size = data.draw(st.integers(0, 6), label="batch size")
        ties = data.draw(st.permutations(range(6)), label="tie order")
        cluster.run(action, pod, size, ties)
    for _ in range(500):
        enabled = cluster.actions()
        if not enabled:
            break
        action, pod = enabled[0]
        cluster.run(action, pod, 0, range(6))
    # Liveness: every pod bound, admitted and allocated (or rejected); nobody waits forever.
    admitted = [p for p in cluster.pods if p not in cluster.rejected]
    stuck = [(p.name, p.stage, p.annotations.get(ANNOTATION_BIND_PHASE)) for p in cluster.pods]
    assert all(p.stage == "bound" and p.phase == "Running" for p in admitted), (
        stuck,
        cluster.log,
    )
    assert all(p.annotations[ANNOTATION_BIND_PHASE] == "success" for p in admitted)
    assert all(p.phase == "Failed" for p in cluster.rejected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=sim_pods(), ask_kubelet=st.booleans(), data=st.data())
def test_every_container_gets_its_own_booking_in_any_interleaving(
    pods: list[SimPod], ask_kubelet: bool, data: st.DataObject
) -> None:
    # in-flight/v1: kubelet's list, when the device plugin reads it, changes nothing for the worse
    play(Cluster(pods, with_lock=False, ask_kubelet=ask_kubelet), data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=sim_pods(), data=st.data())
def test_with_v2_pods_of_one_shape_in_flight_together_each_get_their_own_booking(
    pods: list[SimPod], data: st.DataObject
) -> None:
    play(Cluster(pods, with_lock=False, level=2, ask_kubelet=True), data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=sim_pods(), data=st.data())
def test_with_hamis_lock_one_pod_is_allocating_at_a_time(
    pods: list[SimPod], data: st.DataObject
) -> None:
    cluster = Cluster(pods, with_lock=True)
    play(cluster, data)
    assert cluster.max_allocating == 1


@pytest.mark.parametrize(
    "ties", [list(range(8)), list(reversed(range(8))), [3, 0, 7, 1, 6, 2, 5, 4]]
)
def test_with_v2_identical_pods_created_in_one_second_are_in_flight_at_once(
    ties: list[int],
) -> None:
    pods = [SimPod(f"p{i}", 0, 0, (entry(1, 100 * i),), shape="1 GPU, 100 MiB") for i in range(8)]
    v1 = Cluster([SimPod(p.name, 0, 0, p.entries, p.shape) for p in pods], with_lock=False)
    assert v1.may_annotate(v1.pods[0])
    v1.annotate(v1.pods[0])
    assert not v1.may_annotate(v1.pods[1])  # in-flight/v1: the same second waits
    cluster = Cluster(pods, with_lock=False, level=2, ask_kubelet=True)
    for pod in pods:
        assert cluster.may_annotate(pod)
        cluster.annotate(pod)
        cluster.bind(pod)
    assert cluster.max_allocating == 8
    cluster.cut_batch(8)
    while cluster.batches or cluster.admitting:
        if cluster.admitting is None:
            cluster.take_pod(ties)
        cluster.allocate_next_container()  # asserts each container got its own pod's booking
    assert all(p.annotations[ANNOTATION_BIND_PHASE] == "success" for p in pods)
    order = [p.name for p in cluster.pod_manager]
    assert sorted(order) == sorted(p.name for p in pods)
    # kubelet's tie order, not the bind order, decided who came first
    assert (order == [p.name for p in pods]) == (ties == list(range(8)))


def test_a_burst_of_pods_created_in_different_seconds_is_in_flight_at_once() -> None:
    # Not a timing claim: the rule lets the whole burst be bound before kubelet admits any.
    pods = [SimPod(f"p{i}", i, 0, (entry(1, 100 * i),)) for i in range(8)]
    cluster = Cluster(pods, with_lock=False)
    for pod in pods:
        assert cluster.may_annotate(pod)
        cluster.annotate(pod)
        cluster.bind(pod)
    assert cluster.max_allocating == 8
    cluster.cut_batch(8)
    while cluster.batches or cluster.admitting:
        if cluster.admitting is None:
            cluster.take_pod(list(reversed(range(8))))
        cluster.allocate_next_container()
    assert all(p.annotations[ANNOTATION_BIND_PHASE] == "success" for p in pods)


def test_level_2_frees_only_single_entry_pods_of_one_shape() -> None:
    """Pods with several GPU containers keep the v1 rule even when identical: kubelet's list
    shows the pod being admitted, not one it gave up on between two of its containers."""
    a, b = view("a", 1, shape="s"), view("b", 1, shape="s")
    assert confusable(a, b, level=1) and not confusable(a, b, level=2)
    multi_a, multi_b = view("ma", 1, 1, shape="m"), view("mb", 1, 1, shape="m")
    assert confusable(multi_a, multi_b, level=2)
    assert confusable(a, view("c", 1, shape="other"), level=2)
    assert confusable(a, view("d", 1), level=2)  # no shape: interchangeable with nothing
