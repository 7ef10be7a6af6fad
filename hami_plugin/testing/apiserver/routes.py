"""The REST verbs on the store: a request's path routed to a collection, an object, a Pod's
`binding` or its (or a PodDisruptionBudget's) `status`, and GET, LIST, POST (create), PUT
(replace), PATCH, DELETE (`deletion`) and the bind applied to it as the API server applies
them, with the Priority admission plugin (`priority`) on Pod and PriorityClass writes. Watches
are routed here too, and served by `watch`."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from hami_plugin.testing.apiserver import deletion, priority
from hami_plugin.testing.apiserver.deletion import DeleteOptions
from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.patches import apply_patch
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.apiserver.selectors import Selector
from hami_plugin.testing.apiserver.status import ApiError, not_found
from hami_plugin.testing.apiserver.store import RESOURCES, ObjectStore, Resource


def _api_prefix(resource: Resource) -> str:
    """`/api/v1` for the core group, `/apis/<group>/<version>` for the others."""
    if resource.api_version == "v1":
        return "/api/v1"
    return "/apis/" + re.escape(resource.api_version)


def _route_table() -> list[tuple[re.Pattern[str], str]]:
    """Every resource's collection (cluster-wide, and per namespace for a namespaced one) and
    object paths, then the Pod subresources."""
    table: list[tuple[re.Pattern[str], str]] = []
    for resource in RESOURCES.values():
        prefix, plural = _api_prefix(resource), f"(?P<res>{resource.plural})"
        table.append((re.compile(f"{prefix}/{plural}"), "collection"))
        if resource.namespaced:
            scoped = f"{prefix}/namespaces/(?P<ns>[^/]+)/{plural}"
            table.append((re.compile(scoped), "collection"))
            table.append((re.compile(f"{scoped}/(?P<name>[^/]+)"), "object"))
        else:
            table.append((re.compile(f"{prefix}/{plural}/(?P<name>[^/]+)"), "object"))
    pod = "/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods)/(?P<name>[^/]+)"
    table.append((re.compile(f"{pod}/binding"), "binding"))
    table.append((re.compile(f"{pod}/status"), "status"))
    budget = r"/apis/policy/v1/namespaces/(?P<ns>[^/]+)/(?P<res>poddisruptionbudgets)"
    table.append((re.compile(f"{budget}/(?P<name>[^/]+)/status"), "status"))
    return table


_ROUTES = _route_table()


@dataclass(frozen=True, slots=True)
class Route:
    """Where a path leads: a "collection", an "object", a Pod's "binding" or its "status"."""

    kind: str
    plural: str
    namespace: str
    """The namespace in the path ("" for a cluster-wide collection or a Node)."""
    name: str | None


def route(path: str) -> Route:
    """The route of `path`. Raises ApiError 404 for an unknown path."""
    for pattern, kind in _ROUTES:
        match = pattern.fullmatch(path)
        if match is not None:
            groups = match.groupdict()
            return Route(
                kind, groups.get("res") or "pods", groups.get("ns") or "", groups.get("name")
            )
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


def handle(store: ObjectStore, request: RecordedRequest) -> tuple[int, JsonObject]:
    """Serve one request that is not a watch; returns (status, JSON body). Raises ApiError for
    failures."""
    target = route(request.path)
    with store.lock:
        if target.kind == "binding":
            return _bind(store, target.namespace, str(target.name), request)
        if target.kind == "status":
            return _status(store, target.plural, target.namespace, str(target.name), request)
        if target.kind == "collection":
            return _collection(store, target.plural, target.namespace, request)
        return _object(store, target.plural, target.namespace, str(target.name), request)


def _collection(
    store: ObjectStore, plural: str, namespace: str, request: RecordedRequest
) -> tuple[int, JsonObject]:
    if request.method == "GET":
        return 200, _list(store, plural, namespace, request)
    if request.method == "POST":
        if RESOURCES[plural].namespaced and not namespace:
            raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
        created = _body_object(request)
        if plural == "pods":
            created = priority.admit_pod_create(store, created)
        elif plural == "priorityclasses":
            priority.validate_priority_class(store, created, creating=True)
        return 201, copy.deepcopy(store.create(plural, namespace, created))
    raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")


def _list(store: ObjectStore, plural: str, namespace: str, request: RecordedRequest) -> JsonObject:
    selector = Selector.parse(plural, namespace, request)
    limit_text = request.param("limit") or "0"
    if not limit_text.isdigit():
        raise ApiError(400, "BadRequest", f"invalid limit {limit_text!r}")
    return store.list_objects(plural, selector, int(limit_text), request.param("continue"))


def _object(
    store: ObjectStore, plural: str, namespace: str, name: str, request: RecordedRequest
) -> tuple[int, JsonObject]:
    key = (namespace, name)
    obj = store.get(plural, key)
    if obj is None:
        raise not_found(plural, name)
    if request.method == "GET":
        return 200, copy.deepcopy(obj)
    if request.method == "DELETE":
        options = DeleteOptions.from_request(request)
        return 200, copy.deepcopy(deletion.delete(store, plural, key, options, datetime.now(UTC)))
    if request.method == "PATCH":
        patched = _admit_update(store, plural, apply_patch(obj, request), obj)
        _check_precondition(plural, name, obj, patched)
        return 200, copy.deepcopy(store.replace(plural, key, obj, patched))
    if request.method == "PUT":
        replacement = _body_object(request)
        metadata = replacement.get("metadata")
        if not isinstance(metadata, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if metadata.get("name") not in (None, name):
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({metadata['name']}) does not match the name on "
                f"the URL ({name})",
            )
        replacement = _admit_update(store, plural, replacement, obj)
        _check_precondition(plural, name, obj, replacement)
        return 200, copy.deepcopy(store.replace(plural, key, obj, replacement))
    raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")


def _admit_update(
    store: ObjectStore, plural: str, proposed: JsonObject, current: JsonObject
) -> JsonObject:
    """The Priority admission plugin on an UPDATE (`priority`)."""
    if plural == "pods":
        return priority.admit_pod_update(proposed, current)
    if plural == "priorityclasses":
        priority.validate_priority_class(store, proposed, creating=False)
    return proposed


def _check_precondition(plural: str, name: str, current: JsonObject, proposed: JsonObject) -> None:
    # A patch that leaves metadata.resourceVersion alone carries the current value.
    wanted = proposed["metadata"].get("resourceVersion")
    if wanted not in (None, "") and wanted != current["metadata"]["resourceVersion"]:
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            {"name": name, "kind": plural},
        )


def _status(
    store: ObjectStore, plural: str, namespace: str, name: str, request: RecordedRequest
) -> tuple[int, JsonObject]:
    """`pods/<name>/status` (or a PodDisruptionBudget's): GET the object; PATCH or PUT change
    its `status` only, the rest of the request is ignored (as kube-scheduler's condition
    writes, kubelet's status writes and the disruption controller's go)."""
    key = (namespace, name)
    pod = store.get(plural, key)
    if pod is None:
        raise not_found(plural, name)
    if request.method == "GET":
        return 200, copy.deepcopy(pod)
    if request.method == "PATCH":
        proposed = apply_patch(pod, request)
    elif request.method == "PUT":
        proposed = _body_object(request)
        if not isinstance(proposed.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
    else:
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")
    _check_precondition(plural, name, pod, proposed)
    status = proposed.get("status")
    if not isinstance(status, dict):
        raise ApiError(422, "Invalid", "status must be an object")
    return 200, copy.deepcopy(store.replace(plural, key, pod, {**pod, "status": status}))


def _bind(
    store: ObjectStore, namespace: str, name: str, request: RecordedRequest
) -> tuple[int, JsonObject]:
    """`POST pods/<name>/binding`: set `spec.nodeName` and the PodScheduled condition and merge
    the Binding's annotations (409 if the pod is already bound or `metadata.uid` names another
    pod, 400 if the Binding's name is not the pod's)."""
    if request.method != "POST":
        raise ApiError(405, "MethodNotAllowed", "binding only supports POST")
    binding = _body_object(request)
    target = binding.get("target")
    metadata = binding.get("metadata") if isinstance(binding.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    if not isinstance(target, dict) or not target.get("name"):
        raise ApiError(422, "Invalid", "Binding.target.name is required")
    if metadata.get("name") not in (None, name):
        raise ApiError(
            400,
            "BadRequest",
            f"name in URL does not match name in Binding object: {name},{metadata['name']}",
        )
    key = (namespace, name)
    pod = store.get("pods", key)
    if pod is None:
        raise not_found("pods", name)
    uid = metadata.get("uid")
    if uid and uid != pod["metadata"].get("uid"):
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
            f"UID in precondition: {uid}, UID in object meta: {pod['metadata'].get('uid')}",
            {"name": name, "kind": "pods/binding"},
        )
    bound = pod.get("spec", {}).get("nodeName")
    if bound:
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
            f'assigned to node "{bound}"',
            {"name": name, "kind": "pods/binding"},
        )
    updated = copy.deepcopy(pod)
    updated.setdefault("spec", {})["nodeName"] = str(target["name"])
    if isinstance(metadata.get("annotations"), dict):
        updated["metadata"].setdefault("annotations", {}).update(metadata["annotations"])
    status = updated.setdefault("status", {})
    conditions = [c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"]
    status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True"}]
    store.commit("pods", key, "MODIFIED", updated)
    return 201, {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }


def _body_object(request: RecordedRequest) -> JsonObject:
    try:
        body = request.json()
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body must be a JSON object")
    return body
