"""The exposition server over real HTTP: address syntax, /metrics, 404, clean stop, ScrapeGuard."""

from __future__ import annotations

import logging
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from hami_plugin.clock import ManualClock
from hami_plugin.metrics.server import (
    MetricsServer,
    MetricsServerError,
    ScrapeGuard,
    guarded_registry,
    parse_bind_address,
    start_metrics_server,
)
from hami_plugin.protocol.address import BindAddress

LOOPBACK_ANY_PORT = BindAddress("127.0.0.1", 0)


class Fixed:
    """A collector with one gauge."""

    def __init__(self, name: str, value: float) -> None:
        self.name = name
        self.value = value

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, "fixed")

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, "fixed", value=self.value)


class Slow(Fixed):
    """A collector that takes `seconds` of `clock` to collect."""

    def __init__(self, name: str, value: float, clock: ManualClock, seconds: float) -> None:
        super().__init__(name, value)
        self.clock = clock
        self.seconds = seconds

    def collect(self) -> Iterator[Metric]:
        self.clock.advance(self.seconds)
        return super().collect()


class Broken:
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("half_done", "yielded before the error", value=1)
        raise RuntimeError("collector bug")


def scrape(url: str) -> dict[str, Metric]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Metric) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


# --- the address flag ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9394", BindAddress("", 9394)),
        ("127.0.0.1:9394", BindAddress("127.0.0.1", 9394)),
        ("localhost:0", BindAddress("localhost", 0)),
        ("[::1]:9395", BindAddress("::1", 9395)),
        ("[::]:80", BindAddress("::", 80)),
        (" :9394 ", BindAddress("", 9394)),
        ("0", None),
    ],
)
def test_bind_address_syntax_as_hami(text: str, expected: BindAddress | None) -> None:
    assert parse_bind_address(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("9394", "expected host:port, :port or 0 (off)"),
        ("host", "expected host:port"),
        ("host:", "port must be a number from 0 to 65535, got ''"),
        (":65536", "port must be a number from 0 to 65535, got '65536'"),
        (":-1", "port must be a number"),
        (":http", "port must be a number"),
        ("::1:9394", "an IPv6 address needs brackets, [::1]:9394"),
        ("[::1]9394", "expected [address]:port"),
        ("[::1", "expected [address]:port"),
        ("", "expected host:port"),
    ],
)
def test_bad_bind_addresses_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_bind_address(text)


def test_bind_address_prints_as_written() -> None:
    assert str(BindAddress("", 9394)) == ":9394"
    assert str(BindAddress("::1", 9394)) == "[::1]:9394"
    assert str(BindAddress("10.0.0.1", 1)) == "10.0.0.1:1"


# --- the server ------------------------------------------------------------------------------


def test_serves_the_registry_at_metrics_only() -> None:
    registry = CollectorRegistry()
    registry.register(Fixed("answer", 42))
    with MetricsServer(LOOPBACK_ANY_PORT, registry).start() as server:
        assert server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        assert samples(scrape(server.url)["answer"]) == {(): 42.0}
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5)
        assert caught.value.code == 404
        assert b"/metrics" in caught.value.read()


def test_reads_state_at_scrape_time() -> None:
    registry = CollectorRegistry()
    gauge = Fixed("live", 1)
    registry.register(gauge)
    with MetricsServer(LOOPBACK_ANY_PORT, registry).start() as server:
        assert samples(scrape(server.url)["live"]) == {(): 1.0}
        gauge.value = 7
        assert samples(scrape(server.url)["live"]) == {(): 7.0}


def test_stop_closes_the_port_and_joins_its_thread() -> None:
    server = MetricsServer(LOOPBACK_ANY_PORT, CollectorRegistry()).start()
    port = server.port
    assert any(t.name == "metrics-http" for t in threading.enumerate())
    server.stop()
    server.stop()  # idempotent
    assert not any(t.name == "metrics-http" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass


def test_a_port_in_use_is_one_clear_error() -> None:
    with MetricsServer(LOOPBACK_ANY_PORT, CollectorRegistry()).start() as first:
        taken = BindAddress("127.0.0.1", first.port)
        with pytest.raises(MetricsServerError) as caught:
            MetricsServer(taken, CollectorRegistry()).start()
    message = str(caught.value)
    assert message == f"metrics endpoint: cannot listen on 127.0.0.1:{first.port}: " + (
        "Address already in use"
    )


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server = MetricsServer(BindAddress("::1", 0), CollectorRegistry()).start()
    except MetricsServerError as error:
        pytest.skip(f"IPv6 loopback unusable here: {error}")
    with server:
        assert server.url == f"http://[::1]:{server.port}/metrics"
        scrape(server.url)


def test_start_from_the_flag_value() -> None:
    assert start_metrics_server("0", CollectorRegistry()) is None
    with pytest.raises(MetricsServerError, match="--metrics-bind-address: expected host:port"):
        start_metrics_server("9394", CollectorRegistry())
    server = start_metrics_server("127.0.0.1:0", CollectorRegistry())
    assert server is not None
    server.stop()


# --- ScrapeGuard ------------------------------------------------------------------------------


def test_guard_times_each_collector_and_reports_success() -> None:
    clock = ManualClock()
    guard = ScrapeGuard(
        {"a": Slow("a_value", 1, clock, 0.25), "b": Slow("b_value", 2, clock, 1.5)}, clock=clock
    )
    families = {family.name: family for family in guard.collect()}
    assert samples(families["hami_scrape_collector_duration_seconds"]) == {
        (("collector", "a"),): 0.25,
        (("collector", "b"),): 1.5,
    }
    assert samples(families["hami_scrape_collector_success"]) == {
        (("collector", "a"),): 1.0,
        (("collector", "b"),): 1.0,
    }
    assert samples(families["a_value"]) == {(): 1.0}


def test_a_failing_collector_never_fails_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    registry = guarded_registry({"bad": Broken(), "good": Fixed("good_value", 3)})
    with (
        MetricsServer(LOOPBACK_ANY_PORT, registry).start() as server,
        caplog.at_level(logging.ERROR),
    ):
        families = scrape(server.url)
    assert "half_done" not in families  # a collector's partial output is dropped
    assert samples(families["good_value"]) == {(): 3.0}
    assert samples(families["hami_scrape_collector_success"]) == {
        (("collector", "bad"),): 0.0,
        (("collector", "good"),): 1.0,
    }
    assert "metrics collector 'bad' failed; its metrics are left out" in caplog.text
    assert "RuntimeError: collector bug" in caplog.text


def test_guarded_registry_refuses_two_collectors_with_one_name() -> None:
    with pytest.raises(ValueError, match="metrics collectors 'a' and 'b' both export same"):
        guarded_registry({"a": Fixed("same", 1), "b": Fixed("same", 2)})
