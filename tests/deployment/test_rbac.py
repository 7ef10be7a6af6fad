"""Least-privilege RBAC, derived from what the daemons really call.

Each daemon runs as its manifests configure it against the API server double
(`tests/deployment/exercise.py`); every request it sends is turned into RBAC attributes and
compared both ways with the rules bound to its ServiceAccount, in the plain manifests and in
the chart: a call without a rule fails (the daemon would get 403 in a cluster), and so does a
rule no call uses. `hami certs` (the install Job and the renewal CronJob) is run the same way;
kube-scheduler's needs are derived from its configuration in the same manifests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from hami_plugin.testing.apiserver import RecordedRequest
from tests.deployment import exercise
from tests.deployment.manifests import (
    Obj,
    config_map_data,
    hami_container,
    helm_template,
    named,
    of_kind,
    plain_manifests,
    pod_spec,
    workload_running,
)
from tests.deployment.rbac import Access, Grant, access_of, grants_for, problems

KUBE_SCHEDULER_ROLES = frozenset(
    {("ClusterRole", "system:kube-scheduler"), ("ClusterRole", "system:volume-scheduler")}
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": plain_manifests,
    "chart": helm_template,
}


@pytest.fixture(scope="module")
def device_plugin_calls(tmp_path_factory: pytest.TempPathFactory) -> list[RecordedRequest]:
    return exercise.device_plugin_requests(
        plain_manifests(), tmp_path_factory.mktemp("device-plugin")
    )


@pytest.fixture(scope="module")
def scheduler_calls(tmp_path_factory: pytest.TempPathFactory) -> list[RecordedRequest]:
    return exercise.scheduler_requests(plain_manifests(), tmp_path_factory.mktemp("scheduler"))


def service_account(workload: Obj) -> tuple[str, str]:
    return workload["metadata"]["namespace"], pod_spec(workload)["serviceAccountName"]


def kube_scheduler_accesses(objects: Sequence[Obj]) -> list[Access]:
    """kube-scheduler's own Lease (the built-in role only covers the one named kube-scheduler),
    from the KubeSchedulerConfiguration it is started with."""
    config = yaml.safe_load(config_map_data(objects, "hami-scheduler", "config.yaml"))
    election = config["leaderElection"]
    if not election.get("leaderElect"):
        return []
    namespace, name = election["resourceNamespace"], election["resourceName"]
    return [
        Access("coordination.k8s.io", "leases", verb, namespace, name) for verb in ("get", "update")
    ]


@pytest.mark.parametrize("source", SOURCES)
def test_the_device_plugin_may_do_exactly_what_it_calls(
    source: str, device_plugin_calls: list[RecordedRequest]
) -> None:
    objects = SOURCES[source]()
    namespace, account = service_account(workload_running(objects, "device-plugin"))
    bound = grants_for(objects, namespace, account)
    assert bound.external == frozenset()
    assert problems(exercise.accesses(device_plugin_calls), bound.grants, namespace) == []


@pytest.mark.parametrize("source", SOURCES)
def test_the_scheduler_may_do_exactly_what_it_and_kube_scheduler_call(
    source: str, scheduler_calls: list[RecordedRequest]
) -> None:
    objects = SOURCES[source]()
    namespace, account = service_account(workload_running(objects, "scheduler"))
    bound = grants_for(objects, namespace, account)
    assert bound.external == KUBE_SCHEDULER_ROLES
    called = exercise.accesses(scheduler_calls) + kube_scheduler_accesses(objects)
    assert problems(called, bound.grants, namespace) == []


CERTS_SOURCES: dict[str, Callable[[], list[Obj]]] = {
    **SOURCES,
    "chart without the webhook": lambda: helm_template("scheduler.admissionWebhook.enabled=false"),
}


@pytest.mark.parametrize("source", CERTS_SOURCES)
def test_the_certificate_jobs_may_do_exactly_what_hami_certs_calls(
    source: str, tmp_path: Path
) -> None:
    """The install Job and the renewal CronJob run the same `hami certs`; each one's
    ServiceAccount (the chart's hook has its own: the release's do not exist before install)
    may do exactly what that run calls."""
    objects = CERTS_SOURCES[source]()
    calls = exercise.accesses(exercise.certs_requests(objects, tmp_path))
    (cronjob,) = [c for c in of_kind(objects, "CronJob") if hami_container(c, "certs")]
    job = exercise.certs_job(objects)
    waits = "--require-webhook-configuration"  # the install Job's alone: the same calls
    assert hami_container(cronjob, "certs")["args"] == [
        a for a in hami_container(job, "certs")["args"] if a != waits
    ]
    for workload in (job, cronjob):
        namespace, account = service_account(workload)
        bound = grants_for(objects, namespace, account)
        assert bound.external == frozenset()
        assert problems(calls, bound.grants, namespace) == [], workload["kind"]
    if source == "chart without the webhook":
        assert not [c for c in calls if c.resource == "mutatingwebhookconfigurations"]


def test_the_exercise_reaches_every_api_path_the_daemons_use(
    device_plugin_calls: list[RecordedRequest], scheduler_calls: list[RecordedRequest]
) -> None:
    """The runs above are only as good as the paths they take: pin the ones each run must
    cover, so a refactor that silently stops exercising one fails here."""
    plugin = {(a.resource, a.verb) for a in exercise.accesses(device_plugin_calls)}
    assert {("nodes", "get"), ("nodes", "patch"), ("pods", "list"), ("pods", "patch")} <= plugin
    assert ("events", "create") in plugin
    scheduler = {(a.resource, a.verb) for a in exercise.accesses(scheduler_calls)}
    assert {
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods/binding", "create"),
        ("nodes", "list"),
        ("nodes", "watch"),
        ("nodes", "get"),
        ("nodes", "patch"),
        ("events", "create"),
        ("leases", "create"),
        ("leases", "get"),
        ("leases", "update"),
    } <= scheduler


# --- the comparison itself ------------------------------------------------------------------


LEASES = "/apis/coordination.k8s.io/v1/namespaces/s/leases/l"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes/n1", {}, ("", "nodes", "get", None, "n1")),
        ("GET", "/api/v1/pods", {"watch": ["true"]}, ("", "pods", "watch", None, None)),
        ("GET", "/api/v1/pods", {"fieldSelector": ["x=y"]}, ("", "pods", "list", None, None)),
        ("GET", "/api/v1/namespaces/a/pods", {}, ("", "pods", "list", "a", None)),
        ("PATCH", "/api/v1/namespaces/a/pods/p", {}, ("", "pods", "patch", "a", "p")),
        ("POST", "/api/v1/namespaces/a/pods/p/binding", {}, ("", "pods/binding", "create", "a", "p")),  # noqa: E501
        ("POST", "/api/v1/namespaces/a/events", {}, ("", "events", "create", "a", None)),
        ("PUT", LEASES, {}, ("coordination.k8s.io", "leases", "update", "s", "l")),
        ("DELETE", "/api/v1/namespaces/a/pods", {}, ("", "pods", "deletecollection", "a", None)),
        ("GET", "/api/v1/namespaces/a", {}, ("", "namespaces", "get", None, "a")),
    ],
)  # fmt: skip
def test_requests_map_to_rbac_attributes(
    method: str,
    path: str,
    query: dict[str, list[str]],
    expected: tuple[str, str, str, str | None, str | None],
) -> None:
    assert access_of(method, path, query) == Access(*expected)


def _grant(verb: str, namespace: str | None = None, name: str | None = None) -> Grant:
    return Grant("Role r", "coordination.k8s.io", "leases", verb, namespace, name)


def test_the_comparison_reports_each_kind_of_drift() -> None:
    lease = Access("coordination.k8s.io", "leases", "get", "ns", "mine")
    assert problems([lease], [_grant("get", "ns", "mine")]) == []
    assert problems([lease], [])[0].startswith("missing:")
    extra = problems([lease], [_grant("get", "ns", "mine"), _grant("update", "ns")])
    assert [p.split(":")[0] for p in extra] == ["unused"]
    assert problems([lease], [_grant("get")], "ns")[0].startswith("too broad:")  # cluster-wide
    assert problems([lease], [_grant("get", None, "mine")], "elsewhere") == []
    assert "resourceNames" in problems([lease], [_grant("get", "ns")])[0]
    assert problems([lease], [_grant("get", "other", "mine")])[0].startswith("missing:")
    assert problems([lease], [Grant("Role r", "*", "*", "*", "ns", None)])[0].startswith("wildcard")


def test_a_manifest_missing_a_verb_fails_the_comparison(
    device_plugin_calls: list[RecordedRequest],
) -> None:
    objects = plain_manifests()
    role = named(objects, "ClusterRole", "hami-device-plugin")
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["events"]]
    namespace, account = service_account(workload_running(objects, "device-plugin"))
    found = problems(
        exercise.accesses(device_plugin_calls), grants_for(objects, namespace, account).grants
    )
    assert found and all("events" in p and p.startswith("missing:") for p in found)
