"""The kubelets of the extender benchmark's nodes that have no device plugin, and the plain HTTP
the benchmark uses to reach the API server double (`bench_extender.py`).

* `ApiHttp`: one keep-alive pool to the double, JSON in and out (the bearer token the double's
  kubeconfig carries).
* `Kubelets`: a pod bound to a preloaded node is admitted at once, in the order the benchmark
  hands it over (one thread, one merge patch per pod): the in-flight rules see pods start.
* `SerialKubelets`: kubelet's pace on many nodes: each node sees a bound pod `watch_delay`
  after the Binding (one cluster-wide pod watch stands in for every kubelet's own), admits one
  pod at a time in the order the watch delivered them (kubelet's batch sort by creation second
  is not modelled: the pods of a burst arrive one by one), each admission taking
  `admission_seconds` before its "Allocate" lands as one merge patch (to-allocate emptied,
  bind-phase success, Running). With `release_node_lock` the patch is followed by what HAMi's
  device plugin does at the end of Allocate (`nodelock.ReleaseNodeLock`, pkg/util/nodelock/
  nodelock.go:175 in v2.10): the node's `hami.io/mutex.lock` deleted when it names the pod.
  Two threads and a small pool run every node (no thread per node): cheap on 2 cores.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import urllib3

from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
)
from hami_plugin.protocol.nodelock import releasable_by

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"

ADMITTED_PATCH = {
    "metadata": {
        "annotations": {ANNOTATION_BIND_PHASE: "success", ANNOTATION_DEVICES_TO_ALLOCATE: ";"}
    },
    "status": {"phase": "Running"},
}
"""What kubelet and the device plugin leave on a single-container pod after Allocate."""


class ApiHttp:
    """JSON over one thread-safe keep-alive pool to the API server double at `url`."""

    def __init__(self, url: str, *, connections: int = 16) -> None:
        self.url = url.rstrip("/")
        self._http = urllib3.PoolManager(
            maxsize=connections,
            retries=urllib3.Retry(total=3, backoff_factor=0.05),
            timeout=urllib3.Timeout(connect=10, read=60),
        )
        self._headers = {"Authorization": "Bearer fake-token", "Accept": "application/json"}

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """The status and the decoded answer (None when it is not JSON)."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        response = self._http.request(method, self.url + path, body=data, headers=headers)
        try:
            return response.status, json.loads(response.data)
        except ValueError:
            return response.status, None

    def ok(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """`request`, asserting a 2xx answer."""
        status, answer = self.request(method, path, body, content_type)
        assert 200 <= status <= 299, (method, path, status, answer)
        return answer

    def stream(self, path: str) -> urllib3.BaseHTTPResponse:
        """A GET whose body is read as it comes (a watch)."""
        return self._http.request(
            "GET", self.url + path, headers=self._headers, preload_content=False, retries=False
        )

    def pod_path(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"

    def close(self) -> None:
        self._http.clear()


class Kubelets:
    """The kubelets and device plugins of the preloaded nodes, reduced to what the scheduler
    sees of them: a pod bound there is admitted right away (bind-phase success, its GPU entries
    consumed, Running), so the in-flight rules see it start as they would in a cluster. One
    thread, one merge patch per pod, against the API server double."""

    def __init__(self, http: ApiHttp, namespace: str) -> None:
        self._http = http
        self._namespace = namespace
        self._todo: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kubelets", daemon=True)
        self._thread.start()

    def admit(self, name: str) -> None:
        self._todo.put(name)

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join(60)

    def _run(self) -> None:
        while (name := self._todo.get()) is not None:
            self._http.ok("PATCH", self._http.pod_path(self._namespace, name), ADMITTED_PATCH,
                          MERGE_PATCH)  # fmt: skip


@dataclass(slots=True)
class _Seen:
    namespace: str
    name: str
    ready_at: float
    """When this node's kubelet has it from its watch."""


@dataclass(slots=True)
class _Node:
    waiting: deque[_Seen] = field(default_factory=deque)
    admitting: _Seen | None = None
    admitted_at: float = 0.0
    """When the admission in progress is done and its patch goes out."""
    patching: bool = False


class SerialKubelets:
    """kubelet's serial admission on every node of `nodes` (module docstring).

    `start()` lists the pods (for the watch's resourceVersion) and starts; pods already bound
    then are not admitted. Results: `running_at[name]` (perf_counter when its patch answered),
    `lock_releases`, `errors` (API calls that failed; the pod is then left as it was)."""

    def __init__(
        self,
        http: ApiHttp,
        nodes: Collection[str],
        *,
        watch_delay_seconds: float = 0.05,
        admission_seconds: float = 0.03,
        release_node_lock: bool = False,
        workers: int = 8,
    ) -> None:
        self._http = http
        self._nodes = {name: _Node() for name in nodes}
        self._watch_delay = watch_delay_seconds
        self._admission = admission_seconds
        self._release_lock = release_node_lock
        self._condition = threading.Condition()
        self._due: list[tuple[float, int, str]] = []  # (when, tie-break, node) to look at
        self._sequence = itertools.count()
        self._seen: set[str] = set()  # pod UIDs
        self._stop = threading.Event()
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._patches: queue.Queue[tuple[str, _Seen] | None] = queue.Queue()
        self.running_at: dict[str, float] = {}
        self.lock_releases = 0
        self.errors: list[str] = []

    def start(self) -> SerialKubelets:
        listing = self._http.ok("GET", "/api/v1/pods")
        version = str(listing["metadata"]["resourceVersion"])
        for item in listing.get("items") or ():
            if item["spec"].get("nodeName"):
                self._seen.add(item["metadata"]["uid"])
        self._threads = [
            threading.Thread(target=self._watch, args=(version,), name="serial-kubelets-watch"),
            threading.Thread(target=self._loop, name="serial-kubelets-admit"),
            *(
                threading.Thread(target=self._allocate_loop, name=f"serial-kubelets-{i}")
                for i in range(self._workers)
            ),
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        for _ in range(self._workers):
            self._patches.put(None)
        with self._condition:
            self._condition.notify_all()
        for thread in self._threads:
            thread.join(30)

    def wait_for(self, names: Iterable[str], timeout: float) -> None:
        """Block until every pod of `names` is Running; AssertionError naming the rest if not."""
        wanted = set(names)
        with self._condition:
            if not self._condition.wait_for(lambda: wanted <= self.running_at.keys(), timeout):
                missing = sorted(wanted - self.running_at.keys())
                raise AssertionError(
                    f"{len(missing)} pods not admitted within {timeout} s: {missing[:5]} "
                    f"(kubelet errors: {self.errors[:3]})"
                )

    # --- the watch: which pods each node's kubelet has -------------------------------------

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            # a short server-side timeout, resumed from the last event: close() is prompt
            response = self._http.stream(
                f"/api/v1/pods?watch=true&resourceVersion={version}&timeoutSeconds=2"
            )
            try:
                buffered = b""
                for chunk in response.stream(65536):
                    buffered += chunk
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        if line.strip():
                            version = self._on_event(json.loads(line), version)
            except urllib3.exceptions.HTTPError as error:
                logger.warning("serial kubelets: watch ended: %s", error)
            finally:
                response.release_conn()

    def _on_event(self, event: dict[str, Any], version: str) -> str:
        obj = event.get("object") or {}
        metadata = obj.get("metadata") or {}
        if event.get("type") == "ERROR":
            raise AssertionError(f"serial kubelets: watch error {obj}")
        node = (obj.get("spec") or {}).get("nodeName")
        uid = str(metadata.get("uid"))
        phase = (obj.get("status") or {}).get("phase")
        if event.get("type") != "DELETED" and node in self._nodes and uid not in self._seen:
            self._seen.add(uid)
            if phase == "Pending":
                ready = time.perf_counter() + self._watch_delay
                with self._condition:
                    self._nodes[node].waiting.append(
                        _Seen(metadata["namespace"], metadata["name"], ready)
                    )
                    self._look_at(node, ready)
        return str(metadata.get("resourceVersion") or version)

    # --- one admission at a time per node ---------------------------------------------------

    def _look_at(self, node: str, when: float) -> None:
        """Have the loop look at `node` at `when` (the condition is held)."""
        heapq.heappush(self._due, (when, next(self._sequence), node))
        self._condition.notify_all()

    def _loop(self) -> None:
        with self._condition:
            while not self._stop.is_set():
                now = time.perf_counter()
                while self._due and self._due[0][0] <= now:
                    _, _, node = heapq.heappop(self._due)
                    self._step(node, now)
                timeout = self._due[0][0] - now if self._due else None
                self._condition.wait(timeout)

    def _step(self, name: str, now: float) -> None:
        node = self._nodes[name]
        if node.admitting is None:
            if node.waiting and node.waiting[0].ready_at <= now:
                node.admitting = node.waiting.popleft()
                node.admitted_at = now + self._admission
                self._look_at(name, node.admitted_at)
            elif node.waiting:
                self._look_at(name, node.waiting[0].ready_at)
        elif not node.patching and now >= node.admitted_at:
            node.patching = True
            self._patches.put((name, node.admitting))

    def _allocate_loop(self) -> None:
        while (job := self._patches.get()) is not None:
            name, pod = job
            try:
                self._allocate(name, pod)
            except Exception as error:  # recorded: the benchmark's wait names it
                self.errors.append(f"{pod.name}: {error}")
            now = time.perf_counter()
            with self._condition:
                node = self._nodes[name]
                node.admitting, node.patching = None, False
                if node.waiting:
                    self._look_at(name, max(now, node.waiting[0].ready_at))
                self._condition.notify_all()

    def _allocate(self, node: str, pod: _Seen) -> None:
        self._http.ok("PATCH", self._http.pod_path(pod.namespace, pod.name), ADMITTED_PATCH,
                      MERGE_PATCH)  # fmt: skip
        with self._condition:
            self.running_at[pod.name] = time.perf_counter()
        if not self._release_lock:
            return
        current = self._http.ok("GET", f"/api/v1/nodes/{quote(node)}")
        lock = (current["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_LOCK)
        if releasable_by(lock, pod.namespace, pod.name):
            patch = {"metadata": {"annotations": {ANNOTATION_NODE_LOCK: None}}}
            self._http.ok("PATCH", f"/api/v1/nodes/{quote(node)}", patch, MERGE_PATCH)
            with self._condition:
                self.lock_releases += 1
