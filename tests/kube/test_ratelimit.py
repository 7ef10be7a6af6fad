"""The client-side rate limit (`--kube-qps`, `--kube-burst`) and the per-request timeout
(`--kube-timeout`): the token bucket on a manual clock, and the client over the wire against
the API server double, its waits recorded on that clock instead of slept."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Retryable
from hami_plugin.kube.ratelimit import ClientRateLimit, TokenBucket
from hami_plugin.testing.apiserver import FakeApiServer
from tests.kube.support import FAST

NODE = "gpu-node-1"


# --- the bucket ------------------------------------------------------------------------------


def test_a_full_bucket_lets_burst_calls_go_then_paces_them_at_qps() -> None:
    clock = ManualClock()
    bucket = TokenBucket(ClientRateLimit(qps=2.0, burst=3), clock)
    assert [bucket.reserve() for _ in range(5)] == [0.0, 0.0, 0.0, 0.5, 1.0]
    clock.advance(1.0)  # two tokens back, both owed to the calls still waiting
    assert bucket.reserve() == 0.5


def test_an_idle_bucket_refills_only_up_to_burst() -> None:
    clock = ManualClock()
    bucket = TokenBucket(ClientRateLimit(qps=10.0, burst=2), clock)
    bucket.reserve()
    bucket.reserve()
    clock.advance(3600)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, pytest.approx(0.1)]


def test_a_wait_past_the_limit_takes_no_token() -> None:
    clock = ManualClock()
    bucket = TokenBucket(ClientRateLimit(qps=1.0, burst=1), clock)
    assert bucket.reserve() == 0.0
    assert bucket.reserve(max_wait_seconds=0.5) is None
    assert bucket.reserve(max_wait_seconds=1.0) == 1.0  # the refused call did not queue


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 1), (-1.0, 1), (float("nan"), 1), (5.0, 0)])
def test_a_limit_out_of_range_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="ClientRateLimit"):
        ClientRateLimit(qps=qps, burst=burst)


# --- over the wire ---------------------------------------------------------------------------


class ClockSleep:
    """Stands in for time.sleep: records each wait and moves the manual clock by it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sleep(clock: ManualClock) -> ClockSleep:
    return ClockSleep(clock)


@pytest.fixture
def limited(
    apiserver: FakeApiServer, clock: ManualClock, sleep: ClockSleep
) -> Iterator[KubeClient]:
    """A client of the double limited to 10 calls a second, 3 at once."""
    apiserver.add_node(NODE)
    with KubeClient(
        apiserver.api_client(),
        FAST,
        sleep=sleep,
        rng=random.Random(7),
        clock=clock,
        rate_limit=ClientRateLimit(qps=10.0, burst=3),
    ) as client:
        yield client


def test_burst_calls_reach_the_server_at_once_then_one_every_tenth_of_a_second(
    limited: KubeClient, apiserver: FakeApiServer, sleep: ClockSleep
) -> None:
    apiserver.clear_requests()
    for _ in range(6):
        assert limited.get_node(NODE).name == NODE
    assert len(apiserver.requests_matching("GET", f"/api/v1/nodes/{NODE}")) == 6
    assert sleep.waits == [pytest.approx(0.1)] * 3


def test_a_retry_takes_a_token_too(
    limited: KubeClient, apiserver: FakeApiServer, sleep: ClockSleep
) -> None:
    for _ in range(3):
        limited.get_node(NODE)  # the bucket is empty now
    apiserver.clear_requests()
    apiserver.inject_fault("GET", f"/api/v1/nodes/{NODE}", status=503)
    assert limited.get_node(NODE).name == NODE
    assert len(apiserver.requests_matching("GET", f"/api/v1/nodes/{NODE}")) == 2
    # first try: a token's wait; then the backoff, then the rest of the next token's wait
    first, backoff, rest = sleep.waits
    assert first == pytest.approx(0.1)
    assert backoff + rest == pytest.approx(0.1)


def test_a_call_the_limit_would_hold_past_its_budget_is_not_sent(
    limited: KubeClient, apiserver: FakeApiServer, sleep: ClockSleep
) -> None:
    for _ in range(3):
        limited.get_node(NODE)
    apiserver.clear_requests()
    with limited.deadline(0.05), pytest.raises(Retryable, match=r"rate limit \(--kube-qps 10\)"):
        limited.get_node(NODE)
    assert apiserver.requests_matching("GET", f"/api/v1/nodes/{NODE}") == []
    # the refused tries (and their backoffs) took no token: the next call waits out the rest
    # of the one token it is owed, no more
    limited.get_node(NODE)
    assert sum(sleep.waits) == pytest.approx(0.1)


def test_from_config_wires_the_rate_limit_and_the_request_timeout(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.add_node(NODE)
    kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    patient = dataclasses.replace(FAST, attempts=1, timeout_seconds=30.0)
    with pytest.raises(ValueError, match="qps and burst go together"):
        KubeClient.from_config(kubeconfig, patient, qps=5.0)
    with KubeClient.from_config(
        kubeconfig, patient, qps=1000.0, burst=2, timeout_seconds=0.3
    ) as client:
        assert client.get_node(NODE).name == NODE
        # a server that answers after 5 s: the 0.3 s timeout ends the call, not retry's 30 s
        apiserver.inject_fault("GET", f"/api/v1/nodes/{NODE}", hang_seconds=5.0)
        with pytest.raises(Retryable, match="timed out"):
            client.get_node(NODE)
