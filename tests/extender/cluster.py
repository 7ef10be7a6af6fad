"""An in-process `hami scheduler` against the API server double, called over real HTTP."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from hami_plugin.clock import Clock
from hami_plugin.extender.daemon import ElectorFactory, SchedulerDaemon
from hami_plugin.extender.settings import SchedulerConfig
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.helpers import RecordingObserver
from tests.processes import wait_until

FAST_RETRY = RetryPolicy(
    attempts=3, initial_backoff_seconds=0.01, max_backoff_seconds=0.05, timeout_seconds=5.0
)
BASE_CONFIG = SchedulerConfig(
    http_host="127.0.0.1",
    http_port=0,
    metrics_bind_address="0",
    node_lock_retry_timeout_seconds=5.0,
)


class Scheduler:
    """A running daemon and a client for its routes."""

    def __init__(
        self, daemon: SchedulerDaemon, observer: RecordingObserver, api: FakeApiServer
    ) -> None:
        self.daemon = daemon
        self.observer = observer
        self.api = api
        self.ssl_context: ssl.SSLContext | None = None

    @property
    def state(self) -> Any:
        return self.daemon.state

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """One request on a fresh connection: status, body, headers (lower-case names)."""
        if self.ssl_context is not None:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                "127.0.0.1", self.daemon.port, timeout=30, context=self.ssl_context
            )
        else:
            connection = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=dict(headers or {}))
            response = connection.getresponse()
            data = response.read()
            return response.status, data, {k.lower(): v for k, v in response.getheaders()}
        finally:
            connection.close()

    def post(self, path: str, document: Any) -> tuple[int, Any]:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        status, data, headers = self.request(
            "POST", path, body, {"Content-Type": "application/json"}
        )
        if headers.get("content-type", "").startswith("application/json"):
            return status, json.loads(data)
        return status, data.decode()

    def filter(self, pod: Mapping[str, Any], nodes: list[str]) -> dict[str, Any]:
        status, result = self.post("/filter", {"Pod": pod, "NodeNames": nodes})
        assert status == 200, result
        assert isinstance(result, dict)
        return result

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        metadata = pod["metadata"]
        status, result = self.post(
            "/bind",
            {
                "PodName": metadata["name"],
                "PodNamespace": metadata.get("namespace", "default"),
                "PodUID": metadata.get("uid", ""),
                "Node": node,
            },
        )
        assert status == 200, result
        error = result["Error"]
        assert isinstance(error, str)
        return error

    def schedule(self, pod: Mapping[str, Any], nodes: list[str]) -> str:
        """Filter then bind as kube-scheduler does; the node, or raises with the reason."""
        result = self.filter(pod, nodes)
        if not result["NodeNames"]:
            raise AssertionError(f"no node: {result}")
        node = str(result["NodeNames"][0])
        error = self.bind(pod, node)
        if error:
            raise AssertionError(f"bind failed: {error}")
        return node

    def sees_pod(self, namespace: str, name: str, check: Callable[[Any], bool]) -> None:
        wait_until(
            lambda: (p := self.state.pod(namespace, name)) is not None and check(p),
            what=f"pod {namespace}/{name} in the scheduler's watch",
        )


@contextmanager
def running_scheduler(
    api: FakeApiServer,
    config: SchedulerConfig = BASE_CONFIG,
    *,
    elector_factory: ElectorFactory | None = None,
    retry: RetryPolicy = FAST_RETRY,
    clock: Clock | None = None,
    election_clock: Clock | None = None,
    wait_ready: bool = True,
    **changes: Any,
) -> Iterator[Scheduler]:
    """A `SchedulerDaemon` on a free loopback port against `api`; stopped afterwards."""
    config = replace(config, **changes) if changes else config
    client = KubeClient(api.api_client(), retry)
    observer = RecordingObserver()
    daemon = SchedulerDaemon(
        config,
        kube=client,
        observer=observer,
        elector_factory=elector_factory,
        clock=clock,
        election_clock=election_clock,
        recovery_interval_seconds=0.2,
        watch_timeout_seconds=30,
    )
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(daemon.run()), name="scheduler")
    thread.start()
    try:
        if not daemon.started.wait(20):
            raise AssertionError("the scheduler did not start")
        if wait_ready and not daemon.ready.wait(20):
            raise AssertionError("the scheduler did not get its first lists")
        yield Scheduler(daemon, observer, api)
    finally:
        daemon.stop()
        thread.join(60)
        client.close()
    assert not thread.is_alive(), "the scheduler did not stop"
    assert result == [0]
