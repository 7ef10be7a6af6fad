"""One HTTP exposition server per daemon, bound to `--metrics-bind-address`, path `/metrics`.

HAMi's syntax for the address (its monitor's and scheduler's `--metrics-bind-address`):
`:9394` (every interface), `host:port`, `[v6 address]:port`; `0` turns the endpoint off, as in
the Kubernetes components' flags. Port 0 asks the kernel for a free port (tests use it).

The server serves one registry that the caller builds and passes in (never prometheus_client's
global one), on a thread per request; `stop()` closes the socket and joins the serving thread.
`ScrapeGuard` runs a daemon's collectors at scrape time, times each one and keeps a collector
that raises from failing the whole scrape.

`prometheus_client` is imported when a server starts, not when this module is imported, so the
daemons' flag parsing (which validates the address with `parse_bind_address`) stays light.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.protocol.address import BindAddress, parse_host_port

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
DISABLED = "0"
"""The `--metrics-bind-address` value that turns the endpoint off."""


class MetricsServerError(Exception):
    """The metrics endpoint could not start; the message is the one log line to show."""


def parse_bind_address(text: str) -> BindAddress | None:
    """Parse HAMi's `--metrics-bind-address`: `0` (off, None) or a listen address
    (`protocol.address.parse_host_port`: `:9394`, `host:port`, `[::1]:9394`).

    Raises ValueError naming the problem.
    """
    value = text.strip()
    if value == DISABLED:
        return None
    if ":" not in value:
        raise ValueError(f"expected host:port, :port or 0 (off), got {text!r}")
    return parse_host_port(text)


class _QuietHandler(WSGIRequestHandler):
    """Requests are logged at debug level, not written to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics %s: " + format, self.address_string(), *args)


_NOT_FOUND = b"not found: the metrics are at " + METRICS_PATH.encode() + b"\n"


class MetricsServer:
    """The `/metrics` endpoint over one registry. `start()`, then `stop()` (idempotent).

    Other paths answer 404. Usable as a context manager.
    """

    def __init__(self, address: BindAddress, registry: CollectorRegistry) -> None:
        self.address = address
        self._registry = registry
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> MetricsServer:
        """Listen and serve on a background thread. Raises MetricsServerError (port in use,
        unknown host ...) with the address in the message."""
        from prometheus_client.exposition import ThreadingWSGIServer

        from hami_plugin.metrics.exposition import CONTENT_TYPE, render_text

        registry = self._registry

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != METRICS_PATH:
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [_NOT_FOUND]
            body = render_text(registry.collect())
            headers = [("Content-Type", CONTENT_TYPE)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                # Level 1: a node's 1.5 MB of samples shrink ~10x in a few ms (level 9 costs
                # more than rendering them).
                body = gzip.compress(body, compresslevel=1)
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]

        host = self.address.host or "0.0.0.0"

        class _Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            httpd = make_server(host, self.address.port, app, _Server, _QuietHandler)
        except OSError as error:
            reason = error.strerror or str(error)
            raise MetricsServerError(
                f"metrics endpoint: cannot listen on {self.address}: {reason}"
            ) from error
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-http"
        )
        with self._lock:
            self._httpd, self._thread = httpd, thread
        thread.start()
        logger.info("serving metrics on http://%s%s", self.bound, METRICS_PATH)
        return self

    @property
    def port(self) -> int:
        """The port listened on (the kernel's choice when the address asked for port 0)."""
        if self._httpd is None:
            raise RuntimeError("metrics server not started")
        return int(self._httpd.server_address[1])

    @property
    def bound(self) -> BindAddress:
        """The address listened on, with the real port."""
        return BindAddress(self.address.host, self.port)

    @property
    def url(self) -> str:
        """`http://<host>:<port>/metrics`, with loopback standing in for every interface."""
        host = self.address.host or "127.0.0.1"
        return f"http://{BindAddress(host, self.port)}{METRICS_PATH}"

    def stop(self) -> None:
        """Stop serving, close the socket and join the serving thread."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._thread = None
        if httpd is None or thread is None:
            return
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        logger.info("metrics endpoint on %s stopped", self.bound)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_metrics_server(bind_address: str, registry: CollectorRegistry) -> MetricsServer | None:
    """Parse the flag value and start the endpoint; None when the value is `0` (off).

    Raises MetricsServerError for an unusable address (the message names it).
    """
    try:
        address = parse_bind_address(bind_address)
    except ValueError as error:
        raise MetricsServerError(f"--metrics-bind-address: {error}") from None
    if address is None:
        logger.info("metrics endpoint off (--metrics-bind-address=0)")
        return None
    return MetricsServer(address, registry).start()


def guarded_registry(
    collectors: Mapping[str, Collector], clock: Clock | None = None
) -> CollectorRegistry:
    """A fresh registry (never prometheus_client's global one) holding `collectors` under one
    `ScrapeGuard` timed by `clock` (the system clock when None). Raises ValueError when two
    collectors describe the same metric name."""
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(ScrapeGuard(collectors, clock))
    return registry


# --- collectors run under a guard ----------------------------------------------------------------

SCRAPE_DURATION = "hami_scrape_collector_duration_seconds"
SCRAPE_SUCCESS = "hami_scrape_collector_success"


class ScrapeGuard:
    """Runs named collectors at scrape time; times each; contains their failures.

    Register this one object in the registry instead of the collectors it holds. Each scrape
    it collects every collector completely, in order, then yields what they produced plus
    `hami_scrape_collector_duration_seconds{collector}` (the wall time that collector took in
    this very scrape) and `hami_scrape_collector_success{collector}` (0 when it raised: its
    output is dropped for this scrape, the traceback logged, and the other collectors' metrics
    are still served, so Prometheus never sees a failed scrape for one bad collector).

    Durations are read from `clock.monotonic()` (the system clock when None).
    Raises ValueError when two collectors' `describe()` name the same metric (the exposition
    would hold the family twice, which Prometheus rejects).
    """

    def __init__(self, collectors: Mapping[str, Collector], clock: Clock | None = None) -> None:
        self._collectors = dict(collectors)
        self._clock: Clock = clock or SystemClock()
        owners: dict[str, str] = {SCRAPE_DURATION: "ScrapeGuard", SCRAPE_SUCCESS: "ScrapeGuard"}
        for name, collector in self._collectors.items():
            describe = getattr(collector, "describe", None)
            for family in describe() if describe is not None else ():
                owner = owners.setdefault(family.name, name)
                if owner != name:
                    raise ValueError(
                        f"metrics collectors {owner!r} and {name!r} both export {family.name}"
                    )

    def describe(self) -> Iterator[Metric]:
        """The names this guard produces, for the registry's duplicate check."""
        from prometheus_client.metrics_core import GaugeMetricFamily

        yield GaugeMetricFamily(SCRAPE_DURATION, _DURATION_HELP, labels=["collector"])
        yield GaugeMetricFamily(SCRAPE_SUCCESS, _SUCCESS_HELP, labels=["collector"])
        for collector in self._collectors.values():
            describe = getattr(collector, "describe", None)
            if describe is not None:
                yield from describe()

    def collect(self) -> Iterator[Metric]:
        """Collect every collector now (see the class docstring)."""
        from prometheus_client.metrics_core import GaugeMetricFamily

        duration = GaugeMetricFamily(SCRAPE_DURATION, _DURATION_HELP, labels=["collector"])
        success = GaugeMetricFamily(SCRAPE_SUCCESS, _SUCCESS_HELP, labels=["collector"])
        for name, collector in self._collectors.items():
            started = self._clock.monotonic()
            try:
                families = list(collector.collect())
            except Exception:
                # The one place a scrape is protected from a collector's bug: log it whole.
                logger.exception("metrics collector %r failed; its metrics are left out", name)
                families = []
                success.add_metric([name], 0)
            else:
                success.add_metric([name], 1)
            duration.add_metric([name], self._clock.monotonic() - started)
            yield from families
        yield duration
        yield success


_DURATION_HELP = "Seconds this collector took to read its state in this scrape"
_SUCCESS_HELP = "1 when this collector read its state in this scrape, 0 when it failed"
