"""An HTTP test double of the Kubernetes API server, for the real `kubernetes` client.

Serves a slice of the API over real HTTP/1.1 on 127.0.0.1 (random port), from a
`ThreadingHTTPServer` in a background thread: Nodes, Pods and Events (core/v1) and Leases
(coordination.k8s.io/v1) in memory.

What it implements, as the real API server does it:
* GET one object, LIST with `fieldSelector` (`=`, `==`, `!=` on the fields listed in
  `_FIELD_SELECTORS`) and `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`), list bodies with
  `kind`, `apiVersion` and `metadata.resourceVersion`; `limit` and `continue` pages served from
  a snapshot taken by the first page (as etcd serves them at the list's revision), a token older
  than the event history answering 410 Expired;
* WATCH (`?watch=true`) of every collection, cluster-wide or in a namespace: a chunked HTTP/1.1
  stream of newline-delimited JSON events (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`)
  from `resourceVersion` (unset or "0": the current objects first, as ADDED), replayed from an
  event history ring buffer. A version older than the buffer answers HTTP 200 and one ERROR
  event carrying a 410 `Expired` Status, as the watch cache does. Selectors apply to events: an
  object that stops matching is sent as DELETED (its last matching state at the event's
  version), one that starts matching as ADDED. `allowWatchBookmarks=true` gets a BOOKMARK
  (kind, apiVersion and metadata.resourceVersion only) every `bookmark_interval_seconds` of
  silence; `timeoutSeconds` ends the stream cleanly (the terminating chunk);
* POST (create; `generateName` works; 409 AlreadyExists), PUT (replace), DELETE;
* PATCH with `application/merge-patch+json` (RFC 7386), `application/strategic-merge-patch+json`
  (treated as a merge patch: equal on metadata maps, lists are replaced whole) and
  `application/json-patch+json` (RFC 6902 add/remove/replace/test/copy/move); other types
  answer 415;
* one cluster-wide `resourceVersion` counter bumped on every write, and every write recorded as
  one watch event at its new version; a PATCH or PUT that carries a `metadata.resourceVersion`
  that is not the current one answers 409 Conflict (a Lease PUT is how leader election takes
  and renews a lease);
* `POST pods/<name>/binding` sets `spec.nodeName` and the PodScheduled condition, merges the
  Binding's annotations (409 if the pod is already bound or `metadata.uid` names another pod,
  400 if the Binding's name is not the pod's);
* errors as `metav1.Status` bodies with the API server's reasons and messages.

Test controls: `inject_fault` (next K matching requests, watches included, answer status S, a
raw body, hang for T seconds, or drop the connection), `drop_watches` (cut every open watch
stream mid-flight), `expire_history` (the next watch from an older version gets 410),
`requests` (a log of every request), `watch_count`, and helpers to add, get, update and delete
objects as plain dicts (writes through the helpers emit watch events too). All thread-safe.

Stored objects are never changed in place: every write stores a new dict (sharing unchanged
parts with the old one), so the event history and the watch streams hold references, not
copies, and serialise them outside the lock.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
import secrets
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from kubernetes import client as k8s

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class _Resource:
    plural: str
    kind: str
    namespaced: bool
    api_version: str = "v1"


_RESOURCES = {
    "nodes": _Resource("nodes", "Node", namespaced=False),
    "pods": _Resource("pods", "Pod", namespaced=True),
    "events": _Resource("events", "Event", namespaced=True),
    "leases": _Resource("leases", "Lease", namespaced=True, api_version="coordination.k8s.io/v1"),
}

# Field selectors the real API server accepts for these resources (a subset).
_FIELD_SELECTORS: dict[str, frozenset[str]] = {
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
}

_ROUTES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"/api/v1/(?P<res>nodes|pods|events)"), "collection"),
    (re.compile(r"/api/v1/(?P<res>nodes)/(?P<name>[^/]+)"), "object"),
    (re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|events)"), "collection"),
    (
        re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|events)/(?P<name>[^/]+)"),
        "object",
    ),
    (re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/binding"), "binding"),
    (re.compile(r"/apis/coordination\.k8s\.io/v1/(?P<res>leases)"), "collection"),
    (
        re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<res>leases)"),
        "collection",
    ),
    (
        re.compile(
            r"/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<res>leases)"
            r"/(?P<name>[^/]+)"
        ),
        "object",
    ),
]


# --- public records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Header names in lower case."""
    content_type: str
    body: bytes
    query_string: str = ""
    """The raw query (after `?`), as sent."""

    def json(self) -> Any:
        """The body decoded as JSON (raises ValueError if it is not JSON)."""
        return json.loads(self.body)


@dataclass(slots=True)
class Fault:
    """A rule that changes the answer to matching requests; see `FakeApiServer.inject_fault`."""

    method: str
    path: str
    times: int | None
    status: int | None = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang_seconds: float = 0.0
    disconnect: bool = False
    query: str = ".*"
    fired: int = 0
    """How many requests this rule has answered so far."""

    def _matches(self, request: RecordedRequest) -> bool:
        return (
            (self.times is None or self.fired < self.times)
            and re.fullmatch(self.method, request.method, re.IGNORECASE) is not None
            and re.fullmatch(self.path, request.path) is not None
            and re.fullmatch(self.query, request.query_string) is not None
        )


class ApiError(Exception):
    """Raised inside the fake to answer with a metav1.Status."""

    def __init__(self, code: int, reason: str, message: str, details: JsonObject | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status_body(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    501: "NotImplemented",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str | None = None) -> JsonObject:
    """A metav1.Status failure body for `code`."""
    reason = _REASONS.get(code, "Unknown")
    return ApiError(code, reason, message or f"injected fault: {reason}").status_body()


# --- object builders --------------------------------------------------------------------------


def make_node(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> JsonObject:
    """A Node object as the API server stores it (without server-set fields)."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {"kubernetes.io/hostname": name}),
        },
        "spec": {},
        "status": {
            "allocatable": dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}),
            "capacity": dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}),
        },
    }


def make_container(
    name: str,
    *,
    env: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    image: str = "busybox",
) -> JsonObject:
    """A container entry for `make_pod`."""
    container: JsonObject = {"name": name, "image": image, "resources": {}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return container


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    node_name: str = "",
    phase: str = "Pending",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    containers: Iterable[JsonObject] | None = None,
    init_containers: Iterable[JsonObject] | None = None,
) -> JsonObject:
    """A Pod object as the API server stores it (without server-set fields)."""
    spec: JsonObject = {
        "containers": list(containers) if containers is not None else [make_container("main")],
        "schedulerName": "default-scheduler",
    }
    if init_containers is not None:
        spec["initContainers"] = list(init_containers)
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


# --- patch algorithms -------------------------------------------------------------------------


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


# --- selectors --------------------------------------------------------------------------------


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
        if key not in _FIELD_SELECTORS[resource]:
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
class _Selector:
    """A request's namespace, field selector and label selector, checked once when parsed."""

    namespace: str
    field_terms: tuple[tuple[str, str, bool], ...]
    label_text: str

    @classmethod
    def parse(cls, plural: str, namespace: str, request: RecordedRequest) -> _Selector:
        field_terms = _parse_field_selector(plural, _query(request, "fieldSelector") or "")
        label_text = _query(request, "labelSelector") or ""
        _label_matches({}, label_text)  # a bad selector is a 400 now, not in the middle of a watch
        return cls(namespace, tuple(field_terms), label_text)

    def equal_to(self, field: str) -> str | None:
        """The value the selector requires `field` to equal, if it has such a term."""
        for key, value, equal in self.field_terms:
            if key == field and equal:
                return value
        return None

    def matches(self, obj: JsonObject) -> bool:
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return False
        if any((_field_value(obj, k) == v) != eq for k, v, eq in self.field_terms):
            return False
        return _label_matches(obj["metadata"].get("labels") or {}, self.label_text)


def _node_name(pod: JsonObject | None) -> str:
    if pod is None:
        return ""
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


@dataclass(frozen=True, slots=True)
class _Change:
    """One write, as the watch cache keeps it. `obj` is the new state (for DELETED the last
    state at the deletion's version); `previous` the state before (None for ADDED)."""

    resource_version: int
    plural: str
    type: str
    obj: JsonObject
    previous: JsonObject | None

    def event_for(self, selector: _Selector) -> JsonObject | None:
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


@dataclass(slots=True)
class _Watch:
    """One open watch stream: where it is in the history and what it asked for."""

    plural: str
    selector: _Selector
    position: int
    """The last resourceVersion the stream has covered."""
    deadline: float
    bookmarks: bool
    generation: int
    """`FakeApiServer._drop_generation` when opened; a newer one means "cut"."""
    next_bookmark: float
    pending: list[JsonObject] = field(default_factory=list)
    """Events to send before reading the history (the initial ADDED events, or an ERROR)."""
    ended: bool = False
    """Set with an ERROR in `pending`: the stream ends after it."""


# How often an idle watch checks that its client is still there: the real server lets a watcher
# go when its client closes the connection, so a watch closed by a client must not linger.
_CLIENT_CHECK_SECONDS = 0.2
# Continue tokens kept (oldest dropped first; a dropped token answers 410 like an expired one).
_MAX_CONTINUE_TOKENS = 100


def _with_version(obj: JsonObject, version_source: JsonObject) -> JsonObject:
    """`obj` with the resourceVersion of `version_source` (new top-level and metadata dicts)."""
    metadata = dict(obj["metadata"])
    metadata["resourceVersion"] = version_source["metadata"]["resourceVersion"]
    return {**obj, "metadata": metadata}


def _expired_status(message: str) -> JsonObject:
    return ApiError(410, "Expired", message).status_body()


class FakeApiServer:
    """In-memory API server over real HTTP. Use as a context manager or start()/stop().

    `history_size` is how many writes (at least) the event history keeps for watches to
    resume from; `bookmark_interval_seconds` how long a watch that allows bookmarks
    stays silent before it gets one (the real server: about a minute). Both can be changed
    while serving.
    """

    def __init__(
        self, *, history_size: int = 10_000, bookmark_interval_seconds: float = 60.0
    ) -> None:
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size}")
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[str, dict[tuple[str, str], JsonObject]] = {r: {} for r in _RESOURCES}
        # Pods by spec.nodeName, as the real server's field index: a kubelet's or device
        # plugin's list of its node's pods must not cost a scan of every pod's fields.
        self._pods_on_node: dict[str, set[tuple[str, str]]] = {}
        # As etcd, whose revision starts at 1: an empty server lists at "1" and the first write
        # is "2". A list never answers "0", which a watch reads as "any version" (a snapshot).
        self._resource_version = 1
        self._history: list[_Change] = []
        # Every change with a version above the floor is in _history, in order, with
        # consecutive versions: _history[i] has version _history_floor + 1 + i.
        self._history_floor = 1
        self.history_size = history_size
        self.bookmark_interval_seconds = bookmark_interval_seconds
        self._drop_generation = 0
        self._watches: set[int] = set()
        self._pages: dict[str, tuple[int, list[JsonObject]]] = {}
        self._faults: list[Fault] = []
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        """Bind a random port on 127.0.0.1 and serve in a background thread."""
        if self._httpd is not None:
            raise RuntimeError("FakeApiServer already started")
        self._stopping.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-apiserver-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake hung requests and watches, drop open connections and join every
        thread."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._stopping.set()
        with self._lock:
            self._changed.notify_all()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeApiServer not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- client factories -----------------------------------------------------------------

    def configuration(self) -> k8s.Configuration:
        """A client Configuration pointing at this server."""
        configuration = k8s.Configuration(host=self.url)
        configuration.api_key = {"BearerToken": "Bearer fake-token"}
        return configuration

    def api_client(self) -> k8s.ApiClient:
        """A fresh `kubernetes.client.ApiClient` bound to this server (caller closes it)."""
        return k8s.ApiClient(self.configuration())

    def write_kubeconfig(self, path: str | Path, *, token: str = "fake-token") -> Path:
        """Write a kubeconfig file for this server (for `--kubeconfig` tests); returns the path."""
        path = Path(path)
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return path

    # --- test controls --------------------------------------------------------------------

    def inject_fault(
        self,
        method: str = ".*",
        path: str = ".*",
        *,
        times: int | None = 1,
        status: int | None = None,
        body: bytes | JsonObject | None = None,
        headers: Mapping[str, str] | None = None,
        hang_seconds: float = 0.0,
        disconnect: bool = False,
        query: str = ".*",
    ) -> Fault:
        """Change the answer to the next `times` requests (None = forever) matching the rule.

        `method`, `path` and `query` are regular expressions matched in full (`path` without
        the query, `query` the raw query string: a watch is a GET of its collection with
        `watch=true`, e.g. `query=".*watch=true.*"`). The first matching rule wins. Actions,
        applied in this order: `hang_seconds` waits (cut short by `stop()`); `disconnect`
        closes the connection with no answer; `status` answers with that code and `body`
        (default: a metav1.Status); `body` alone answers 200 with that body (raw bytes are
        sent as they are, e.g. bad JSON). A hang without another action then serves the
        request normally.
        """
        raw_body = json.dumps(body).encode() if isinstance(body, dict) else body
        fault = Fault(
            method=method,
            path=path,
            times=times,
            status=status,
            body=raw_body,
            headers=dict(headers or {}),
            hang_seconds=hang_seconds,
            disconnect=disconnect,
            query=query,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def drop_watches(self) -> None:
        """Cut every open watch stream at once, without the terminating chunk (a dropped
        connection, as a restarting API server or a load balancer gives)."""
        with self._lock:
            self._drop_generation += 1
            self._changed.notify_all()

    def expire_history(self) -> None:
        """Forget the event history and every continue token: a watch from any version older
        than the current one, or a continue, now answers 410 Expired (etcd compaction)."""
        with self._lock:
            self._history.clear()
            self._history_floor = self._resource_version
            self._pages.clear()
            self._changed.notify_all()

    @property
    def watch_count(self) -> int:
        """How many watch streams are open now."""
        with self._lock:
            return len(self._watches)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def requests_matching(self, method: str = ".*", path: str = ".*") -> list[RecordedRequest]:
        """Requests whose method and path fully match the regular expressions."""
        return [
            r
            for r in self.requests
            if re.fullmatch(method, r.method, re.IGNORECASE) and re.fullmatch(path, r.path)
        ]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # --- object helpers -------------------------------------------------------------------

    def add_object(self, obj: Mapping[str, Any]) -> JsonObject:
        """Store a Node, Pod, Event or Lease dict (by `kind`) as if created; returns the stored
        copy."""
        plural = {r.kind: r.plural for r in _RESOURCES.values()}.get(str(obj.get("kind")))
        if plural is None:
            raise ValueError(f"unsupported kind {obj.get('kind')!r}")
        namespace = str(obj.get("metadata", {}).get("namespace") or "default")
        with self._lock:
            return copy.deepcopy(self._create(plural, namespace, copy.deepcopy(dict(obj))))

    def add_node(self, node: Mapping[str, Any] | str, **kwargs: Any) -> JsonObject:
        """Store a node (a dict, or a name passed to `make_node` with `kwargs`)."""
        return self.add_object(make_node(node, **kwargs) if isinstance(node, str) else node)

    def add_pod(
        self, pod: Mapping[str, Any] | str, namespace: str = "default", **kwargs: Any
    ) -> JsonObject:
        """Store a pod (a dict, or a name passed to `make_pod` with `namespace` and `kwargs`)."""
        if isinstance(pod, str):
            pod = make_pod(pod, namespace, **kwargs)
        return self.add_object(pod)

    def load_yaml(self, path: str | Path) -> list[JsonObject]:
        """Store every object of a (multi-document) YAML file, e.g. from tests/fixtures/."""
        text = Path(path).read_text(encoding="utf-8")
        return [self.add_object(doc) for doc in yaml.safe_load_all(text) if doc]

    def get_node(self, name: str) -> JsonObject | None:
        return self.get_object("nodes", "", name)

    def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        return self.get_object("pods", namespace, name)

    def get_lease(self, namespace: str, name: str) -> JsonObject | None:
        return self.get_object("leases", namespace, name)

    def get_object(self, plural: str, namespace: str, name: str) -> JsonObject | None:
        """A copy of the stored object, or None (`namespace` is ignored for nodes)."""
        with self._lock:
            obj = self._objects[plural].get(self._key(plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None) -> list[JsonObject]:
        """Copies of the stored objects of a resource, optionally of one namespace."""
        with self._lock:
            return [
                copy.deepcopy(obj)
                for (ns, _), obj in self._objects[plural].items()
                if namespace is None or ns == namespace
            ]

    def delete_pod(self, namespace: str, name: str) -> bool:
        return self.delete_object("pods", namespace, name)

    def delete_object(self, plural: str, namespace: str, name: str) -> bool:
        """Delete as another client would (a DELETED watch event); False if it was not there."""
        with self._lock:
            key = self._key(plural, namespace, name)
            if key not in self._objects[plural]:
                return False
            self._commit(plural, key, "DELETED", None)
            return True

    def update_object(
        self, plural: str, namespace: str, name: str, change: Callable[[JsonObject], None]
    ) -> JsonObject:
        """Change a stored object (a copy is passed to `change`, which edits it in place) as
        another client would: its version is bumped and a MODIFIED watch event sent."""
        with self._lock:
            key = self._key(plural, namespace, name)
            obj = copy.deepcopy(self._objects[plural][key])
            change(obj)
            return copy.deepcopy(self._commit(plural, key, "MODIFIED", obj))

    def events(self, namespace: str | None = None) -> list[JsonObject]:
        """Stored events, oldest first, optionally of one namespace."""
        return self.objects("events", namespace)

    @property
    def resource_version(self) -> int:
        """The cluster-wide resourceVersion counter (the last write's version)."""
        with self._lock:
            return self._resource_version

    @staticmethod
    def _key(plural: str, namespace: str, name: str) -> tuple[str, str]:
        return (namespace if _RESOURCES[plural].namespaced else "", name)

    # --- request handling (called from handler threads) ----------------------------------

    def _record(self, request: RecordedRequest) -> Fault | None:
        with self._lock:
            self._requests.append(request)
            for fault in self._faults:
                if fault._matches(request):
                    fault.fired += 1
                    return fault
        return None

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _route(self, request: RecordedRequest) -> tuple[str, str, str, str | None]:
        """(route kind, plural, namespace, name). Raises ApiError 404 for an unknown path."""
        for pattern, kind in _ROUTES:
            match = pattern.fullmatch(request.path)
            if match is not None:
                groups = match.groupdict()
                return kind, groups.get("res") or "pods", groups.get("ns") or "", groups.get("name")
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _handle(self, request: RecordedRequest) -> tuple[int, JsonObject]:
        """Route one request; returns (status, JSON body). Raises ApiError for failures."""
        kind, plural, namespace, name = self._route(request)
        with self._lock:
            if kind == "binding":
                return self._bind(namespace, str(name), request)
            if kind == "collection":
                return self._collection(plural, namespace, request)
            return self._object(plural, namespace, str(name), request)

    def _collection(
        self, plural: str, namespace: str, request: RecordedRequest
    ) -> tuple[int, JsonObject]:
        if request.method == "GET":
            return 200, self._list(plural, namespace, request)
        if request.method == "POST":
            if _RESOURCES[plural].namespaced and not namespace:
                raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
            return 201, copy.deepcopy(self._create(plural, namespace, _body_object(request)))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    def _object(
        self, plural: str, namespace: str, name: str, request: RecordedRequest
    ) -> tuple[int, JsonObject]:
        key = (namespace, name)
        obj = self._objects[plural].get(key)
        if obj is None:
            raise _not_found(plural, name)
        if request.method == "GET":
            return 200, copy.deepcopy(obj)
        if request.method == "DELETE":
            return 200, copy.deepcopy(self._commit(plural, key, "DELETED", None))
        if request.method == "PATCH":
            patched = self._apply_patch(obj, request)
            self._check_precondition(plural, name, obj, patched)
            return 200, copy.deepcopy(self._store_update(plural, key, obj, patched))
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
            self._check_precondition(plural, name, obj, replacement)
            return 200, copy.deepcopy(self._store_update(plural, key, obj, replacement))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    def _apply_patch(self, obj: JsonObject, request: RecordedRequest) -> JsonObject:
        try:
            patch = request.json()
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from exc
        content_type = request.content_type
        try:
            if content_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
                if not isinstance(patch, dict):
                    raise ValueError("a merge patch must be a JSON object")
                result = merge_patch(obj, patch)
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

    def _check_precondition(
        self, plural: str, name: str, current: JsonObject, proposed: JsonObject
    ) -> None:
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

    def _store_update(
        self, plural: str, key: tuple[str, str], current: JsonObject, proposed: JsonObject
    ) -> JsonObject:
        metadata = dict(proposed.get("metadata") or {})
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if immutable in current["metadata"]:
                metadata[immutable] = current["metadata"][immutable]
        proposed = {
            **proposed,
            "kind": current["kind"],
            "apiVersion": current["apiVersion"],
            "metadata": metadata,
        }
        return self._commit(plural, key, "MODIFIED", proposed)

    def _create(self, plural: str, namespace: str, obj: JsonObject) -> JsonObject:
        resource = _RESOURCES[plural]
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
        return self._commit(plural, key, "ADDED", obj)

    def _commit(
        self, plural: str, key: tuple[str, str], change: str, obj: JsonObject | None
    ) -> JsonObject:
        """The one place a write happens: bump the version, store (or delete) the object at
        it, record the change for watches and wake them. Returns the stored object (for a
        delete, the last state at the deletion's version)."""
        self._resource_version += 1
        version = str(self._resource_version)
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
        self._history.append(_Change(self._resource_version, plural, change, stored, previous))
        # Trimmed in batches of a quarter of the size, so that a write does not move the whole
        # buffer: the history holds between history_size and 1.25 times as many writes.
        excess = len(self._history) - self.history_size
        if excess > max(1, self.history_size // 4):
            self._history_floor = self._history[excess - 1].resource_version
            del self._history[:excess]
        self._changed.notify_all()
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

    def _matching(self, plural: str, selector: _Selector) -> list[JsonObject]:
        store = self._objects[plural]
        node = selector.equal_to("spec.nodeName") if plural == "pods" else None
        if node is None:
            return [obj for obj in store.values() if selector.matches(obj)]
        keys = self._pods_on_node.get(node, set())
        return [obj for key, obj in store.items() if key in keys and selector.matches(obj)]

    def _list(self, plural: str, namespace: str, request: RecordedRequest) -> JsonObject:
        selector = _Selector.parse(plural, namespace, request)
        limit_text = _query(request, "limit") or "0"
        token = _query(request, "continue")
        if not limit_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid limit {limit_text!r}")
        limit = int(limit_text)
        if token:
            # A continue page is served from the first page's snapshot, at its version.
            pager = self._pages.get(token)
            if pager is None:
                raise ApiError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter, or use "
                    "the continue token in this response to retrieve the remainder of the "
                    "results. Continuing with the provided token results in an inconsistent "
                    "list - objects that were created, modified, or deleted between the time "
                    "the first chunk was returned and now may show up in the list.",
                )
            version, items = pager
        else:
            version = self._resource_version
            items = self._matching(plural, selector)
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
            "kind": f"{_RESOURCES[plural].kind}List",
            "apiVersion": _RESOURCES[plural].api_version,
            "metadata": metadata,
            # The real API server leaves kind/apiVersion off list items.
            "items": [
                {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in items
            ],
        }

    def _bind(self, namespace: str, name: str, request: RecordedRequest) -> tuple[int, JsonObject]:
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
        pod = self._objects["pods"].get(key)
        if pod is None:
            raise _not_found("pods", name)
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
        self._commit("pods", key, "MODIFIED", updated)
        return 201, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    # --- watches --------------------------------------------------------------------------

    def _open_watch(self, request: RecordedRequest) -> _Watch | None:
        """A `_Watch` for a watch request (None for any other request). Raises ApiError for a
        bad one (unknown path, bad selector or version)."""
        if request.method != "GET" or _query(request, "watch") not in ("true", "1"):
            return None
        kind, plural, namespace, _ = self._route(request)
        if kind != "collection":
            return None
        selector = _Selector.parse(plural, namespace, request)
        version_text = _query(request, "resourceVersion") or ""
        if version_text and not version_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {version_text!r}")
        timeout_text = _query(request, "timeoutSeconds") or "1800"
        if not timeout_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid timeoutSeconds {timeout_text!r}")
        now = time.monotonic()
        with self._lock:
            watch = _Watch(
                plural=plural,
                selector=selector,
                position=self._resource_version,
                deadline=now + int(timeout_text),
                bookmarks=_query(request, "allowWatchBookmarks") == "true",
                generation=self._drop_generation,
                next_bookmark=now + self.bookmark_interval_seconds,
            )
            if version_text in ("", "0"):
                # No version: the current state first, as ADDED events, then changes.
                watch.pending = [
                    {"type": "ADDED", "object": obj}
                    for obj in self._objects[plural].values()
                    if selector.matches(obj)
                ]
            elif int(version_text) < self._history_floor:
                # As the watch cache: HTTP 200, then one ERROR event with the 410 Status.
                message = f"too old resource version: {version_text} ({self._history_floor})"
                watch.pending = [{"type": "ERROR", "object": _expired_status(message)}]
                watch.ended = True
            else:
                watch.position = int(version_text)
            self._watches.add(id(watch))
        return watch

    def _close_watch(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(id(watch))

    def _next_events(
        self, watch: _Watch, client_gone: Callable[[], bool]
    ) -> tuple[list[JsonObject], str | None]:
        """Block until the watch has something to send: (events, end) where end is None (go
        on), "timeout" (end the stream cleanly), "error" (end it after these events) or
        "dropped" (cut the connection; also when `client_gone()`, checked while waiting)."""
        with self._lock:
            while True:
                if self._stopping.is_set() or watch.generation != self._drop_generation:
                    return [], "dropped"
                if watch.pending:
                    events, watch.pending = watch.pending, []
                    return events, "error" if watch.ended else None
                if watch.position < self._history_floor:
                    message = f"too old resource version: {watch.position} ({self._history_floor})"
                    return [{"type": "ERROR", "object": _expired_status(message)}], "error"
                events = []
                for index in range(watch.position - self._history_floor, len(self._history)):
                    change = self._history[index]
                    if change.plural == watch.plural:
                        event = change.event_for(watch.selector)
                        if event is not None:
                            events.append(event)
                watch.position = self._resource_version
                now = time.monotonic()
                if events:
                    watch.next_bookmark = now + self.bookmark_interval_seconds
                    return events, None
                if now >= watch.deadline:
                    return [], "timeout"
                if watch.bookmarks and now >= watch.next_bookmark:
                    watch.next_bookmark = now + self.bookmark_interval_seconds
                    resource = _RESOURCES[watch.plural]
                    bookmark = {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(watch.position)},
                    }
                    return [{"type": "BOOKMARK", "object": bookmark}], None
                if client_gone():
                    return [], "dropped"
                wake = watch.deadline
                if watch.bookmarks:
                    wake = min(wake, watch.next_bookmark)
                self._changed.wait(min(max(0.0, wake - now), _CLIENT_CHECK_SECONDS))


def _query(request: RecordedRequest, name: str) -> str | None:
    values = request.query.get(name)
    return values[-1] if values else None


def _body_object(request: RecordedRequest) -> JsonObject:
    try:
        body = request.json()
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body must be a JSON object")
    return body


def _not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


# --- HTTP plumbing ----------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    # Handler threads are joined by server_close() so a test never leaks one.
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Wake handler threads blocked reading a kept-alive connection."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY the client's delayed ACK
    # adds ~40 ms to every kept-alive request.
    disable_nagle_algorithm = True
    server: _HTTPServer
    timeout = 30  # an idle kept-alive connection is dropped after this

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def _serve(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        request = RecordedRequest(
            method=self.command,
            path=url.path,
            query=parse_qs(url.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            content_type=(self.headers.get("Content-Type") or "").split(";")[0].strip(),
            body=body,
            query_string=url.query,
        )
        fault = fake._record(request)
        if fault is not None:
            if fault.hang_seconds:
                fake._wait(fault.hang_seconds)
            if fault.disconnect:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault.status is not None or fault.body is not None:
                status = fault.status or 200
                payload = fault.body
                if payload is None:
                    payload = json.dumps(status_body(status)).encode()
                self._send(status, payload, fault.headers)
                return
        try:
            watch = fake._open_watch(request)
        except ApiError as exc:
            self._send(exc.code, json.dumps(exc.status_body()).encode(), {})
            return
        if watch is not None:
            try:
                self._stream(watch)
            finally:
                fake._close_watch(watch)
            return
        try:
            status, answer = fake._handle(request)
        except ApiError as exc:
            status, answer = exc.code, exc.status_body()
        except Exception as exc:  # a bug in the fake: answer 500 and say so in the log
            logger.exception("fake API server failed on %s %s", request.method, request.path)
            status, answer = 500, ApiError(500, "InternalError", str(exc)).status_body()
        self._send(status, json.dumps(answer).encode(), {})

    def _stream(self, watch: _Watch) -> None:
        """Serve a watch: chunked newline-delimited JSON events until it ends."""
        fake = self.server.fake
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                events, end = fake._next_events(watch, self._client_gone)
                # One chunk per event, as the API server flushes them; one write per batch.
                chunks = []
                for event in events:
                    line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                    chunks.append(b"%x\r\n%s\r\n" % (len(line), line))
                if end == "dropped":
                    break
                if end is not None:
                    chunks.append(b"0\r\n\r\n")
                self.wfile.write(b"".join(chunks))
                if end is not None:
                    return
        except OSError:
            pass  # the client went away
        # Dropped: no terminating chunk, the connection cut as a failing server or proxy does.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _client_gone(self) -> bool:
        """Whether the client closed its end (a watch client sends nothing while it reads)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _send(self, status: int, payload: bytes, headers: Mapping[str, str]) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            # The client gave up (timeout) and closed the socket.
            self.close_connection = True
