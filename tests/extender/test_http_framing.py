"""HTTP/1.1 framing and the listener's bounds, over raw sockets: malformed framing is a 400 and
the connection closed, bodies are cut at the route's limit plus one byte, heads and connections
are bounded, idle and slow clients are closed, and one huge body leaves the daemon's memory flat.

Most tests run an `BoundedServer` over a recording stand-in for the routes, with small limits
(a deadline of a fraction of a second, two connections); the ones about the extender's own
answers run the daemon, in process or as `hami scheduler`.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from hami_plugin.extender.wire import HttpReply
from hami_plugin.httpserve.server import BoundedServer, ServerLimits
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import running_scheduler
from tests.processes import LoggedProcess, wait_until

HAMI = str(Path(sys.executable).with_name("hami"))
LIMIT = 4096
MIB = 1024 * 1024


class RecordingRoutes:
    """Answers every request with what it received; `/hold` waits for `release`."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.seen: list[tuple[str, str, bytes, str]] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    def body_limit(self, path: str) -> int:
        return self.limit

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> HttpReply:
        self.seen.append((method, path, body, content_type))
        if path == "/hold":
            self.holding.set()
            self.release.wait(20)
        answer = {"method": method, "path": path, "bytes": len(body)}
        return HttpReply(200, json.dumps(answer).encode(), "application/json")


@contextmanager
def serving(routes: RecordingRoutes, limits: ServerLimits | None = None) -> Iterator[BoundedServer]:
    server = BoundedServer("127.0.0.1", 0, routes, limits=limits)
    server.start()
    try:
        yield server
    finally:
        routes.release.set()
        server.stop(10)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool
    """The server closed the connection after the answer."""


class _KeptFile:
    """The connection's reader, which HTTPResponse may close without losing what it buffered."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def close(self) -> None:
        pass


class Client:
    """A raw connection, and one buffered reader for its answers (pipelined answers arrive
    together: a reader per answer would lose what the first one read ahead)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._file = self.sock.makefile("rb")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self.sock.close()

    def makefile(self, mode: str) -> _KeptFile:
        return _KeptFile(self._file)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readline(self) -> bytes:
        return self._file.readline()

    def answer(self, method: str = "POST") -> Answer:
        response = http.client.HTTPResponse(self, method=method)  # type: ignore[arg-type]
        response.begin()
        body = response.read()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return Answer(response.status, headers, body, closed=False)

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """Whether the server closes (EOF or reset) within `timeout` s, sending nothing
        more."""
        self.sock.settimeout(timeout)
        try:
            return self._file.read(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def exchange(port: int, data: bytes, method: str = "POST") -> Answer:
    """Send `data` on a new connection; the answer, and whether the server then closed."""
    with Client(port) as client:
        client.sendall(data)
        answer = client.answer(method)
        answer.closed = client.closed_by_server()
        return answer


def serves(port: int) -> bool:
    """Whether a new connection gets GET /healthz answered (HTTP 200)."""
    with Client(port) as client:
        client.sendall(GOOD)
        return client.answer("GET").status == 200


def chunked(*lines: bytes, path: bytes = b"/filter") -> bytes:
    head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(lines)


def with_length(length: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: "
        + length
        + b"\r\n"
        + extra
        + (b"\r\n" + body)
    )


GOOD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

MALFORMED = {
    "chunk size -1": chunked(b"-1\r\n", b"x" * 1000),
    "chunk size 0x10": chunked(b"0x10\r\n", b"y" * 16, b"\r\n0\r\n\r\n"),
    "chunk size +5": chunked(b"+5\r\n", b"hello\r\n0\r\n\r\n"),
    "chunk size of 21 digits": chunked(b"0" * 20 + b"5\r\nhello\r\n0\r\n\r\n"),
    "chunk size line over the bound": chunked(b"a" * 70_000),
    "chunk longer than its size": chunked(b"3\r\nabcdef\r\n0\r\n\r\n"),
    "Content-Length not a number": with_length(b"abc", b"abc"),
    "Content-Length negative": with_length(b"-5", b"hello"),
    "Content-Length given twice, differently": with_length(
        b"5", b"hello", b"Content-Length: 6\r\n"
    ),
    "Content-Length and Transfer-Encoding": with_length(
        b"5", b"5\r\nhello\r\n0\r\n\r\n", b"Transfer-Encoding: chunked\r\n"
    ),
    "Transfer-Encoding not chunked": (
        b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxxxx"
    ),
    "request line": b"NOT AN HTTP REQUEST\r\n\r\n",
    "header without a colon": b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "HTTP/1.1 without Host": b"GET /healthz HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_framing_is_a_400_and_the_connection_closed(data: bytes) -> None:
    routes = RecordingRoutes()
    with serving(routes) as server:
        answer = exchange(server.port, data)
        assert answer.status == 400
        assert answer.body.startswith(b"bad request: ")
        assert answer.headers["connection"] == "close"
        assert answer.closed
        assert routes.seen == []  # the routes never saw it
        assert serves(server.port)  # and the server lives on


@pytest.mark.parametrize(
    "data",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Flood: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 0123456789abcdef\r\n" * 4000 + b"\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["one long header", "many headers", "long target"],
)
def test_a_head_over_the_bound_is_a_431(data: bytes) -> None:
    routes = RecordingRoutes()
    with serving(routes) as server:
        answer = exchange(server.port, data, "GET")
    assert (answer.status, answer.closed) == (431, True)
    assert routes.seen == []


def test_a_head_under_the_bound_is_served() -> None:
    routes = RecordingRoutes()
    with serving(routes) as server, Client(server.port) as client:
        client.sendall(
            b"GET /x HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 0123456789abcdef\r\n" * 1000 + b"\r\n"
        )
        assert client.answer("GET").status == 200


@pytest.mark.parametrize(
    "data",
    [
        chunked(b"FFFFFFFF\r\n", b"z" * 10_000),
        chunked(b"800\r\n", b"z" * 0x800, b"\r\n", b"801\r\n", b"z" * 0x801, b"\r\n0\r\n\r\n"),
        with_length(b"10000", b"z" * 10_000),
        with_length(b"99999999999", b"z" * 10_000),
    ],
    ids=["one huge chunk", "two chunks over the limit", "Content-Length", "Content-Length huge"],
)
def test_a_body_over_the_limit_is_cut_at_limit_plus_one_and_the_connection_closed(
    data: bytes,
) -> None:
    routes = RecordingRoutes()
    with serving(routes) as server:
        answer = exchange(server.port, data)
    assert (answer.status, answer.closed) == (200, True)
    assert json.loads(answer.body)["bytes"] == LIMIT + 1
    assert [len(body) for _, _, body, _ in routes.seen] == [LIMIT + 1]


def test_a_body_at_the_limit_is_served_whole_and_the_connection_kept() -> None:
    routes = RecordingRoutes()
    with serving(routes) as server, Client(server.port) as client:
        client.sendall(
            chunked(b"1000;name=value\r\n", b"b" * LIMIT, b"\r\n0\r\nX-Trailer: 1\r\n\r\n")
        )
        assert json.loads(client.answer().body)["bytes"] == LIMIT
        client.sendall(
            with_length(b"2", b"ok", b"Content-Type: application/json; charset=utf-8\r\n")
        )
        assert json.loads(client.answer().body)["bytes"] == 2  # the same connection
    assert routes.seen[1] == ("POST", "/filter", b"ok", "application/json")


def test_pipelined_requests_are_answered_in_order() -> None:
    routes = RecordingRoutes()
    with serving(routes) as server, Client(server.port) as client:
        client.sendall(
            b"GET /a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            + with_length(b"3", b"abc")
            + b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answers = [client.answer(method) for method in ("GET", "POST", "GET")]
        assert client.closed_by_server()
    assert [json.loads(answer.body)["path"] for answer in answers] == ["/a", "/filter", "/c"]
    assert answers[2].headers["connection"] == "close"


def test_head_answers_the_length_without_the_body(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver) as scheduler, Client(scheduler.daemon.port) as client:
        client.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + GOOD)
        head = client.answer("HEAD")
        get = client.answer("GET")  # parsed right: nothing came between the two
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", "3")
    assert (get.status, get.body) == (200, b"ok\n")


def test_expect_100_continue_gets_a_continue_before_the_body() -> None:
    routes = RecordingRoutes()
    with serving(routes) as server, Client(server.port) as client:
        client.sendall(with_length(b"5", b"", b"Expect: 100-continue\r\n"))
        assert (client.readline(), client.readline()) == (b"HTTP/1.1 100 Continue\r\n", b"\r\n")
        client.sendall(b"hello")
        assert json.loads(client.answer().body)["bytes"] == 5


def test_connections_over_the_bound_are_closed_at_once_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = RecordingRoutes()
    caplog.set_level(logging.WARNING, "hami_plugin.httpserve.server")
    with serving(routes, ServerLimits(max_connections=2, log_interval_seconds=3600)) as server:
        first, second = Client(server.port), Client(server.port)
        try:
            for client in (first, second):  # both admitted, kept alive
                client.sendall(GOOD)
                assert client.answer("GET").status == 200
            for _ in range(3):
                with Client(server.port) as refused:
                    assert refused.closed_by_server()  # nothing answered, closed at once
            first.close()
            wait_until(lambda: server.connection_count == 1, what="the first connection gone")
            assert serves(server.port)
        finally:
            first.close()
            second.close()
    refusals = [record for record in caplog.records if "refused" in record.getMessage()]
    assert len(refusals) == 1
    assert "2 connections open" in refusals[0].getMessage()


@pytest.mark.parametrize(
    ("head", "trickle"),
    [
        (b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a"),
        (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", b"b"),
        (b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\nc\r\n"),
    ],
    ids=["head", "body", "chunks"],
)
def test_a_slow_client_is_closed_at_the_request_deadline(head: bytes, trickle: bytes) -> None:
    routes = RecordingRoutes()
    with (
        serving(routes, ServerLimits(request_seconds=0.5, idle_seconds=3600)) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
    ):
        sock.sendall(head)
        sock.settimeout(0.05)
        for _ in range(2000):  # 100 s of trickling if the server never gave up
            try:
                sock.sendall(trickle)
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                break
        else:
            pytest.fail("the server kept reading a request that never ended")
    assert routes.seen == []


def test_a_connection_that_sends_nothing_is_closed_at_the_first_request_deadline() -> None:
    limits = ServerLimits(request_seconds=0.3, idle_seconds=3600)
    with serving(RecordingRoutes(), limits) as server, Client(server.port) as client:
        assert client.closed_by_server()


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    limits = ServerLimits(idle_seconds=0.3, request_seconds=3600)
    with serving(RecordingRoutes(), limits) as server, Client(server.port) as client:
        client.sendall(GOOD)
        answer = client.answer("GET")
        assert answer.status == 200 and "connection" not in answer.headers  # kept alive
        assert client.closed_by_server()


def test_stop_finishes_the_request_in_progress_and_closes_idle_connections() -> None:
    routes = RecordingRoutes()
    server = BoundedServer("127.0.0.1", 0, routes)
    server.start()
    with Client(server.port) as idle, Client(server.port) as busy:
        idle.sendall(GOOD)
        assert idle.answer("GET").status == 200
        busy.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        assert routes.holding.wait(10)
        stopper = threading.Thread(target=server.stop, args=(10,))
        stopper.start()
        assert idle.closed_by_server()
        assert stopper.is_alive()  # waiting for the request in progress
        routes.release.set()
        answer = busy.answer("GET")
        stopper.join(10)
    assert (answer.status, answer.headers["connection"]) == (200, "close")
    assert not stopper.is_alive()


def test_an_over_cap_filter_body_gets_the_json_answer(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver, max_body_bytes=4096) as scheduler:
        answer = exchange(scheduler.daemon.port, chunked(b"FFFFFFFF\r\n", b"{" * 8000))
        assert (answer.status, answer.closed) == (200, True)
        assert json.loads(answer.body)["Error"] == "request body larger than 4096 bytes"
        answer = exchange(scheduler.daemon.port, chunked(b"-1\r\n", b"{" * 8000))
        assert (answer.status, answer.closed) == (400, True)


def _stream(port: int, head: bytes, total: int) -> int:
    """Send `head` and then up to `total` bytes; how many went out before the server stopped
    taking them."""
    block = b"7" * MIB
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(head)
            while sent < total:
                sock.sendall(block)
                sent += len(block)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
    return sent


def test_a_huge_body_leaves_the_daemons_memory_flat(kubeconfig_path: Path, tmp_path: Path) -> None:
    process = LoggedProcess(
        "scheduler",
        [
            HAMI, "scheduler", "--kubeconfig", str(kubeconfig_path), "--http-bind",
            "127.0.0.1:0", "--metrics-bind-address", "0",
        ],
        tmp_path,
    )  # fmt: skip
    try:
        port = int(process.wait_for_log(r"serving on http://127\.0\.0\.1:(\d+)").group(1))
        assert serves(port)
        before = process.memory_kib()
        heads = [
            chunked(b"-1\r\n"),
            chunked(b"FFFFFFFFFFFFFFFFFFFF\r\n"),
            with_length(str(200 * MIB).encode(), b""),
        ]
        sent = [_stream(port, head, 200 * MIB) for head in heads]
        after = process.memory_kib()
        assert serves(port)
    finally:
        status = process.stop()
    assert status == 0
    # the server stopped reading each stream at once: a few MiB in socket buffers and the
    # linger, not 200
    assert all(count < 32 * MIB for count in sent), sent
    for figure in ("VmRSS", "VmHWM"):
        assert after[figure] - before[figure] < 30 * 1024, (figure, before, after)
