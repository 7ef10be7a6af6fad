"""The double's HTTP/1.1 server: a `ThreadingHTTPServer` on 127.0.0.1 (random port) whose
handler records each request, applies the first matching fault, streams watches as chunked
newline-delimited JSON and answers everything else through `routes`."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hami_plugin.testing.apiserver import routes
from hami_plugin.testing.apiserver.request import RecordedRequest, RequestLog
from hami_plugin.testing.apiserver.status import ApiError, status_body
from hami_plugin.testing.apiserver.store import ObjectStore
from hami_plugin.testing.apiserver.watch import Watch, Watches

logger = logging.getLogger(__name__)


class HttpServer(ThreadingHTTPServer):
    """Serves `store` over HTTP; `stopping` cuts short the hangs of injected faults."""

    # Handler threads are joined by server_close() so a test never leaks one.
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(
        self,
        store: ObjectStore,
        watches: Watches,
        log: RequestLog,
        stopping: threading.Event,
    ) -> None:
        self.store = store
        self.watches = watches
        self.log = log
        self.stopping = stopping
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake handler threads blocked reading a kept-alive connection."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY the client's delayed ACK
    # adds ~40 ms to every kept-alive request.
    disable_nagle_algorithm = True
    server: HttpServer
    timeout = 30  # an idle kept-alive connection is dropped after this

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def _serve(self) -> None:
        server = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = RecordedRequest(
            method=self.command,
            path=url.path,
            query=parse_qs(url.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            content_type=(self.headers.get("Content-Type") or "").split(";")[0].strip(),
            body=body,
            query_string=url.query,
        )
        fault = server.log.record(request)
        if fault is not None:
            if fault.hang_seconds:
                server.stopping.wait(fault.hang_seconds)
            if fault.disconnect:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault.status is not None or fault.body is not None:
                status = fault.status or 200
                payload = fault.body
                if payload is None:
                    payload = json.dumps(status_body(status)).encode()
                self._send(status, payload, fault.headers)
                return
        try:
            watch = server.watches.open(request)
        except ApiError as exc:
            self._send(exc.code, json.dumps(exc.status_body()).encode(), {})
            return
        if watch is not None:
            try:
                self._stream(watch)
            finally:
                server.watches.close(watch)
            return
        try:
            status, answer = routes.handle(server.store, request)
        except ApiError as exc:
            status, answer = exc.code, exc.status_body()
        except Exception as exc:  # a bug in the fake: answer 500 and say so in the log
            logger.exception("fake API server failed on %s %s", request.method, request.path)
            status, answer = 500, ApiError(500, "InternalError", str(exc)).status_body()
        server.log.answered(request, status)
        self._send(status, json.dumps(answer).encode(), {})

    def _stream(self, watch: Watch) -> None:
        """Serve a watch: chunked newline-delimited JSON events until it ends."""
        watches = self.server.watches
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                events, end = watches.next_events(watch, self._client_gone)
                # One chunk per event, as the API server flushes them; one write per batch.
                chunks = []
                for event in events:
                    line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                    chunks.append(b"%x\r\n%s\r\n" % (len(line), line))
                if end == "dropped":
                    break
                if end is not None:
                    chunks.append(b"0\r\n\r\n")
                self.wfile.write(b"".join(chunks))
                if end is not None:
                    return
        except OSError:
            pass  # the client went away
        # Dropped: no terminating chunk, the connection cut as a failing server or proxy does.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _client_gone(self) -> bool:
        """Whether the client closed its end (a watch client sends nothing while it reads)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _send(self, status: int, payload: bytes, headers: Mapping[str, str]) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            # The client gave up (timeout) and closed the socket.
            self.close_connection = True
