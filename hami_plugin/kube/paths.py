"""API paths built from names, whatever the names hold.

A namespace, a name or a node name goes into a URL path as one segment, and the names come from
outside (a pod author's namespace and name, kube-scheduler's `/bind` arguments). Quoting alone
does not keep a name in its segment: the API server decodes the path before it routes it, so
`a%2Fb` still reads as two segments, and `..` climbs one up. client-go therefore refuses such a
name before it sends anything (`IsValidPathSegmentName` in k8s.io/apimachinery
`pkg/api/validation/path/name.go`: not `.` or `..`, no `/` and no `%`; and a name may not be
empty); so does this client, and it percent-quotes what remains (`?`, `#`, spaces) so that it
stays inside its segment. A name that also goes into a field selector may not hold the
selector's own syntax (`,`, `=`, `!`, `\\`) either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import quote

from hami_plugin.kube.errors import InvalidName

__all__ = ["check_selector_value", "collection_path", "fill_path", "path_segment_problem"]

_PARAMETER = re.compile(r"\{(\w+)\}")
_SELECTOR_SYNTAX = (",", "=", "!", "\\")


def path_segment_problem(segment: str) -> str | None:
    """Why `segment` cannot be one segment of an API path, as client-go words it; None when
    it can."""
    if not segment:
        return "may not be empty"
    if segment in (".", ".."):
        return f"may not be '{segment}'"
    problems = [f"may not contain '{part}'" for part in ("/", "%") if part in segment]
    return ", ".join(problems) or None


def _checked(kind: str, value: str) -> str:
    problem = path_segment_problem(value)
    if problem is not None:
        raise InvalidName(f"invalid {kind} {json.dumps(value)}: {problem}")
    return quote(value, safe="")


def fill_path(template: str, params: Mapping[str, str]) -> str:
    """`template` (`/api/v1/namespaces/{namespace}/pods/{name}`) with each `{key}` replaced by
    `params[key]`, checked and percent-quoted. Raises InvalidName for a value that is no path
    segment (KeyError for a key `params` lacks)."""
    return _PARAMETER.sub(lambda match: _checked(match[1], params[match[1]]), template)


def collection_path(path: str) -> str:
    """`path`, a collection as a caller wrote it (`/api/v1/pods`, `/api/v1/namespaces/<ns>/pods`,
    `/apis/<group>/<version>/[namespaces/<ns>/]<resource>`), every segment checked and
    percent-quoted. Raises InvalidName for another shape: a namespace holding a `/` adds a
    segment, an empty one leaves `//`."""
    segments = path.split("/")
    prefix = 3 if segments[1:2] == ["api"] else 4 if segments[1:2] == ["apis"] else 0
    namespaced = len(segments) == prefix + 3 and segments[prefix : prefix + 1] == ["namespaces"]
    if segments[0] != "" or not prefix or not (len(segments) == prefix + 1 or namespaced):
        raise InvalidName(
            f"invalid collection path {json.dumps(path)}: not /api/<version>/[namespaces/<ns>/]"
            "<resource> or /apis/<group>/<version>/[namespaces/<ns>/]<resource>"
        )
    return "/".join(
        segment if index == 0 else _checked("path segment", segment)
        for index, segment in enumerate(segments)
    )


def check_selector_value(kind: str, value: str) -> str:
    """`value` for a field selector term (`spec.nodeName=<value>`): a path segment that holds
    none of the selector's syntax. Raises InvalidName."""
    _checked(kind, value)
    for part in _SELECTOR_SYNTAX:
        if part in value:
            raise InvalidName(f"invalid {kind} {json.dumps(value)}: may not contain '{part}'")
    return value
