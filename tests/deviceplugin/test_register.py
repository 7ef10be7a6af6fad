"""The node register annotation publisher, against the API server double."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from hami_plugin.deviceplugin.register import RegisterPublisher
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.inflight import ALLOCATE_PROTOCOL, ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import ANNOTATION_NODE_REGISTER
from hami_plugin.testing.apiserver import FakeApiServer

NODE = "gpu-node-1"


@pytest.fixture(autouse=True)
def node(apiserver: FakeApiServer) -> None:
    apiserver.add_node(NODE)


def patches(apiserver: FakeApiServer) -> list[dict[str, object]]:
    return [r.json() for r in apiserver.requests_matching("PATCH", f"/api/v1/nodes/{NODE}")]


def annotation(apiserver: FakeApiServer) -> object:
    stored = apiserver.get_node(NODE)
    assert stored is not None
    return stored["metadata"]["annotations"].get(ANNOTATION_NODE_REGISTER)


def test_writes_only_when_the_value_changes(apiserver: FakeApiServer, kube: KubeClient) -> None:
    values = iter(["[1]", "[1]", "[2]"])
    publisher = RegisterPublisher(kube, NODE, lambda: next(values))
    assert publisher.publish_once()
    assert publisher.publish_once()
    assert annotation(apiserver) == "[1]"
    assert len(patches(apiserver)) == 1
    assert publisher.publish_once()
    assert annotation(apiserver) == "[2]"
    assert patches(apiserver)[-1] == {
        "metadata": {"annotations": {ANNOTATION_NODE_REGISTER: "[2]"}}
    }


def test_api_failures_are_retried_next_round(apiserver: FakeApiServer, kube: KubeClient) -> None:
    apiserver.inject_fault("PATCH", status=500, times=None)
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]")
    assert not publisher.publish_once()
    assert publisher.last_written is None
    apiserver.clear_faults()
    assert publisher.publish_once()
    assert annotation(apiserver) == "[1]"


def test_a_failing_value_builder_skips_the_round(kube: KubeClient) -> None:
    def broken() -> str:
        raise RuntimeError("scan failed")

    assert not RegisterPublisher(kube, NODE, broken).publish_once()


@pytest.fixture
def running_publisher(kube: KubeClient) -> Iterator[tuple[RegisterPublisher, list[str]]]:
    values = ["[1]"]
    publisher = RegisterPublisher(kube, NODE, lambda: values[-1], interval_seconds=60)
    publisher.start()
    try:
        yield publisher, values
    finally:
        publisher.stop()


def test_poke_publishes_at_once(
    apiserver: FakeApiServer, running_publisher: tuple[RegisterPublisher, list[str]]
) -> None:
    publisher, values = running_publisher
    done = threading.Event()
    for _ in range(250):
        if annotation(apiserver) == "[1]":
            break
        done.wait(0.02)
    assert annotation(apiserver) == "[1]"  # first round at start
    values.append("[1,2]")
    publisher.poke()  # the 60 s interval would be far too late
    for _ in range(250):
        if annotation(apiserver) == "[1,2]":
            break
        done.wait(0.02)
    assert annotation(apiserver) == "[1,2]"


# --- the in-flight protocol mark ----------------------------------------------------------------

PROTOCOL = {ANNOTATION_ALLOCATE_PROTOCOL: ALLOCATE_PROTOCOL}


def node_annotations(apiserver: FakeApiServer) -> dict[str, str]:
    stored = apiserver.get_node(NODE)
    assert stored is not None
    return dict(stored["metadata"]["annotations"])


def test_the_protocol_mark_goes_out_with_the_register_value(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]", also_annotate=PROTOCOL)
    assert publisher.publish_once()
    assert patches(apiserver) == [
        {"metadata": {"annotations": {ANNOTATION_NODE_REGISTER: "[1]", **PROTOCOL}}}
    ]
    assert node_annotations(apiserver)[ANNOTATION_ALLOCATE_PROTOCOL] == "in-flight/v1"


def test_a_lost_protocol_mark_is_written_again(apiserver: FakeApiServer, kube: KubeClient) -> None:
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]", also_annotate=PROTOCOL)
    assert publisher.publish_once()
    assert publisher.publish_once()
    assert len(patches(apiserver)) == 1  # unchanged: read, not written
    apiserver.update_object(
        "nodes", "", NODE, lambda n: n["metadata"]["annotations"].pop(ANNOTATION_ALLOCATE_PROTOCOL)
    )
    assert publisher.publish_once()
    assert len(patches(apiserver)) == 2
    assert node_annotations(apiserver)[ANNOTATION_ALLOCATE_PROTOCOL] == ALLOCATE_PROTOCOL


def test_withdraw_removes_the_mark_and_keeps_the_register_value(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]", also_annotate=PROTOCOL)
    assert publisher.publish_once()
    assert publisher.withdraw()
    annotations = node_annotations(apiserver)
    assert ANNOTATION_ALLOCATE_PROTOCOL not in annotations
    assert annotations[ANNOTATION_NODE_REGISTER] == "[1]"
    assert patches(apiserver)[-1] == {
        "metadata": {"annotations": {ANNOTATION_ALLOCATE_PROTOCOL: None}}
    }


def test_withdraw_gives_up_within_its_budget_when_the_api_server_hangs(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]", also_annotate=PROTOCOL)
    assert publisher.publish_once()
    apiserver.inject_fault("PATCH", hang_seconds=30, times=None)
    assert not publisher.withdraw(budget_seconds=0.3)
    apiserver.clear_faults()
    assert ANNOTATION_ALLOCATE_PROTOCOL in node_annotations(apiserver)


def test_without_a_mark_withdraw_sends_nothing(apiserver: FakeApiServer, kube: KubeClient) -> None:
    publisher = RegisterPublisher(kube, NODE, lambda: "[1]")
    assert publisher.withdraw()
    assert patches(apiserver) == []
