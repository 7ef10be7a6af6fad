"""The HTTP server: injected faults, and a stop that wakes every request and watch."""

from __future__ import annotations

import threading
import time

import pytest
import urllib3

from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.processes import wait_until
from tests.testing.apiserver.wire import Stream, call, open_watch


def test_faults_fire_the_given_number_of_times(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    apiserver.add_node("n")
    fault = apiserver.inject_fault("GET", r"/api/v1/nodes/.*", status=503, times=2)

    statuses = [call(http, apiserver, "GET", "/api/v1/nodes/n")[0] for _ in range(3)]
    other = call(http, apiserver, "POST", "/api/v1/namespaces/default/pods", make_pod("p"))[0]

    assert statuses == [503, 503, 200]
    assert other == 201
    assert fault.fired == 2
    assert [r.method for r in apiserver.requests] == ["GET", "GET", "GET", "POST"]
    assert apiserver.requests_matching("POST")[0].json()["metadata"]["name"] == "p"


def test_faults_apply_to_watches(
    apiserver: FakeApiServer,
    http: urllib3.PoolManager,
) -> None:
    fault = apiserver.inject_fault("GET", "/api/v1/pods", query=".*watch=true.*", status=500)

    status, body = call(http, apiserver, "GET", "/api/v1/pods?watch=true")
    listed = call(http, apiserver, "GET", "/api/v1/pods")[0]

    assert (status, body["reason"], fault.fired) == (500, "InternalError", 1)
    assert listed == 200


def test_stop_wakes_hung_requests_and_leaks_no_threads() -> None:
    # the threads: tests/conftest.py fails a test that leaves one running
    server = FakeApiServer().start()
    server.inject_fault(hang_seconds=60, times=None)
    pool = urllib3.PoolManager(retries=False, timeout=30.0)
    outcome: list[object] = []

    def hang() -> None:
        try:
            outcome.append(pool.request("GET", server.url + "/api/v1/nodes/n").status)
        except urllib3.exceptions.HTTPError as exc:
            outcome.append(exc)

    client = threading.Thread(target=hang)
    client.start()
    wait_until(lambda: server.requests, "the request reaches the server")
    started = time.monotonic()
    server.stop()
    client.join(timeout=10)

    assert time.monotonic() - started < 5
    assert not client.is_alive()
    assert len(outcome) == 1
    pool.clear()


def test_stop_ends_open_watches(http: urllib3.PoolManager) -> None:
    server = FakeApiServer().start()
    stream = Stream(open_watch(http, server, "/api/v1/nodes?watch=true"))
    wait_until(lambda: server.watch_count > 0, "the watch is open")

    server.stop()

    with pytest.raises(urllib3.exceptions.ProtocolError):
        stream.next_event()
    http.clear()
