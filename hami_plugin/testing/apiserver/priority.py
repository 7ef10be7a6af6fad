"""The `Priority` admission plugin, as kube-apiserver runs it on Pods and PriorityClasses
created or updated over HTTP (k8s.io/kubernetes `plugin/pkg/admission/priority/admission.go`,
`Plugin.admitPod` and `Plugin.validatePriorityClass`; the PriorityClass defaults from
`pkg/apis/scheduling/v1/defaults.go` `SetDefaults_PriorityClass`):

* Pod CREATE: `spec.priorityClassName` names a PriorityClass, whose `value` becomes
  `spec.priority` and whose `preemptionPolicy` becomes `spec.preemptionPolicy`; an unknown name
  is 403 Forbidden. With no name, the `globalDefault` class (the lowest value if several) gives
  them and its name, else priority 0 and `PreemptLowerPriority`. A pod that sets a
  `spec.priority` or `spec.preemptionPolicy` other than the computed one is 403 Forbidden;
* Pod UPDATE: a `spec.priority` or `spec.preemptionPolicy` left out keeps the stored one;
* PriorityClass CREATE or UPDATE: a second `globalDefault` class is 403 Forbidden;
  `preemptionPolicy` defaults to `PreemptLowerPriority` (done in `validation`, for every write).

Objects stored through `FakeApiServer`'s helpers skip admission, as fixtures loaded straight
into etcd would. The built-in `system-cluster-critical` and `system-node-critical` classes are
not created at start (the real server's bootstrap hook does): a test that needs them adds them.
"""

from __future__ import annotations

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.status import ApiError
from hami_plugin.testing.apiserver.store import ObjectStore

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"


def _forbidden(plural: str, obj: JsonObject, message: str) -> ApiError:
    # admission.NewForbidden: the object's name, else its generateName, in errors.NewForbidden.
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    group = "scheduling.k8s.io" if plural == "priorityclasses" else ""
    qualified = f"{plural}.{group}" if group else plural
    subject = f'{qualified} "{name}"' if name else qualified
    return ApiError(
        403,
        "Forbidden",
        f"{subject} is forbidden: {message}",
        {"name": name, "group": group, "kind": plural},
    )


def _default_class(store: ObjectStore) -> JsonObject | None:
    """`getDefaultPriorityClass`: the globalDefault class of the lowest value, if any."""
    defaults = [pc for _, pc in store.items("priorityclasses") if pc.get("globalDefault")]
    return min(defaults, key=lambda pc: int(pc.get("value") or 0), default=None)


def admit_pod_create(store: ObjectStore, pod: JsonObject) -> JsonObject:
    """`pod` with its priority resolved, as `admitPod` does on CREATE (the caller holds the
    lock). Raises ApiError 403 as the plugin does."""
    spec = dict(pod.get("spec") or {})
    class_name = str(spec.get("priorityClassName") or "")
    policy: str | None
    if not class_name:
        default = _default_class(store)
        if default is None:
            value, policy = 0, PREEMPT_LOWER_PRIORITY
        else:
            value, policy = int(default.get("value") or 0), default.get("preemptionPolicy")
            spec["priorityClassName"] = default["metadata"]["name"]
    else:
        priority_class = store.get("priorityclasses", ("", class_name))
        if priority_class is None:
            raise _forbidden("pods", pod, f"no PriorityClass with name {class_name} was found")
        value = int(priority_class.get("value") or 0)
        policy = priority_class.get("preemptionPolicy")
    asked = spec.get("priority")
    if asked is not None and asked != value:
        raise _forbidden(
            "pods",
            pod,
            f"the integer value of priority ({asked}) must not be provided in pod spec; "
            f"priority admission controller computed {value} from the given PriorityClass name",
        )
    spec["priority"] = value
    if policy is not None:
        asked_policy = spec.get("preemptionPolicy")
        if asked_policy is not None and asked_policy != policy:
            raise _forbidden(
                "pods",
                pod,
                f"the string value of PreemptionPolicy ({asked_policy}) must not be provided "
                f"in pod spec; priority admission controller computed {policy} from the given "
                "PriorityClass name",
            )
        spec["preemptionPolicy"] = policy
    return {**pod, "spec": spec}


def admit_pod_update(pod: JsonObject, stored: JsonObject) -> JsonObject:
    """`admitPod` on UPDATE: a priority or preemption policy left out keeps the stored one."""
    spec = pod.get("spec")
    old_spec = stored.get("spec") or {}
    if not isinstance(spec, dict):
        return pod
    kept = {
        field: old_spec[field]
        for field in ("priority", "preemptionPolicy")
        if spec.get(field) is None and old_spec.get(field) is not None
    }
    return {**pod, "spec": {**spec, **kept}} if kept else pod


def validate_priority_class(store: ObjectStore, priority_class: JsonObject, creating: bool) -> None:
    """`validatePriorityClass`: only one globalDefault class. Raises ApiError 403."""
    if not priority_class.get("globalDefault"):
        return
    default = _default_class(store)
    if default is None:
        return
    default_name = default["metadata"]["name"]
    if creating or default_name != (priority_class.get("metadata") or {}).get("name"):
        raise _forbidden(
            "priorityclasses",
            priority_class,
            f"PriorityClass {default_name} is already marked as default. Only one default "
            "can exist",
        )
