"""PATCH as the API server applies it: `application/merge-patch+json` (RFC 7386),
`application/strategic-merge-patch+json` and `application/json-patch+json` (RFC 6902); other
types answer 415.

Strategic merge (k8s.io/apimachinery `pkg/util/strategicpatch/patch.go`) is a merge patch
except on the lists whose Go field is tagged `patchStrategy:"merge"` (`MERGE_KEYS`, read from
k8s.io/api `core/v1/types.go` and `meta/v1/types.go`): those merge item by item on their
`patchMergeKey` (`status.conditions` by `type`, so a `DisruptionTarget` condition is added
beside `PodScheduled`), a `{"$patch": "delete"}` item removes its match, a `{"$patch":
"replace"}` item replaces the list; a list of scalars (`metadata.finalizers`) gets the patch's
values not already in it. `$setElementOrder/<field>` and `$retainKeys` (client-go's two-way
patches send them) are accepted and do not reorder; `$deleteFromPrimitiveList/<field>` removes
values. Other lists are replaced whole."""

from __future__ import annotations

import copy
from typing import Any

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.apiserver.status import ApiError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, `null` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists that strategic merge merges, by path from the object's root, with their merge key
# (None: a list of scalars, merged as a set).
MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    ("metadata", "finalizers"): None,
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
}


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """`target` with the strategic merge `patch` applied (`path`: where `target` sits in the
    object). Raises ValueError for a directive it cannot apply."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive is not None:
        raise ValueError(f"unsupported $patch directive {directive!r} on a map")
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
            continue
        where = (*path, key)
        current = result.get(key)
        if where in MERGE_KEYS and isinstance(value, list) and isinstance(current, list):
            result[key] = _merge_list(current, value, MERGE_KEYS[where])
        else:
            result[key] = strategic_merge_patch(current, value, where)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str | None) -> list[Any]:
    if merge_key is None:
        return [*current, *(copy.deepcopy(v) for v in patch if v not in current)]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            copy.deepcopy(item)
            for item in patch
            if not (isinstance(item, dict) and item.get("$patch") == "replace")
        ]
    merged = list(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise ValueError(f"a list item without its merge key {merge_key!r}: {item!r}")
        index = next(
            (
                i
                for i, old in enumerate(merged)
                if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(strategic_merge_patch({}, item, ("<item>",)))
        else:
            merged[index] = strategic_merge_patch(merged[index], item, ("<item>",))
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"path element {part!r} not found")
    return node


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ValueError(f"path {'/'.join(parts)!r} not found")


def _remove(doc: Any, parts: list[str]) -> Any:
    value = _get(doc, parts)
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return value


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise ValueError(f"bad array index {last!r}")
        parent.insert(index, copy.deepcopy(value))
    else:
        raise ValueError(f"cannot add below a {type(parent).__name__}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch on a copy of `doc`. Raises ValueError on a bad or failed operation."""
    if not isinstance(operations, list):
        raise ValueError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise ValueError(f"bad operation {op!r}")
        parts = _pointer(op["path"])
        name = op.get("op")
        if name == "add":
            doc = _add(doc, parts, op.get("value"))
        elif name == "remove":
            _remove(doc, parts)
        elif name == "replace":
            _get(doc, parts)
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, op.get("value"))
        elif name == "test":
            if _get(doc, parts) != op.get("value"):
                raise ValueError(f"test failed at {op['path']!r}")
        elif name in ("copy", "move"):
            source = _pointer(str(op.get("from", "")))
            value = _remove(doc, source) if name == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value)
        else:
            raise ValueError(f"unknown operation {name!r}")
    return doc


def apply_patch(obj: JsonObject, request: RecordedRequest) -> JsonObject:
    """`obj` patched by the PATCH `request`, by its content type. Raises ApiError: 400 for a
    body that is not JSON, 415 for another content type, 422 for a patch that cannot apply or
    leaves no metadata."""
    try:
        patch = request.json()
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from exc
    content_type = request.content_type
    try:
        if content_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
            if not isinstance(patch, dict):
                raise ValueError("a merge patch must be a JSON object")
            if content_type == MERGE_PATCH:
                result = merge_patch(obj, patch)
            else:
                result = strategic_merge_patch(obj, patch)
        elif content_type == JSON_PATCH:
            result = json_patch(obj, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}; "
                f'got "{content_type}"',
            )
    except ValueError as exc:
        raise ApiError(422, "Invalid", f"the patch could not be applied: {exc}") from exc
    if not isinstance(result, dict) or not isinstance(result.get("metadata"), dict):
        raise ApiError(422, "Invalid", "the patched object has no metadata")
    return result
