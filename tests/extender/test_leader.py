"""Leader election: client-go's rules, step by step on a fake clock.

The electors here talk to `FakeKube` (hami_plugin.kube.fake), an in-memory store with the API
server's optimistic-concurrency rules for leases (create: Conflict when it exists; update:
Conflict unless the resourceVersion is current), so that each test can pick its clock and
interleave two electors' calls exactly. The same rules over HTTP, through `KubeClient` and the
API server double, are in tests/extender/test_leader_wire.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import pytest

from hami_plugin.extender.leader import (
    _EXPIRY_SLACK_SECONDS,
    DEFAULT_LEASE_NAME,
    DEFAULT_LEASE_NAMESPACE,
    ElectionConfig,
    LeaderElector,
    holder_identity,
)
from hami_plugin.kube.errors import Retryable
from hami_plugin.kube.fake import FakeKube
from hami_plugin.kube.records import LeaseRecord, ObjectList
from hami_plugin.protocol.objects import PodInfo
from tests.extender.helpers import SplitClock

NAMESPACE = "hami-system"
NAME = "hami-scheduler-extender"
_EPOCH = datetime(2026, 11, 30, 12, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _View:
    """One elector's window on the shared store: it can be cut off (every call raises
    Retryable, as after the KubeClient's retries against an API server answering 500) or
    given a hook that runs before each write (to interleave another elector's calls)."""

    def __init__(self, store: FakeKube) -> None:
        self.store = store
        self.down = False
        self.before_write: Callable[[], object] | None = None

    def _check(self) -> None:
        if self.down:
            raise Retryable("HTTP 500: injected (gave up after 5 attempts)", 500)

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        self._check()
        return self.store.get_lease(namespace, name)

    def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        self._hook()
        return self.store.create_lease(record)

    def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        self._hook()
        return self.store.update_lease(record)

    def _hook(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def deadline(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        return self.store.deadline(seconds)

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodInfo:
        return self.store.patch_pod_metadata(namespace, name, annotations, labels, resource_version)

    def list_objects(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        return self.store.list_objects(
            path, label_selector=label_selector, field_selector=field_selector, page_size=page_size
        )


@dataclasses.dataclass
class Replica:
    elector: LeaderElector
    view: _View
    transitions: list[str]


def _replica(
    store: FakeKube,
    clock: Callable[[], float],
    identity: str,
    *,
    wall_clock: Callable[[], datetime] | None = None,
    lease_seconds: int = 15,
    renew_seconds: float = 10.0,
    retry_seconds: float = 2.0,
) -> Replica:
    view = _View(store)
    transitions: list[str] = []
    config = ElectionConfig(
        NAMESPACE,
        NAME,
        identity,
        lease_duration_seconds=lease_seconds,
        renew_deadline_seconds=renew_seconds,
        retry_period_seconds=retry_seconds,
    )
    elector = LeaderElector(
        view,
        config,
        on_started_leading=lambda: transitions.append("started"),
        on_stopped_leading=lambda: transitions.append("stopped"),
        clock=SplitClock(clock, wall_clock or (lambda: _EPOCH + timedelta(seconds=clock()))),
        rng=random.Random(7),
    )
    return Replica(elector, view, transitions)


@pytest.fixture
def store() -> FakeKube:
    kube = FakeKube()
    # No replica here has POD_NAME/POD_NAMESPACE: none may label pods.
    unlabelled = AssertionError("no pod labels without POD_NAME/POD_NAMESPACE")
    kube.fail("patch_pod_metadata", unlabelled, times=None)
    kube.fail("list_objects", unlabelled, times=None)
    return kube


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _lease(store: FakeKube) -> LeaseRecord:
    return store.get_lease(NAMESPACE, NAME)


# --- acquiring ------------------------------------------------------------------------------


def test_the_first_candidate_creates_the_lease_and_leads(store: FakeKube, clock: FakeClock) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")

    assert a.elector.tick() == 2.0  # a leader renews every retry period
    wait = b.elector.tick()

    assert a.elector.is_leader() and not b.elector.is_leader()
    assert a.transitions == ["started"] and b.transitions == []
    assert b.elector.holder() == "a"
    assert 1.0 < wait <= 2.0  # jittered, never longer than one retry period
    lease = _lease(store)
    assert (lease.holder_identity, lease.lease_duration_seconds, lease.lease_transitions) == (
        "a",
        15,
        0,
    )
    assert lease.acquire_time == lease.renew_time


def test_a_renewing_leader_keeps_the_lease(store: FakeKube, clock: FakeClock) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a.elector.tick()
    acquired = _lease(store).acquire_time
    for _ in range(40):  # 80 s, much longer than the lease duration
        clock.advance(2.0)
        a.elector.tick()
        b.elector.tick()
        assert a.elector.is_leader() and not b.elector.is_leader()
    lease = _lease(store)
    assert lease.holder_identity == "a" and lease.lease_transitions == 0
    assert lease.acquire_time == acquired  # a renewal keeps acquireTime


def test_a_follower_takes_over_a_lease_duration_after_it_last_saw_it_change(
    store: FakeKube, clock: FakeClock
) -> None:
    # The dead leader stamped renewTime a year ahead of everyone: the follower never compares
    # timestamps with its clock, it times the lease from when it saw the record change.
    future = _EPOCH + timedelta(days=365)
    a = _replica(store, clock, "a", wall_clock=lambda: future + timedelta(seconds=clock.now))
    b = _replica(store, clock, "b")
    a.elector.tick()
    b.elector.tick()  # b sees a's record now: t = 0
    seen = clock.now

    taken_at = None
    while taken_at is None:
        clock.advance(0.5)
        b.elector.tick()
        if b.elector.is_leader():
            taken_at = clock.now - seen
        assert clock.now - seen <= 30, "the follower never took over"

    assert taken_at == 15.0
    assert not a.elector.is_leader()  # its renew deadline passed long ago
    lease = _lease(store)
    assert (lease.holder_identity, lease.lease_transitions) == ("b", 1)


def test_a_candidate_reads_again_the_moment_the_lease_it_saw_expires(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a.elector.tick()  # a leads, then dies: it never writes again
    seen = clock.now
    waits = []
    while not b.elector.is_leader():
        waits.append(b.elector.tick())
        if not b.elector.is_leader():
            clock.advance(waits[-1])
        assert clock.now - seen <= 30, "the follower never took over"

    assert clock.now - seen == pytest.approx(15.0 + _EXPIRY_SLACK_SECONDS)
    # every wait within one retry period; the last one cut short to land on the expiry
    assert all(0 < wait <= 2.0 for wait in waits)


def test_a_dead_leaders_lease_is_taken_within_one_retry_period_of_its_expiry(
    store: FakeKube, clock: FakeClock
) -> None:
    # a renews on its cadence, b reads on its own; whenever a dies, b takes over no earlier
    # than a lease duration after a's last renewal and at most one retry period later.
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a_next = b_next = clock.now
    death = clock.now + 20.0
    last_renewal = None
    for step in range(40):
        death += 0.37  # a different phase against both cadences each round
        while not b.elector.is_leader():
            if a_next <= death and a_next <= b_next:
                clock.now = a_next
                a_next = clock.now + a.elector.tick()
                if a.elector.is_leader():
                    last_renewal = clock.now
            else:
                clock.now = b_next
                b_next = clock.now + b.elector.tick()
        assert last_renewal is not None
        assert 15.0 <= clock.now - last_renewal <= 15.0 + 2.0 + _EXPIRY_SLACK_SECONDS, step
        # b is the dead one now, a the follower: swap roles for the next round
        a, b = b, a
        a_next, b_next = clock.now + 2.0, clock.now
        death = clock.now + 20.0 + 0.37 * step
        last_renewal = clock.now


def test_a_candidate_that_failed_at_expiry_waits_a_retry_period(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a.elector.tick()
    b.elector.tick()
    clock.advance(15.0 + _EXPIRY_SLACK_SECONDS)
    b.view.down = True  # the read at expiry fails: no busy loop against a failing API server

    assert 1.0 < b.elector.tick() <= 2.0
    assert not b.elector.is_leader()


def test_a_leader_that_cannot_renew_steps_down_before_anyone_can_take_over(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    c = _replica(store, clock, "c")
    a.elector.tick()
    b.elector.tick()
    clock.advance(1.0)
    c.elector.tick()
    a.view.down = True  # from now on every call of a's fails, as with an API server down for a

    stepped_down = taken = None
    a_next = b_next = c_next = clock.now
    while taken is None:
        clock.advance(0.25)
        if clock.now >= a_next:
            a_next = clock.now + a.elector.tick()
        if stepped_down is None and not a.elector.is_leader():
            stepped_down = clock.now
        if clock.now >= b_next:
            b_next = clock.now + b.elector.tick()
        if clock.now >= c_next:
            c_next = clock.now + c.elector.tick()
        if b.elector.is_leader() or c.elector.is_leader():
            taken = clock.now
        assert not (a.elector.is_leader() and (b.elector.is_leader() or c.elector.is_leader()))

    assert stepped_down is not None and stepped_down < taken
    assert a.transitions == ["started", "stopped"]
    assert _lease(store).lease_transitions == 1


def test_is_leader_turns_false_at_the_renew_deadline_even_without_a_tick(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    a.elector.tick()
    clock.advance(9.9)
    assert a.elector.is_leader()
    clock.advance(0.1)  # the election thread is stuck: no tick, yet no longer leader
    assert not a.elector.is_leader()
    assert a.transitions == ["started"]
    a.elector.tick()
    assert a.transitions == ["started", "stopped"]


def test_a_leader_steps_down_at_once_when_another_identity_holds_the_lease(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    a.elector.tick()
    intruder = dataclasses.replace(_lease(store), holder_identity="intruder")
    store.update_lease(intruder)
    clock.advance(2.0)

    a.elector.tick()

    assert not a.elector.is_leader()
    assert a.transitions == ["started", "stopped"]
    assert a.elector.holder() == "intruder"


def test_a_stepped_down_leader_campaigns_again(store: FakeKube, clock: FakeClock) -> None:
    a = _replica(store, clock, "a")
    a.elector.tick()
    a.view.down = True
    for _ in range(6):
        clock.advance(2.0)
        a.elector.tick()
    assert not a.elector.is_leader()
    a.view.down = False
    clock.advance(2.0)
    a.elector.tick()  # nobody else took it: ours again, no transition counted
    assert a.elector.is_leader()
    assert a.transitions == ["started", "stopped", "started"]
    assert _lease(store).lease_transitions == 0


# --- races ----------------------------------------------------------------------------------


def test_two_candidates_creating_the_lease_one_wins(store: FakeKube, clock: FakeClock) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    # b reads "not found", then a creates the lease before b's create arrives.
    b.view.before_write = a.elector.tick

    b.elector.tick()

    assert a.elector.is_leader() and not b.elector.is_leader()
    assert _lease(store).holder_identity == "a"


def test_two_candidates_taking_over_an_expired_lease_one_wins(
    store: FakeKube, clock: FakeClock
) -> None:
    dead = _replica(store, clock, "dead")
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    dead.elector.tick()
    a.elector.tick()
    b.elector.tick()
    clock.advance(15.0)
    # Both read the expired lease; a's write lands first, b's carries a stale resourceVersion.
    b.view.before_write = a.elector.tick

    b.elector.tick()

    assert a.elector.is_leader() and not b.elector.is_leader()
    lease = _lease(store)
    assert (lease.holder_identity, lease.lease_transitions) == ("a", 1)  # counted once


def test_a_renewal_with_a_stale_version_reads_the_lease_and_renews(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    a.elector.tick()
    # Someone touched the lease (same holder record, new resourceVersion): the fast path gets
    # a Conflict, the slow path reads the lease and renews it.
    store.update_lease(_lease(store))
    clock.advance(2.0)
    writes = store.writes

    a.elector.tick()

    assert a.elector.is_leader()
    assert store.writes == writes + 1


# --- release --------------------------------------------------------------------------------


def test_release_empties_the_holder_and_the_next_candidate_takes_over_at_once(
    store: FakeKube, clock: FakeClock
) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a.elector.tick()
    b.elector.tick()

    assert a.elector.release()

    lease = _lease(store)
    assert (lease.holder_identity, lease.lease_duration_seconds, lease.lease_transitions) == (
        "",
        1,
        0,
    )
    b.elector.tick()  # no waiting for the old lease duration
    assert b.elector.is_leader()
    assert _lease(store).lease_transitions == 1


def test_release_leaves_a_lease_someone_else_holds(store: FakeKube, clock: FakeClock) -> None:
    a = _replica(store, clock, "a")
    b = _replica(store, clock, "b")
    a.elector.tick()
    b.elector.tick()
    clock.advance(15.0)
    b.elector.tick()
    assert b.elector.is_leader()

    assert a.elector.release()  # a thinks it holds it; the read says b does

    assert _lease(store).holder_identity == "b"


def test_run_stops_leading_then_releases_on_stop(store: FakeKube) -> None:
    order: list[str] = []
    view = _View(store)
    original = view.update_lease

    def update(record: LeaseRecord) -> LeaseRecord:
        if not record.holder_identity:
            order.append("released")
        return original(record)

    view.update_lease = update  # type: ignore[method-assign]
    leading = threading.Event()
    config = ElectionConfig(
        NAMESPACE,
        NAME,
        "a",
        lease_duration_seconds=2,
        renew_deadline_seconds=1.0,
        retry_period_seconds=0.1,
    )
    elector = LeaderElector(
        view,
        config,
        on_started_leading=leading.set,
        on_stopped_leading=lambda: order.append("stopped"),
    )
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,))
    thread.start()
    try:
        assert leading.wait(5.0)
    finally:
        stop.set()
        thread.join(5.0)
    assert not thread.is_alive()
    assert order == ["stopped", "released"]
    assert not elector.is_leader()
    assert _lease(store).holder_identity == ""


# --- configuration --------------------------------------------------------------------------


def test_identity_is_the_pod_name_else_hostname_and_a_random_suffix() -> None:
    assert holder_identity("hami-scheduler-7f9c") == "hami-scheduler-7f9c"
    first = holder_identity("", hostname="box")
    second = holder_identity("", hostname="box")
    assert first.startswith("box_") and second.startswith("box_") and first != second


def test_config_from_flags_defaults() -> None:
    config = ElectionConfig.from_flags()
    assert (config.namespace, config.name) == (DEFAULT_LEASE_NAMESPACE, DEFAULT_LEASE_NAME)
    assert (config.pod_namespace, config.pod_name) == ("", "")
    assert (
        config.lease_duration_seconds,
        config.renew_deadline_seconds,
        config.retry_period_seconds,
    ) == (15, 10.0, 2.0)

    in_pod = ElectionConfig.from_flags(pod_namespace="hami", pod_name="s-1")
    assert (in_pod.namespace, in_pod.identity) == ("hami", "s-1")
    assert (in_pod.pod_namespace, in_pod.pod_name) == ("hami", "s-1")

    flags = ElectionConfig.from_flags("mine", "elsewhere", pod_namespace="hami")
    assert (flags.namespace, flags.name) == ("elsewhere", "mine")
    assert flags.pod_name == ""  # no POD_NAME: no pod to label


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "message"),
    [
        (10, 10.0, 2.0, "lease duration"),
        (15, 2.4, 2.0, "renew deadline"),
        (15, 10.0, 0.0, "retry period"),
    ],
)
def test_config_refuses_timings_client_go_refuses(
    lease: int, renew: float, retry: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ElectionConfig(NAMESPACE, NAME, "a", lease, renew, retry)


def test_callback_errors_do_not_stop_the_election(store: FakeKube, clock: FakeClock) -> None:
    def broken() -> None:
        raise RuntimeError("bug in a callback")

    config = ElectionConfig(NAMESPACE, NAME, "a")
    elector = LeaderElector(
        store,
        config,
        on_started_leading=broken,
        clock=SplitClock(clock, lambda: _EPOCH + timedelta(seconds=clock())),
    )
    elector.tick()
    assert elector.is_leader()
    clock.advance(2.0)
    elector.tick()
    assert elector.is_leader()
    assert store.writes == 2  # created, then renewed
