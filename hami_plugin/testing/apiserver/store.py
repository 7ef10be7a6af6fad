"""The double's objects: one cluster-wide `resourceVersion` counter bumped on every write, every
write recorded as one change at its new version (the history watches resume from), the Pods
indexed by `spec.nodeName`, and list pages served from a snapshot.

Stored objects are never changed in place: every write stores a new dict (sharing unchanged
parts with the old one), so the history and the watch streams hold references, not copies, and
serialise them outside the lock.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.selectors import Selector
from hami_plugin.testing.apiserver.status import ApiError
from hami_plugin.testing.apiserver.validation import admit


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource the double serves."""

    plural: str
    kind: str
    namespaced: bool
    api_version: str = "v1"


RESOURCES = {
    "nodes": Resource("nodes", "Node", namespaced=False),
    "namespaces": Resource("namespaces", "Namespace", namespaced=False),
    "pods": Resource("pods", "Pod", namespaced=True),
    "events": Resource("events", "Event", namespaced=True),
    "leases": Resource("leases", "Lease", namespaced=True, api_version="coordination.k8s.io/v1"),
    "secrets": Resource("secrets", "Secret", namespaced=True),
    "resourcequotas": Resource("resourcequotas", "ResourceQuota", namespaced=True),
    "mutatingwebhookconfigurations": Resource(
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
        api_version="admissionregistration.k8s.io/v1",
    ),
    "poddisruptionbudgets": Resource(
        "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, api_version="policy/v1"
    ),
    "priorityclasses": Resource(
        "priorityclasses", "PriorityClass", namespaced=False, api_version="scheduling.k8s.io/v1"
    ),
}

# Continue tokens kept (oldest dropped first; a dropped token answers 410 like an expired one).
_MAX_CONTINUE_TOKENS = 100

_EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list "
    "result. You can start a new list without the continue parameter, or use "
    "the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent "
    "list - objects that were created, modified, or deleted between the time "
    "the first chunk was returned and now may show up in the list."
)


def _node_name(pod: JsonObject | None) -> str:
    if pod is None:
        return ""
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


def _with_version(obj: JsonObject, version_source: JsonObject) -> JsonObject:
    """`obj` with the resourceVersion of `version_source` (new top-level and metadata dicts)."""
    metadata = dict(obj["metadata"])
    metadata["resourceVersion"] = version_source["metadata"]["resourceVersion"]
    return {**obj, "metadata": metadata}


@dataclass(frozen=True, slots=True)
class Change:
    """One write, as the watch cache keeps it. `obj` is the new state (for DELETED the last
    state at the deletion's version); `previous` the state before (None for ADDED)."""

    resource_version: int
    plural: str
    type: str
    obj: JsonObject
    previous: JsonObject | None

    def event_for(self, selector: Selector) -> JsonObject | None:
        """The event a watcher with `selector` gets for this change (None: nothing), as the
        watch cache converts it: an object that stops matching is DELETED, at this version."""
        now = self.type != "DELETED" and selector.matches(self.obj)
        before = self.previous is not None and selector.matches(self.previous)
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": self.obj}
        if before:
            assert self.previous is not None
            return {"type": "DELETED", "object": _with_version(self.previous, self.obj)}
        return None


class ObjectStore:
    """The stored objects of every resource, their versions and their history.

    Every method expects the caller to hold `lock`; `changed` is notified on every write (and
    whenever a watch should look again: a drop, a stop, an expired history).
    """

    def __init__(self, history_size: int) -> None:
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size}")
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objects: dict[str, dict[tuple[str, str], JsonObject]] = {r: {} for r in RESOURCES}
        # Pods by spec.nodeName, as the real server's field index: a kubelet's or device
        # plugin's list of its node's pods must not cost a scan of every pod's fields.
        self._pods_on_node: dict[str, set[tuple[str, str]]] = {}
        # As etcd, whose revision starts at 1: an empty server lists at "1" and the first write
        # is "2". A list never answers "0", which a watch reads as "any version" (a snapshot).
        self.resource_version = 1
        self._history: list[Change] = []
        # Every change with a version above the floor is in _history, in order, with
        # consecutive versions: _history[i] has version history_floor + 1 + i.
        self.history_floor = 1
        self.history_size = history_size
        """How many writes (at least) the history keeps."""
        self._pages: dict[str, tuple[int, list[JsonObject]]] = {}

    @staticmethod
    def key(plural: str, namespace: str, name: str) -> tuple[str, str]:
        """The store key of an object (`namespace` is ignored for cluster-scoped resources)."""
        return (namespace if RESOURCES[plural].namespaced else "", name)

    def get(self, plural: str, key: tuple[str, str]) -> JsonObject | None:
        """The stored object itself (not a copy: never change it), or None."""
        return self._objects[plural].get(key)

    def items(self, plural: str) -> list[tuple[tuple[str, str], JsonObject]]:
        """Every stored object of `plural` with its key, in creation order (not copies)."""
        return list(self._objects[plural].items())

    def create(self, plural: str, namespace: str, obj: JsonObject) -> JsonObject:
        """Store a new object as POST does (server-set fields filled in; `obj` is changed).
        Raises ApiError for a missing name, a namespace mismatch or an existing object."""
        resource = RESOURCES[plural]
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = f"{metadata['generateName']}{secrets.token_hex(3)[:5]}"
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(422, "Invalid", f"{resource.kind} name is required")
        if resource.namespaced:
            body_ns = metadata.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            namespace = namespace or body_ns or "default"
            metadata["namespace"] = namespace
        else:
            namespace = ""
        key = (namespace, name)
        if key in self._objects[plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{plural} "{name}" already exists',
                {"name": name, "kind": plural},
            )
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        metadata["uid"] = str(uuid.uuid4())
        metadata.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        return self.commit(plural, key, "ADDED", admit(plural, obj, None))

    def replace(
        self, plural: str, key: tuple[str, str], current: JsonObject, proposed: JsonObject
    ) -> JsonObject:
        """Store `proposed` in place of `current` (PUT, PATCH), keeping the immutable fields."""
        metadata = dict(proposed.get("metadata") or {})
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if immutable in current["metadata"]:
                metadata[immutable] = current["metadata"][immutable]
        # An update can never remove or change a deletion timestamp, nor remove the grace
        # period (k8s.io/apiserver pkg/registry/rest/update.go `BeforeUpdate`).
        if current["metadata"].get("deletionTimestamp") is not None:
            metadata["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
        if metadata.get("deletionGracePeriodSeconds") is None:
            grace = current["metadata"].get("deletionGracePeriodSeconds")
            if grace is not None:
                metadata["deletionGracePeriodSeconds"] = grace
        proposed = {
            **proposed,
            "kind": current["kind"],
            "apiVersion": current["apiVersion"],
            "metadata": metadata,
        }
        return self.commit(plural, key, "MODIFIED", admit(plural, proposed, current))

    def commit(
        self, plural: str, key: tuple[str, str], change: str, obj: JsonObject | None
    ) -> JsonObject:
        """The one place a write happens: bump the version, store (or delete) the object at
        it, record the change for watches and wake them. Returns the stored object (for a
        delete, the last state at the deletion's version)."""
        self.resource_version += 1
        version = str(self.resource_version)
        store = self._objects[plural]
        previous = store.get(key)
        if change == "DELETED":
            assert previous is not None
            stored = {**previous, "metadata": {**previous["metadata"], "resourceVersion": version}}
            del store[key]
        else:
            assert obj is not None
            stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
            store[key] = stored
        if plural == "pods":
            self._index_pod(key, previous, None if change == "DELETED" else stored)
        self._history.append(Change(self.resource_version, plural, change, stored, previous))
        # Trimmed in batches of a quarter of the size, so that a write does not move the whole
        # buffer: the history holds between history_size and 1.25 times as many writes.
        excess = len(self._history) - self.history_size
        if excess > max(1, self.history_size // 4):
            self.history_floor = self._history[excess - 1].resource_version
            del self._history[:excess]
        self.changed.notify_all()
        return stored

    def _index_pod(
        self, key: tuple[str, str], before: JsonObject | None, after: JsonObject | None
    ) -> None:
        old_node = _node_name(before)
        new_node = _node_name(after)
        if before is not None and after is not None and old_node == new_node:
            return
        keys = self._pods_on_node.get(old_node) if before is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._pods_on_node[old_node]
        if after is not None:
            self._pods_on_node.setdefault(new_node, set()).add(key)

    def matching(self, plural: str, selector: Selector) -> list[JsonObject]:
        """The stored objects `selector` selects, in creation order (not copies)."""
        store = self._objects[plural]
        node = selector.equal_to("spec.nodeName") if plural == "pods" else None
        if node is None:
            return [obj for obj in store.values() if selector.matches(obj)]
        keys = self._pods_on_node.get(node, set())
        return [obj for key, obj in store.items() if key in keys and selector.matches(obj)]

    def list_objects(
        self, plural: str, selector: Selector, limit: int, token: str | None
    ) -> JsonObject:
        """A list body: the whole list, or a page of `limit` items (0: no limit) with a
        continue token; a `token` continues a list from its first page's snapshot, at its
        version. Raises ApiError 410 for a token that is unknown or dropped."""
        if token:
            pager = self._pages.get(token)
            if pager is None:
                raise ApiError(410, "Expired", _EXPIRED_CONTINUE)
            version, items = pager
        else:
            version = self.resource_version
            items = self.matching(plural, selector)
        metadata: JsonObject = {"resourceVersion": str(version)}
        if limit and len(items) > limit:
            items, rest = items[:limit], items[limit:]
            token = secrets.token_urlsafe(12)
            self._pages[token] = (version, rest)
            for stale in list(self._pages)[:-_MAX_CONTINUE_TOKENS]:
                del self._pages[stale]
            metadata["continue"] = token
            metadata["remainingItemCount"] = len(rest)
        return {
            "kind": f"{RESOURCES[plural].kind}List",
            "apiVersion": RESOURCES[plural].api_version,
            "metadata": metadata,
            # The real API server leaves kind/apiVersion off list items.
            "items": [
                {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in items
            ],
        }

    def changes_after(self, version: int) -> list[Change]:
        """The changes after `version`, oldest first (`version` must not be below
        `history_floor`: those changes are gone)."""
        return self._history[version - self.history_floor :]

    def expire_history(self) -> None:
        """Forget the history and every continue token (etcd compaction)."""
        self._history.clear()
        self.history_floor = self.resource_version
        self._pages.clear()
        self.changed.notify_all()
