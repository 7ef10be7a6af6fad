"""Fixtures for the device-plugin wire tests: short socket dirs, the API server double, a client."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.allocate import AllocateConfig
from hami_plugin.deviceplugin.allocator import ApiFallback, PodAllocator
from hami_plugin.deviceplugin.nodecache import CacheNotListedError, NodeCache
from hami_plugin.deviceplugin.writebehind import WriteBehind
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from tests.deviceplugin.pods import NODE
from tests.processes import wait_until

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


@pytest.fixture
def allocator_parts(
    apiserver: FakeApiServer, kube: KubeClient, tmp_path: Path
) -> Iterator[tuple[PodAllocator, NodeCache, WriteBehind, ManualClock]]:
    """A PodAllocator with the node's watch and a write-behind queue whose worker is not
    started (what it queues stays queued), on a manual clock."""
    apiserver.add_node(NODE)
    stop = threading.Event()
    cache = NodeCache(kube, NODE)
    cache.start(stop)
    writes = WriteBehind(kube)
    clock = ManualClock()
    install_fake_hamicore(tmp_path / "hook")
    allocator = PodAllocator(
        kube,
        NODE,
        AllocateConfig(hook_path=str(tmp_path / "hook"), vgpulock_host_path=str(tmp_path)),
        fallback=ApiFallback(cache, writes),
        clock=clock,
    )
    try:
        wait_until(lambda: _listed(cache), "the watches listed")
        yield allocator, cache, writes, clock
    finally:
        stop.set()
        writes.stop()


def _listed(cache: NodeCache) -> bool:
    try:
        cache.node()
        cache.pods()
    except CacheNotListedError:
        return False
    return True
