"""Pytest fixtures for the fakes. Enabled by `pytest_plugins = ["tests.fakes.pytest_fixtures"]`
in tests/conftest.py.

* `apiserver`: a started `FakeApiServer` (empty), stopped after the test.
* `kube_api_client`: a `kubernetes.client.ApiClient` bound to `apiserver`, closed after the test.
* `kubeconfig_path`: a kubeconfig file in `tmp_path` pointing at `apiserver`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from hami_plugin.testing.apiserver import FakeApiServer


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kube_api_client(apiserver: FakeApiServer) -> Iterator[k8s.ApiClient]:
    api_client = apiserver.api_client()
    try:
        yield api_client
    finally:
        api_client.rest_client.close()
        api_client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def kubeconfig_path(apiserver: FakeApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
