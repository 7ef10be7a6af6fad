"""Label and field selectors as the API server applies them to lists and watches: field
selectors `=`, `==`, `!=` on the fields listed in `FIELD_SELECTORS`, label selectors `k=v`,
`k==v`, `k!=v`, `k`, `!k`, terms joined by commas."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.request import RecordedRequest
from hami_plugin.testing.apiserver.status import ApiError

# Field selectors the real API server accepts for these resources (a subset).
FIELD_SELECTORS: dict[str, frozenset[str]] = {
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.schedulerName",
            "status.phase",
        }
    ),
    "events": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
        }
    ),
    "leases": frozenset({"metadata.name", "metadata.namespace"}),
    "secrets": frozenset({"metadata.name", "metadata.namespace", "type"}),
    "resourcequotas": frozenset({"metadata.name", "metadata.namespace"}),
    "mutatingwebhookconfigurations": frozenset({"metadata.name"}),
    "poddisruptionbudgets": frozenset({"metadata.name", "metadata.namespace"}),
    "priorityclasses": frozenset({"metadata.name"}),
}


def _field_value(obj: JsonObject, dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _parse_field_selector(resource: str, text: str) -> list[tuple[str, str, bool]]:
    terms: list[tuple[str, str, bool]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        key, op, value = match.groups()
        if key not in FIELD_SELECTORS[resource]:
            raise ApiError(
                400,
                "BadRequest",
                f'Unable to find "/v1, Resource={resource}" that match label selector "", '
                f'field selector "{text}": field label not supported: {key}',
            )
        terms.append((key, value, op != "!="))
    return terms


def _label_matches(labels: Mapping[str, str], text: str) -> bool:
    for term in filter(None, (t.strip() for t in text.split(","))):
        if match := re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term):
            key, op, value = match.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", term):
            if term not in labels:
                return False
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return True


@dataclass(frozen=True, slots=True)
class Selector:
    """A request's namespace, field selector and label selector, checked once when parsed."""

    namespace: str
    field_terms: tuple[tuple[str, str, bool], ...]
    label_text: str

    @classmethod
    def parse(cls, plural: str, namespace: str, request: RecordedRequest) -> Selector:
        """The selector of a list or watch of `plural` in `namespace` ("" for all). Raises
        ApiError 400 for a bad selector or a field the resource cannot be selected by."""
        field_terms = _parse_field_selector(plural, request.param("fieldSelector") or "")
        label_text = request.param("labelSelector") or ""
        _label_matches({}, label_text)  # a bad selector is a 400 now, not in the middle of a watch
        return cls(namespace, tuple(field_terms), label_text)

    def equal_to(self, field: str) -> str | None:
        """The value the selector requires `field` to equal, if it has such a term."""
        for key, value, equal in self.field_terms:
            if key == field and equal:
                return value
        return None

    def matches(self, obj: JsonObject) -> bool:
        """Whether the stored object `obj` is selected."""
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return False
        if any((_field_value(obj, k) == v) != eq for k, v, eq in self.field_terms):
            return False
        return _label_matches(obj["metadata"].get("labels") or {}, self.label_text)
