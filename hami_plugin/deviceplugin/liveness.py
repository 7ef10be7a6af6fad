"""The device plugin's probe listener (`--probe-bind-address`) and what its `/healthz` checks.

kubelet's liveness probe used to connect to the gRPC socket only: a connect succeeds as long as
the socket file listens, even when the server behind it no longer answers (issue 25: a thread
storm on `:9394` killed the gRPC serve thread, Allocate timed out, and the probe stayed green).
Now `/healthz` (`hami_plugin.httpserve.probes`) fails when

* the DevicePlugin gRPC server does not answer `GetDevicePluginOptions` on its socket within
  `GRPC_CHECK_SECONDS` (a real call through the same server, the same thread pool, that
  kubelet's Allocate takes);
* the `/metrics` listener's accept loop ended;
* the probe listener's own accept loop ended (then kubelet's probe times out, which fails too).

`/readyz` is 200 once the daemon serves (its gRPC server up and registration begun).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.metrics import DevicePluginMetrics
from hami_plugin.deviceplugin.settings import DevicePluginSettings
from hami_plugin.httpserve.probes import Liveness, probe_server
from hami_plugin.httpserve.routes import PlainReply, text_reply
from hami_plugin.httpserve.server import BoundedServer

__all__ = ["GRPC_CHECK_SECONDS", "ProbeListener", "grpc_check"]

logger = logging.getLogger(__name__)

GRPC_CHECK_SECONDS = 3.0
"""How long the liveness check waits for the gRPC server's answer (kubelet's probe timeout in
the manifests is 5 s)."""


def grpc_check(
    socket_path: Callable[[], str], timeout: float = GRPC_CHECK_SECONDS
) -> Callable[[], str | None]:
    """A liveness check: None when the DevicePlugin server on `socket_path()` answers
    `GetDevicePluginOptions` within `timeout`, else why not."""

    def check() -> str | None:
        path = socket_path()
        try:
            with grpc.insecure_channel(f"unix://{path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            return f"the DevicePlugin gRPC server on {path} does not answer: {code}"
        return None

    return check


class ProbeListener:
    """`/healthz` and `/readyz` on `--probe-bind-address` (nothing when it is `0`).

    Raises ValueError (a bad address) or OSError (cannot bind) at `start()`."""

    def __init__(self, bind_address: str, ready: threading.Event) -> None:
        self.liveness = Liveness()
        self._bind_address = bind_address
        self._ready = ready
        self.server: BoundedServer | None = None

    def start(self) -> None:
        server = probe_server(self._bind_address, self.liveness, {"/readyz": self._readyz})
        if server is None:
            return
        server.start()
        self.server = server
        logger.info("probes on http://%s/healthz", self._bind_address.strip())

    def _readyz(self) -> PlainReply:
        return text_reply(200, "ok") if self._ready.is_set() else text_reply(503, "starting")

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop(2.0)


def start_probes(
    settings: DevicePluginSettings,
    ready: threading.Event,
    grpc_socket: str | None,
    metrics: DevicePluginMetrics | None,
) -> ProbeListener:
    """The probe listener on `--probe-bind-address`, started, checking the gRPC server on
    `grpc_socket` (None: this daemon serves none there, static MIG `single`) and the metrics
    listener. An address that does not parse or bind is logged (kubelet's probe then fails,
    which says it too)."""
    probes = ProbeListener(settings.probe_bind_address, ready)
    if grpc_socket is not None:
        probes.liveness.add(grpc_check(lambda: grpc_socket))
    if metrics is not None:
        probes.liveness.add(metrics.server.problem)
    try:
        probes.start()
    except (ValueError, OSError) as error:
        logger.error("--probe-bind-address %s: %s", settings.probe_bind_address, error)
    return probes
