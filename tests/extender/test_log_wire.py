"""Log injection and flooding through the real webhook endpoint (issue 25 item 7): what anyone
can POST to /webhook reaches the scheduler's log only escaped, cut and rate-limited."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hami_plugin.logsafe import CallerRateLimit, safe_handler
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.extender.cluster import Scheduler, running_scheduler

FORGED = "2026-12-06 08:00:00,000 INFO hami_plugin.extender.bind: pod kube-system/coredns bound"
SIX_MIB = 6 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@dataclass
class DaemonLog:
    """The scheduler's log as its handler (logsafe.configure_logging's) writes it."""

    stream: io.StringIO
    clock: FakeClock

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()


@pytest.fixture
def daemon_log() -> Iterator[DaemonLog]:
    stream, clock = io.StringIO(), FakeClock()
    handler = safe_handler(stream, rate_limit=CallerRateLimit(burst=3, clock=clock))
    root = logging.getLogger()
    webhook = logging.getLogger("hami_plugin.scheduler.admission_review")
    level = webhook.level
    root.addHandler(handler)
    webhook.setLevel(logging.INFO)
    yield DaemonLog(stream, clock)
    webhook.setLevel(level)
    root.removeHandler(handler)


def denied_review(namespace: str = "default", name: str = "bytes") -> dict[str, Any]:
    """An AdmissionReview the webhook denies (gpumem in bytes), so it logs the pod's key."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16Gi"}
    pod = make_pod("bytes", containers=[make_container("app", limits=limits)], uid="uid-bytes")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "namespace": namespace,
            "name": name,
            "operation": "CREATE",
            "object": pod,
        },
    }


def post_denied(scheduler: Scheduler, review: dict[str, Any]) -> None:
    status, result = scheduler.post("/webhook", review)
    assert status == 200 and result["response"]["allowed"] is False, result


def test_a_newline_in_the_namespace_forges_no_line(
    apiserver: FakeApiServer, daemon_log: DaemonLog, caplog: pytest.LogCaptureFixture
) -> None:
    with running_scheduler(apiserver) as scheduler:
        post_denied(scheduler, denied_review(namespace=f"default\n{FORGED}"))
    lines = daemon_log.lines()
    assert not [line for line in lines if line.startswith(FORGED[:20])], lines
    [denied] = [line for line in lines if "denying pod" in line]
    assert f"denying pod default\\n{FORGED}/bytes (uid req-1)" in denied
    # The call site escapes too: a handler without SafeFormatter (pytest's) sees one line.
    [record] = [r for r in caplog.records if "denying pod" in r.getMessage()]
    assert "\n" not in record.getMessage()


def test_six_mib_names_grow_the_log_by_a_bounded_amount_and_are_summarised(
    apiserver: FakeApiServer, daemon_log: DaemonLog
) -> None:
    with running_scheduler(apiserver) as scheduler:
        before = len(daemon_log.stream.getvalue())
        for _ in range(5):
            post_denied(scheduler, denied_review(name="n" * SIX_MIB))
        grown = len(daemon_log.stream.getvalue()) - before
        # Before: 31.5 MB for these five requests. Now: three cut lines, two suppressed.
        assert grown < 8 * 1024, grown
        denied = [line for line in daemon_log.lines() if "denying pod" in line]
        assert len(denied) == 3
        assert all(f"...[cut, {SIX_MIB} characters]" in line for line in denied)

        daemon_log.clock.now += 61.0
        post_denied(scheduler, denied_review(name="after"))
    lines = daemon_log.lines()
    [summary] = [line for line in lines if "suppressed" in line]
    assert "suppressed 2 log lines caused by webhook callers" in summary
    assert lines.index(summary) < next(i for i, line in enumerate(lines) if "default/after" in line)
