"""Registration with kubelet, and re-registration after every kubelet restart.

Order (docs/kubelet-deviceplugin.md 2.2, 6): serve our socket first, then call `Register` on
`<device-plugin-path>/kubelet.sock`; kubelet dials back inside that call. While kubelet is away
the call is retried with backoff.

A kubelet restart deletes every socket in the directory and creates a new `kubelet.sock`
(2.1); kubelet never re-dials a plugin (2.3). `KubeletRegistrar` is a loop over restart
signals: whatever raises one (the default `SocketPollWatch` seeing `kubelet.sock` replaced or
our socket gone, or the last ListAndWatch stream of our server closed by its client), the
loop waits a few milliseconds to absorb the burst, stops the old server, serves a new socket
and registers again. Tests inject their own watch and trigger signals directly.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.server import DevicePluginService, PluginServer
from hami_plugin.kube.retry import RetryPolicy

logger = logging.getLogger(__name__)

KUBELET_SOCKET_NAME = "kubelet.sock"
API_VERSION = "v1beta1"
SOCKET_REPLACED = "our socket was replaced"
"""The restart reason when another process served a socket at our path (kubelet only deletes
sockets): another plugin with our socket name (`deviceplugin.rivals`)."""

AWAY_RETRY = RetryPolicy(initial_backoff_seconds=0.05, max_backoff_seconds=0.5, jitter=False)
"""Nobody answers on kubelet.sock (a stale file while kubelet restarts): retried quickly."""
REFUSED_RETRY = RetryPolicy(initial_backoff_seconds=0.2, max_backoff_seconds=5.0, jitter=False)
"""Kubelet refused us, or our socket cannot be served: retried with a longer backoff."""


@dataclass(frozen=True, slots=True)
class SocketId:
    """Identity of a socket file: a re-created file differs in inode or change time."""

    inode: int
    ctime_ns: int


def socket_id(path: str) -> SocketId | None:
    """The identity of the file at `path`, None when there is none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return SocketId(status.st_ino, status.st_ctime_ns)


class RestartSignal:
    """Coalescing "register again" signal: any number of triggers, one wake-up."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._reasons: list[str] = []

    def trigger(self, reason: str) -> None:
        with self._condition:
            self._reasons.append(reason)
            self._condition.notify_all()

    def wait(self, timeout: float | None = None) -> tuple[str, ...]:
        """Block until triggered (or `timeout`); returns and forgets the pending reasons."""
        with self._condition:
            self._condition.wait_for(lambda: bool(self._reasons), timeout)
            reasons, self._reasons = tuple(self._reasons), []
            return reasons

    def clear(self) -> tuple[str, ...]:
        """Forget pending reasons (they are covered by a registration just made)."""
        with self._condition:
            reasons, self._reasons = tuple(self._reasons), []
            return reasons


class RestartWatch(Protocol):
    """An event source that triggers the signal when kubelet looks restarted."""

    def start(self, signal: RestartSignal) -> None: ...

    def expect(self, kubelet_socket: SocketId | None, plugin_socket: SocketId | None) -> None:
        """The state right after a successful registration; a change from it is a restart."""

    def stop(self) -> None: ...


class SocketPollWatch:
    """Polls `kubelet.sock` and our socket every `interval_seconds` (no inotify needed).

    Triggers once per `expect()` when kubelet.sock is re-created or removed, or our socket is
    removed or replaced.
    """

    def __init__(self, plugin_dir: str, socket_name: str, interval_seconds: float = 0.15) -> None:
        self._kubelet_path = os.path.join(plugin_dir, KUBELET_SOCKET_NAME)
        self._plugin_path = os.path.join(plugin_dir, socket_name)
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._expected: tuple[SocketId | None, SocketId | None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, signal: RestartSignal) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(signal,), name="kubelet-socket-watch", daemon=True
        )
        self._thread.start()

    def expect(self, kubelet_socket: SocketId | None, plugin_socket: SocketId | None) -> None:
        with self._lock:
            self._expected = (kubelet_socket, plugin_socket)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> str | None:
        """One poll: the restart reason, or None while things look as expected."""
        with self._lock:
            expected = self._expected
        if expected is None:
            return None
        kubelet_now = socket_id(self._kubelet_path)
        plugin_now = socket_id(self._plugin_path)
        reason = None
        if plugin_now != expected[1]:
            reason = "our socket was removed" if plugin_now is None else SOCKET_REPLACED
        elif kubelet_now != expected[0]:
            reason = (
                "kubelet.sock is gone" if kubelet_now is None else "kubelet.sock was re-created"
            )
        if reason is not None:
            with self._lock:
                if self._expected == expected:
                    self._expected = None
        return reason

    def _run(self, signal: RestartSignal) -> None:
        while not self._stop.wait(self._interval):
            reason = self.check()
            if reason is not None:
                signal.trigger(reason)


class KubeletRegistrar:
    """Keeps the DevicePlugin served and registered with whichever kubelet is running."""

    def __init__(
        self,
        service: DevicePluginService,
        *,
        plugin_dir: str,
        socket_name: str,
        resource_name: str,
        watch: RestartWatch | None = None,
        away_backoff: RetryPolicy = AWAY_RETRY,
        refused_backoff: RetryPolicy = REFUSED_RETRY,
        register_timeout_seconds: float = 15.0,
        settle_seconds: float = 0.05,
        kubelet_poll_seconds: float = 0.1,
        on_registered: Callable[[tuple[str, ...]], None] | None = None,
    ) -> None:
        self._service = service
        self._socket_name = socket_name
        self._resource_name = resource_name
        self._kubelet_path = os.path.join(plugin_dir, KUBELET_SOCKET_NAME)
        self._socket_path = os.path.join(plugin_dir, socket_name)
        self._watch: RestartWatch = watch or SocketPollWatch(plugin_dir, socket_name)
        self._away_backoff = away_backoff
        self._refused_backoff = refused_backoff
        self._register_timeout = register_timeout_seconds
        self._settle = settle_seconds
        self._kubelet_poll = kubelet_poll_seconds
        self._on_registered = on_registered
        self.signal = RestartSignal()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: PluginServer | None = None
        self._registered = threading.Condition()
        self._registrations = 0

    @property
    def socket_path(self) -> str:
        return self._socket_path

    @property
    def registrations(self) -> int:
        """How many times Register succeeded."""
        with self._registered:
            return self._registrations

    def wait_registered(self, count: int = 1, timeout: float | None = None) -> bool:
        """Block until Register has succeeded `count` times in total."""
        with self._registered:
            return self._registered.wait_for(lambda: self._registrations >= count, timeout)

    def start(self) -> None:
        """Serve and register in a background thread; returns at once."""
        self._watch.start(self.signal)
        self._thread = threading.Thread(target=self._run, name="kubelet-registrar", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and the server and remove our socket. Safe to call more than once."""
        self._stop.set()
        self.signal.trigger("stopping")
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._watch.stop()
        self._stop_server()

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        reasons: tuple[str, ...] = ()
        while not self._stop.is_set():
            try:
                if not self._serve_and_register():
                    return
                if self._on_registered is not None:
                    self._on_registered(tuple(dict.fromkeys(reasons)))
                # stop() may have fired while Register ran, and `signal.clear()` before it
                # swallowed its trigger: look at the flag itself before sleeping on the signal.
                if self._stop.is_set():
                    return
                reasons = self.signal.wait()
                if self._stop.is_set():
                    return
                # A kubelet restart raises several signals in a row (stream closed, our socket
                # deleted, kubelet.sock created): take them as one.
                self._stop.wait(self._settle)
                reasons += self.signal.clear()
                logger.info("re-registering with kubelet: %s", "; ".join(dict.fromkeys(reasons)))
            except Exception:
                # The daemon must not lose kubelet for good over one bad round.
                logger.exception("kubelet registration failed unexpectedly; retrying in 1 s")
                self._stop.wait(1.0)

    def _serve_and_register(self) -> bool:
        """(Re)serve, wait for kubelet.sock, Register; retried until done. False if stopped."""
        need_serve = True
        serve_delay: float | None = None
        register_delay: float | None = None
        waiting_logged = False
        failures = 0
        while not self._stop.is_set():
            if need_serve:
                try:
                    self._serve()
                except OSError as error:
                    serve_delay = self._refused_backoff.pause_after(serve_delay)
                    logger.warning("%s; retrying in %.1f s", error, serve_delay)
                    self._stop.wait(serve_delay)
                    continue
                need_serve = False
            # kubelet deletes every socket before it creates kubelet.sock: look at kubelet.sock
            # first, so that a socket of ours seen after it has survived the clean-up.
            kubelet_before = socket_id(self._kubelet_path)
            if kubelet_before is None:
                if not waiting_logged:
                    logger.info("waiting for kubelet at %s", self._kubelet_path)
                    waiting_logged = True
                self._stop.wait(self._kubelet_poll)
                continue
            plugin_now = socket_id(self._socket_path)
            if plugin_now is None:
                need_serve = True
                continue
            # Signals from here on are not covered by this registration: keep them.
            self.signal.clear()
            try:
                self._register()
            except grpc.RpcError as error:
                failures += 1
                # The two kinds of failure share one growing pause, each at its own cap.
                away = _rpc_code(error) in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
                backoff = self._away_backoff if away else self._refused_backoff
                register_delay = backoff.pause_after(register_delay)
                message = _rpc_error_text(error)
                if failures == 1:
                    logger.warning(
                        "Register with kubelet failed: %s; retrying with backoff", message
                    )
                else:
                    logger.debug("Register attempt %d failed: %s", failures, message)
                self._stop.wait(register_delay)
                continue
            self._watch.expect(kubelet_before, plugin_now)
            with self._registered:
                self._registrations += 1
                count = self._registrations
                self._registered.notify_all()
            logger.info(
                "registered %s with kubelet (endpoint %s, registration %d)",
                self._resource_name,
                self._socket_name,
                count,
            )
            return True
        return False

    def _serve(self) -> None:
        # The old server's busy calls (an Allocate waiting on the API server) must not delay
        # serving the new kubelet: they finish on their own.
        self._stop_server(wait=False)

        def stream_lost() -> None:
            # Only when no stream is left: another client of the socket (a debugging tool)
            # coming and going is no reason to re-register and cut kubelet's stream.
            if server.live_streams == 0:
                self.signal.trigger("kubelet closed the ListAndWatch stream")

        server = PluginServer(self._service, self._socket_path, on_stream_lost=stream_lost)
        server.start()
        self._server = server

    def _stop_server(self, *, wait: bool = True) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(wait=wait)

    def _register(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self._socket_name,
            resource_name=self._resource_name,
            options=self._service.options(),
        )
        with grpc.insecure_channel(f"unix://{self._kubelet_path}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(request, timeout=self._register_timeout)


def _rpc_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _rpc_error_text(error: grpc.RpcError) -> str:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return str(error)
