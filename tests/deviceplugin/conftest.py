"""Fixtures for the device-plugin wire tests: short socket dirs, the API server double, a client."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer

FAST_RETRY = RetryPolicy(
    attempts=2, initial_backoff_seconds=0.01, max_backoff_seconds=0.05, timeout_seconds=5.0
)


@pytest.fixture
def sock_dir() -> Iterator[str]:
    """A short directory for unix sockets (pytest's tmp_path can exceed the 107-byte limit)."""
    path = tempfile.mkdtemp(prefix="hami-dp-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[KubeClient]:
    client = KubeClient(apiserver.api_client(), FAST_RETRY)
    try:
        yield client
    finally:
        client.close()
