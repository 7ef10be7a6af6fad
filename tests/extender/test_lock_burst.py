"""A burst of binds onto one node run by HAMi's device plugin, over the wire: the binds queue
for the node lock in arrival order, and only the head of the queue tries it, so the burst
binds without a herd of conflicting node patches."""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest

from hami_plugin.extender.lockqueue import LockTicket, NodeLockQueue
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod

NODE_PATH = "/api/v1/nodes/n1"
BURST = 12


class HamiDevicePlugin:
    """Plays HAMi's device plugin on node n1: a little after the pod holding the node lock is
    bound (its Allocate is done), the lock is released (the annotation deleted)."""

    def __init__(self, api: FakeApiServer, release_after_seconds: float = 0.05) -> None:
        self._api = api
        self._delay = release_after_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hami-device-plugin")

    def __enter__(self) -> HamiDevicePlugin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            node = self._api.get_node("n1")
            assert node is not None
            value = node["metadata"].get("annotations", {}).get(ANNOTATION_NODE_LOCK)
            if not value:
                continue
            pod = self._api.get_pod("default", value.rsplit(",", 1)[-1])
            if pod is None or not pod["spec"].get("nodeName"):
                continue
            if self._stop.wait(self._delay):
                return
            release = functools.partial(self._release, value=value)
            self._api.update_object("nodes", "", "n1", release)

    @staticmethod
    def _release(node: dict[str, Any], value: str) -> None:
        annotations = node["metadata"]["annotations"]
        if annotations.get(ANNOTATION_NODE_LOCK) == value:
            del annotations[ANNOTATION_NODE_LOCK]


def lock_writes(api: FakeApiServer, status: int) -> list[str]:
    """The pods whose lock our binds wrote on n1 with that answer, in the order written."""
    owners = []
    for request in api.answered_with(status, "PATCH", NODE_PATH):
        value = request.json()["metadata"]["annotations"].get(ANNOTATION_NODE_LOCK)
        if value:
            owners.append(value.rsplit(",", 1)[-1])
    return owners


def test_a_burst_takes_the_node_lock_in_arrival_order_without_conflicts(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.add_object(gpu_node("n1", 4))  # 16 shares: room for the whole burst
    pods = [apiserver.add_object(gpu_pod(f"p{i:02d}")) for i in range(BURST)]
    arrivals: list[str] = []
    arrivals_lock = threading.Lock()
    enter = NodeLockQueue.enter

    def recording_enter(queue: NodeLockQueue, node: str, pod_key: str) -> LockTicket:
        with arrivals_lock:  # the order recorded is the order queued
            ticket = enter(queue, node, pod_key)
            arrivals.append(pod_key.split("/")[1])
            return ticket

    monkeypatch.setattr(NodeLockQueue, "enter", recording_enter)
    with running_scheduler(apiserver, node_lock_retry_timeout_seconds=28.0) as scheduler:
        for pod in pods:
            scheduler.sees_pod("default", pod["metadata"]["name"], lambda p: True)
            assert scheduler.filter(pod, ["n1"])["NodeNames"] == ["n1"]
        apiserver.clear_requests()
        results: dict[str, str] = {}
        threads = [
            threading.Thread(
                target=lambda p=p: results.update({p["metadata"]["name"]: scheduler.bind(p, "n1")})
            )
            for p in pods
        ]
        with HamiDevicePlugin(apiserver):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        failed = [e["message"] for e in apiserver.events() if e["reason"] == "BindingFailed"]
    assert results == {p["metadata"]["name"]: "" for p in pods}
    assert failed == []
    bound = {p["metadata"]["name"] for p in apiserver.objects("pods") if p["spec"].get("nodeName")}
    assert bound == set(results)
    # every bind queued, and each took the lock once, in the order the binds arrived
    assert sorted(arrivals) == sorted(results)
    assert lock_writes(apiserver, 200) == arrivals
    # only the head of the queue tries the lock: no herd of conflicting patches
    conflicts = lock_writes(apiserver, 409)
    assert len(conflicts) <= 1, conflicts
    gets = len(apiserver.requests_matching("GET", NODE_PATH))
    print(f"{BURST} binds: {gets} node GETs, {len(conflicts)} lock patches refused (409)")
