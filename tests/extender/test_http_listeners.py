"""The scheduler's listeners under the issue 25 attacks, over real TLS and HTTP: idle and
silent connections held on the extender port, the webhook port and `/metrics` leave the
threads bounded, and kube-scheduler's `/filter`, the webhook and kubelet's probes (on their own
`--probe-bind-address` listener) keep answering while they are held and after they go.

Small enough for a loaded 2-core CI: 40 connections per port against caps of 16 overall and 8
per client (`listener_limits`; `/metrics` has its own, `METRICS_LIMITS`). Every wait is on a
condition.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from hami_plugin.extender.daemon import SchedulerDaemon
from hami_plugin.httpserve.server import ServerLimits
from hami_plugin.kube.client import KubeClient
from hami_plugin.metrics.server import METRICS_LIMITS
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.certs import Authority, client_context
from tests.extender.cluster import BASE_CONFIG, FAST_RETRY
from tests.extender.helpers import cpu_pod
from tests.httpserve.attack import HALF_SENT, Held, connection_threads, get, holding
from tests.processes import wait_until

ATTACKERS = 40
LIMITS = ServerLimits(
    max_connections=16, max_per_client=8, handshake_seconds=3600, request_seconds=3600
)
"""The timeouts out of the way on the TLS ports: the caps alone must hold the attack."""


@contextmanager
def attacked_scheduler(
    apiserver: FakeApiServer, directory: Path
) -> Iterator[tuple[SchedulerDaemon, ssl.SSLContext, ssl.SSLContext]]:
    """The daemon as the manifests run it (mutual TLS on the extender port, the webhook on its
    own TLS port, `/metrics`, the probe listener), with small listener caps; yields it with
    kube-scheduler's client context and the API server's (no client certificate)."""
    ca = Authority.create("hami-ca")
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    ca.serving().write(cert_file, key_file)
    ca_file = ca.write(directory / "ca.crt")
    config = replace(
        BASE_CONFIG,
        cert_file=str(cert_file),
        key_file=str(key_file),
        client_ca_file=str(ca_file),
        webhook_host="127.0.0.1",
        webhook_port=0,
        metrics_bind_address="127.0.0.1:0",
        probe_bind_address="127.0.0.1:0",
    )
    client = KubeClient(apiserver.api_client(), FAST_RETRY)
    daemon = SchedulerDaemon(
        config,
        kube=client,
        recovery_interval_seconds=0.2,
        watch_timeout_seconds=30,
        listener_limits=LIMITS,
    )
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(daemon.run()), name="scheduler")
    thread.start()
    try:
        assert daemon.started.wait(20) and daemon.ready.wait(20)
        kube_scheduler = client_context(ca_file, ca.client(), directory)
        yield daemon, kube_scheduler, client_context(ca_file)
    finally:
        daemon.stop()
        thread.join(60)
        client.close()
    assert result == [0]


def https(port: int, context: ssl.SSLContext, method: str, path: str, body: bytes | None) -> int:
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def everyone_is_served(
    daemon: SchedulerDaemon, kube_scheduler: ssl.SSLContext, api_server: ssl.SSLContext
) -> None:
    body = json.dumps({"Pod": cpu_pod("web"), "NodeNames": ["n1"]}).encode()
    assert https(daemon.port, kube_scheduler, "POST", "/filter", body) == 200
    assert https(daemon.webhook_port, api_server, "GET", "/healthz", None) == 200
    assert get(daemon.probe_port, "/healthz") == (200, b"ok\n")
    assert get(daemon.probe_port, "/readyz/informer-sync")[0] == 200
    assert get(daemon.metrics_port, "/metrics")[0] == 200


def test_held_connections_on_every_port_leave_filter_webhook_and_probes_served(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    with attacked_scheduler(apiserver, tmp_path) as (daemon, kube_scheduler, api_server):
        everyone_is_served(daemon, kube_scheduler, api_server)
        with ExitStack() as attack:
            # silent TCP on the TLS ports (no handshake), half-sent requests on /metrics
            extender = attack.enter_context(holding(daemon.port, ATTACKERS))
            webhook = attack.enter_context(holding(daemon.webhook_port, ATTACKERS))
            metrics = attack.enter_context(holding(daemon.metrics_port, ATTACKERS, data=HALF_SENT))
            for held, kept in (
                (extender, LIMITS.max_per_client),
                (webhook, LIMITS.max_per_client),
                (metrics, METRICS_LIMITS.max_per_client),
            ):
                # >=: /metrics closes its held ones too after METRICS_LIMITS.request_seconds
                wait_until(
                    _closed_at_least(held, ATTACKERS - kept),
                    what="the connections over the per-client caps closed",
                )
            held_threads = 2 * LIMITS.max_per_client + METRICS_LIMITS.max_per_client
            assert connection_threads() <= held_threads
            everyone_is_served(daemon, kube_scheduler, api_server)
            assert connection_threads() <= held_threads + 5  # the answers' own, if still going
        wait_until(lambda: connection_threads() == 0, what="the attackers' threads gone")
        everyone_is_served(daemon, kube_scheduler, api_server)


def test_liveness_fails_when_the_extender_listeners_accept_loop_died(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    def bug(thread: threading.Thread) -> None:
        raise SystemError("an accept loop bug")

    with attacked_scheduler(apiserver, tmp_path) as (daemon, _, _):
        assert get(daemon.probe_port, "/healthz")[0] == 200
        listener = daemon._server  # the extender listener: its next accept hits the bug
        assert listener is not None
        listener._start_thread = bug
        with holding(daemon.port, 1):
            wait_until(lambda: listener.problem() is not None, what="the accept loop to die")
        status, body = get(daemon.probe_port, "/healthz")
        assert status == 500
        assert body.startswith(b"extender-http on port ") and b"accept loop ended" in body


def _closed_at_least(held: Held, count: int) -> Callable[[], bool]:
    return lambda: held.closed_by_server() >= count
