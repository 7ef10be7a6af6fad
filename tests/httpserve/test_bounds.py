"""The bounded server every listener runs on (`hami_plugin.httpserve.server`), attacked over
real sockets as issue 25 did, at a scale a loaded 2-core CI runs: 40 idle or half-sent
connections against caps of 16 overall and 8 per client. Every wait is on a condition."""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest

from hami_plugin.extender.daemon import WEBHOOK_LIMITS
from hami_plugin.httpserve.probes import PROBE_LIMITS, Liveness, ProbeRoutes
from hami_plugin.httpserve.routes import PlainReply
from hami_plugin.httpserve.server import BoundedServer, ServerLimits
from tests.httpserve.attack import HALF_SENT, connection_threads, get, holding
from tests.processes import wait_until

ATTACKERS = 40
LIMITS = ServerLimits(max_connections=16, max_per_client=8, request_seconds=3600, idle_seconds=3600)
"""Timeouts out of the way: the caps alone must hold the attack."""


class Ok:
    def body_limit(self, path: str) -> int:
        return 1024

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> PlainReply:
        return PlainReply(200, b"ok\n")


def started(server: BoundedServer) -> BoundedServer:
    server.start()
    return server


@pytest.mark.parametrize("data", [b"", HALF_SENT], ids=["silent", "half-sent"])
def test_one_source_gets_its_share_of_slots_and_the_others_are_served(data: bytes) -> None:
    server = started(BoundedServer("127.0.0.1", 0, Ok(), limits=LIMITS))
    try:
        with holding(server.port, ATTACKERS, data=data) as held:
            # the attacker keeps 8 (its per-client cap); the 32 others are closed at once
            wait_until(
                lambda: held.closed_by_server() == ATTACKERS - 8,
                what="connections over the per-client cap closed",
            )
            assert server.connection_count == 8
            assert connection_threads() == 8
            assert get(server.port, "/filter", source="127.0.0.3")[0] == 200
            with holding(server.port, ATTACKERS, source="127.0.0.4", data=data) as second:
                wait_until(lambda: second.closed_by_server() == ATTACKERS - 8, what="second")
                # both sources at their cap: the listener is full, a third is refused
                assert server.connection_count == 16 and connection_threads() == 16
                with holding(server.port, 1, source="127.0.0.5") as third:
                    wait_until(lambda: third.closed_by_server() == 1, what="refused when full")
        wait_until(lambda: server.connection_count == 0, what="the attackers' slots freed")
        assert get(server.port, "/filter")[0] == 200
    finally:
        server.stop(5)
    wait_until(lambda: connection_threads() == 0, what="connection threads gone")


class FailingStart:
    """`threading.Thread.start`, failing the first `failures` times as a pids limit does."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self, thread: threading.Thread) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        thread.start()


def test_a_thread_that_cannot_start_closes_that_client_and_the_server_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "hami_plugin.httpserve.server")
    starter = FailingStart(3, RuntimeError("can't start new thread"))
    limits = ServerLimits(thread_backoff_seconds=0.01, log_interval_seconds=3600)
    server = started(BoundedServer("127.0.0.1", 0, Ok(), limits=limits, start_thread=starter))
    try:
        with holding(server.port, 3, data=HALF_SENT) as refused:
            wait_until(lambda: refused.closed_by_server() == 3, what="clients without a thread")
        assert server.connection_count == 0  # their slots were given back
        assert get(server.port, "/filter")[0] == 200
        assert server.problem() is None
    finally:
        server.stop(5)
    failures = [r.getMessage() for r in caplog.records if "no thread" in r.getMessage()]
    assert len(failures) == 1, failures  # once, not once per client
    assert "can't start new thread" in failures[0]


def test_liveness_fails_when_a_listeners_accept_loop_has_died() -> None:
    starter = FailingStart(1, SystemError("an accept loop bug"))
    victim = started(BoundedServer("127.0.0.1", 0, Ok(), name="victim", start_thread=starter))
    liveness = Liveness()
    liveness.add(victim.problem)
    probes = BoundedServer("127.0.0.1", 0, ProbeRoutes(liveness, {}), limits=PROBE_LIMITS)
    liveness.add(probes.problem)
    probes.start()
    try:
        assert get(probes.port, "/healthz") == (200, b"ok\n")
        with holding(victim.port, 1):
            wait_until(lambda: victim.problem() is not None, what="the accept loop to die")
        status, body = get(probes.port, "/healthz")
        assert status == 500
        assert body.decode() == (
            f"victim on port {victim.port}: accept loop ended: SystemError('an accept loop bug')\n"
        )
        assert get(probes.port, "/livez")[0] == 500
    finally:
        probes.stop(5)
        victim.stop(5)
    assert victim.problem() is None  # stopped on purpose: nothing to report


def test_the_probe_listener_answers_readiness_routes_and_404_elsewhere() -> None:
    ready = {"/readyz": lambda: PlainReply(503, b"not yet\n")}
    probes = started(BoundedServer("127.0.0.1", 0, ProbeRoutes(Liveness(), ready)))
    try:
        assert get(probes.port, "/readyz") == (503, b"not yet\n")
        assert get(probes.port, "/filter")[0] == 404
    finally:
        probes.stop(5)


def test_the_webhook_listener_takes_an_api_server_burst_from_one_source() -> None:
    """The API server (or its konnectivity agent) is one source and opens a connection per
    concurrent admission call: 100 at once from it are all held on the webhook's listener
    (`WEBHOOK_LIMITS`), where `ServerLimits()` would reset 36 of them (the webhook then fails
    open, and the fail-closed policy refuses the unmutated GPU pods)."""
    limits = dataclasses.replace(WEBHOOK_LIMITS, request_seconds=3600, idle_seconds=3600)
    server = started(BoundedServer("127.0.0.1", 0, Ok(), limits=limits))
    try:
        with holding(server.port, 100) as burst:
            wait_until(lambda: server.connection_count == 100, what="the whole burst held")
            assert burst.closed_by_server() == 0
    finally:
        server.stop(5)
    wait_until(lambda: connection_threads() == 0, what="connection threads gone")
