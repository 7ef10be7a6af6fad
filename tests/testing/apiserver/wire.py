"""Helpers for the API server double's tests: raw HTTP requests, watch streams read event by
event, and the real client's watch."""

from __future__ import annotations

import json
from typing import Any

import urllib3

from hami_plugin.testing.apiserver import FakeApiServer

MERGE = "application/merge-patch+json"


def call(
    http: urllib3.PoolManager,
    server: FakeApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """Send one request; returns its status and its JSON body."""
    payload = None if body is None else json.dumps(body).encode()
    response = http.request(
        method, server.url + path, body=payload, headers={"Content-Type": content_type}
    )
    return response.status, json.loads(response.data)


def open_watch(
    http: urllib3.PoolManager, server: FakeApiServer, path_and_query: str
) -> urllib3.BaseHTTPResponse:
    """Open a watch (or any request) without reading its body."""
    return http.request(
        "GET",
        server.url + path_and_query,
        preload_content=False,
        timeout=urllib3.Timeout(connect=5.0, read=30.0),
    )


class Stream:
    """Reads a raw watch response event by event (one JSON object per line)."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self.response = response
        self._chunks = response.read_chunked()
        self._buffer = b""

    def next_event(self) -> dict[str, Any] | None:
        """The next event, or None when the stream ended cleanly (the terminating chunk)."""
        while b"\n" not in self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                assert self._buffer == b""
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        event: dict[str, Any] = json.loads(line)
        return event

    def close(self) -> None:
        """Give up on an unfinished stream: its connection must not go back to the pool."""
        self.response.close()
        self.response.release_conn()

    def take(self, count: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for _ in range(count):
            event = self.next_event()
            assert event is not None, f"stream ended after {events}"
            events.append(event)
        return events

    def rest(self) -> list[dict[str, Any]]:
        """Every event up to the clean end of the stream."""
        events = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of each event."""
    return [
        (
            e["type"],
            e["object"]["metadata"].get("name", ""),
            e["object"]["metadata"]["resourceVersion"],
        )
        for e in events
    ]


def k8s_watch() -> Any:
    """A `kubernetes.watch.Watch`."""
    from kubernetes import watch

    return watch.Watch()  # type: ignore[no-untyped-call]  # the client ships no type hints
