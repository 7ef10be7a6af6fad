"""Idle and half-sent connections held open on a listener, as the issue 25 attacks did, and
what a test reads from them. Sources other than 127.0.0.1 are other loopback addresses
(127.0.0.0/8 is loopback on Linux), so one test can play several clients."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
"""A request head that never ends."""


class Held:
    """`count` connections to `port` from `source`, each having sent `data` (b"": silent)."""

    def __init__(self, port: int, count: int, *, source: str = "127.0.0.2", data: bytes = b""):
        self.sockets: list[socket.socket] = []
        for _ in range(count):
            sock = socket.create_connection(
                ("127.0.0.1", port), timeout=10, source_address=(source, 0)
            )
            if data:
                sock.sendall(data)
            sock.setblocking(False)
            self.sockets.append(sock)

    def closed_by_server(self) -> int:
        """How many of them the server has closed (or reset) by now."""
        closed = 0
        for sock in self.sockets:
            try:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:  # reset
                closed += 1
        return closed

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


@contextlib.contextmanager
def holding(
    port: int, count: int, *, source: str = "127.0.0.2", data: bytes = b""
) -> Iterator[Held]:
    held = Held(port, count, source=source, data=data)
    try:
        yield held
    finally:
        held.close()


def connection_threads() -> int:
    """Threads serving a connection now, on every listener of this process (the bounded
    server names them `<listener>-connection`; any other per-connection server's threads are
    counted by `threading.active_count()`)."""
    return sum(thread.name.endswith("-connection") for thread in threading.enumerate())


def get(port: int, path: str, *, source: str = "127.0.0.1") -> tuple[int, bytes]:
    """One plain-HTTP GET on a fresh connection: status and body."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=(source, 0)
    ) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
