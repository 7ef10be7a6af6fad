"""One HTTP exposition server per daemon, bound to `--metrics-bind-address`, path `/metrics`.

HAMi's syntax for the address (its monitor's and scheduler's `--metrics-bind-address`):
`:9394` (every interface), `host:port`, `[v6 address]:port`; `0` turns the endpoint off, as in
the Kubernetes components' flags. Port 0 asks the kernel for a free port (tests use it).

The server serves one registry that the caller builds and passes in (never prometheus_client's
global one) on the bounded server every listener runs on (`hami_plugin.httpserve.server`), with
`METRICS_LIMITS`: a few connections, a few per client, short header and idle timeouts, so that
idle or half-sent connections cannot take the daemon's threads (a thread per connection without
a cap once let 400 of them kill the extender's accept thread and the device plugin's gRPC
server, issue 25). `stop()` closes the socket and joins the serving thread. `ScrapeGuard` runs a
daemon's collectors at scrape time, times each one and keeps a collector that raises from
failing the whole scrape.

`prometheus_client` is imported when a server starts, not when this module is imported, so the
daemons' flag parsing (which validates the address with `parse_bind_address`) stays light.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.httpserve.probes import parse_listen_address
from hami_plugin.httpserve.routes import PlainReply, text_reply
from hami_plugin.httpserve.server import BoundedServer, ServerLimits, ThreadStarter
from hami_plugin.protocol.address import BindAddress

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"

METRICS_LIMITS = ServerLimits(
    max_connections=16,
    max_per_client=4,
    max_header_bytes=16 * 1024,
    idle_seconds=90.0,
    request_seconds=10.0,
)
"""Prometheus scrapes over one kept-alive connection per target (two servers in an HA pair);
idle above its 30-60 s scrape interval, so the connection is kept between scrapes."""


class MetricsServerError(Exception):
    """The metrics endpoint could not start; the message is the one log line to show."""


def parse_bind_address(text: str) -> BindAddress | None:
    """Parse HAMi's `--metrics-bind-address`: `0` (off, None) or a listen address
    (`protocol.address.parse_host_port`: `:9394`, `host:port`, `[::1]:9394`).

    Raises ValueError naming the problem.
    """
    return parse_listen_address(text)


_NOT_FOUND = "not found: the metrics are at " + METRICS_PATH


class _MetricsRoutes:
    """`GET /metrics`: the registry rendered now; anything else 404."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def body_limit(self, path: str) -> int:
        return 0

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> PlainReply:
        from hami_plugin.metrics.exposition import CONTENT_TYPE, render_text

        if path != METRICS_PATH:
            return text_reply(404, _NOT_FOUND)
        if method not in ("GET", "HEAD"):
            return text_reply(405, "method not allowed")
        return PlainReply(200, render_text(self._registry.collect()), CONTENT_TYPE, compress=True)


class MetricsServer:
    """The `/metrics` endpoint over one registry. `start()`, then `stop()` (idempotent).

    Other paths answer 404. Usable as a context manager. `limits` and `start_thread` are
    `BoundedServer`'s (tests make them small, or make the thread start fail).
    """

    def __init__(
        self,
        address: BindAddress,
        registry: CollectorRegistry,
        *,
        limits: ServerLimits = METRICS_LIMITS,
        start_thread: ThreadStarter | None = None,
    ) -> None:
        self.address = address
        self._registry = registry
        self._limits = limits
        self._start_thread = start_thread
        self._server: BoundedServer | None = None
        self._stopped = False
        self._lock = threading.Lock()

    def start(self) -> MetricsServer:
        """Listen and serve on a background thread. Raises MetricsServerError (port in use,
        unknown host ...) with the address in the message."""
        host = self.address.host or "0.0.0.0"
        try:
            server = BoundedServer(
                host,
                self.address.port,
                _MetricsRoutes(self._registry),
                limits=self._limits,
                name="metrics-http",
                start_thread=self._start_thread,
            )
        except OSError as error:
            # create_server's message adds the address again: the system's words alone
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise MetricsServerError(
                f"metrics endpoint: cannot listen on {self.address}: {reason}"
            ) from error
        with self._lock:
            self._server = server
        server.start()
        logger.info("serving metrics on http://%s%s", self.bound, METRICS_PATH)
        return self

    @property
    def port(self) -> int:
        """The port listened on (the kernel's choice when the address asked for port 0)."""
        if self._server is None:
            raise RuntimeError("metrics server not started")
        return self._server.port

    @property
    def connection_count(self) -> int:
        """Connections open now (each holds a thread)."""
        return 0 if self._server is None else self._server.connection_count

    def problem(self) -> str | None:
        """None while serving (or stopped on purpose), else why not (for liveness)."""
        server = self._server
        return None if server is None else server.problem()

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
            server, stopped, self._stopped = self._server, self._stopped, True
        if server is None or stopped:
            return
        server.stop(5.0)
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
