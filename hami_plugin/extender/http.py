"""The extender's HTTP server: kube-scheduler's filter and bind, the admission webhook, probes.

Routes (HAMi v2.10 `pkg/scheduler/routes/route.go`, docs/hami-reference.md 3.8):

* `POST /filter`, `POST /bind`: the extender v1 JSON (`hami_plugin.extender.wire`),
  always HTTP 200 with `Error` set on a problem (malformed JSON, a body over the cap, a pod
  missing, "not the leader" on a follower), as HAMi answers; an empty body is HTTP 400;
* `POST /webhook`: the AdmissionReview (`hami_plugin.scheduler.admission_review`), answered on
  every replica (it needs no state);
* `GET /healthz`: 200 while the process serves; `GET /readyz`: 200 once the first pod and node
  lists are in and, with leader election, while this replica leads, else 503 with the reason
  (HAMi always answers 200, so a Service could route to a replica that refuses everything).

A `ThreadingHTTPServer`, one thread per connection (kube-scheduler sends up to 16 binds at
once). Bodies are read up to the cap plus one byte, so an oversized body costs no memory.
Anything unexpected is one log line with its traceback and an HTTP 500, never a dead server.

TLS when a certificate and key are given: the handshake runs in the connection's thread (a slow
client does not hold up accepting others), and the files are reloaded when they change (checked
at most once per second, on new connections), as HAMi's certificate watcher does, so a renewed
certificate is served without a restart.

`stop()` stops accepting, closes idle keep-alive connections, lets requests in progress finish
(bounded), then returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.extender.bind import Binder
from hami_plugin.extender.events import PodEvent
from hami_plugin.extender.filtering import FilterAnswer
from hami_plugin.extender.state import SchedulerState
from hami_plugin.extender.wire import (
    MAX_BODY_BYTES,
    ExtenderArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HttpReply,
    admission_reply,
    binding_reply,
    decode_binding_request,
    decode_filter_request,
    filter_reply,
)
from hami_plugin.protocol.objects import ObjectError, read_pod
from hami_plugin.scheduler.admission_review import WEBHOOK_MAX_BODY_BYTES, review_admission_body
from hami_plugin.scheduler.webhook import WebhookSettings

__all__ = ["NOT_LEADER", "ExtenderApp", "ExtenderServer", "TlsFiles"]

logger = logging.getLogger(__name__)

NOT_LEADER = "not the leader"
_TEXT = "text/plain; charset=utf-8"
_SYNC_WAIT_SECONDS = 10.0
_IDLE_CONNECTION_SECONDS = 120.0
_TLS_HANDSHAKE_SECONDS = 10.0
_TLS_RECHECK_SECONDS = 1.0


def _text(status: int, message: str) -> HttpReply:
    return HttpReply(status, (message + "\n").encode(), _TEXT)


class ExtenderApp:
    """The routes, independent of the socket: bytes in, `HttpReply` out. Thread-safe.

    `is_leader` says whether this replica serves filter and bind now; `readiness` returns None
    when ready, else why not.
    """

    def __init__(
        self,
        state: SchedulerState,
        binder: Binder,
        webhook: WebhookSettings,
        record_event: Callable[[PodEvent], None],
        is_leader: Callable[[], bool],
        readiness: Callable[[], str | None],
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        sync_wait_seconds: float = _SYNC_WAIT_SECONDS,
    ) -> None:
        self._state = state
        self._binder = binder
        self._webhook = webhook
        self._record_event = record_event
        self._is_leader = is_leader
        self._readiness = readiness
        self.max_body_bytes = max_body_bytes
        self._sync_wait = sync_wait_seconds

    def body_limit(self, path: str) -> int:
        """How many body bytes a route reads at most."""
        return WEBHOOK_MAX_BODY_BYTES if path == "/webhook" else self.max_body_bytes

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> HttpReply:
        """Route one request."""
        routes: dict[str, tuple[str, Callable[[], HttpReply]]] = {
            "/filter": ("POST", lambda: self.filter(body)),
            "/bind": ("POST", lambda: self.bind(body)),
            "/webhook": ("POST", lambda: self.webhook(body, content_type)),
            "/healthz": ("GET", lambda: _text(200, "ok")),
            "/readyz": ("GET", self.readyz),
        }
        route = routes.get(path)
        if route is None:
            return _text(404, "404 page not found")
        if method != route[0] and not (method == "HEAD" and route[0] == "GET"):
            return _text(405, "Method Not Allowed")
        return route[1]()

    def readyz(self) -> HttpReply:
        why = self._readiness()
        return _text(200, "ok") if why is None else _text(503, why)

    def filter(self, body: bytes) -> HttpReply:
        clock = self._state.clock
        started = clock.monotonic()
        decoded = decode_filter_request(body, max_bytes=self.max_body_bytes)
        if isinstance(decoded, HttpReply):
            self._state.observer.filter_done(clock.monotonic() - started, "error")
            return decoded
        answer = self._filter(decoded)
        for event in answer.events:
            self._record_event(event)
        self._state.observer.filter_done(clock.monotonic() - started, answer.outcome)
        return filter_reply(
            ExtenderFilterResult(
                nodes=tuple(answer.nodes) if answer.nodes is not None else None,
                node_names=tuple(answer.node_names) if answer.node_names is not None else None,
                failed_nodes=answer.failed_nodes,
                error=answer.error,
            )
        )

    def _filter(self, args: ExtenderArgs) -> FilterAnswer:
        if not self._is_leader():
            return FilterAnswer(error=NOT_LEADER, outcome="error")
        if not self._state.synced:
            # HAMi waits for its first registration pass (route.go: WaitForCacheSync)
            clock = self._state.clock
            deadline = clock.monotonic() + self._sync_wait
            for synced in (self._state.pods_synced, self._state.nodes_synced):
                while not synced.is_set() and (left := deadline - clock.monotonic()) > 0:
                    synced.wait(min(left, 1.0))
            if not self._state.synced:
                return FilterAnswer(error="scheduler cache not synced yet", outcome="error")
        try:
            pod = read_pod(args.pod)
        except ObjectError as error:
            return FilterAnswer(error=f"invalid pod: {error}", outcome="error")
        return self._state.filter(pod, args.node_names, args.nodes)

    def bind(self, body: bytes) -> HttpReply:
        decoded = decode_binding_request(body, max_bytes=self.max_body_bytes)
        if isinstance(decoded, HttpReply):
            return decoded
        if not self._is_leader():
            error = NOT_LEADER
        else:
            error = self._binder.bind(
                decoded.pod_namespace, decoded.pod_name, decoded.pod_uid, decoded.node
            )
        return binding_reply(ExtenderBindingResult(error=error))

    def webhook(self, body: bytes, content_type: str) -> HttpReply:
        outcome = review_admission_body(body, self._webhook, content_type=content_type)
        return admission_reply(outcome)


class TlsFiles:
    """A certificate and key served over TLS, reloaded when either file changes."""

    def __init__(self, cert_file: str, key_file: str, *, clock: Clock | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._context = self._load()
        self._checked = self._clock.monotonic()

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        result = []
        for path in (self.cert_file, self.key_file):
            info = os.stat(path)
            result.append((info.st_mtime_ns, info.st_size, info.st_ino))
        return tuple(result)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def context(self) -> ssl.SSLContext:
        """The current context; reloads the files when they changed (a bad new pair is
        logged and the old one kept)."""
        with self._lock:
            now = self._clock.monotonic()
            if now - self._checked < _TLS_RECHECK_SECONDS:
                return self._context
            self._checked = now
            try:
                signature = self._stat()
                if signature != self._signature:
                    self._context = self._load()
                    self._signature = signature
                    logger.info("TLS certificate %s reloaded", self.cert_file)
            except (OSError, ssl.SSLError) as error:
                logger.warning("TLS certificate not reloaded, keeping the old one: %s", error)
            return self._context


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: ExtenderApp, tls: TlsFiles | None) -> None:
        self.app = app
        self.tls = tls
        self.stopping = threading.Event()
        self._connections: dict[socket.socket, bool] = {}  # socket -> busy
        self._connections_lock = threading.Lock()
        self._idle = threading.Condition(self._connections_lock)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        connection: socket.socket = request
        if self.tls is not None:
            try:
                connection.settimeout(_TLS_HANDSHAKE_SECONDS)
                connection = self.tls.context().wrap_socket(connection, server_side=True)
            except (OSError, ssl.SSLError) as error:
                logger.info("TLS handshake with %s failed: %s", client_address[0], error)
                return
        with self._connections_lock:
            self._connections[connection] = False
        try:
            connection.settimeout(_IDLE_CONNECTION_SECONDS)
            _Handler(connection, client_address, self)
        except (OSError, ssl.SSLError) as error:
            logger.debug("connection from %s ended: %s", client_address[0], error)
        finally:
            with self._connections_lock:
                self._connections.pop(connection, None)
                self._idle.notify_all()
            if connection is not request:
                connection.close()

    def mark(self, connection: socket.socket, busy: bool) -> None:
        with self._connections_lock:
            if connection in self._connections:
                self._connections[connection] = busy
            self._idle.notify_all()

    def drain(self, timeout: float) -> bool:
        """Close idle connections, wait for busy ones to finish; True when all are done."""
        # real time, not the daemon's clock: a manual clock must not hold up a shutdown
        deadline = time.monotonic() + timeout
        with self._connections_lock:
            while self._connections:
                for connection, busy in list(self._connections.items()):
                    if not busy:
                        with contextlib.suppress(OSError):
                            connection.shutdown(socket.SHUT_RDWR)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.2))
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle on, the body waits for the
    # client's delayed ACK (~40 ms on Linux) on every kept-alive request.
    disable_nagle_algorithm = True
    server_version = "hami-scheduler"
    sys_version = ""

    def handle_one_request(self) -> None:
        self.server.mark(self.connection, False)
        if self.server.stopping.is_set():
            self.close_connection = True
            return
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._serve(read_body=False)

    def do_HEAD(self) -> None:
        self._serve(read_body=False)

    def do_POST(self) -> None:
        self._serve(read_body=True)

    def do_PUT(self) -> None:
        self._serve(read_body=True)

    def do_DELETE(self) -> None:
        self._serve(read_body=False)

    def _serve(self, read_body: bool) -> None:
        self.server.mark(self.connection, True)
        app = self.server.app
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body(app.body_limit(path)) if read_body else b""
            content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
            reply = app.handle(self.command, path, body, content_type)
        except _BadBodyError as error:
            self.close_connection = True
            reply = _text(400, str(error))
        except Exception:
            logger.exception("%s %s failed", self.command, path)
            reply = _text(500, "internal error")
        if self.server.stopping.is_set():
            self.close_connection = True
        self._send(reply)

    def _read_body(self, limit: int) -> bytes:
        """At most `limit + 1` bytes of the body; the connection is closed after the answer
        when more were sent (the rest is never read)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(limit)
        length_text = self.headers.get("Content-Length")
        if not length_text:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            raise _BadBodyError(f"bad Content-Length {length_text!r}") from None
        if length < 0:
            raise _BadBodyError(f"bad Content-Length {length_text!r}")
        if length > limit:
            self.close_connection = True
        return self.rfile.read(min(length, limit + 1))

    def _read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                chunk = int(line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                raise _BadBodyError("malformed chunked body") from None
            if chunk == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            if size + chunk > limit:
                self.close_connection = True
                parts.append(self.rfile.read(limit + 1 - size))
                return b"".join(parts)
            parts.append(self.rfile.read(chunk))
            size += chunk
            self.rfile.readline(1024)

    def _send(self, reply: HttpReply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)


class _BadBodyError(Exception):
    pass


class ExtenderServer:
    """Serves an `ExtenderApp` on `host:port` (port 0: a free one; see `port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        app: ExtenderApp,
        *,
        tls: TlsFiles | None = None,
    ) -> None:
        self._server = _Server((host, port), app, tls)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self._server.tls is not None else "http"

    def start(self) -> None:
        """Serve from a background thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="extender-http"
        )
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, close idle connections, let requests in progress finish (for at
        most `timeout` seconds), close the socket."""
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        if not self._server.drain(timeout):
            logger.warning("stopping with requests still in progress after %g s", timeout)
        self._server.server_close()
