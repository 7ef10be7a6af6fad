"""The kube-scheduler stand-in's PostFilter preemption (DefaultPreemption, v1.24 flow) with an
extender that serves the preempt verb: over real HTTP against a stub extender and the API
server double; plus the pure choices (`kubescheduler_fit`) table by table."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hami_plugin.kube.client import KubeClient
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.kubescheduler import KubeSchedulerStandIn
from hami_plugin.testing.kubescheduler_fit import (
    NodeState,
    Victims,
    fits_node,
    parse_quantity,
    pdb_disruptions,
    pick_one_node_for_preemption,
    select_victims_on_node,
)
from tests.extender.cluster import FAST_RETRY
from tests.extender.helpers import gpu_node
from tests.processes import wait_until

NOW = datetime(2026, 1, 2, tzinfo=UTC)
Answer = Callable[[dict[str, Any]], dict[str, Any]]


def pod(
    name: str,
    *,
    priority: int = 0,
    cpu: str | None = None,
    node: str = "",
    labels: dict[str, str] | None = None,
    started: str | None = None,
    policy: str | None = None,
    grace: int = 0,
) -> dict[str, Any]:
    """A pod of the stand-in's scheduler asking `cpu`, bound to `node` when given; `grace`:
    its termination grace period (0: a DELETE removes it at once)."""
    resources = {"requests": {"cpu": cpu}} if cpu else {}
    spec: dict[str, Any] = {
        "schedulerName": "hami-scheduler",
        "priority": priority,
        "containers": [{"name": "main", "image": "x", "resources": resources}],
    }
    if node:
        spec["nodeName"] = node
    spec["terminationGracePeriodSeconds"] = grace
    if policy:
        spec["preemptionPolicy"] = policy
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if started:
        status["startTime"] = started
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "labels": labels or {},
        },
        "spec": spec,
        "status": status,
    }


class StubExtender:
    """An extender on a loopback port: `filter` and `preempt` answer as the test says, `bind`
    binds through the API server. Records every call."""

    def __init__(self, kube: KubeClient) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.filter: Answer = lambda args: {"NodeNames": args["NodeNames"], "Error": ""}
        self.preempt: Answer = lambda args: {"NodeNameToMetaVictims": args["NodeNameToMetaVictims"]}
        owner = self

        def bind(args: dict[str, Any]) -> dict[str, Any]:
            kube.bind_pod(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"])
            return {"Error": ""}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                document = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls.append((self.path, document))
                verbs = {"/filter": owner.filter, "/preempt": owner.preempt, "/bind": bind}
                body = json.dumps(verbs[self.path](document)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="stub-extender")
        self.thread.start()

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.add_object(gpu_node("n1", 1, protocol=True))  # allocatable cpu 8, pods 110
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
def extender(kube: KubeClient) -> Iterator[StubExtender]:
    server = StubExtender(kube)
    try:
        yield server
    finally:
        server.stop()


def run_standin(kube: KubeClient, url: str, **kwargs: Any) -> KubeSchedulerStandIn:
    standin = KubeSchedulerStandIn(kube, url, initial_backoff_seconds=0.05, **kwargs)
    standin.start()
    wait_until(lambda: standin.synced, "the stand-in has listed pods and nodes")
    return standin


def status_of(api: FakeApiServer, name: str) -> dict[str, Any]:
    stored = api.get_pod("default", name)
    assert stored is not None
    return dict(stored.get("status") or {})


def scheduled_message(api: FakeApiServer, name: str) -> str:
    for entry in status_of(api, name).get("conditions") or ():
        if entry.get("type") == "PodScheduled":
            return str(entry.get("message") or "")
    return ""


# --- over the wire --------------------------------------------------------------------------


def test_a_high_priority_pod_preempts_the_lowest_victim_through_the_preempt_verb(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("mid", priority=50, cpu="4", node="n1"))
    low = pod("low", priority=10, cpu="4", node="n1", grace=30)
    low_uid = api.add_object(low)["metadata"]["uid"]
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100, cpu="4"))
        # the DELETE leaves the victim terminating for its grace period (30 s by default)
        wait_until(
            lambda: (api.get_pod("default", "low") or {})["metadata"].get("deletionTimestamp"),
            "the victim is terminating",
        )
        assert api.finish_termination("default", "low")  # its containers stopped
        wait_until(
            lambda: (api.get_pod("default", "high") or {}).get("spec", {}).get("nodeName"),
            "the preemptor is bound once the victim is gone",
        )
        assert [(p.preemptor, p.node, p.victims) for p in standin.preemptions] == [
            ("default/high", "n1", ("default/low",))
        ]
        (call,) = standin.preempt_calls
        assert call.args["NodeNameToMetaVictims"] == {
            "n1": {"Pods": [{"UID": low_uid}], "NumPDBViolations": 0}
        }
        assert call.args["Pod"]["metadata"]["name"] == "high"
        # in-tree NodeResourcesFit refused n1 first, so the extender's filter was not asked
        assert extender.paths()[:1] == ["/preempt"]
        events = [e for e in api.events() if e["involvedObject"]["name"] == "low"]
        assert [(e["reason"], e["message"]) for e in events] == [
            ("Preempted", "Preempted by default/high on node n1")
        ]
        assert api.get_pod("default", "mid") is not None
    finally:
        standin.stop()


def test_the_preemptor_is_nominated_and_the_victim_marked_while_it_terminates(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("low", priority=10, cpu="8", node="n1"))
    api.inject_fault("DELETE", r".*/pods/low", status=403, times=None)
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100, cpu="8"))
        wait_until(lambda: standin.preempt_calls, "the preempt verb is called")
        wait_until(
            lambda: any(
                c.get("type") == "DisruptionTarget"
                for c in status_of(api, "low").get("conditions") or ()
            ),
            "the victim carries DisruptionTarget",
        )
        (target,) = [
            c for c in status_of(api, "low")["conditions"] if c["type"] == "DisruptionTarget"
        ]
        assert (target["status"], target["reason"], target["message"]) == (
            "True",
            "PreemptionByScheduler",
            "hami-scheduler: preempting to accommodate a higher priority pod",
        )
        # the DELETE failed: an Error status, no nomination written, the message unchanged
        wait_until(lambda: scheduled_message(api, "high"), "the condition is written")
        assert scheduled_message(api, "high") == "0/1 nodes are available: 1 Insufficient cpu."
        assert "nominatedNodeName" not in status_of(api, "high")
        assert standin.preemptions == []
    finally:
        standin.stop()


def test_a_node_that_fits_without_victims_is_an_error_and_the_extender_is_not_asked(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    """The GPU case of issue 26: kube-scheduler sees no shortage it can count."""
    api.add_object(pod("low", priority=10, node="n1"))
    extender.filter = lambda args: {
        "NodeNames": [], "FailedNodes": {"n1": "CardInsufficientMemory"}, "Error": ""
    }  # fmt: skip
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100))
        wait_until(lambda: standin.parked() == {"default/high"}, "the pod is parked")
        assert (
            scheduled_message(api, "high") == "0/1 nodes are available: 1 CardInsufficientMemory."
        )
        assert "/preempt" not in extender.paths()
        assert api.get_pod("default", "low") is not None
        assert "nominatedNodeName" not in status_of(api, "high")
    finally:
        standin.stop()


def test_preemption_policy_never_takes_nothing_and_says_why(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("low", priority=10, cpu="8", node="n1"))
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100, cpu="8", policy="Never"))
        wait_until(lambda: scheduled_message(api, "high"), "the condition is written")
        assert scheduled_message(api, "high") == (
            "0/1 nodes are available: 1 Insufficient cpu. "
            "preemption: not eligible due to preemptionPolicy=Never."
        )
        assert standin.preempt_calls == [] and api.get_pod("default", "low") is not None
    finally:
        standin.stop()


def test_an_extender_naming_a_pod_not_on_the_node_fails_the_preemption(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("low", priority=10, cpu="8", node="n1"))
    extender.preempt = lambda args: {
        "nodeNameToMetaVictims": {"n1": {"pods": [{"uid": "uid-elsewhere"}]}}
    }
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100, cpu="8"))
        wait_until(lambda: standin.preempt_calls, "the preempt verb is called")
        wait_until(lambda: standin.parked() == {"default/high"}, "the pod is parked")
        assert api.get_pod("default", "low") is not None
        assert standin.preemptions == []
        assert scheduled_message(api, "high") == "0/1 nodes are available: 1 Insufficient cpu."
    finally:
        standin.stop()


def test_the_extender_choosing_fewer_victims_is_obeyed_case_insensitively(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(gpu_node("n2", 1, protocol=True))
    api.add_object(pod("a", priority=10, cpu="8", node="n1"))
    b_uid = api.add_object(pod("b", priority=10, cpu="8", node="n2"))["metadata"]["uid"]
    extender.preempt = lambda args: {
        "nodeNameToMetaVictims": {"n2": {"pods": [{"uid": b_uid}], "numPDBViolations": 0}}
    }
    standin = run_standin(kube, extender.url)
    try:
        api.add_object(pod("high", priority=100, cpu="8"))
        wait_until(lambda: standin.preemptions, "a preemption")
        assert standin.preemptions[0].node == "n2"
        assert set(standin.preempt_calls[0].args["NodeNameToMetaVictims"]) == {"n1", "n2"}
        wait_until(lambda: api.get_pod("default", "b") is None, "b is deleted")
        assert api.get_pod("default", "a") is not None
    finally:
        standin.stop()


def test_a_pdb_steers_the_victim_to_the_other_node(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(gpu_node("n2", 1, protocol=True))
    api.add_object(pod("guarded", priority=10, cpu="8", node="n1", labels={"app": "db"}))
    api.add_object(pod("free", priority=10, cpu="8", node="n2", labels={"app": "web"}))
    budget = {
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["db"]}
        ]}},
        "status": {"disruptionsAllowed": 0},
    }  # fmt: skip
    standin = run_standin(kube, extender.url, pdbs=lambda: [budget])
    try:
        api.add_object(pod("high", priority=100, cpu="8"))
        wait_until(lambda: standin.preemptions, "a preemption")
        assert [(p.node, p.victims) for p in standin.preemptions] == [("n2", ("default/free",))]
        sent = standin.preempt_calls[0].args["NodeNameToMetaVictims"]
        assert sent["n1"]["NumPDBViolations"] == 1 and sent["n2"]["NumPDBViolations"] == 0
    finally:
        standin.stop()


def test_the_queue_pops_the_higher_priority_pod_first(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("first-low", priority=1))
    api.add_object(pod("then-high", priority=1000))
    standin = run_standin(kube, extender.url)
    try:
        wait_until(lambda: len(standin.tried()) == 2, "both are scheduled")
        assert [a.pod for a in standin.tried()] == ["default/then-high", "default/first-low"]
    finally:
        standin.stop()


def test_without_a_preempt_verb_the_in_tree_victims_are_taken_as_found(
    api: FakeApiServer, kube: KubeClient, extender: StubExtender
) -> None:
    api.add_object(pod("low", priority=10, cpu="8", node="n1"))
    standin = run_standin(kube, extender.url, preempt_verb=None)
    try:
        api.add_object(pod("high", priority=100, cpu="8"))
        wait_until(lambda: standin.preemptions, "a preemption")
        assert standin.preempt_calls == [] and "/preempt" not in extender.paths()
        wait_until(lambda: status_of(api, "high").get("nominatedNodeName") == "n1", "nominated")
    finally:
        standin.stop()


# --- the pure choices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("1Gi", "1073741824"), ("1k", "1000"), ("2", "2"), ("1e3", "1000")],
)
def test_quantities_parse_as_kubernetes_writes_them(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity("1Q")


def node_state(
    *pods: dict[str, Any], pods_allowed: str = "10", nominated: tuple[Any, ...] = ()
) -> NodeState:
    allocatable = {"cpu": "8", "pods": pods_allowed}
    node = {"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}
    return NodeState(node, list(pods), list(nominated))


def test_nominated_pods_of_equal_or_higher_priority_count_against_the_node() -> None:
    wanted = pod("p", priority=5, cpu="4")
    assert fits_node(wanted, node_state(nominated=(pod("n", priority=5, cpu="6"),))) == [
        "Insufficient cpu"
    ]
    assert fits_node(wanted, node_state(nominated=(pod("n", priority=4, cpu="6"),))) == []
    assert fits_node(wanted, node_state(pod("a"), pod("b"), pod("c"), pods_allowed="3")) == [
        "Too many pods"
    ]


def test_victims_are_minimal_and_the_most_important_are_reprieved_first() -> None:
    running = [
        pod("old", priority=1, cpu="2", started="2026-01-01T00:00:00Z"),
        pod("new", priority=1, cpu="2", started="2026-01-01T10:00:00Z"),
        pod("mid", priority=3, cpu="2"),
        pod("same", priority=9, cpu="2"),
    ]
    victims, reasons = select_victims_on_node(
        pod("p", priority=9, cpu="2"), node_state(*running), [], NOW
    )
    assert reasons == [] and victims is not None
    # mid (most important) and old (started earlier) are reprieved; new goes
    assert [v["metadata"]["name"] for v in victims.pods] == ["new"]


def test_pdb_matching_follows_filter_pods_with_pdb_violation() -> None:
    pods = [pod(name, labels={"app": "db"}) for name in ("a", "b", "c")]
    budget = {
        "metadata": {"namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 1, "disruptedPods": {"a": "2026-01-01T00:00:00Z"}},
    }
    violating, fine = pdb_disruptions(pods, [budget])
    assert [p["metadata"]["name"] for p in violating] == ["c"]
    assert [p["metadata"]["name"] for p in fine] == ["a", "b"]
    empty = {**budget, "spec": {"selector": {}}}
    assert pdb_disruptions(pods, [empty]) == ([], pods)


def test_pick_one_node_follows_kube_schedulers_order() -> None:
    low, mid = pod("l", priority=1), pod("m", priority=5)
    early = pod("e", priority=1, started="2026-01-01T00:00:00Z")
    late = pod("t", priority=1, started="2026-01-01T05:00:00Z")
    cases: list[tuple[dict[str, Victims], str]] = [
        ({"a": Victims((low,), 1), "b": Victims((mid,), 0)}, "b"),
        ({"a": Victims((mid,)), "b": Victims((low, low))}, "b"),
        ({"a": Victims((low, low)), "b": Victims((low,))}, "b"),
        ({"a": Victims((early,)), "b": Victims((late,))}, "b"),
        ({"a": Victims((late,)), "b": Victims((late,))}, "a"),
        ({}, ""),
    ]
    for candidates, chosen in cases:
        assert pick_one_node_for_preemption(candidates, NOW) == chosen
