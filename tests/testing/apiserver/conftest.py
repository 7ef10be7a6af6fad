"""Fixtures for the API server double's tests: a raw HTTP pool and the real client's CoreV1Api
(the `apiserver` fixture itself comes from `tests.fakes.pytest_fixtures`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client as k8s

from hami_plugin.testing.apiserver import FakeApiServer


@pytest.fixture
def http() -> Iterator[urllib3.PoolManager]:
    pool = urllib3.PoolManager(retries=False, timeout=5.0)
    yield pool
    pool.clear()


@pytest.fixture
def core(apiserver: FakeApiServer) -> Iterator[k8s.CoreV1Api]:
    api_client = apiserver.api_client()
    yield k8s.CoreV1Api(api_client)
    api_client.rest_client.close()
