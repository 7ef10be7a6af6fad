"""Pod events correlated as client-go's recorder does: the correlator's decisions on a manual
clock (dedup, aggregation, spam filter, the LRU bound), the recorder's coalescing and its 404
fallback against the in-memory fake, and over the wire: the real `KubeClient` against the API
server double, alone and inside the scheduler daemon."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.extender.events import (
    COMBINED_PREFIX,
    EventCorrelator,
    EventKey,
    EventRecorder,
    EventWrite,
)
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import NotFound
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.fake import FakeKube
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import FAST_RETRY, running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def failed(message: str, pod: str = "p", reason: str = "FilteringFailed") -> PodEvent:
    return PodEvent("ml", pod, f"uid-{pod}", reason, message, "Warning")


def observe(correlator: EventCorrelator, clock: ManualClock, event: PodEvent) -> EventWrite:
    write = correlator.observe(event, clock.now(), clock.now())
    assert write is not None, f"{event} dropped"
    return write


# --- the correlator ---------------------------------------------------------------------------


def test_a_repeat_is_a_patch_of_the_stored_event_with_its_count() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    event = failed("no available node, 2 nodes do not meet")

    first = observe(correlator, clock, event)
    assert (first.name, first.count, first.key) == (None, 1, EventKey.of(event))
    correlator.created(first.key, "p.17")
    clock.advance(30)
    second = observe(correlator, clock, event)

    assert (second.name, second.count, second.event) == ("p.17", 2, event)
    assert second.first_seen == START
    assert second.last_seen == START + timedelta(seconds=30)


def test_another_message_reason_type_or_pod_is_another_event() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    event = failed("1 nodes CardInsufficientMemory(n1)")
    correlator.created(observe(correlator, clock, event).key, "p.1")

    others = [
        failed("1 nodes CardInsufficientMemory(n2)"),
        failed(event.message, reason="BindingFailed"),
        PodEvent("ml", "p", "uid-p", event.reason, event.message, "Normal"),
        failed(event.message, pod="q"),
    ]
    writes = [observe(correlator, clock, other) for other in others]

    assert [(write.name, write.count) for write in writes] == [(None, 1)] * 4
    assert len({write.key for write in writes} | {EventKey.of(event)}) == 5


def test_a_write_not_stored_is_posted_again_with_the_count_so_far() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    event = failed("m")
    observe(correlator, clock, event)  # its POST failed: `created` never came

    again = observe(correlator, clock, event)

    assert (again.name, again.count) == (None, 2)


def test_the_tenth_distinct_message_is_combined_onto_one_event() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    messages = [f"{n} nodes do not meet" for n in range(12)]

    own = [observe(correlator, clock, failed(message)) for message in messages[:9]]
    tenth = observe(correlator, clock, failed(messages[9]))
    correlator.created(tenth.key, "p.combined")
    eleventh = observe(correlator, clock, failed(messages[10]))

    assert all(
        write.event.message == message for write, message in zip(own, messages[:9], strict=True)
    )
    combined_key = EventKey.of(failed(""), combined=True)
    assert tenth.key == combined_key and tenth.name is None
    assert tenth.event.message == COMBINED_PREFIX + messages[9]
    assert (eleventh.key, eleventh.name, eleventh.count) == (combined_key, "p.combined", 2)
    assert eleventh.event.message == COMBINED_PREFIX + messages[10]
    # client-go keeps 9 of the 10 messages (here the newest): one of them is still its own
    assert observe(correlator, clock, failed(messages[5])).key == EventKey.of(failed(messages[5]))
    # the oldest was let go: seen again, it is combined
    assert observe(correlator, clock, failed(messages[0])).key == combined_key


def test_aggregation_starts_over_after_600_seconds_without_a_similar_event() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    for n in range(9):
        observe(correlator, clock, failed(f"message {n}"))
        clock.advance(600)  # a gap of exactly 600 s keeps the window open

    assert observe(correlator, clock, failed("message 9")).event.message.startswith(COMBINED_PREFIX)
    clock.advance(601)
    assert observe(correlator, clock, failed("message 10")).event.message == "message 10"


def test_spam_filter_lets_25_events_of_a_pod_through_then_one_per_300_seconds() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    event = failed("no available node, 1 nodes do not meet")

    writes = [correlator.observe(event, clock.now(), clock.now()) for _ in range(30)]

    assert all(write is not None for write in writes[:25])
    assert writes[25:] == [None] * 5
    # another reason of the same pod shares its budget; another pod has its own
    assert correlator.observe(failed("x", reason="BindingFailed"), START, START) is None
    assert correlator.observe(failed(event.message, pod="q"), START, START) is not None
    clock.advance(299)
    assert correlator.observe(event, clock.now(), clock.now()) is None
    clock.advance(1)
    refilled = correlator.observe(event, clock.now(), clock.now())
    assert refilled is not None
    # the dropped repeats were counted, as client-go counts before it filters
    assert refilled.count == 32
    assert correlator.observe(event, clock.now(), clock.now()) is None


def test_dedup_cache_keeps_the_4096_most_recently_used_events() -> None:
    clock = ManualClock(START)
    correlator = EventCorrelator(clock)
    pods = [failed("m", pod=f"p{n}") for n in range(4097)]
    for n, event in enumerate(pods[:4096]):
        correlator.created(observe(correlator, clock, event).key, f"e{n}")
    observe(correlator, clock, pods[0])  # used again: now the most recent

    correlator.created(observe(correlator, clock, pods[4096]).key, "e4096")

    assert correlator.cached_events == 4096
    assert observe(correlator, clock, pods[0]).name == "e0"
    forgotten = observe(correlator, clock, pods[1])  # the least recently used went
    assert (forgotten.name, forgotten.count) == (None, 1)


# --- the recorder, on the in-memory fake ------------------------------------------------------


def run_once(recorder: EventRecorder) -> None:
    """Let the sender take everything queued in one batch, then stop it."""
    recorder.start()
    recorder.stop()


def test_repeats_queued_before_the_sender_took_them_are_one_call_with_the_summed_count() -> None:
    clock = ManualClock(START)
    kube = FakeKube(clock=clock)
    recorder = EventRecorder(kube, "hami-scheduler", clock=clock)
    reasons = failed("1 nodes CardInsufficientMemory(n1)")
    summary = failed("no available node, 1 nodes do not meet")
    for _ in range(30):
        recorder.record(reasons)
        recorder.record(summary)
        clock.advance(10)

    run_once(recorder)

    assert kube.calls == ["create_event", "create_event"]
    assert [(e["message"], e["count"]) for e in kube.events] == [
        (reasons.message, 30),
        (summary.message, 30),
    ]
    assert kube.events[0]["firstTimestamp"] == "2026-03-01T12:00:00Z"
    assert kube.events[0]["lastTimestamp"] == "2026-03-01T12:04:50Z"

    recorder.record(summary)
    run_once(recorder)

    assert kube.calls[2:] == ["patch_event"]
    assert (kube.events[1]["count"], kube.events[1]["firstTimestamp"]) == (
        31,
        "2026-03-01T12:00:00Z",
    )
    assert kube.events[1]["lastTimestamp"] == "2026-03-01T12:05:00Z"


def test_a_patch_that_answers_404_creates_the_event_anew() -> None:
    clock = ManualClock(START)
    kube = FakeKube(clock=clock)
    recorder = EventRecorder(kube, "hami-scheduler", clock=clock)
    event = failed("no available node, 3 nodes do not meet")
    recorder.record(event)
    run_once(recorder)
    kube.fail("patch_event", NotFound("patch event ml/p.1: HTTP 404", 404))

    recorder.record(event)
    run_once(recorder)
    recorder.record(event)
    run_once(recorder)

    assert kube.calls == ["create_event", "patch_event", "create_event", "patch_event"]
    expired, recreated = kube.events
    assert expired["count"] == 1
    assert recreated["count"] == 3 and recreated["firstTimestamp"] == expired["firstTimestamp"]


def test_spam_drops_are_counted_and_the_rest_is_sent() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "hami-scheduler", clock=ManualClock(START))
    for n in range(30):
        recorder.record(failed("m", reason=f"Reason{n}"))

    run_once(recorder)

    assert [e["reason"] for e in kube.events] == [f"Reason{n}" for n in range(25)]
    assert (recorder.spam_dropped, recorder.dropped) == (5, 0)


def test_a_full_queue_drops_without_blocking() -> None:
    kube = FakeKube()
    recorder = EventRecorder(kube, "hami-scheduler", capacity=2)
    for n in range(3):
        recorder.record(failed(f"m{n}"))

    assert recorder.dropped == 1
    run_once(recorder)
    assert [e["message"] for e in kube.events] == ["m0", "m1"]


# --- over the wire ----------------------------------------------------------------------------


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[KubeClient]:
    client = KubeClient(apiserver.api_client(), FAST_RETRY)
    yield client
    client.close()


def events_of(apiserver: FakeApiServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.events("ml") if e["reason"] == reason]


def test_over_the_wire_a_repeat_patches_the_event_and_an_expired_one_is_posted_again(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    clock = ManualClock(START)
    recorder = EventRecorder(kube, "hami-scheduler", clock=clock)
    event = failed("no available node, 2 nodes do not meet")
    recorder.record(event)
    run_once(recorder)
    [stored] = events_of(apiserver, "FilteringFailed")
    clock.advance(60)
    recorder.record(event)
    run_once(recorder)

    [patched] = events_of(apiserver, "FilteringFailed")
    assert patched["metadata"]["name"] == stored["metadata"]["name"]
    assert (patched["count"], patched["lastTimestamp"]) == (2, "2026-03-01T12:01:00Z")
    assert patched["involvedObject"]["uid"] == "uid-p"
    patch = apiserver.requests_matching("PATCH", r"/api/v1/namespaces/ml/events/.*")[-1]
    assert patch.content_type == "application/merge-patch+json"
    assert patch.json() == {
        "count": 2,
        "lastTimestamp": "2026-03-01T12:01:00Z",
        "message": event.message,
    }

    name = patched["metadata"]["name"]
    assert apiserver.delete_object("events", "ml", name)  # the Event's TTL ran out
    recorder.record(event)
    run_once(recorder)

    [recreated] = events_of(apiserver, "FilteringFailed")
    assert recreated["metadata"]["name"] != name
    assert (recreated["count"], recreated["firstTimestamp"]) == (3, "2026-03-01T12:00:00Z")
    assert len(apiserver.requests_matching("POST", r"/api/v1/namespaces/ml/events")) == 2


def test_a_pod_failing_filtering_30_times_leaves_one_event_per_message_counted_30(
    apiserver: FakeApiServer,
) -> None:
    """The scheduler daemon, filter over real HTTP, 30 retries of an unschedulable pod 10
    minutes apart (so the spam budget, 2 events a retry, refills): 2 Events, each count 30,
    not 60 Events."""
    clock = ManualClock(START)
    apiserver.add_object(gpu_node("small", 1, memory=500))
    pod = gpu_pod("big", namespace="ml", uid="uid-big")
    with running_scheduler(apiserver, clock=clock) as scheduler:
        for _ in range(30):
            assert scheduler.filter(pod, ["small", "cpu-only"])["NodeNames"] is None
            clock.advance(600)

        def counts() -> list[tuple[str, int]]:
            return sorted(
                (e["message"], e["count"]) for e in events_of(apiserver, "FilteringFailed")
            )

        wait_until(
            lambda: [count for _, count in counts()] == [30, 30],
            what="two FilteringFailed events counted 30",
            timeout=30,
        )
        assert counts() == [
            ("1 nodes CardInsufficientMemory(small)", 30),
            ("no available node, 2 nodes do not meet", 30),
        ]
        posts = apiserver.requests_matching("POST", r"/api/v1/namespaces/ml/events")
        patches = apiserver.requests_matching("PATCH", r"/api/v1/namespaces/ml/events/.*")
        assert len(posts) == 2 and len(patches) <= 58
        last = {e["lastTimestamp"] for e in events_of(apiserver, "FilteringFailed")}
        assert last == {"2026-03-01T16:50:00Z"}  # the 30th retry, 29 x 10 min on
