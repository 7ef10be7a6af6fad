"""Run a ValidatingAdmissionPolicy's CEL on one admission request, as the API server does.

`admit(policy, request)` matches the request against the policy's `matchConstraints` and
`matchConditions`, evaluates its `variables` (lazily: an unused variable that would fail, such
as one reading `oldObject` on CREATE, fails nothing) and its `validations`, and answers None
(the policy does not apply), [] (allowed) or the messages of the failed validations (denied;
an evaluation error counts as a failure, the policy failing closed).

The evaluator is cel-python (`celpy`, in the dev extras and their lock): standard CEL with its
macros, which is all these policies use (no Kubernetes library function), so a policy that
relies on one fails here instead of passing untested. Missing (a venv made before it was
added): skipped with how to get it, failed under CI=true as every tool the suite needs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.deployment.manifests import Obj


def _celpy() -> Any:
    try:
        import celpy  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        message = "celpy not found: `pip install cel-python==0.5.0` to run the policies' CEL"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so this test must run")
        pytest.skip(message)
    return celpy


@dataclass(frozen=True)
class Request:
    """One admission request, in the names CEL sees (`request.*`, `object`, `oldObject`,
    `namespaceObject`)."""

    operation: str
    object: Obj | None
    old_object: Obj | None = None
    username: str = "alice"
    extra: Mapping[str, list[str]] = field(default_factory=dict)
    resource: str = "pods"
    sub_resource: str = ""
    namespace_labels: Mapping[str, str] | None = None

    def activation(self) -> dict[str, Any]:
        user: dict[str, Any] = {"username": self.username}
        if self.extra:
            user["extra"] = dict(self.extra)
        namespace: dict[str, Any] = {"metadata": {"name": "team"}}
        if self.namespace_labels is not None:
            namespace["metadata"]["labels"] = dict(self.namespace_labels)
        return {
            "request": {
                "operation": self.operation,
                "userInfo": user,
                "resource": {"group": "", "version": "v1", "resource": self.resource},
                "subResource": self.sub_resource,
            },
            "object": self.object,
            "oldObject": self.old_object,
            "namespaceObject": namespace,
        }


class _Variables:
    """`variables.<name>`, evaluated on first use, as the API server does."""

    def __init__(self, celpy: Any, sources: Mapping[str, str], base: dict[str, Any]) -> None:
        self._celpy, self._sources, self._base = celpy, sources, base
        self.values: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self.values:
            self.values[name] = _evaluate(self._celpy, self._sources[name], self._base, self)
        return self.values[name]


def _names(expression: str) -> list[str]:
    import re

    return re.findall(r"\bvariables\.([A-Za-z_][A-Za-z0-9_]*)", expression)


def _evaluate(celpy: Any, expression: str, base: dict[str, Any], variables: _Variables) -> Any:
    # celpy.Environment() raises the process's recursion limit to 2500 for good: the rest of
    # the suite (Python's JSON nesting limit, which the Go JSON tests pin) must not see that
    limit = sys.getrecursionlimit()
    try:
        return _evaluate_with(celpy, expression, base, variables)
    finally:
        sys.setrecursionlimit(limit)


def _evaluate_with(celpy: Any, expression: str, base: dict[str, Any], variables: _Variables) -> Any:
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    used = {name: variables.get(name) for name in _names(expression)}
    activation = {name: celpy.json_to_cel(value) for name, value in base.items()}
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in used.items()}
    )
    result = program.evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def _matches(policy: Obj, request: Request) -> bool:
    resource = request.resource + (f"/{request.sub_resource}" if request.sub_resource else "")
    return any(
        request.operation in rule["operations"] and resource in rule["resources"]
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    )


def admit(policy: Obj, request: Request) -> list[str] | None:
    """None: the policy does not apply to `request`; else the messages of its failed
    validations ([]: allowed)."""
    celpy = _celpy()
    if not _matches(policy, request):
        return None
    spec = policy["spec"]
    base = request.activation()
    sources = {v["name"]: v["expression"] for v in spec.get("variables", [])}
    variables = _Variables(celpy, sources, base)
    for condition in spec.get("matchConditions", []):
        if not bool(_evaluate(celpy, condition["expression"], base, variables)):
            return None
    failed = []
    for validation in spec["validations"]:
        try:
            allowed = bool(_evaluate(celpy, validation["expression"], base, variables))
        except Exception as error:  # an evaluation error: failurePolicy Fail denies
            failed.append(f"error: {error}")
            continue
        if not allowed:
            message = _evaluate(celpy, validation["messageExpression"], base, variables)
            failed.append(str(message))
    return failed
