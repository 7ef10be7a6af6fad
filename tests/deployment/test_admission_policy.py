"""The ValidatingAdmissionPolicies (`daemonset/admission-policy.yaml`, and the chart's on
Kubernetes 1.30+), checked by what their CEL says.

Here the expressions are read (test_admission_policy_cel.py runs them on allowed and denied
requests): the users they exempt are the ServiceAccounts the workloads run as, the annotation
keys they guard are exactly the ones the daemons own (and that the webhook strips at CREATE, so
a normal pod passes), every optional field is read behind `has()`, `oldObject` only on UPDATE,
the node name comes from the requester's token, and every policy fails closed. Their schemas
are checked in test_manifests.py, their equality between the file and the chart in
test_chart.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from hami_plugin.protocol import model
from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from tests.deployment import exercise
from tests.deployment.manifests import (
    Obj,
    admission_policy_manifests,
    helm_template,
    named,
    of_kind,
    plain_manifests,
    pod_spec,
    workload_running,
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": lambda: plain_manifests() + admission_policy_manifests(),
    "chart": lambda: helm_template(kube_version="v1.30.0"),
}
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The user-info extra the API server puts into bound service account tokens of pods (1.30+)."""


@pytest.fixture(params=SOURCES, scope="module")
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return SOURCES[request.param]()


def _username(objects: list[Obj], subcommand: str) -> str:
    """The user the pods of the workload running `hami <subcommand>` call the API as."""
    workload = workload_running(objects, subcommand)
    namespace = workload["metadata"]["namespace"]
    return f"system:serviceaccount:{namespace}:{pod_spec(workload)['serviceAccountName']}"


def _policy(objects: list[Obj], users_of: str) -> Obj:
    """The policy whose match conditions name the user of `hami <users_of>`: the device
    plugin's on nodes, the booking's (which names the scheduler) on pods."""
    user = _username(objects, users_of)
    found = [
        p
        for p in of_kind(objects, "ValidatingAdmissionPolicy")
        if any(user in c["expression"] for c in p["spec"].get("matchConditions", []))
        and (users_of == "scheduler") == ("pods" in _resources(p))
        and not p["metadata"]["name"].endswith("-own-pods")
    ]
    assert len(found) == 1, [p["metadata"]["name"] for p in found]
    return found[0]


def _resources(policy: Obj) -> set[str]:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    return {r for rule in rules for r in rule["resources"]}


def _operations(policy: Obj) -> set[str]:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    return {o for rule in rules for o in rule["operations"]}


def _literals(expression: str) -> list[str]:
    return re.findall(r"'([^']*)'", expression)


def _expressions(policy: Obj) -> dict[str, str]:
    """Every CEL expression of the policy by where it stands (variables by name)."""
    spec = policy["spec"]
    found = {f"variables.{v['name']}": v["expression"] for v in spec.get("variables", [])}
    for index, validation in enumerate(spec["validations"]):
        found[f"validation {index}"] = validation["expression"]
        found[f"message {index}"] = validation.get("messageExpression", "")
    return {where: " ".join(text.split()) for where, text in found.items()}


def test_every_policy_fails_closed_and_is_bound_to_deny(objects: list[Obj]) -> None:
    policies = of_kind(objects, "ValidatingAdmissionPolicy")
    assert len(policies) == 4
    for policy in policies:
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert "paramKind" not in policy["spec"]
        (binding,) = [
            b
            for b in of_kind(objects, "ValidatingAdmissionPolicyBinding")
            if b["spec"]["policyName"] == policy["metadata"]["name"]
        ]
        # every namespace, no parameters, refused (not only audited or warned)
        assert binding["spec"] == {
            "policyName": policy["metadata"]["name"],
            "validationActions": ["Deny"],
        }
        for validation in policy["spec"]["validations"]:
            assert validation["reason"] == "Forbidden" and validation["messageExpression"]


def test_the_device_plugin_may_change_only_the_node_its_token_names(objects: list[Obj]) -> None:
    policy = _policy(objects, "device-plugin")
    spec = policy["spec"]
    # every write RBAC grants the device plugin on nodes is an UPDATE (a patch is admitted as
    # one); it can create or delete none
    account = pod_spec(workload_running(objects, "device-plugin"))["serviceAccountName"]
    rules = named(objects, "ClusterRole", account)["rules"]
    node_verbs = {v for rule in rules if "nodes" in rule["resources"] for v in rule["verbs"]}
    assert node_verbs - {"get", "list", "watch"} == {"patch"}
    assert _resources(policy) == {"nodes"} and _operations(policy) == {"UPDATE"}
    for rule in spec["matchConstraints"]["resourceRules"]:
        assert rule["apiGroups"] == [""]
    # only the device plugin's requests, decided by its token's node name
    (condition,) = spec["matchConditions"]
    assert " ".join(condition["expression"].split()) == (
        f"request.userInfo.username == '{_username(objects, 'device-plugin')}'"
    )
    cel = _expressions(policy)
    token = cel["variables.tokenNode"]
    # the extra is optional, and so is the key in it: read only behind both checks, else no
    # node (refused)
    assert token == (
        f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra ? "
        f"request.userInfo.extra['{NODE_NAME_EXTRA}'] : []"
    )
    assert cel["validation 0"] == "variables.tokenNode == [object.metadata.name]"
    assert "variables.tokenNode[0]" in cel["message 0"]
    assert "size(variables.tokenNode) == 0 ?" in cel["message 0"]


# the keys the booking policy guards, as its CEL spells the test on an annotation key `k`
_KEY_TEST = re.compile(r"k\.startsWith\('([^']+)'\)|k == '([^']+)'")


def _guarded(owned: str) -> tuple[frozenset[str], frozenset[str]]:
    """(prefixes, exact keys) of the `owned` variable; both halves (the new object's
    annotations and the old one's) must test keys alike."""
    halves = owned.split(" + ")
    assert [h.split(".filter(")[0] for h in halves] == [
        "variables.newAnnotations",
        "variables.oldAnnotations",
    ]
    tests = set()
    for half in halves:
        found = _KEY_TEST.findall(half)
        tests.add((frozenset(p for p, _ in found if p), frozenset(e for _, e in found if e)))
    assert len(tests) == 1, "the two halves test different keys"
    (result,) = tests
    return result


def _known_annotations() -> set[str]:
    """Every annotation key the code names."""
    names = {v for k, v in vars(model).items() if k.startswith("ANNOTATION_")}
    return names | {ANNOTATION_BOOKING_SIGNATURE}


def test_only_the_two_service_accounts_may_touch_the_booking_annotations(
    objects: list[Obj],
) -> None:
    policy = _policy(objects, "scheduler")
    spec = policy["spec"]
    assert {"pods", "pods/status", "pods/binding"} <= _resources(policy)
    assert _operations(policy) == {"CREATE", "UPDATE"}
    # everyone but the scheduler (with kube-scheduler, the same pod) and the device plugin
    (condition,) = spec["matchConditions"]
    expression = " ".join(condition["expression"].split())
    assert expression.startswith("!(request.userInfo.username in [")
    assert set(_literals(expression)) == {
        _username(objects, "scheduler"),
        _username(objects, "device-plugin"),
    }
    cel = _expressions(policy)
    # annotations are optional on either side, and there is no old object on CREATE
    assert cel["variables.newAnnotations"] == (
        "has(object.metadata.annotations) ? object.metadata.annotations : {}"
    )
    assert cel["variables.oldAnnotations"] == (
        "request.operation == 'UPDATE' && has(oldObject.metadata.annotations) ? "
        "oldObject.metadata.annotations : {}"
    )
    for where, text in cel.items():
        if where not in (
            "variables.newAnnotations",
            "variables.oldAnnotations",
            "variables.newLabels",
            "variables.oldLabels",
        ):
            assert not re.search(r"\b(object|oldObject)\.", text), where
    # the keys guarded: exactly the annotations the daemons own, which the webhook strips at
    # CREATE (so a pod created normally passes); none a pod author sets
    prefixes, exact = _guarded(cel["variables.owned"])
    assert prefixes == {"hami.io/vgpu-", "hami.io/bind-"}
    assert exact == {ANNOTATION_BOOKING_SIGNATURE}
    guarded = {
        name
        for name in _known_annotations()
        if name in exact or any(name.startswith(p) for p in prefixes)
    }
    assert guarded == set(BOOKING_ANNOTATIONS)
    assert model.ANNOTATION_GPU_SCHEDULER_POLICY not in guarded
    # a guarded key counts as changed when it is added, removed or given another value
    assert cel["variables.changed"] == (
        "variables.owned.filter(k, !(k in variables.newAnnotations) || "
        "!(k in variables.oldAnnotations) || "
        "variables.newAnnotations[k] != variables.oldAnnotations[k])"
    )
    assert cel["validation 0"] == "size(variables.changed) == 0"
    assert "variables.changed[0]" in cel["message 0"]


def test_the_key_reading_sees_a_policy_that_guards_too_little() -> None:
    """`_guarded` reads what the CEL says: a half that forgets a prefix is caught."""
    owned = _expressions(_policy(SOURCES["manifests"](), "scheduler"))["variables.owned"]
    assert _guarded(owned) == (
        frozenset({"hami.io/vgpu-", "hami.io/bind-"}),
        frozenset({ANNOTATION_BOOKING_SIGNATURE}),
    )
    new, old = owned.split(" + ")
    weaker = new + " + " + old.replace("k.startsWith('hami.io/bind-') || ", "")
    with pytest.raises(AssertionError):
        _guarded(weaker)
    with pytest.raises(AssertionError):
        _guarded(old + " + " + new)


# --- hami-device-plugin-own-pods: what it lets through is what the device plugin writes ------


@pytest.fixture(scope="module")
def device_plugin_pod_patches(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The bodies of the pod PATCHes `hami device-plugin`, as the manifests run it, sends
    (`tests.deployment.exercise`: Allocate served and failed)."""
    calls = exercise.device_plugin_requests(
        plain_manifests(), tmp_path_factory.mktemp("device-plugin-patches")
    )
    return [
        r.json()
        for r in calls
        if r.method == "PATCH" and re.fullmatch(r"/api/v1/namespaces/[^/]+/pods/[^/]+", r.path)
    ]


def test_the_device_plugin_writes_only_what_its_pod_policy_lets_through(
    objects: list[Obj], device_plugin_pod_patches: list[Obj]
) -> None:
    (policy,) = [
        p
        for p in of_kind(objects, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-own-pods")
    ]
    (condition,) = policy["spec"]["matchConditions"]
    assert _literals(condition["expression"]) == [_username(objects, "device-plugin")]
    written = set(_literals(_expressions(policy)["variables.written"]))
    assert written == {
        model.ANNOTATION_BIND_PHASE,
        model.ANNOTATION_DEVICES_TO_ALLOCATE,
        model.ANNOTATION_VGPU_MIG_ALLOCATIONS,
    }
    assert device_plugin_pod_patches, "the exercise patched no pod"
    for body in device_plugin_pod_patches:
        assert set(body) == {"metadata"}, body
        assert set(body["metadata"]) == {"annotations"}, body  # no label, no finalizer
        assert set(body["metadata"]["annotations"]) <= written, body
