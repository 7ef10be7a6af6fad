"""The probe listener: kubelet's liveness and readiness checks, on a port of their own.

The probes used to share a listener with the API server's webhook calls (or kube-scheduler's),
so 128 idle connections from any pod made every probe fail (issue 25). Now each daemon serves
them on `--probe-bind-address` (plain HTTP: kubelet needs no TLS for a check that carries no
data), which the NetworkPolicies admit from no pod at all: the common network plugins let a
pod's own node (kubelet) through whatever the policy says, so only the node can fill its few
slots. It runs on the same bounded server as every other listener, with small caps
(`PROBE_LIMITS`).

`GET /healthz` (and `/livez`) is the liveness check: 200 "ok" while every registered check
passes (each listener's accept loop runs, the device plugin's gRPC server answers), else 500
with one line per failing check, so kubelet restarts a pod whose listener died rather than
leave it up and deaf. Other paths are the daemon's readiness routes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from hami_plugin.httpserve.routes import PlainReply, Reply, text_reply
from hami_plugin.httpserve.server import BoundedServer, ServerLimits
from hami_plugin.protocol.address import BindAddress, parse_host_port

__all__ = [
    "DISABLED",
    "PROBE_LIMITS",
    "Liveness",
    "ProbeRoutes",
    "parse_listen_address",
    "probe_server",
]

logger = logging.getLogger(__name__)

DISABLED = "0"
"""The bind-address value that turns a listener off."""

PROBE_LIMITS = ServerLimits(
    max_connections=8,
    max_per_client=4,
    max_header_bytes=8 * 1024,
    idle_seconds=30.0,
    request_seconds=5.0,
)
"""kubelet makes one probe at a time per kind (startup, liveness, readiness), each a new
connection: 8 slots are plenty, and only the node reaches the port."""

LIVENESS_PATHS = frozenset({"/healthz", "/livez"})

Check = Callable[[], str | None]
"""A liveness check: None when fine, else what is wrong (one line)."""


def parse_listen_address(text: str) -> BindAddress | None:
    """`0` (off: None) or a listen address (`:8081`, `host:port`, `[::1]:8081`).
    Raises ValueError naming the problem."""
    value = text.strip()
    if value == DISABLED:
        return None
    if ":" not in value:
        raise ValueError(f"expected host:port, :port or 0 (off), got {text!r}")
    return parse_host_port(text)


class Liveness:
    """The liveness checks of one daemon. Thread-safe."""

    def __init__(self) -> None:
        self._checks: list[Check] = []
        self._lock = threading.Lock()

    def add(self, check: Check) -> None:
        with self._lock:
            self._checks.append(check)

    def problems(self) -> list[str]:
        """What fails now, one line each (a check that raises fails with its error)."""
        with self._lock:
            checks = list(self._checks)
        found = []
        for check in checks:
            try:
                problem = check()
            except Exception as error:  # a broken check must fail the probe, not the server
                problem = f"liveness check failed: {error!r}"
            if problem is not None:
                found.append(problem)
        return found


class ProbeRoutes:
    """`/healthz` and `/livez` from `liveness`; the paths in `readiness` (GET) from their
    functions; anything else 404. No route takes a body."""

    def __init__(self, liveness: Liveness, readiness: Mapping[str, Callable[[], Reply]]) -> None:
        self.liveness = liveness
        self._readiness = dict(readiness)
        self._logged: frozenset[str] = frozenset()

    def body_limit(self, path: str) -> int:
        return 0

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> Reply:
        if method not in ("GET", "HEAD"):
            return text_reply(405, "method not allowed")
        if path in LIVENESS_PATHS:
            return self.healthz()
        route = self._readiness.get(path)
        if route is None:
            return text_reply(404, "404 page not found")
        return route()

    def healthz(self) -> PlainReply:
        problems = self.liveness.problems()
        failing = frozenset(problems)
        if failing != self._logged:  # once per change, not once per probe
            self._logged = failing
            for problem in problems:
                logger.error("liveness: %s", problem)
        if problems:
            return PlainReply(500, ("\n".join(problems) + "\n").encode())
        return text_reply(200, "ok")


def probe_server(
    bind_address: str, liveness: Liveness, readiness: Mapping[str, Callable[[], Reply]]
) -> BoundedServer | None:
    """kubelet's probes on a plain-HTTP listener of their own (`--probe-bind-address` of both
    daemons), not started; None when the address is `0`. The server's own accept loop is
    one of `liveness`'s checks. Raises ValueError for an address that does not parse."""
    address = parse_listen_address(bind_address)
    if address is None:
        return None
    server = BoundedServer(
        address.host or "0.0.0.0",
        address.port,
        ProbeRoutes(liveness, readiness),
        limits=PROBE_LIMITS,
        name="probe-http",
    )
    liveness.add(server.problem)
    return server
