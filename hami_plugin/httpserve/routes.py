"""What a listener's routes see and answer (`server.BoundedServer` calls them): a method, a
path, the body and its Content-Type in; a `Reply` out. No sockets here."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "TEXT_CONTENT_TYPE",
    "PlainReply",
    "Reply",
    "Routes",
    "TlsSource",
    "text_reply",
]

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


class Reply(Protocol):
    """What a route answers (`hami_plugin.extender.wire.HttpReply`, `PlainReply`)."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...

    @property
    def content_type(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PlainReply:
    """A status, a body and its Content-Type."""

    status: int
    body: bytes
    content_type: str = TEXT_CONTENT_TYPE
    compress: bool = False
    """Sent gzip-compressed (level 1) to a client that accepts it (`/metrics`: a node's
    1.5 MB of samples shrink ~10x in a few ms; level 9 costs more than rendering them)."""


def text_reply(status: int, message: str) -> PlainReply:
    """A plain-text answer, one line."""
    return PlainReply(status, (message + "\n").encode())


class TlsSource(Protocol):
    """Where a TLS listener gets its context from, per connection
    (`hami_plugin.extender.tls.TlsFiles`: reloaded when the files change)."""

    def context(self) -> ssl.SSLContext: ...


class Routes(Protocol):
    """What a listener serves. Both methods are called from many connection threads at once."""

    def body_limit(self, path: str) -> int:
        """How many body bytes a request to `path` may carry."""

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> Reply:
        """The answer to one request; `body` longer than `body_limit(path)` (by one byte) when
        the client sent more than that."""
