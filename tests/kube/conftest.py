"""Fixtures of the hami_plugin.kube tests: `kube`, a client of the `apiserver` double whose
backoffs are recorded in `sleeps` instead of waited."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from tests.kube.support import FAST, SleepRecorder


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def kube(apiserver: FakeApiServer, sleeps: SleepRecorder) -> Iterator[KubeClient]:
    with KubeClient(apiserver.api_client(), FAST, sleep=sleeps, rng=random.Random(7)) as client:
        yield client
