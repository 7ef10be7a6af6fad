"""Retries, timeouts and error translation (hami_plugin.kube.retry, hami_plugin.kube.errors),
through the real kubernetes client against the HTTP API server double."""

from __future__ import annotations

import dataclasses
import random
import threading
from datetime import UTC, datetime

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from hami_plugin.clock import ManualClock
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError, Retryable
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer
from tests.kube.support import FAST, SleepRecorder, client_for

# --- retries, timeouts, translation -----------------------------------------------------------


def test_two_server_errors_then_success_is_retried(
    apiserver: FakeApiServer,
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1", annotations={"a": "1"})
    fault = apiserver.inject_fault("GET", r"/api/v1/nodes/gpu-1", status=500, times=2)

    node = kube.get_node("gpu-1")

    assert node.annotations == {"a": "1"}
    assert fault.fired == 2
    assert len(apiserver.requests) == 3
    assert len(sleeps.waits) == 2
    # exponential backoff with jitter: retry k waits within [b/2, b], b = min(0.001*2^(k-1), max)
    assert 0.0005 <= sleeps.waits[0] <= 0.001
    assert 0.001 <= sleeps.waits[1] <= 0.002


def test_service_unavailable_forever_gives_up_as_retryable(
    apiserver: FakeApiServer,
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault(".*", ".*", status=503, times=None)

    with pytest.raises(
        Retryable, match=r"get node gpu-1: HTTP 503: .*gave up after 3 attempts"
    ) as e:
        kube.get_node("gpu-1")

    assert e.value.status == 503
    assert isinstance(e.value.__cause__, ApiException)
    assert len(apiserver.requests) == 3
    assert len(sleeps.waits) == 2


def test_too_many_requests_honours_retry_after(
    apiserver: FakeApiServer,
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=429, headers={"Retry-After": "0.005"})

    kube.get_node("gpu-1")

    assert sleeps.waits == [0.005]


def test_retry_after_is_capped_by_max_backoff(
    apiserver: FakeApiServer,
    kube: KubeClient,
    sleeps: SleepRecorder,
) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=429, headers={"Retry-After": "120"})

    kube.get_node("gpu-1")

    assert sleeps.waits == [FAST.max_backoff_seconds]


@pytest.mark.parametrize(
    "date", ["Thu, 01 Jan 2026 00:00:03 GMT", "Thu, 01 Jan 2026 00:00:03 -0000"]
)
def test_retry_after_as_a_date_is_read_against_the_clients_clock(
    apiserver: FakeApiServer, date: str
) -> None:
    apiserver.add_node("gpu-1")
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    sleeps = SleepRecorder()
    apiserver.inject_fault("GET", ".*", status=503, headers={"Retry-After": date})
    policy = dataclasses.replace(FAST, max_backoff_seconds=10.0)

    with KubeClient(apiserver.api_client(), policy, sleep=sleeps, clock=clock) as kube:
        kube.get_node("gpu-1")

    assert sleeps.waits == [3.0]


@pytest.mark.parametrize("status", [400, 403, 422])
def test_client_errors_are_permanent(
    apiserver: FakeApiServer,
    kube: KubeClient,
    status: int,
) -> None:
    apiserver.add_pod("p")
    apiserver.inject_fault("PATCH", ".*", status=status, times=None)

    with pytest.raises(KubeError) as e:
        kube.patch_pod_metadata("default", "p", {"a": "b"})

    assert type(e.value) is KubeError
    assert e.value.status == status
    assert f"patch pod default/p metadata: HTTP {status}: injected fault" in str(e.value)
    assert len(apiserver.requests) == 1


def test_hanging_server_times_out_as_retryable(apiserver: FakeApiServer) -> None:
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", hang_seconds=30, times=None)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with (
        client_for(apiserver, policy) as kube,
        pytest.raises(
            Retryable, match=r"get node gpu-1: timed out .*gave up after 2 attempts"
        ) as e,
    ):
        kube.get_node("gpu-1")

    assert isinstance(e.value.__cause__, urllib3.exceptions.HTTPError)
    # urllib3's own retries are off: one request per attempt, not four.
    assert len(apiserver.requests) == 2


def test_one_slow_answer_then_success(apiserver: FakeApiServer) -> None:
    apiserver.add_node("gpu-1", annotations={"a": "1"})
    apiserver.inject_fault("GET", ".*", hang_seconds=30)
    policy = RetryPolicy(attempts=2, initial_backoff_seconds=0, timeout_seconds=0.2)

    with client_for(apiserver, policy) as kube:
        assert kube.get_node("gpu-1").annotations == {"a": "1"}


def test_dropped_connection_is_retried(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.add_pod("p", node_name="gpu-1")
    apiserver.inject_fault("GET", ".*", disconnect=True)

    assert [p.name for p in kube.list_pods_on_node("gpu-1")] == ["p"]
    assert len(apiserver.requests) == 2


def test_connection_refused_is_retryable() -> None:
    with FakeApiServer() as server:
        api_client = server.api_client()
    # The server is gone and its port closed.
    with (
        KubeClient(api_client, FAST, sleep=SleepRecorder()) as kube,
        pytest.raises(Retryable, match=r"get node gpu-1: connection failed: .*gave up after 3"),
    ):
        kube.get_node("gpu-1")


def test_malformed_json_is_a_kube_error_not_retried(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body=b'{"metadata": {"name": ')

    with pytest.raises(KubeError, match="get node gpu-1: malformed response") as e:
        kube.get_node("gpu-1")

    assert type(e.value) is KubeError
    assert isinstance(e.value.__cause__, ValueError)
    assert len(apiserver.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"metadata": {"annotations": ["not", "a", "map"]}}',
        b'{"metadata": {"annotations": {"k": 1}}}',
        b'{"metadata": {"name": "p", "creationTimestamp": "yesterday"}}',
        b'{"spec": {"containers": [{"name": "c", "env": [{"value": "no name"}]}]}}',
        b'{"spec": {"containers": "c"}}',
    ],
)
def test_wrong_shapes_are_kube_errors(
    apiserver: FakeApiServer,
    kube: KubeClient,
    body: bytes,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body=body)

    with pytest.raises(KubeError, match="get pod default/p: malformed response"):
        kube.get_pod("default", "p")


def test_malformed_list_item_is_a_kube_error(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=200, body={"kind": "PodList", "items": ["x"]})

    with pytest.raises(KubeError, match="list pods on node gpu-1: malformed response"):
        kube.list_pods_on_node("gpu-1")


def test_server_error_with_garbage_body_is_still_retryable(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    apiserver.inject_fault("GET", ".*", status=502, body=b"<html>bad gateway</html>", times=None)

    with pytest.raises(Retryable, match=r"HTTP 502: <html>bad gateway</html>"):
        kube.get_node("gpu-1")


def test_concurrent_calls_share_one_client(
    apiserver: FakeApiServer,
    kube: KubeClient,
) -> None:
    names = [f"p{i}" for i in range(8)]
    for name in names:
        apiserver.add_pod(name, node_name="gpu-1")
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            for round_ in range(5):
                kube.patch_pod_metadata("default", name, {"round": str(round_)})
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert {p.annotations["round"] for p in kube.list_pods_on_node("gpu-1")} == {"4"}


# --- policy -----------------------------------------------------------------------------------


@given(
    retry=st.integers(min_value=1, max_value=40),
    initial=st.floats(min_value=0, max_value=5),
    maximum=st.floats(min_value=0, max_value=30),
    seed=st.integers(),
)
def test_backoff_is_jittered_exponential_and_capped(
    retry: int, initial: float, maximum: float, seed: int
) -> None:
    policy = RetryPolicy(initial_backoff_seconds=initial, max_backoff_seconds=maximum)
    ceiling = min(initial * 2 ** (retry - 1), maximum)

    wait = policy.backoff_seconds(retry, random.Random(seed))

    assert ceiling / 2 <= wait <= ceiling
    assert wait <= maximum


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"timeout_seconds": 0}, {"initial_backoff_seconds": -1}],
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_steps_and_no_jitter_give_the_schedule_as_written() -> None:
    policy = RetryPolicy(attempts=6, jitter=False, steps=(0.02, 0.05, 0.4))

    assert [policy.backoff_seconds(retry) for retry in range(1, 6)] == [0.02, 0.05, 0.4, 0.4, 0.4]
    doubling = RetryPolicy(initial_backoff_seconds=0.05, max_backoff_seconds=0.5, jitter=False)
    assert [doubling.backoff_seconds(retry) for retry in (1, 2, 4, 5, 1000)] == [
        0.05,
        0.1,
        0.4,
        0.5,
        0.5,
    ]


def test_a_pause_after_another_doubles_it_up_to_this_policys_cap() -> None:
    away = RetryPolicy(initial_backoff_seconds=0.05, max_backoff_seconds=0.5, jitter=False)
    refused = RetryPolicy(initial_backoff_seconds=0.2, max_backoff_seconds=5.0, jitter=False)

    assert refused.pause_after(None) == 0.2
    assert away.pause_after(0.4) == 0.5
    assert refused.pause_after(away.pause_after(None)) == 0.1


def test_tries_pause_between_attempts_and_stop_after_the_last() -> None:
    sleeps = SleepRecorder()
    policy = RetryPolicy(attempts=3, jitter=False, steps=(0.5, 1.0))

    assert list(policy.tries(sleep=sleeps)) == [1, 2, 3]
    assert sleeps.waits == [0.5, 1.0]

    no_pause = RetryPolicy(attempts=2, initial_backoff_seconds=0, jitter=False)
    assert list(no_pause.tries(sleep=sleeps)) == [1, 2]
    assert sleeps.waits == [0.5, 1.0]


def test_tries_end_when_stopped_or_when_a_pause_would_pass_the_deadline() -> None:
    stop = threading.Event()
    stop.set()
    policy = RetryPolicy(attempts=5, jitter=False, steps=(0.5,))

    assert list(policy.tries(stop=stop)) == [1]
    clock = ManualClock()
    ends_at = clock.monotonic() + 1.2  # room for two pauses of 0.5 s, not three
    tries = policy.tries(sleep=clock.advance, ends_at=ends_at, monotonic=clock.monotonic)
    assert list(tries) == [1, 2, 3]
