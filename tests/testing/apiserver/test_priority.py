"""PriorityClasses and the Priority admission plugin on pods created over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami_plugin.testing.apiserver import FakeApiServer, JsonObject, make_pod


@pytest.fixture
def scheduling(apiserver: FakeApiServer) -> Iterator[k8s.SchedulingV1Api]:
    api_client = apiserver.api_client()
    yield k8s.SchedulingV1Api(api_client)
    api_client.rest_client.close()


def _class(
    name: str, value: int, *, policy: str | None = None, default: bool = False
) -> k8s.V1PriorityClass:
    return k8s.V1PriorityClass(
        metadata=k8s.V1ObjectMeta(name=name),
        value=value,
        preemption_policy=policy,
        global_default=default,
    )


def _pod(name: str, class_name: str | None = None, **spec: object) -> JsonObject:
    pod = make_pod(name)
    if class_name is not None:
        pod["spec"]["priorityClassName"] = class_name
    pod["spec"].update(spec)
    return pod


def _create(core: k8s.CoreV1Api, pod: JsonObject) -> dict[str, Any]:
    """Create over HTTP (the client sends a dict body as it is); the answer's `spec`."""
    created: dict[str, Any] = core.create_namespaced_pod("default", cast(Any, pod)).to_dict()
    return dict(created["spec"])


def _forbidden(call: object) -> dict[str, object]:
    assert isinstance(call, pytest.ExceptionInfo)
    exc = call.value
    assert isinstance(exc, ApiException)
    assert exc.status == 403
    body: dict[str, object] = json.loads(str(exc.body))
    assert body["reason"] == "Forbidden"
    return body


def test_a_pods_class_gives_its_priority_and_preemption_policy(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
    scheduling: k8s.SchedulingV1Api,
) -> None:
    high = scheduling.create_priority_class(_class("high", 100000))
    scheduling.create_priority_class(_class("polite", 5000, policy="Never"))

    preemptor = _create(core, _pod("preemptor", "high"))
    waiter = _create(core, _pod("waiter", "polite"))

    assert high.preemption_policy == "PreemptLowerPriority"  # defaulted
    assert (preemptor["priority"], preemptor["preemption_policy"]) == (
        100000,
        "PreemptLowerPriority",
    )
    assert (waiter["priority"], waiter["preemption_policy"]) == (5000, "Never")
    assert [
        pc["metadata"]["name"] for pc in scheduling.list_priority_class().to_dict()["items"]
    ] == [
        "high",
        "polite",
    ]


def test_no_class_is_priority_zero_or_the_global_default(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
    scheduling: k8s.SchedulingV1Api,
) -> None:
    before = _create(core, _pod("before"))
    scheduling.create_priority_class(_class("normal", 1000, policy="Never", default=True))
    after = _create(core, _pod("after"))

    assert (before["priority"], before["preemption_policy"]) == (0, "PreemptLowerPriority")
    assert before["priority_class_name"] is None
    assert (after["priority"], after["preemption_policy"]) == (1000, "Never")
    assert after["priority_class_name"] == "normal"


def test_an_unknown_class_is_forbidden(core: k8s.CoreV1Api, apiserver: FakeApiServer) -> None:
    with pytest.raises(ApiException) as refused:
        _create(core, _pod("p", "ghost"))

    body = _forbidden(refused)
    assert body["message"] == ('pods "p" is forbidden: no PriorityClass with name ghost was found')
    assert apiserver.get_pod("default", "p") is None


def test_a_priority_other_than_the_computed_one_is_forbidden(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
    scheduling: k8s.SchedulingV1Api,
) -> None:
    scheduling.create_priority_class(_class("high", 100000))

    with pytest.raises(ApiException) as wrong_value:
        _create(core, _pod("a", "high", priority=7))
    with pytest.raises(ApiException) as wrong_policy:
        _create(core, _pod("b", "high", preemptionPolicy="Never"))
    same = _create(core, _pod("c", "high", priority=100000))

    assert _forbidden(wrong_value)["message"] == (
        'pods "a" is forbidden: the integer value of priority (7) must not be provided in pod '
        "spec; priority admission controller computed 100000 from the given PriorityClass name"
    )
    assert _forbidden(wrong_policy)["message"] == (
        'pods "b" is forbidden: the string value of PreemptionPolicy (Never) must not be '
        "provided in pod spec; priority admission controller computed PreemptLowerPriority "
        "from the given PriorityClass name"
    )
    assert same["priority"] == 100000


def test_only_one_global_default(scheduling: k8s.SchedulingV1Api) -> None:
    scheduling.create_priority_class(_class("first", 10, default=True))

    with pytest.raises(ApiException) as second:
        scheduling.create_priority_class(_class("second", 20, default=True))

    assert _forbidden(second)["message"] == (
        'priorityclasses.scheduling.k8s.io "second" is forbidden: PriorityClass first is '
        "already marked as default. Only one default can exist"
    )


def test_an_update_keeps_the_admitted_priority(
    apiserver: FakeApiServer,
    core: k8s.CoreV1Api,
    scheduling: k8s.SchedulingV1Api,
) -> None:
    scheduling.create_priority_class(_class("high", 100000))
    _create(core, _pod("p", "high"))
    stored = apiserver.get_pod("default", "p")
    assert stored is not None
    del stored["spec"]["priority"], stored["spec"]["preemptionPolicy"]

    replaced = core.replace_namespaced_pod("p", "default", cast(Any, stored)).to_dict()["spec"]

    assert (replaced["priority"], replaced["preemption_policy"]) == (
        100000,
        "PreemptLowerPriority",
    )


def test_pods_stored_by_the_helpers_skip_admission(apiserver: FakeApiServer) -> None:
    stored = apiserver.add_pod(_pod("fixture", "nowhere", priority=42))

    assert stored["spec"]["priority"] == 42
    assert "preemptionPolicy" not in stored["spec"]
