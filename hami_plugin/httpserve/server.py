"""The bounded HTTP/1.1 server every listener of both daemons runs on: sockets and threads here,
the framing by h11. The request line, the headers, `Content-Length` and chunked bodies are
parsed by h11, a maintained sans-I/O HTTP/1.1 implementation, so that no framing is parsed by
hand (a chunk size `-1` once passed a hand-written size check and read a connection to its end).
h11 is imported here only (import-linter checks it); the routes (`routes.Routes`: the
extender's, the webhook's, the probes', `/metrics`) see a method, a path, the body and its
Content-Type, and return a `Reply`. h11 rather than a threaded WSGI server (cheroot, wsgiref):
it frames HTTP and nothing else, so the threads, TLS (the handshake in the connection's thread,
client certificates, the reload on change), the bounds below and the drain at stop stay as they
are here.

One thread per connection, as kube-scheduler calls: its binds go out up to 16 at once, each on
its own kept-alive connection. The TLS handshake runs in the connection's thread, so a slow
client does not hold up accepting others.

What one client can cost is bounded (`ServerLimits`):

* framing that is malformed in any way (a chunk size that is not 1 to 20 hex digits, a
  chunk-size line or trailers over `max_header_bytes`, a bad or conflicting Content-Length,
  both Content-Length and Transfer-Encoding, a bad request line or header) is an HTTP 400 and
  the connection is closed;
* a head (request line and headers) over `max_header_bytes` is an HTTP 431 and the
  connection is closed;
* a body is read up to the route's limit plus one byte, never further: the route answers a body
  over its limit (the extender's JSON error answer, the webhook's refusal) and the connection is
  closed; at most `limit + 1` body bytes are ever held;
* at most `max_connections` connections (and so connection threads) at once, and at most
  `max_per_client` from one source address, so one client cannot take every slot from the
  others (kube-scheduler, kubelet, Prometheus): one more is closed as soon as it is accepted,
  logged at most once a minute;
* a kept-alive connection idle for `idle_seconds` is closed; a request must arrive whole (head
  and body, and for a new connection the TLS handshake, itself bounded by `handshake_seconds`)
  within `request_seconds` of its first byte (of the connection's accept for the first
  request), else the connection is closed (a slowloris client holds a thread that long at
  most).

A connection thread that cannot start (`RuntimeError: can't start new thread` under a pids
limit) closes that client, is logged at most once a minute, and the accept loop waits
`thread_backoff_seconds` before accepting again: it never dies of it. Should the accept loop end
any other way while the server is meant to run, `problem()` says so, and the daemon's liveness
endpoint (`hami_plugin.httpserve.probes`) fails so that kubelet restarts the pod.

After an answer that closes the connection, the server stops sending and reads (and drops) what
the client still sends for up to `linger_seconds`, so the client reads the answer rather than a
reset: closing a socket with unread bytes in it sends RST, which can discard the answer in
flight.

`stop()` stops accepting, closes idle connections, lets requests in progress finish (bounded),
then returns.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import NoReturn

import h11

from hami_plugin.httpserve.routes import Reply, Routes, TlsSource, text_reply

__all__ = [
    "BoundedServer",
    "ServerLimits",
    "ThreadStarter",
]

logger = logging.getLogger(__name__)

SERVER_NAME = b"hami-plugin"
_RECV_BYTES = 64 * 1024
_LINGER_MAX_BYTES = 1024 * 1024
_ACCEPT_POLL_SECONDS = 0.2
_LISTEN_BACKLOG = 128
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


ThreadStarter = Callable[[threading.Thread], None]
"""Starts a connection thread (`threading.Thread.start`; a test seam for its failure)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one listener lets its clients cost; see the module docstring."""

    max_connections: int = 128
    max_per_client: int = 64
    max_header_bytes: int = 64 * 1024
    idle_seconds: float = 120.0
    request_seconds: float = 10.0
    handshake_seconds: float = 5.0
    linger_seconds: float = 2.0
    log_interval_seconds: float = 60.0
    thread_backoff_seconds: float = 0.5


class _Throttled:
    """One log line at most every `interval` seconds, counting the ones left out: what a
    client can trigger at will must not flood the log."""

    def __init__(self, level: int, message: str, interval: float) -> None:
        self._level = level
        self._message = message
        self._interval = interval
        self._lock = threading.Lock()
        self._next = 0.0
        self._left_out = 0

    def __call__(self, *args: object) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._left_out += 1
                return
            left_out, self._left_out = self._left_out, 0
            self._next = now + self._interval
        if left_out:
            logger.log(self._level, self._message + " (%d more not logged)", *args, left_out)
        else:
            logger.log(self._level, self._message, *args)


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    content_type: str
    body: bytes
    complete: bool
    gzip: bool
    """The client accepts a gzip-compressed answer."""
    """False when the body went over the route's limit and the rest was left unread."""


class _ConnectionEnd(Exception):  # noqa: N818 (an ending, not an error)
    """The connection ends without a (further) answer: closed by the client, timed out,
    or answered already with the error that ends it."""


class BoundedServer:
    """Serves `routes` on `host:port` (port 0: a free one; see `port`), over TLS when `tls`
    is given. Raises OSError at construction when the address cannot be bound.

    `start_thread` starts each connection's thread (`threading.Thread.start`; tests pass one
    that fails the way a pids limit makes it fail)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Routes,
        *,
        tls: TlsSource | None = None,
        limits: ServerLimits | None = None,
        name: str = "http",
        start_thread: ThreadStarter | None = None,
    ) -> None:
        self.routes = routes
        self.tls = tls
        self.limits = limits or ServerLimits()
        self.name = name
        self.stopping = threading.Event()
        self._start_thread: ThreadStarter = start_thread or threading.Thread.start
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=_LISTEN_BACKLOG)
        self._listener.settimeout(_ACCEPT_POLL_SECONDS)
        self._port = int(self._listener.getsockname()[1])
        self._thread: threading.Thread | None = None
        self._ended: str | None = None
        self._connections: dict[_Connection, None] = {}
        self._per_client: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        interval = self.limits.log_interval_seconds
        self.log_refused = _Throttled(
            logging.WARNING,
            f"{name}: connection from %s refused: {self.limits.max_connections} connections "
            f"open, or {self.limits.max_per_client} from that address",
            interval,
        )
        self.log_no_thread = _Throttled(
            logging.ERROR, f"{name}: connection from %s closed: no thread for it: %s", interval
        )
        self.log_handshake = _Throttled(logging.INFO, "TLS handshake with %s failed: %s", interval)
        self.log_bad_request = _Throttled(logging.INFO, "bad request from %s: %s", interval)
        self.log_slow = _Throttled(logging.INFO, "closed a slow client %s: %s", interval)

    @property
    def port(self) -> int:
        return self._port

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def start(self) -> None:
        """Accept from a background thread."""
        self._thread = threading.Thread(target=self._accept_loop, name=self.name, daemon=True)
        self._thread.start()

    def problem(self) -> str | None:
        """None while the server accepts (or was stopped on purpose, or not started yet), else
        why not: what the liveness endpoint reports."""
        if self.stopping.is_set() or self._thread is None:
            return None
        if self._ended is not None:
            return f"{self.name} on port {self._port}: {self._ended}"
        if not self._thread.is_alive():
            return f"{self.name} on port {self._port}: accept loop ended"
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, close idle connections, let requests in progress finish (for at
        most `timeout` seconds), close the socket."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._listener.close()
        if not self._drain(timeout):
            logger.warning("stopping with requests still in progress after %g s", timeout)

    def _accept_loop(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    client, address = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError as error:  # out of file descriptors, say: wait, do not spin
                    logger.warning("%s: accept failed: %s", self.name, error)
                    self.stopping.wait(_ACCEPT_POLL_SECONDS)
                    continue
                if not self._admit(client, str(address[0])):
                    self.stopping.wait(self.limits.thread_backoff_seconds)
        except BaseException as error:  # a bug: say so where kubelet sees it
            self._ended = f"accept loop ended: {error!r}"
            logger.exception("%s: accept loop ended; the liveness probe fails now", self.name)

    def _admit(self, client: socket.socket, peer: str) -> bool:
        """Serve `client` on a thread of its own, or close it (over a cap: refused; no thread:
        closed). False when no thread could be started (the loop backs off)."""
        connection = _Connection(self, client, peer)
        limits = self.limits
        with self._lock:
            from_peer = self._per_client.get(peer, 0)
            admitted = (
                len(self._connections) < limits.max_connections
                and from_peer < limits.max_per_client
            )
            if admitted:
                self._connections[connection] = None
                self._per_client[peer] = from_peer + 1
        if not admitted:
            client.close()
            self.log_refused(peer)
            return True
        thread = threading.Thread(
            target=self._serve, args=(connection,), name=f"{self.name}-connection", daemon=True
        )
        try:
            self._start_thread(thread)
        except BaseException as error:
            self._release(connection)
            client.close()
            if not isinstance(error, RuntimeError):
                raise
            # "can't start new thread": a pids or memory limit
            self.log_no_thread(peer, error)
            return False
        return True

    def _serve(self, connection: _Connection) -> None:
        try:
            connection.serve()
        except _ConnectionEnd:
            pass
        except (OSError, h11.ProtocolError) as error:
            logger.debug("connection from %s ended: %s", connection.peer, error)
        except Exception:
            logger.exception("connection from %s failed", connection.peer)
        finally:
            self._release(connection)
            connection.socket.close()

    def _release(self, connection: _Connection) -> None:
        with self._lock:
            if self._connections.pop(connection, False) is None:
                left = self._per_client[connection.peer] - 1
                if left:
                    self._per_client[connection.peer] = left
                else:
                    del self._per_client[connection.peer]
            self._changed.notify_all()

    def mark(self, connection: _Connection, busy: bool) -> None:
        with self._lock:
            connection.busy = busy
            self._changed.notify_all()

    def _drain(self, timeout: float) -> bool:
        """Close idle connections, wait for busy ones to finish; True when all are done."""
        # real time, not the daemon's clock: a manual clock must not hold up a shutdown
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._connections:
                for connection in self._connections:
                    if not connection.busy:
                        connection.interrupt()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.2))
        return True


class _Connection:
    """One client connection: its socket (plain, or TLS once wrapped), its h11 state machine,
    and whether a request is being answered (what the drain at stop waits for)."""

    def __init__(self, server: BoundedServer, client: socket.socket, peer: str) -> None:
        self.server = server
        self.socket = client
        self.peer = peer
        self.busy = False
        self._limits = server.limits
        self._h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=server.limits.max_header_bytes
        )

    def interrupt(self) -> None:
        """Shut the socket down under the thread reading it (at stop)."""
        with contextlib.suppress(OSError):
            # the plain socket's shutdown, also for a TLS socket: SSLSocket.shutdown would
            # drop its TLS state under the reading thread
            socket.socket.shutdown(self.socket, socket.SHUT_RDWR)

    def serve(self) -> None:
        """Answer requests until the connection ends; raises OSError, _ConnectionEnd."""
        limits = self._limits
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        first_deadline = time.monotonic() + limits.request_seconds
        if self.server.tls is not None:
            self._handshake(self.server.tls, first_deadline)
        deadline: float | None = first_deadline
        while True:
            request = self._receive(deadline)
            reply = self._answer(request)
            if request.gzip and getattr(reply, "compress", False):
                reply = _gzipped(reply)
            close = not request.complete or self.server.stopping.is_set()
            self._send(request.method, reply, close)
            if close or self._h11.our_state is h11.MUST_CLOSE:
                self.server.mark(self, False)  # answered: a stop need not wait for the linger
                self._linger()
                return
            self._h11.start_next_cycle()
            self.server.mark(self, False)
            pipelined = self._h11.trailing_data[0]
            deadline = time.monotonic() + limits.request_seconds if pipelined else None

    def _handshake(self, tls: TlsSource, deadline: float) -> None:
        try:
            wrapped = tls.context().wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        except (OSError, ssl.SSLError) as error:
            self.server.log_handshake(self.peer, error)
            raise _ConnectionEnd from error
        self.socket = wrapped  # before the handshake: a stop can interrupt it
        try:
            wrapped.settimeout(min(self._limits.handshake_seconds, deadline - time.monotonic()))
            wrapped.do_handshake()
        except (OSError, ssl.SSLError) as error:
            self.server.log_handshake(self.peer, error)
            raise _ConnectionEnd from error

    def _receive(self, deadline: float | None) -> _Request:
        """The next request, its body cut at the route's limit plus one byte. `deadline`: when
        the request must be in whole (None: the connection is idle, waiting for one). Raises
        _ConnectionEnd (after answering a framing error), OSError."""
        connection = self._h11
        head: h11.Request | None = None
        parts: list[bytes] = []
        size = limit = 0
        head_bytes = 0  # fed while the head is incomplete
        while True:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError as error:
                # h11 hints 431 for any line over the bound; in a body (a chunk-size line,
                # the trailers) that is a malformed body, not headers too large
                too_large = error.error_status_hint == 431 and head is None
                self._refuse(431 if too_large else 400, str(error))
            if event is h11.NEED_DATA:
                if head is None and deadline is None and self.server.stopping.is_set():
                    raise _ConnectionEnd
                # h11 refuses a head over the bound only while it is incomplete: reading no
                # more than the bound before the head is in makes the bound exact
                if head is None:
                    data = self._recv(
                        deadline, max(1, self._limits.max_header_bytes + 1 - head_bytes)
                    )
                    head_bytes += len(data)
                else:
                    data = self._recv(deadline, _RECV_BYTES)
                if deadline is None:
                    deadline = time.monotonic() + self._limits.request_seconds
                connection.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                self.server.mark(self, True)
                problem = _framing_problem(event)
                if problem:
                    self._refuse(400, problem)
                limit = self.server.routes.body_limit(_path(event.target))
                if connection.they_are_waiting_for_100_continue:
                    self._write(
                        connection.send(
                            h11.InformationalResponse(
                                status_code=100, headers=[], reason=b"Continue"
                            )
                        )
                    )
            elif isinstance(event, h11.Data):
                assert head is not None
                take = limit + 1 - size
                parts.append(event.data if len(event.data) <= take else event.data[:take])
                size += min(len(event.data), take)
                if size > limit:
                    return _request(head, b"".join(parts), complete=False)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _request(head, b"".join(parts), complete=True)
            else:  # ConnectionClosed: the client hung up between requests
                raise _ConnectionEnd

    def _recv(self, deadline: float | None, size: int) -> bytes:
        """Bytes from the client (b"" at its end), waiting until `deadline` (None: the idle
        timeout). Raises _ConnectionEnd when the wait runs out."""
        if deadline is None:
            timeout = self._limits.idle_seconds
        else:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                self.server.log_slow(self.peer, "request not in whole in time")
                raise _ConnectionEnd
        self.socket.settimeout(timeout)
        try:
            return self.socket.recv(min(size, _RECV_BYTES))
        except TimeoutError:
            if deadline is not None:
                self.server.log_slow(self.peer, "request not in whole in time")
            raise _ConnectionEnd from None

    def _answer(self, request: _Request) -> Reply:
        try:
            return self.server.routes.handle(
                request.method, request.path, request.body, request.content_type
            )
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            return text_reply(500, "internal error")

    def _refuse(self, status: int, problem: str) -> NoReturn:
        """Answer a framing error and end the connection; raises _ConnectionEnd."""
        self.server.log_bad_request(self.peer, problem)
        with contextlib.suppress(h11.ProtocolError):
            self._send("", text_reply(status, f"bad request: {problem}"), close=True)
            self._linger()
        raise _ConnectionEnd

    def _send(self, method: str, reply: Reply, close: bool) -> None:
        headers = [
            (b"content-type", reply.content_type.encode()),
            (b"content-length", str(len(reply.body)).encode()),
            (b"server", SERVER_NAME),
        ]
        if isinstance(reply, _Gzipped):
            headers.append((b"content-encoding", b"gzip"))
        if close:
            headers.append((b"connection", b"close"))
        connection = self._h11
        response = h11.Response(
            status_code=reply.status, headers=headers, reason=_REASONS.get(reply.status, b"")
        )
        data = connection.send(response) or b""
        if method != "HEAD" and reply.body:
            data += connection.send(h11.Data(data=reply.body)) or b""
        connection.send(h11.EndOfMessage())
        self._write(data)

    def _write(self, data: bytes | None) -> None:
        # one write per answer: with a separate write for the body, Nagle and the client's
        # delayed ACK would hold the body back ~40 ms (TCP_NODELAY is set as well)
        self.socket.settimeout(self._limits.request_seconds)
        self.socket.sendall(data or b"")

    def _linger(self) -> None:
        limits = self._limits
        buffer = bytearray(_RECV_BYTES)
        dropped = 0
        deadline = time.monotonic() + limits.linger_seconds
        with contextlib.suppress(OSError):
            # plain socket calls on a TLS socket too: the bytes are dropped unread, and
            # SSLSocket.shutdown would drop the TLS state the answer just went out with
            socket.socket.shutdown(self.socket, socket.SHUT_WR)
            while dropped < _LINGER_MAX_BYTES and (left := deadline - time.monotonic()) > 0:
                self.socket.settimeout(left)
                count = socket.socket.recv_into(self.socket, buffer)
                if count == 0:
                    return
                dropped += count


def _path(target: bytes) -> str:
    return target.split(b"?", 1)[0].decode("ascii", "replace")


def _framing_problem(request: h11.Request) -> str:
    """What h11 accepts but a server must not (RFC 9112 6.1: a request with both is a
    smuggling attempt, and a proxy in front may have framed it the other way)."""
    names = {name for name, _ in request.headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        return "both Content-Length and Transfer-Encoding"
    return ""


@dataclass(frozen=True, slots=True)
class _Gzipped:
    status: int
    body: bytes
    content_type: str


def _gzipped(reply: Reply) -> _Gzipped:
    return _Gzipped(reply.status, gzip.compress(reply.body, compresslevel=1), reply.content_type)


def _request(head: h11.Request, body: bytes, *, complete: bool) -> _Request:
    content_type = ""
    accepts_gzip = False
    for name, value in head.headers:
        if name == b"content-type":
            content_type = value.split(b";", 1)[0].strip().decode("latin-1")
        elif name == b"accept-encoding":
            accepts_gzip = accepts_gzip or b"gzip" in value
    return _Request(
        method=head.method.decode("ascii"),
        path=_path(head.target),
        content_type=content_type,
        body=body,
        complete=complete,
        gzip=accepts_gzip,
    )
