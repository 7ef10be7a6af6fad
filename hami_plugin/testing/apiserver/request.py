"""What the double received, and the rules that change its answers: every request is recorded
(`FakeApiServer.requests`), and the first `Fault` that matches it decides the answer."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Header names in lower case."""
    content_type: str
    body: bytes
    query_string: str = ""
    """The raw query (after `?`), as sent."""

    def json(self) -> Any:
        """The body decoded as JSON (raises ValueError if it is not JSON)."""
        return json.loads(self.body)

    def param(self, name: str) -> str | None:
        """The last value of query parameter `name`, or None when it was not sent."""
        values = self.query.get(name)
        return values[-1] if values else None


@dataclass(slots=True)
class Fault:
    """A rule that changes the answer to matching requests; see `FakeApiServer.inject_fault`."""

    method: str
    path: str
    times: int | None
    status: int | None = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang_seconds: float = 0.0
    disconnect: bool = False
    query: str = ".*"
    fired: int = 0
    """How many requests this rule has answered so far."""

    def _matches(self, request: RecordedRequest) -> bool:
        return (
            (self.times is None or self.fired < self.times)
            and re.fullmatch(self.method, request.method, re.IGNORECASE) is not None
            and re.fullmatch(self.path, request.path) is not None
            and re.fullmatch(self.query, request.query_string) is not None
        )


class RequestLog:
    """The requests received so far and the faults in force. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._answers: list[tuple[RecordedRequest, int]] = []
        self._faults: list[Fault] = []

    def record(self, request: RecordedRequest) -> Fault | None:
        """Log `request`; returns the first fault that answers it (counted as fired), if any."""
        with self._lock:
            self._requests.append(request)
            for fault in self._faults:
                if fault._matches(request):
                    fault.fired += 1
                    return fault
        return None

    def answered(self, request: RecordedRequest, status: int) -> None:
        """Log the status the store answered `request` with (not watches, not faults)."""
        with self._lock:
            self._answers.append((request, status))

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def answers(self) -> list[tuple[RecordedRequest, int]]:
        """Every request the store answered, with the status, oldest first (a copy)."""
        with self._lock:
            return list(self._answers)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()
            self._answers.clear()
