"""DELETE as kube-apiserver serves it: `metav1.DeleteOptions` read from the body (or, with no
body, the `gracePeriodSeconds` query parameter), their preconditions checked for every
resource, and a Pod deleted gracefully.

Read from k8s.io/apiserver `pkg/registry/generic/registry/store.go` (`Store.Delete`,
`updateForGracefulDeletionAndFinalizers`), `pkg/registry/rest/delete.go` (`BeforeDelete`),
`pkg/endpoints/handlers/delete.go` (`DeleteResource`: the body wins, the query is read only when
there is none) and k8s.io/kubernetes `pkg/registry/core/pod/strategy.go`
(`podStrategy.CheckGracefulDelete`):

* a precondition whose `uid` or `resourceVersion` is not the object's answers 409 Conflict
  (`BeforeDelete`'s wording), whatever the resource; a negative grace period counts as 1 s;
* a Pod's grace period is the one asked for, else `spec.terminationGracePeriodSeconds` (30 when
  absent: `SetDefaults_PodSpec` sets it at creation), and 0 when the pod is not bound or is
  `Failed`/`Succeeded`. The Pod is first written with `metadata.deletionTimestamp` (now plus the
  grace period) and `metadata.deletionGracePeriodSeconds` (a MODIFIED watch event, its
  `generation` bumped when set); with a grace period of 0 it is then removed (DELETED), else it
  stays until a later DELETE with grace 0 (kubelet, once its containers stopped);
* a DELETE of a Pod already terminating may only shorten its grace period (the deletion
  timestamp moves by the difference); one that asks for as long or longer, or for nothing,
  changes nothing and answers the object as it is; a terminating Pod whose grace period is 0
  is removed;
* the answer is 200 with the object: its last state for a removal, its terminating state
  otherwise (the Pod store sets `ReturnDeletedObject`).

Other resources are removed at once, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.apiserver.status import ApiError
from hami_plugin.testing.apiserver.store import RESOURCES, ObjectStore

# k8s.io/kubernetes pkg/apis/core/v1/defaults.go `SetDefaults_PodSpec`
# (DefaultTerminationGracePeriodSeconds).
DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS = 30

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    """The parts of `metav1.DeleteOptions` the double honours."""

    grace_period_seconds: int | None = None
    uid: str | None = None
    resource_version: str | None = None

    @classmethod
    def from_request(cls, request: RecordedRequest) -> DeleteOptions:
        """The options of a DELETE: from its body when it has one, else from its query.
        Raises ApiError 400 for a body that is not a JSON object or a bad value."""
        if request.body.strip():
            try:
                body = json.loads(request.body)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"error decoding DeleteOptions: {exc}") from exc
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "DeleteOptions must be a JSON object")
            preconditions = body.get("preconditions") or {}
            if not isinstance(preconditions, dict):
                raise ApiError(400, "BadRequest", "preconditions must be an object")
            return cls(
                _grace(body.get("gracePeriodSeconds")),
                _optional_text(preconditions.get("uid")),
                _optional_text(preconditions.get("resourceVersion")),
            )
        return cls(_grace(request.param("gracePeriodSeconds")))


def _grace(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds {value!r}")
    try:
        seconds = int(value)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds {value!r}") from exc
    # BeforeDelete: "Negative values will be treated as the value `1s` on the delete path."
    return 1 if seconds < 0 else seconds


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)


def _conflict(plural: str, name: str, reason: str) -> ApiError:
    # errors.NewConflict(GroupResource{gvk.Group, gvk.Kind}, name, err), as BeforeDelete builds it.
    resource = RESOURCES[plural]
    group = resource.api_version.rpartition("/")[0]
    qualified = f"{resource.kind}.{group}" if group else resource.kind
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {reason}',
        {"name": name, "group": group, "kind": resource.kind},
    )


def check_preconditions(plural: str, obj: JsonObject, options: DeleteOptions) -> None:
    """Raise ApiError 409 when a precondition of `options` does not hold for `obj`."""
    metadata = obj["metadata"]
    name = str(metadata.get("name"))
    uid = metadata.get("uid")
    if options.uid is not None and options.uid != uid:
        raise _conflict(
            plural,
            name,
            f"the UID in the precondition ({options.uid}) does not match the UID in record "
            f"({uid}). The object might have been deleted and then recreated",
        )
    version = metadata.get("resourceVersion")
    if options.resource_version is not None and options.resource_version != version:
        raise _conflict(
            plural,
            name,
            f"the ResourceVersion in the precondition ({options.resource_version}) does not "
            f"match the ResourceVersion in record ({version}). The object might have been "
            "modified",
        )


def pod_grace_period_seconds(pod: JsonObject, asked: int | None) -> int:
    """`podStrategy.CheckGracefulDelete`: the grace period a first DELETE gives `pod`."""
    spec = pod.get("spec") or {}
    if asked is not None:
        period = asked
    else:
        default = spec.get("terminationGracePeriodSeconds")
        period = DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS if default is None else int(default)
    if not spec.get("nodeName"):
        period = 0
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        period = 0
    return 1 if period < 0 else period


def delete(
    store: ObjectStore,
    plural: str,
    key: tuple[str, str],
    options: DeleteOptions,
    now: datetime,
) -> JsonObject:
    """Serve a DELETE of the stored object at `key` (the caller holds the lock and has checked
    it is there); returns the answer's object. Raises ApiError 409 for a failed
    precondition."""
    obj = store.get(plural, key)
    assert obj is not None
    check_preconditions(plural, obj, options)
    if plural != "pods":
        return store.commit(plural, key, "DELETED", None)
    metadata = obj["metadata"]
    grace = pod_grace_period_seconds(obj, options.grace_period_seconds)
    deadline = now + timedelta(seconds=grace)
    marked = dict(metadata)
    if metadata.get("deletionTimestamp") is not None:
        current = metadata.get("deletionGracePeriodSeconds")
        if current is None or int(current) == 0:
            return store.commit(plural, key, "DELETED", None)
        asked = options.grace_period_seconds
        if asked is None or asked >= int(current):
            return obj  # graceful deletion pending: nothing changes
        previous_deadline = datetime.fromisoformat(str(metadata["deletionTimestamp"]))
        grace = asked
        deadline = previous_deadline - timedelta(seconds=int(current) - asked)
    elif isinstance(metadata.get("generation"), int) and metadata["generation"] > 0:
        marked["generation"] = metadata["generation"] + 1
    marked["deletionTimestamp"] = deadline.strftime(_TIME_FORMAT)
    marked["deletionGracePeriodSeconds"] = grace
    terminating = store.commit(plural, key, "MODIFIED", {**obj, "metadata": marked})
    if grace > 0:
        return terminating
    return store.commit(plural, key, "DELETED", None)
