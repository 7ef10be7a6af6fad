"""`FakeKube`'s write history and the selectors its lists and watches apply (the API server's
equality selectors, over the JSON it keeps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hami_plugin.kube.records import WatchEvent

__all__ = ["Write", "collection_of", "fields_match", "in_path", "labels_match"]


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """One write to a node or a pod: the object after it (`after`) and before it (None: it
    created the object), at `version`."""

    version: int
    kind: str
    after: dict[str, Any]
    before: dict[str, Any] | None

    def event(
        self, path: str, label_selector: str | None, field_selector: str | None
    ) -> WatchEvent | None:
        """What a watch of `path` with these selectors sees of this write, if anything."""
        now, then = (
            obj is not None
            and in_path(obj, path)
            and labels_match(obj, label_selector)
            and fields_match(obj, field_selector)
            for obj in (self.after, self.before)
        )
        if now:
            return WatchEvent("MODIFIED" if then else "ADDED", self.after)
        return WatchEvent("DELETED", self.after) if then else None


def collection_of(path: str) -> str:
    """ "nodes" or "pods", the collections the fake keeps. Raises ValueError for another."""
    parts = path.strip("/").split("/")
    if parts == ["api", "v1", "nodes"]:
        return "nodes"
    if parts == ["api", "v1", "pods"] or (
        parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"] and len(parts) == 5
    ):
        return "pods"
    raise ValueError(f"FakeKube cannot list {path!r}")


def in_path(obj: Mapping[str, Any], path: str) -> bool:
    """Whether `obj` is in the collection of `path` (all of it, or one namespace's pods)."""
    parts = path.strip("/").split("/")
    return len(parts) != 5 or obj.get("metadata", {}).get("namespace") == parts[3]


def _selector(text: str | None) -> list[tuple[str, str | None]]:
    terms: list[tuple[str, str | None]] = []
    for term in (text or "").split(","):
        if not term:
            continue
        if "!" in term or "(" in term:
            raise ValueError(f"FakeKube supports equality selectors only, not {term!r}")
        key, sep, value = term.partition("=")
        terms.append((key.strip(), value.lstrip("=").strip() if sep else None))
    return terms


def labels_match(obj: Mapping[str, Any], selector: str | None) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(
        key in labels if value is None else labels.get(key) == value
        for key, value in _selector(selector)
    )


def fields_match(obj: Mapping[str, Any], selector: str | None) -> bool:
    for key, value in _selector(selector):
        where: Any = obj
        for part in key.split("."):
            where = where.get(part) if isinstance(where, Mapping) else None
        if (where or "") != (value or ""):
            return False
    return True
