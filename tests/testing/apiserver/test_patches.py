"""The PATCH algorithms, alone and as the real client sends them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, json_patch, merge_patch


def test_merge_patch_follows_rfc7386_examples() -> None:
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


@given(
    st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.none(), max_size=6),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=6),
)
def test_merge_patch_on_string_maps(patch: dict[str, str | None], target: dict[str, str]) -> None:
    result = merge_patch(target, patch)

    for key, value in patch.items():
        assert result.get(key) == value
    for key in target.keys() - patch.keys():
        assert result[key] == target[key]


def test_json_patch_operations() -> None:
    doc = {"metadata": {"annotations": {"a/b": "1"}}, "items": [1, 2]}
    ops = [
        {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/c", "value": "2"},
        {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "3"},
        {"op": "remove", "path": "/items/0"},
        {"op": "add", "path": "/items/-", "value": 9},
        {"op": "copy", "from": "/items", "path": "/copied"},
        {"op": "move", "from": "/copied", "path": "/moved"},
    ]

    assert json_patch(doc, ops) == {
        "metadata": {"annotations": {"a/b": "3", "c": "2"}},
        "items": [2, 9],
        "moved": [2, 9],
    }
    assert doc["items"] == [1, 2]  # the input is left alone


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/a", "value": "other"}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "frobnicate", "path": "/a"}],
        {"op": "add"},
    ],
)
def test_json_patch_failures_raise(ops: Any) -> None:
    with pytest.raises(ValueError):
        json_patch({"a": "b"}, ops)


def test_default_strategic_merge_patch_from_the_client_is_applied(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_node("n", annotations={"a": "1", "b": "2"})

    core.patch_node("n", {"metadata": {"annotations": {"a": None, "c": "3"}}})

    node = apiserver.get_node("n")
    assert node is not None
    assert node["metadata"]["annotations"] == {"b": "2", "c": "3"}
    assert apiserver.requests[-1].content_type == "application/strategic-merge-patch+json"


def test_json_patch_from_the_client_is_applied(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    apiserver.add_pod("p", annotations={"a": "1"})

    core.patch_namespaced_pod(
        "p", "default", [{"op": "replace", "path": "/metadata/annotations/a", "value": "2"}]
    )

    pod = apiserver.get_pod("default", "p")
    assert pod is not None
    assert pod["metadata"]["annotations"] == {"a": "2"}
    assert apiserver.requests[-1].content_type == "application/json-patch+json"


def test_failed_json_patch_test_is_422_and_changes_nothing(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
) -> None:
    stored = apiserver.add_pod("p")

    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]
        )

    assert e.value.status == 422
    assert apiserver.get_pod("default", "p") == stored
