"""Test doubles that speak the real wire protocols (HTTP API server, ...)."""

from tests.fakes.apiserver import (
    FakeApiServer,
    Fault,
    RecordedRequest,
    make_container,
    make_node,
    make_pod,
    status_body,
)

__all__ = [
    "FakeApiServer",
    "Fault",
    "RecordedRequest",
    "make_container",
    "make_node",
    "make_pod",
    "status_body",
]
