"""What the tests of hami_plugin.kube share: a fast retry policy and a sleep that only records."""

from __future__ import annotations

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer

FAST = RetryPolicy(
    attempts=3, initial_backoff_seconds=0.001, max_backoff_seconds=0.01, timeout_seconds=2.0
)


class SleepRecorder:
    """Stands in for time.sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def client_for(server: FakeApiServer, policy: RetryPolicy) -> KubeClient:
    """A client of `server` with `policy`, whose backoffs take no time."""
    return KubeClient(server.api_client(), policy, sleep=SleepRecorder())
