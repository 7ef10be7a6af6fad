"""The requeue loop (`hami_plugin.extender.requeue`): which pods it patches, when, how often,
and what it does when the API fails; then the daemon running it over the wire."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.config import ConfigError
from hami_plugin.extender.requeue import Requeuer
from hami_plugin.extender.settings import resolve_config
from hami_plugin.kube.errors import NotFound, Retryable
from hami_plugin.protocol.objects import PodCondition, PodInfo, read_pod
from hami_plugin.scheduler.requeue import ANNOTATION_REQUEUE
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import cpu_pod, gpu_node, gpu_pod
from tests.extender.test_settings import parse
from tests.processes import wait_until

FAILED = PodCondition("False", "Unschedulable", 'Post "https://x/filter": connection refused')


def parked_pod(name: str, **changes: object) -> PodInfo:
    pod = replace(read_pod(gpu_pod(name)), scheduler_name="hami-scheduler", scheduled=FAILED)
    return replace(pod, **changes)  # type: ignore[arg-type]


class PatchLog:
    """A `PodPatchApi` that records patches; `failures` raise in order before answering."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, dict[str, str | None]]] = []
        self.failures: list[Exception] = []

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodInfo:
        if self.failures:
            raise self.failures.pop(0)
        self.patched.append((f"{namespace}/{name}", dict(annotations)))
        return read_pod(gpu_pod(name))

    def names(self) -> list[str]:
        return [key for key, _ in self.patched]


class Harness:
    def __init__(self, pods: list[PodInfo], **kwargs: object) -> None:
        self.api = PatchLog()
        self.pods = pods
        self.active = True
        self.busy: set[str] = set()
        self.clock = ManualClock()
        self.requeuer = Requeuer(
            self.api,
            lambda: self.pods,
            lambda: self.active,
            lambda pod: pod.key in self.busy,
            scheduler_name="hami-scheduler",
            settings=SchedulerSettings(),
            clock=self.clock,
            qps=1000.0,
            **kwargs,  # type: ignore[arg-type]
        )

    def run_pass(self) -> int:
        return self.requeuer.run_pass()


def test_only_parked_gpu_pods_of_our_scheduler_are_patched_with_the_time() -> None:
    other = replace(read_pod(cpu_pod("cpu")), scheduler_name="hami-scheduler", scheduled=FAILED)
    harness = Harness(
        [
            parked_pod("a"),
            parked_pod("bound", node_name="gpu-1"),
            parked_pod("theirs", scheduler_name="default-scheduler"),
            parked_pod("placed", scheduled=PodCondition("True")),
            other,
        ]
    )
    assert harness.run_pass() == 1
    [(key, annotations)] = harness.api.patched
    assert key == "default/a"
    assert annotations == {
        ANNOTATION_REQUEUE: harness.clock.now().isoformat(timespec="microseconds")
    }


def test_nothing_is_patched_until_the_replica_can_answer_and_after_the_window() -> None:
    harness = Harness([parked_pod("a")], window_seconds=60)
    harness.active = False
    assert harness.run_pass() == 0
    harness.active = True
    assert harness.run_pass() == 1
    harness.clock.advance(61)
    assert harness.run_pass() == 0, "the window is shut"
    harness.active = False
    harness.run_pass()
    harness.active = True
    assert harness.run_pass() == 1, "answering again opens a new window"
    assert harness.api.names() == ["default/a", "default/a"]


def test_a_pod_still_parked_is_patched_again_only_after_its_interval() -> None:
    harness = Harness(
        [parked_pod("a")], window_seconds=60, first_interval_seconds=2, max_interval_seconds=20
    )
    assert harness.run_pass() == 1
    harness.clock.advance(1.9)
    assert harness.run_pass() == 0
    harness.clock.advance(0.1)
    assert harness.run_pass() == 1
    harness.clock.advance(3.9)
    assert harness.run_pass() == 0, "the second gap is twice the first"
    harness.clock.advance(0.1)
    assert harness.run_pass() == 1


def test_a_pod_this_replica_is_placing_is_left_alone() -> None:
    harness = Harness([parked_pod("a"), parked_pod("b")])
    harness.busy.add("default/a")
    assert harness.run_pass() == 1
    assert harness.api.names() == ["default/b"]


def test_a_pod_gone_is_skipped_and_the_pass_goes_on() -> None:
    harness = Harness([parked_pod("a"), parked_pod("b")])
    harness.api.failures.append(NotFound('pods "a" not found'))
    assert harness.run_pass() == 1
    assert harness.api.names() == ["default/b"]


def test_an_api_failure_ends_the_pass_is_logged_once_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = Harness([parked_pod("a"), parked_pod("b")], window_seconds=1)
    harness.api.failures.extend([Retryable("503"), Retryable("503")])
    with caplog.at_level(logging.INFO, logger="hami_plugin.extender.requeue"):
        assert harness.run_pass() == 0
        harness.clock.advance(1.5)  # past the window: a failed pass keeps it open
        assert harness.run_pass() == 0
        assert harness.run_pass() == 2
    assert sorted(harness.api.names()) == ["default/a", "default/b"]
    paused = [r for r in caplog.records if "paused" in r.getMessage()]
    resumed = [r for r in caplog.records if "resumed" in r.getMessage()]
    assert (len(paused), len(resumed)) == (1, 1)


def test_the_flags_set_the_rate_and_the_window_and_zero_turns_it_off() -> None:
    config = resolve_config(parse(), {})
    assert (config.requeue_qps, config.requeue_window_seconds) == (20.0, 60.0)
    config = resolve_config(parse("--requeue-qps", "0", "--requeue-window", "2m"), {})
    assert (config.requeue_qps, config.requeue_window_seconds) == (0.0, 120.0)
    with pytest.raises(ConfigError, match="--requeue-qps"):
        resolve_config(parse("--requeue-qps", "-1"), {})
    with pytest.raises(ConfigError, match="--requeue-window"):
        resolve_config(parse("--requeue-window", "0s"), {})


# --- the daemon, over the wire ------------------------------------------------------------------


def _parked_object(name: str) -> dict[str, object]:
    pod = gpu_pod(name)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": "x"}
    ]
    return pod


def test_the_daemon_patches_a_parked_pod_once_its_lists_are_in() -> None:
    api = FakeApiServer().start()
    try:
        api.add_object(gpu_node("gpu-1", 1, protocol=True))
        api.add_object(_parked_object("parked"))
        with running_scheduler(api):
            wait_until(
                lambda: (
                    ANNOTATION_REQUEUE
                    in (api.get_pod("default", "parked") or {})["metadata"]["annotations"]
                ),
                "the parked pod carries the requeue annotation",
            )
    finally:
        api.stop()


def test_requeue_qps_zero_runs_no_requeue_loop() -> None:
    api = FakeApiServer().start()
    try:
        with running_scheduler(api, requeue_qps=0.0) as scheduler:
            assert scheduler.daemon.ready.is_set()
            assert "requeue" not in {thread.name for thread in threading.enumerate()}
    finally:
        api.stop()


class _SwitchableElector:
    """Leads once `leading` is set."""

    def __init__(self) -> None:
        self.leading = threading.Event()

    def is_leader(self) -> bool:
        return self.leading.is_set()

    def run(self, stop: threading.Event) -> None:
        stop.wait()


def test_a_replica_that_takes_the_lead_patches_the_parked_pods_once() -> None:
    api = FakeApiServer().start()
    elector = _SwitchableElector()
    try:
        api.add_object(gpu_node("gpu-1", 1, protocol=True))
        api.add_object(_parked_object("parked"))
        with running_scheduler(
            api, elector_factory=lambda *args: elector, leader_elect=True
        ) as scheduler:
            scheduler.sees_pod("default", "parked", lambda pod: pod.scheduled is not None)
            # the follower's view is warm (that a follower never patches is checked above,
            # pass by pass); taking the lead opens the window
            elector.leading.set()
            wait_until(
                lambda: api.requests_matching("PATCH", "/api/v1/namespaces/default/pods/parked"),
                "the new leader patches the parked pod",
            )
            patches = api.requests_matching("PATCH", "/api/v1/namespaces/default/pods/.*")
            assert len(patches) == 1
            assert ANNOTATION_REQUEUE in patches[0].json()["metadata"]["annotations"]
    finally:
        api.stop()


def test_the_requeue_annotation_on_a_booked_pod_leaves_its_booking_and_bind_alone() -> None:
    api = FakeApiServer().start()
    try:
        api.add_object(gpu_node("gpu-1", 1, protocol=True))
        pod = api.add_object(gpu_pod("booked"))
        with running_scheduler(api) as scheduler:
            scheduler.sees_pod("default", "booked", lambda seen: True)
            answer = scheduler.filter(pod, ["gpu-1"])
            assert answer["NodeNames"] == ["gpu-1"], answer
            patched = api.update_object(
                "pods", "default", "booked",
                lambda obj: obj["metadata"]["annotations"].update({ANNOTATION_REQUEUE: "x"}),
            )  # fmt: skip
            version = patched["metadata"]["resourceVersion"]
            scheduler.sees_pod("default", "booked", lambda seen: seen.resource_version == version)
            assert scheduler.state.booking_phase("default", "booked") is not None
            assert scheduler.bind(pod, "gpu-1") == ""
            bound = api.get_pod("default", "booked")
            assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
            assert scheduler.state.counts()[1] == 1
    finally:
        api.stop()
