"""The extender's routes over real HTTP: HAMi's JSON shapes, probes, bad bodies, TLS (framing:
`test_http_framing.py`; client certificates and the webhook listener: `test_mtls.py`)."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
from pathlib import Path

import pytest

from hami_plugin.extender.daemon import Elector
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_NODE,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.extender.certs import Authority, client_context
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import cpu_pod, gpu_node, gpu_pod
from tests.processes import wait_until


def test_filter_fit_answers_only_the_chosen_node(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1", 2))
    apiserver.add_object(gpu_node("n2", 1))
    with running_scheduler(apiserver) as scheduler:
        status, body, headers = scheduler.request(
            "POST",
            "/filter",
            json.dumps({"Pod": gpu_pod("a"), "NodeNames": ["n1", "n2"]}).encode(),
            {"Content-Type": "application/json"},
        )
    assert status == 200
    assert headers["content-type"] == "application/json"
    # binpack: both nodes are empty, so the tie goes to the smaller name
    assert body == (
        b'{"Nodes":null,"NodeNames":["n1"],"FailedNodes":null,'
        b'"FailedAndUnresolvableNodes":null,"Error":""}'
    )


def test_filter_no_fit_lists_hamis_reasons(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("small", 1, memory=500))
    with running_scheduler(apiserver) as scheduler:
        result = scheduler.filter(gpu_pod("a"), ["small", "cpu-only"])
        assert result == {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {
                "cpu-only": "node unregistered",
                "small": "1/1 CardInsufficientMemory",
            },
            "FailedAndUnresolvableNodes": None,
            "Error": "",
        }
        assert scheduler.observer.named("filter_done") == ["no_fit"]


def test_lowercase_go_keys_and_quantity_suffixes(apiserver: FakeApiServer) -> None:
    """Go decodes field names case-insensitively; `1k` MiB is 1000 MiB."""
    apiserver.add_object(gpu_node("n1", 1, memory=999))
    apiserver.add_object(gpu_node("n2", 1, memory=1000))
    pod = make_pod(
        "k",
        containers=[make_container("c", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1k"})],
    )
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post("/filter", {"pod": pod, "nodenames": ["n1", "n2"]})
    assert status == 200
    assert result["NodeNames"] == ["n2"]
    assert result["FailedNodes"] is None


def test_pod_without_gpu_passes_node_names_untouched(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver) as scheduler:
        result = scheduler.filter(cpu_pod("web"), ["x", "y"])
    assert result["NodeNames"] == ["x", "y"]
    assert result["Error"] == ""


def test_nodes_form_is_hamis_simulation(apiserver: FakeApiServer) -> None:
    roomy = gpu_node("roomy", 2)
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post(
            "/filter",
            {"Pod": gpu_pod("a"), "Nodes": {"items": [gpu_node("full", 1, memory=10), roomy]}},
        )
        assert scheduler.state.bookings() == {}
    assert status == 200
    assert result["NodeNames"] is None
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == ["roomy"]
    assert result["FailedNodes"] == {"full": "1/1 CardInsufficientMemory"}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{", "unexpected EOF"),
        (b"[1]", "json: cannot unmarshal array into Go value of type v1.ExtenderArgs"),
        (b'{"NodeNames":["a"]}', "extender args missing pod"),
    ],
)
def test_malformed_filter_body_is_an_error_answer(
    apiserver: FakeApiServer, body: bytes, error: str
) -> None:
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post("/filter", body)
    assert status == 200
    assert result["Error"] == error
    assert result["NodeNames"] is None


def test_malformed_bind_body_and_empty_body(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post("/bind", b"not json")
        assert status == 200
        assert result["Error"].startswith("invalid character")
        status, result = scheduler.post("/bind", b"")
        assert status == 200
        assert result == {"Error": "EOF"}


def test_body_over_the_cap_is_refused_clearly(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver, max_body_bytes=4096) as scheduler:
        pod = gpu_pod("big", annotations={"filler": "x" * 8000})
        status, result = scheduler.post("/filter", {"Pod": pod, "NodeNames": ["n1"]})
        assert status == 200
        assert result["Error"] == "request body larger than 4096 bytes"
        # the server survived and serves the next call
        assert scheduler.request("GET", "/healthz")[0] == 200


def test_probes_and_unknown_routes(apiserver: FakeApiServer) -> None:
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.request("GET", "/healthz")[:2] == (200, b"ok\n")
        assert scheduler.request("GET", "/readyz")[:2] == (200, b"ok\n")
        assert scheduler.request("GET", "/nope")[0] == 404
        assert scheduler.request("GET", "/filter")[0] == 405


def test_readyz_waits_for_the_first_lists(apiserver: FakeApiServer) -> None:
    apiserver.inject_fault("GET", "/api/v1/pods", times=None, status=500)
    with running_scheduler(apiserver, wait_ready=False) as scheduler:
        status, body, _ = scheduler.request("GET", "/readyz")
        assert (status, body) == (503, b"waiting for the first pod and node lists\n")
        assert scheduler.request("GET", "/healthz")[0] == 200
        apiserver.clear_faults()
        assert scheduler.daemon.ready.wait(20)
        assert scheduler.request("GET", "/readyz")[0] == 200


class _Follower:
    def __init__(self) -> None:
        self.leading = threading.Event()

    def is_leader(self) -> bool:
        return self.leading.is_set()

    def run(self, stop: threading.Event) -> None:
        stop.wait()


def test_follower_refuses_filter_and_bind_and_is_not_ready(apiserver: FakeApiServer) -> None:
    apiserver.add_object(gpu_node("n1"))
    follower = _Follower()

    def factory(client: object, started: object, stopped: object) -> Elector:
        return follower

    with running_scheduler(apiserver, elector_factory=factory, leader_elect=True) as scheduler:
        assert scheduler.filter(gpu_pod("a"), ["n1"])["Error"] == "not the leader"
        assert scheduler.bind(gpu_pod("a"), "n1") == "not the leader"
        status, body, _ = scheduler.request("GET", "/readyz")
        assert (status, body) == (503, b"not the leader\n")
        # the ledger is warm all the same, and leading takes effect at once
        assert scheduler.state.registered_nodes() == ["n1"]
        follower.leading.set()
        assert scheduler.request("GET", "/readyz")[0] == 200
        assert scheduler.filter(gpu_pod("a"), ["n1"])["NodeNames"] == ["n1"]


def test_webhook_answers_an_admission_review(apiserver: FakeApiServer) -> None:
    pod = gpu_pod("w", annotations={ANNOTATION_VGPU_NODE: "n9", ANNOTATION_BIND_PHASE: "success"})
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post("/webhook", review)
    assert status == 200
    response = result["response"]
    assert response["uid"] == "req-1"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    paths = {op["path"] for op in patch}
    assert "/spec/schedulerName" in paths
    assert "/metadata/annotations/hami.io~1vgpu-node" in paths  # stripped: only we write it
    assert ANNOTATION_DEVICES_ALLOCATED not in json.dumps(patch)


def test_webhook_denies_a_gpu_request_the_scheduler_would_drop(
    apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`gpumem: 16Gi` (bytes for MiB): HAMi admits the pod and its scheduler drops the request;
    ours denies it with what to write instead, and the filter keeps HAMi's decision (the pod
    asks no GPU) but logs why."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16Gi"}
    pod = make_pod("bytes", containers=[make_container("app", limits=limits)], uid="uid-bytes")
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "req-2", "namespace": "default", "operation": "CREATE", "object": pod},
    }
    with running_scheduler(apiserver) as scheduler:
        status, result = scheduler.post("/webhook", review)
        with caplog.at_level(logging.WARNING, "hami_plugin.extender.state"):
            assert scheduler.filter(pod, ["n1", "n2"])["NodeNames"] == ["n1", "n2"]
    assert status == 200
    assert result["response"] == {
        "uid": "req-2",
        "allowed": False,
        "status": {
            "metadata": {},
            "message": "container 'app': nvidia.com/gpumem=16Gi: out of range 0..2147483647 "
            "(MiB); write 16384: nvidia.com/gpumem counts MiB, and 16Gi is 16384 MiB; the "
            "scheduler would drop the GPU request",
            "reason": "Forbidden",
            "code": 403,
        },
    }
    logged = [r.getMessage() for r in caplog.records if r.name == "hami_plugin.extender.state"]
    assert logged == [
        "pod default/bytes: container 'app': nvidia.com/gpumem=16Gi: out of range "
        "0..2147483647 (MiB); write 16384: nvidia.com/gpumem counts MiB, and 16Gi is 16384 "
        "MiB; GPU request dropped"
    ]


def test_tls_serves_and_reloads_the_certificate(apiserver: FakeApiServer, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_ca, second_ca = Authority.create("first"), Authority.create("second")
    first_ca.serving().write(cert, key)
    with running_scheduler(apiserver, cert_file=str(cert), key_file=str(key)) as scheduler:
        assert scheduler.daemon.url.startswith("https://")
        scheduler.ssl_context = client_context(first_ca.write(tmp_path / "first.crt"))
        assert scheduler.request("GET", "/healthz")[0] == 200
        assert scheduler.filter(cpu_pod("web"), ["n"])["NodeNames"] == ["n"]
        # plain HTTP on the TLS port gets nothing useful
        scheduler.ssl_context = None
        try:
            status: int | None = scheduler.request("GET", "/healthz")[0]
        except (OSError, http.client.HTTPException):
            status = None
        assert status != 200
        # a renewed certificate (from another CA here, to tell them apart) is served without
        # a restart
        second_ca.serving().write(cert, key)
        scheduler.ssl_context = client_context(second_ca.write(tmp_path / "second.crt"))

        def served_second() -> bool:
            try:
                return scheduler.request("GET", "/healthz")[0] == 200
            except ssl.SSLError:
                return False

        wait_until(served_second, what="the renewed certificate", interval=0.2)


def test_an_unexpected_error_is_a_500_and_the_server_lives_on(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with running_scheduler(apiserver) as scheduler:

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(scheduler.state, "filter", broken)
        status, text = scheduler.post("/filter", {"Pod": gpu_pod("a"), "NodeNames": ["n1"]})
        assert (status, text) == (500, "internal error\n")
        assert "RuntimeError: a bug" in caplog.text
        monkeypatch.undo()
        assert scheduler.filter(cpu_pod("web"), ["n1"])["NodeNames"] == ["n1"]
