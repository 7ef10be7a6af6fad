"""Names never change the API path (issue 14, attack 6: `PodNamespace: "a/b"` went into a path as
is). Every name the client puts into a URL is checked as client-go checks a path segment and
percent-quoted; a bad one is refused before any request leaves, as the API server double's
request log shows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import InvalidName, NotFound
from hami_plugin.kube.paths import (
    check_selector_value,
    collection_path,
    fill_path,
    path_segment_problem,
)
from hami_plugin.kube.records import LeaseRecord, ObjectRef, SecretRecord
from hami_plugin.testing.apiserver import FakeApiServer

# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "problem"),
    [
        ("default", None),
        ("gpu-node.example.com", None),
        ("a?b#c d", None),  # quoted, it stays one segment
        ("", "may not be empty"),
        (".", "may not be '.'"),
        ("..", "may not be '..'"),
        ("a/b", "may not contain '/'"),
        ("%2F", "may not contain '%'"),
        ("../%", "may not contain '/', may not contain '%'"),
    ],
)
def test_path_segments_are_checked_as_client_go_checks_them(
    segment: str, problem: str | None
) -> None:
    assert path_segment_problem(segment) == problem


def test_a_template_is_filled_with_quoted_segments() -> None:
    template = "/api/v1/namespaces/{namespace}/pods/{name}"
    filled = fill_path(template, {"namespace": "default", "name": "a?b #1"})
    assert filled == "/api/v1/namespaces/default/pods/a%3Fb%20%231"
    with pytest.raises(InvalidName, match="invalid namespace \"a/b\": may not contain '/'"):
        fill_path(template, {"namespace": "a/b", "name": "p"})


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/pods",
        "/api/v1/nodes",
        "/api/v1/namespaces/ml/pods",
        "/apis/coordination.k8s.io/v1/leases",
        "/apis/coordination.k8s.io/v1/namespaces/hami-system/leases",
    ],
)
def test_collection_paths_of_both_shapes_pass(path: str) -> None:
    assert collection_path(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/a/b/pods",  # namespace "a/b"
        "/api/v1/namespaces//pods",  # namespace ""
        "/api/v1/namespaces/../pods",
        "/api/v1/namespaces/%2e%2e/pods",
        "/api/v1/nodes/n1/proxy",
        "/apis/coordination.k8s.io/v1/namespaces/a/b/leases",
        "api/v1/pods",
        "/healthz",
        "/api/v1/pods/",
    ],
)
def test_collection_paths_of_another_shape_are_refused(path: str) -> None:
    with pytest.raises(InvalidName, match="invalid"):
        collection_path(path)


@pytest.mark.parametrize("value", ["a,b", "a=b", "a!=b", "a\\,b", "a/b", ".."])
def test_a_selector_value_holds_no_selector_syntax(value: str) -> None:
    with pytest.raises(InvalidName, match="invalid node name"):
        check_selector_value("node name", value)


# --- over the wire: nothing leaves --------------------------------------------------------------

_BAD = ["a/b", "..", ".", "", "50%", "%2F..", "../kube-system"]
_WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def _lease(namespace: str, name: str) -> LeaseRecord:
    return LeaseRecord(namespace, name, "me", 15, _WHEN, _WHEN, 0, resource_version="1")


_CALLS: dict[str, Callable[[KubeClient, str], Any]] = {
    "get_node": lambda kube, bad: kube.get_node(bad),
    "patch_node_annotations": lambda kube, bad: kube.patch_node_annotations(bad, {"a": "b"}),
    "get_pod namespace": lambda kube, bad: kube.get_pod(bad, "p"),
    "get_pod name": lambda kube, bad: kube.get_pod("default", bad),
    "list_pods_on_node": lambda kube, bad: kube.list_pods_on_node(bad),
    "patch_pod_metadata": lambda kube, bad: kube.patch_pod_metadata(bad, "p", {"a": "b"}),
    "bind_pod": lambda kube, bad: kube.bind_pod("default", bad, "uid", "node-1"),
    "list_objects": lambda kube, bad: kube.list_objects(f"/api/v1/namespaces/{bad}/pods"),
    "watch_objects": lambda kube, bad: next(
        iter(kube.watch_objects(f"/api/v1/namespaces/{bad}/pods", ""))
    ),
    "get_lease": lambda kube, bad: kube.get_lease("hami-system", bad),
    "create_lease": lambda kube, bad: kube.create_lease(_lease(bad, "l")),
    "update_lease": lambda kube, bad: kube.update_lease(_lease("hami-system", bad)),
    "get_secret": lambda kube, bad: kube.get_secret(bad, "s"),
    "create_secret": lambda kube, bad: kube.create_secret(SecretRecord(bad, "s", "Opaque", {}, {})),
    "patch_secret_data": lambda kube, bad: kube.patch_secret_data("ns", bad, {"k": b"v"}),
    "get_mutating_webhook_configuration": lambda kube, bad: kube.get_mutating_webhook_configuration(
        bad
    ),
    "patch_mutating_webhook_ca_bundles": lambda kube, bad: kube.patch_mutating_webhook_ca_bundles(
        bad, ["w"], b"ca"
    ),
}


@pytest.mark.parametrize("bad", _BAD)
@pytest.mark.parametrize("call", sorted(_CALLS))
def test_no_request_leaves_with_a_bad_segment(
    apiserver: FakeApiServer, kube: KubeClient, call: str, bad: str
) -> None:
    with pytest.raises(InvalidName, match="invalid"):
        _CALLS[call](kube, bad)
    assert apiserver.requests == []


def test_an_event_in_a_bad_namespace_is_logged_and_not_sent(
    apiserver: FakeApiServer, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """`create_event` is best effort: the refusal is its warning line, nothing is sent."""
    kube.create_event(ObjectRef("Pod", "a/b", "p"), "Reason", "message")
    assert apiserver.requests == []
    assert "invalid namespace \"a/b\": may not contain '/'" in caplog.text


def test_what_remains_is_percent_quoted_into_its_own_segment(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    with pytest.raises(NotFound):
        kube.get_pod("default", "a?watch=true#x y")
    [request] = apiserver.requests
    assert request.path == "/api/v1/namespaces/default/pods/a%3Fwatch%3Dtrue%23x%20y"
    assert request.query_string == ""


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=8), st.text(max_size=8))
def test_any_namespace_and_name_keep_the_path_shape(
    apiserver: FakeApiServer, kube: KubeClient, namespace: str, name: str
) -> None:
    """Either the call is refused before a request leaves, or the request's path has exactly
    the template's segments, each decoding back to the name it was built from."""
    apiserver.clear_requests()
    try:
        kube.get_pod(namespace, name)
    except InvalidName:
        assert apiserver.requests == []
        assert path_segment_problem(namespace) or path_segment_problem(name)
        return
    except NotFound:
        pass
    [request] = apiserver.requests
    segments = request.path.split("/")
    assert segments[:4] == ["", "api", "v1", "namespaces"] and segments[5] == "pods"
    assert len(segments) == 7
    assert (unquote(segments[4]), unquote(segments[6])) == (namespace, name)
    assert request.query_string == ""
