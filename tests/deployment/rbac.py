"""RBAC as the API server decides it, small enough to check the manifests against what the
daemons really call.

`access_of` turns one HTTP request into the attributes RBAC authorises (API group, resource
with subresource, verb, namespace, object name), as the API server's request-info resolver
does. `grants_for` flattens the Roles and ClusterRoles a ServiceAccount is bound to into one
`Grant` per (rule, resource, verb, resource name). `problems` compares the two both ways: a
request no grant allows (the daemon would get 403), a grant no request uses (more than the
daemon needs), a cluster-wide grant only ever used in the daemon's own namespace (a Role would
do), and a namespaced grant on one object without `resourceNames` (it could name it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
NAMED_VERBS = frozenset({"get", "update", "patch", "delete"})
"""Verbs RBAC can narrow with resourceNames (list/watch only with a metadata.name selector,
create never: the object has no name yet when the decision is made)."""


@dataclass(frozen=True, slots=True)
class Access:
    """One request as RBAC sees it. `namespace` None: a cluster-scoped resource or a request
    across all namespaces; `name` None: a collection."""

    group: str
    resource: str
    verb: str
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = (
            f" in {self.namespace}" if self.namespace else " (no namespace: cluster-scoped or all)"
        )
        what = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{what}{where}"


def access_of(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Access:
    """The RBAC attributes of a request to the API. Raises ValueError for a path outside
    /api and /apis (no such request is made by a client of resources)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a resource path: {path}")
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ValueError(f"no resource in {path}")
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    method = method.upper()
    if method == "GET":
        watching = (query.get("watch") or [""])[-1] in ("true", "1")
        verb = "get" if name else "watch" if watching else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    elif method in _VERBS:
        verb = _VERBS[method]
    else:
        raise ValueError(f"unexpected method {method} {path}")
    return Access(group, resource, verb, namespace, name)


@dataclass(frozen=True, slots=True)
class Grant:
    """One permission of a role binding: `namespace` None for a ClusterRole bound by a
    ClusterRoleBinding (everywhere), else the RoleBinding's namespace; `name` one of the rule's
    resourceNames, None when the rule names none."""

    role: str
    group: str
    resource: str
    verb: str
    namespace: str | None
    name: str | None

    def allows(self, access: Access) -> bool:
        return (
            self.group == access.group
            and self.resource == access.resource
            and self.verb == access.verb
            and (self.namespace is None or self.namespace == access.namespace)
            and (self.name is None or self.name == access.name)
        )

    def __str__(self) -> str:
        scope = f"in {self.namespace}" if self.namespace else "cluster-wide"
        what = f" {self.name}" if self.name else ""
        return f"{self.role}: {self.verb} {self.group or 'core'}/{self.resource}{what} {scope}"


@dataclass(frozen=True, slots=True)
class Bindings:
    """What a ServiceAccount is bound to: grants from roles defined in the manifests, and the
    (kind, name) of roles it is bound to that the manifests do not define (built-in ones)."""

    grants: tuple[Grant, ...]
    external: frozenset[tuple[str, str]]


def _subject_is(subject: Mapping[str, Any], namespace: str, name: str) -> bool:
    return (
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == name
        and subject.get("namespace") == namespace
    )


def grants_for(objects: Iterable[Mapping[str, Any]], namespace: str, name: str) -> Bindings:
    """Everything the ServiceAccount `namespace/name` may do according to `objects`."""
    objects = list(objects)
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o.get("kind") in ("Role", "ClusterRole")
    }
    grants: list[Grant] = []
    external: set[tuple[str, str]] = set()
    for binding in objects:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(_subject_is(s, namespace, name) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_namespace = scope if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_namespace, ref["name"]))
        if role is None:
            external.add((ref["kind"], ref["name"]))
            continue
        label = f"{ref['kind']} {ref['name']}"
        for rule in role.get("rules") or []:
            names = rule.get("resourceNames") or [None]
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        for object_name in names:
                            grants.append(Grant(label, group, resource, verb, scope, object_name))
    return Bindings(tuple(sorted(set(grants), key=str)), frozenset(external))


def problems(
    accesses: Iterable[Access], grants: Sequence[Grant], own_namespace: str | None = None
) -> list[str]:
    """Every difference between what was called and what is granted; empty when they match.

    `own_namespace` is the daemon's namespace: a cluster-wide grant used only there should be
    a Role there (workloads' namespaces are not known in advance, so a grant used in one of
    them must stay cluster-wide)."""
    accesses = sorted(set(accesses), key=str)
    found: list[str] = []
    for grant in grants:
        if "*" in (grant.group, grant.resource, grant.verb):
            found.append(f"wildcard: {grant}")
    for access in accesses:
        if not any(g.allows(access) for g in grants):
            found.append(f"missing: the daemon calls {access}, no rule allows it")
    for grant in grants:
        used = [a for a in accesses if grant.allows(a)]
        if not used:
            found.append(f"unused: {grant}, the daemon never calls it")
            continue
        namespaces = {a.namespace for a in used}
        if grant.namespace is None and own_namespace and namespaces == {own_namespace}:
            found.append(
                f"too broad: {grant} is only used in namespace {own_namespace}: make it a Role"
            )
        names = {a.name for a in used}
        if (
            grant.namespace is not None
            and grant.name is None
            and grant.verb in NAMED_VERBS
            and len(names) == 1
            and None not in names
        ):
            found.append(f"too broad: {grant} is only used on {names.pop()}: add resourceNames")
    return found
