"""The kube-scheduler stand-in follows kube-scheduler 1.24's queueing rules for failed
extender calls (`docs/kube-scheduler.md` 2-4), over real HTTP against a scripted extender and
the API server double.

"Nothing moved the pod" is shown without waiting for time to pass: watch events reach the
stand-in in order, so when a later event's move is recorded, an earlier event that should
have moved nothing has been handled and its absence from `moves` is final.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn, is_pod_updated
from tests.extender.cluster import FAST_RETRY
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

Answer = Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedExtender:
    """An extender on a loopback port: `filter` and `bind` answer each call; the bind also
    binds the pod in the API server, as ours does. Records the documents it was sent."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.filter: Answer = lambda args: {"NodeNames": args["NodeNames"][:1], "Error": ""}
        self.bind: Answer = self._bind
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                document = json.loads(self.rfile.read(length))
                owner.calls.append((self.path, document))
                answer = owner.filter(document) if self.path == "/filter" else owner.bind(document)
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="extender")
        self.thread.start()

    def _bind(self, args: dict[str, Any]) -> dict[str, Any]:
        self.kube.bind_pod(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"])
        return {"Error": ""}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for name in ("n1", "n2"):
        server.add_object(gpu_node(name, 1, protocol=True))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube(api: FakeApiServer) -> Iterator[KubeClient]:
    client = KubeClient(api.api_client(), FAST_RETRY)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def extender(kube: KubeClient) -> Iterator[ScriptedExtender]:
    server = ScriptedExtender(kube)
    try:
        yield server
    finally:
        server.stop()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def start_standin(kube: KubeClient, url: str, **kwargs: Any) -> KubeSchedulerStandIn:
    standin = KubeSchedulerStandIn(kube, url, **kwargs)
    standin.start()
    wait_until(lambda: standin.synced, "the stand-in has listed pods and nodes")
    return standin


def add_gpu_pod(api: FakeApiServer, name: str) -> None:
    pod = gpu_pod(name)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    api.add_object(pod)


def condition(api: FakeApiServer, name: str) -> dict[str, Any] | None:
    pod = api.get_pod("default", name)
    assert pod is not None
    for entry in pod.get("status", {}).get("conditions") or ():
        if entry.get("type") == "PodScheduled":
            return dict(entry)
    return None


def bound_to(api: FakeApiServer, name: str) -> str:
    pod = api.get_pod("default", name)
    assert pod is not None
    return str(pod["spec"].get("nodeName") or "")


@pytest.fixture
def parked_pod(api: FakeApiServer, kube: KubeClient) -> Iterator[tuple[KubeSchedulerStandIn, str]]:
    """A stand-in whose extender is down, and a GPU pod it parked."""
    standin = start_standin(kube, closed_port_url())
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: standin.parked() == {"default/p"}, "the pod is parked")
        yield standin, "p"
    finally:
        standin.stop()


def test_a_pod_is_filtered_then_bound_to_the_node_the_extender_returns(
    api: FakeApiServer, kube: KubeClient, extender: ScriptedExtender
) -> None:
    extender.filter = lambda args: {"NodeNames": ["n2"], "FailedNodes": {}, "Error": ""}
    standin = start_standin(kube, extender.url)
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: bound_to(api, "p") == "n2", "the pod is bound to n2")
        wait_until(lambda: standin.tried(), "the attempt is over")
        (filter_path, filter_args), (bind_path, bind_args) = extender.calls
        assert filter_path == "/filter" and bind_path == "/bind"
        assert filter_args["NodeNames"] == ["n1", "n2"]
        assert filter_args["Pod"]["metadata"]["name"] == "p"
        stored = api.get_pod("default", "p")
        assert stored is not None
        assert bind_args == {
            "PodName": "p", "PodNamespace": "default", "PodUID": stored["metadata"]["uid"],
            "Node": "n2",
        }  # fmt: skip
        assert condition(api, "p") == {"type": "PodScheduled", "status": "True"}
        assert [a.outcome for a in standin.tried()] == ["bound"]
    finally:
        standin.stop()


def test_a_failed_filter_parks_the_pod_and_writes_why_to_its_status(
    api: FakeApiServer, parked_pod: tuple[KubeSchedulerStandIn, str]
) -> None:
    standin, name = parked_pod
    wait_until(lambda: condition(api, name) is not None, "the condition is written")
    written = condition(api, name)
    assert written is not None
    assert (written["status"], written["reason"]) == ("False", "Unschedulable")
    assert written["message"].startswith(f'Post "{standin.extender_url}/filter": ')
    assert [a.outcome for a in standin.tried()] == ["error"]


def test_a_status_write_leaves_a_parked_pod_parked_and_an_annotation_moves_it(
    api: FakeApiServer,
    kube: KubeClient,
    extender: ScriptedExtender,
    parked_pod: tuple[KubeSchedulerStandIn, str],
) -> None:
    standin, name = parked_pod
    wait_until(lambda: condition(api, name) is not None, "the condition is written")
    standin.extender_url = extender.url
    kube.patch_pod_status("default", name, {"message": "a status write"})
    kube.patch_pod_metadata("default", name, {"hami-plugin.io/requeue": "now"})
    wait_until(lambda: bound_to(api, name) == "n1", "the pod is bound")
    assert [(m.pod, m.event) for m in standin.moved()] == [("default/p", "PodUpdate")]


def test_node_annotations_move_nothing_and_a_label_change_moves_every_parked_pod(
    api: FakeApiServer, kube: KubeClient, parked_pod: tuple[KubeSchedulerStandIn, str]
) -> None:
    standin, _ = parked_pod
    kube.patch_node_annotations("n1", {"hami.io/node-handshake": "Requesting_x"})
    api.update_object("nodes", "", "n1", lambda node: node["metadata"]["labels"].update(a="b"))
    wait_until(lambda: standin.moved(), "a move")
    assert [(m.pod, m.event) for m in standin.moved()] == [("default/p", "NodeUpdate")]


def test_an_assigned_pod_deleted_moves_every_parked_pod(
    api: FakeApiServer, parked_pod: tuple[KubeSchedulerStandIn, str]
) -> None:
    standin, _ = parked_pod
    running = gpu_pod("running")
    running["spec"]["nodeName"] = "n1"
    api.add_object(running)
    api.delete_pod("default", "running")
    wait_until(lambda: standin.moved(), "a move")
    assert [(m.pod, m.event) for m in standin.moved()] == [("default/p", "AssignedPodDelete")]


def test_the_flush_moves_a_pod_parked_longer_than_the_limit(
    api: FakeApiServer, kube: KubeClient
) -> None:
    standin = start_standin(
        kube, closed_port_url(), flush_after_seconds=0.3, flush_interval_seconds=0.1
    )
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: standin.moved(), "the flush")
        assert standin.moved()[0].event == "UnschedulableTimeout"
    finally:
        standin.stop()


def test_as_1_28_a_pod_rejected_by_an_error_backs_off_instead_of_parking(
    api: FakeApiServer, kube: KubeClient, extender: ScriptedExtender
) -> None:
    answers = iter([{"NodeNames": [], "Error": "not synced"}] * 2)
    extender.filter = lambda args: next(answers, {"NodeNames": ["n1"], "Error": ""})
    standin = start_standin(
        kube, extender.url, errors_to_backoff=True, initial_backoff_seconds=0.05
    )
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: bound_to(api, "p") == "n1", "the pod is bound")
        wait_until(lambda: standin.tried()[-1].outcome == "bound", "the attempt is over")
        assert [a.outcome for a in standin.tried()] == ["error", "error", "bound"]
        assert standin.moved() == []
    finally:
        standin.stop()


def test_a_failed_bind_backs_off_with_scheduler_error_and_is_tried_again(
    api: FakeApiServer, kube: KubeClient, extender: ScriptedExtender
) -> None:
    answers = iter([{"Error": "node lock taken"}])
    extender.bind = lambda args: next(answers, None) or extender._bind(args)
    standin = start_standin(kube, extender.url, initial_backoff_seconds=0.05)
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: bound_to(api, "p") == "n1", "the pod is bound")
        wait_until(lambda: standin.tried()[-1].outcome == "bound", "the attempt is over")
        outcomes = [(a.outcome, a.message) for a in standin.tried()]
        assert outcomes == [("bind-error", "binding rejected: node lock taken"), ("bound", "")]
        assert standin.moved() == []
    finally:
        standin.stop()


def test_no_node_left_parks_the_pod_saying_how_many_nodes_and_why(
    api: FakeApiServer, kube: KubeClient, extender: ScriptedExtender
) -> None:
    failed = {"n1": "CardInsufficientMemory", "n2": "CardInsufficientMemory"}
    extender.filter = lambda args: {"NodeNames": [], "FailedNodes": failed, "Error": ""}
    standin = start_standin(kube, extender.url)
    try:
        add_gpu_pod(api, "p")
        wait_until(lambda: condition(api, "p") is not None, "the condition is written")
        written = condition(api, "p")
        assert written is not None
        assert written["reason"] == "Unschedulable"
        assert written["message"] == "0/2 nodes are available: 2 CardInsufficientMemory."
        wait_until(lambda: standin.parked() == {"default/p"}, "the pod is parked")
    finally:
        standin.stop()


@pytest.mark.parametrize(
    ("change", "updated"),
    [
        (lambda pod: pod["metadata"].update(resourceVersion="9"), False),
        (lambda pod: pod["metadata"].update(managedFields=[{"manager": "x"}]), False),
        (lambda pod: pod["metadata"].update(finalizers=["f"]), False),
        (lambda pod: pod["status"].update(conditions=[{"type": "PodScheduled"}]), False),
        (lambda pod: pod["metadata"]["annotations"].update(a="b"), True),
        (lambda pod: pod["metadata"]["labels"].update(a="b"), True),
        (lambda pod: pod["spec"].update(priority=5), True),
    ],
)
def test_is_pod_updated_ignores_what_kube_scheduler_ignores(
    change: Callable[[dict[str, Any]], None], updated: bool
) -> None:
    old = gpu_pod("p")
    new = json.loads(json.dumps(old))
    change(new)
    assert is_pod_updated(old, new) is updated


def test_the_status_subresource_changes_only_the_status(
    api: FakeApiServer, kube: KubeClient
) -> None:
    add_gpu_pod(api, "p")
    patched = kube.patch_pod_status("default", "p", {"conditions": [{"type": "PodScheduled"}]})
    assert patched.scheduled is not None and patched.scheduled.status == ""
    body = {"metadata": {"annotations": {"a": "b"}}, "status": {"phase": "Running"}}
    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=10)
    try:
        for method, path, document, status in (
            ("PATCH", "/api/v1/namespaces/default/pods/p/status", body, 200),
            ("GET", "/api/v1/namespaces/default/pods/missing/status", None, 404),
            ("DELETE", "/api/v1/namespaces/default/pods/p/status", None, 405),
        ):
            connection.request(
                method,
                path,
                body=None if document is None else json.dumps(document),
                headers={"Content-Type": "application/merge-patch+json"},
            )
            response = connection.getresponse()
            response.read()
            assert response.status == status, (method, path)
    finally:
        connection.close()
    stored = api.get_pod("default", "p")
    assert stored is not None
    assert stored["status"]["phase"] == "Running"  # a status write ignores everything else
    assert "a" not in stored["metadata"]["annotations"]
    assert stored["status"]["conditions"] == [{"type": "PodScheduled"}]
