"""`/metrics` on the bounded server: idle and half-sent connections cannot take the daemon's
threads (issue 25: wsgiref's thread per connection held 400 threads for 400 half-sent requests
and, under a pids limit, killed the daemon's other threads), and a thread that cannot start is
survived. Over real sockets; every wait is on a condition."""

from __future__ import annotations

import gzip
import threading
import urllib.request

from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from hami_plugin.metrics.server import METRICS_LIMITS, MetricsServer
from hami_plugin.protocol.address import BindAddress
from tests.httpserve.attack import HALF_SENT, connection_threads, holding
from tests.processes import wait_until

ATTACKERS = 40


class One:
    def collect(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("hami_test_value", "a value", value=1)]


def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(One())
    return registry


def scrape(server: MetricsServer) -> bytes:
    request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Encoding"] == "gzip"
        return gzip.decompress(answer.read())


def test_half_sent_scrapes_hold_a_few_threads_and_prometheus_is_still_served() -> None:
    before = threading.active_count()
    per_client = METRICS_LIMITS.max_per_client
    with MetricsServer(BindAddress("127.0.0.1", 0), registry()).start() as server:
        with holding(server.port, ATTACKERS, data=HALF_SENT) as held:
            # >=: the held ones are closed too once METRICS_LIMITS.request_seconds pass
            wait_until(
                lambda: held.closed_by_server() >= ATTACKERS - per_client,
                what="half-sent connections over the per-client cap closed",
            )
            assert server.connection_count <= per_client
            assert threading.active_count() <= before + 1 + per_client  # + the accept thread
            assert b"hami_test_value 1.0" in scrape(server)
        wait_until(lambda: server.connection_count == 0, what="the held connections gone")
        assert b"hami_test_value 1.0" in scrape(server)
    wait_until(lambda: connection_threads() == 0, what="connection threads gone")


def test_a_connection_thread_that_cannot_start_is_survived() -> None:
    calls: list[int] = []

    def start(thread: threading.Thread) -> None:
        calls.append(1)
        if len(calls) <= 5:
            raise RuntimeError("can't start new thread")
        thread.start()

    server = MetricsServer(BindAddress("127.0.0.1", 0), registry(), start_thread=start)
    with server.start():
        with holding(server.port, 5, source="127.0.0.2", data=HALF_SENT) as refused:
            wait_until(lambda: refused.closed_by_server() == 5, what="threadless clients closed")
        assert b"hami_test_value 1.0" in scrape(server)
        assert server.problem() is None
