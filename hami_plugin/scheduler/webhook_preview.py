"""A pod file as the admission webhook would let it in, for the dry run (`hami schedule`).

A pod written by hand has not been through the API server: the webhook (`webhook.admit_pod`,
HAMi's MutateAdmission) would add `nvidia.com/gpu: 1` to a container asking only memory or
cores, and 100 % cores to one asking whole GPUs, before the scheduler ever sees it. `admit`
runs that decision and applies its JSON patch, so the dry run decides for the pod the scheduler
would get; `describe` says each change in a line. The patch holds only what `admit_pod` writes
(add, replace, remove on object members and `-` appends), which is all `apply_patch` takes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_plugin.scheduler.webhook import PodAdmission, WebhookSettings, admit_pod

__all__ = ["AdmittedPod", "admit", "apply_patch", "describe", "explain"]


@dataclass(frozen=True, slots=True)
class AdmittedPod:
    """The webhook's answer for a pod object, and the object with its patch applied (the
    object as given when the answer is not `allowed`)."""

    admission: PodAdmission
    document: Mapping[str, Any]


def _tokens(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _parent(document: Any, tokens: Sequence[str], path: str) -> Any:
    node = document
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise ValueError(f"no {path!r} in the pod")
    return node


def apply_patch(document: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`document` (a copy) with the RFC 6902 `patch` of `admit_pod` applied: `add`, `replace`
    and `remove` of object members, `add` at `-` of a list. Raises ValueError on any other
    operation or a path that is not there."""
    result: dict[str, Any] = copy.deepcopy(dict(document))
    for operation in patch:
        path = str(operation.get("path", ""))
        tokens = _tokens(path)
        parent = _parent(result, tokens, path)
        last, op = tokens[-1], operation.get("op")
        if isinstance(parent, list) and op == "add" and last == "-":
            parent.append(copy.deepcopy(operation["value"]))
        elif isinstance(parent, dict) and op in ("add", "replace"):
            if op == "replace" and last not in parent:
                raise ValueError(f"no {path!r} in the pod to replace")
            parent[last] = copy.deepcopy(operation["value"])
        elif isinstance(parent, dict) and op == "remove" and last in parent:
            del parent[last]
        else:
            raise ValueError(f"cannot apply {op} at {path!r}")
    return result


def admit(document: Mapping[str, Any], settings: WebhookSettings) -> AdmittedPod:
    """The webhook's decision for the pod object `document`, and the object it would let in."""
    admission = admit_pod(document, settings)
    if not admission.allowed:
        return AdmittedPod(admission, document)
    return AdmittedPod(admission, apply_patch(document, admission.patch))


def _container_name(document: Mapping[str, Any], kind: str, index: str) -> str:
    spec = document.get("spec")
    containers = spec.get(kind) if isinstance(spec, Mapping) else None
    if isinstance(containers, list) and index.isdigit() and int(index) < len(containers):
        entry = containers[int(index)]
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            return str(entry["name"])
    return index


def _leaves(prefix: str, value: Any) -> list[str]:
    """`prefix: value` lines, one per leaf of the maps and lists the webhook adds whole."""
    if isinstance(value, Mapping) and {"name", "value"} == value.keys():  # an env variable
        return [f"{prefix} {value['name']}={value['value']}"]
    if isinstance(value, Mapping) and value:
        return [line for key, item in value.items() for line in _leaves(f"{prefix} {key}", item)]
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        return [line for item in value for line in _leaves(prefix, item)]
    shown = value if isinstance(value, str) else json.dumps(value)
    return [f"{prefix}: {shown}"]


def describe(document: Mapping[str, Any], operation: Mapping[str, Any]) -> list[str]:
    """What one operation of the webhook's patch changes, in lines a user reads
    (`container app: limits nvidia.com/gpu: 1`), against the pod as given."""
    tokens = _tokens(str(operation.get("path", "")))
    op, value = operation.get("op"), operation.get("value")
    if (
        tokens[:1] == ["spec"]
        and len(tokens) >= 3
        and tokens[1] in ("containers", "initContainers")
    ):
        kind = "init container" if tokens[1] == "initContainers" else "container"
        where = f"{kind} {_container_name(document, tokens[1], tokens[2])}:"
        rest = [token for token in tokens[3:] if token not in ("resources", "-")]
        return _leaves(" ".join([where, *rest]), value)
    where = ".".join(tokens)
    if op == "remove":
        return [f"{where} removed"]
    return _leaves(where, value)


def explain(document: Mapping[str, Any] | None, patch: Sequence[Mapping[str, Any]]) -> str:
    """The dry run's `--explain` line: what the webhook changed in `document`; `document` None:
    the webhook was not applied (`--no-webhook`)."""
    if document is None:
        return "admission webhook: not applied (--no-webhook): the pod as given"
    if not patch:
        return "admission webhook: the pod unchanged"
    lines = [line for operation in patch for line in describe(document, operation)]
    return "admission webhook (--no-webhook: the pod as given): " + "; ".join(lines)
