"""An in-memory cluster behind the role protocols of `hami_plugin.kube.api`, for unit tests.

What httpx's `MockTransport` is to httpx: the production seam, faked over dicts. `FakeKube`
keeps nodes and pods as the API's JSON (so `list_objects` answers what the API server would,
and every read goes through the same `read_pod`/`read_node` as `KubeClient`'s), leases, Secrets
and webhook configurations as records, and the events written. It keeps the API server's
rules that callers depend on: a resourceVersion per write, the `resourceVersion` precondition
(Conflict), merge patch with `None` deleting a key, create-twice and bind-elsewhere conflicts,
NotFound. Failures are injected per call with `fail()`. Nodes and pods are watched as the API
server streams them (`list_pages`, `watch_objects`: the informer's surface), from a history of
every write. Wire behaviour (HTTP, retries, dropped watches) is the HTTP double's job:
`hami_plugin.testing.apiserver`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.fake_history import (
    Write,
    collection_of,
    fields_match,
    in_path,
    labels_match,
)
from hami_plugin.kube.records import (
    LeaseRecord,
    ObjectList,
    ObjectRef,
    SecretRecord,
    WatchEvent,
    WebhookConfigurationRecord,
    event_body,
    event_patch,
)
from hami_plugin.kube.watch import WATCH_READ_TIMEOUT_SECONDS
from hami_plugin.protocol.objects import NodeInfo, PodInfo, read_node, read_pod

__all__ = ["FakeKube"]


class FakeKube:
    """Nodes, pods, leases, events, Secrets and webhook configurations in memory; every call of
    `KubeClient` the daemons and `hami certs` use.

    Safe to share between threads. `calls` lists the calls made, by name, in order; `writes`
    counts the writes that landed (the set-up's `put_*` too). `clock.now()` dates the events
    (the system clock when None).
    """

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        *,
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._written = threading.Condition(self._lock)
        self._history: list[Write] = []
        self._last: dict[object, dict[str, Any]] = {}
        self._version = 0
        self._failures: dict[str, list[BaseException]] = {}
        self._always: dict[str, BaseException] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], LeaseRecord] = {}
        self.secrets: dict[tuple[str, str], SecretRecord] = {}
        self.webhook_configurations: dict[str, WebhookConfigurationRecord] = {}
        self.events: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.writes = 0
        for node in nodes:
            self.put_node(node)
        for pod in pods:
            self.put_pod(pod)

    # --- setting up -----------------------------------------------------------------------

    def put_node(self, obj: Mapping[str, Any]) -> NodeInfo:
        """Store a Node object (replacing one of the same name) at a new resourceVersion."""
        with self._lock:
            stored = self._stamp(obj)
            self.nodes[read_node(stored).name] = self._record("nodes", stored)
            return read_node(stored)

    def put_pod(self, obj: Mapping[str, Any]) -> PodInfo:
        """Store a Pod object (replacing one of the same namespace and name) at a new
        resourceVersion."""
        with self._lock:
            stored = self._stamp(obj)
            pod = read_pod(stored)
            stored["metadata"].setdefault("namespace", pod.namespace)
            self.pods[(pod.namespace, pod.name)] = self._record("pods", stored)
            return read_pod(stored)

    def fail(self, call: str, error: BaseException, *, times: int | None = 1) -> None:
        """Make the next `times` calls named `call` ("get_node", "bind_pod"...) raise `error`;
        `times=None`: every call until `heal(call)`."""
        with self._lock:
            if times is None:
                self._always[call] = error
            else:
                self._failures.setdefault(call, []).extend([error] * times)

    def heal(self, call: str) -> None:
        """Undo `fail(call, ...)`: the call works again."""
        with self._lock:
            self._always.pop(call, None)
            self._failures.pop(call, None)

    # --- nodes ----------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeInfo:
        """The node. Raises NotFound."""
        with self._lock:
            self._enter("get_node")
            return read_node(self._node(name))

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> NodeInfo:
        """Merge-patch node annotations (None deletes). Raises NotFound, Conflict."""
        with self._lock:
            self._enter("patch_node_annotations")
            node = self._node(name)
            self._check_version(node, resource_version, f"node {name}")
            self._merge(node, "annotations", annotations)
            return read_node(self._record("nodes", self._restamp(node)))

    # --- pods -----------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> PodInfo:
        """The pod. Raises NotFound."""
        with self._lock:
            self._enter("get_pod")
            return read_pod(self._pod(namespace, name))

    def list_pods_on_node(self, node_name: str) -> list[PodInfo]:
        """Every pod bound to the node."""
        with self._lock:
            self._enter("list_pods_on_node")
            return [
                read_pod(pod)
                for pod in self.pods.values()
                if pod.get("spec", {}).get("nodeName") == node_name
            ]

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodInfo:
        """Merge-patch pod annotations and labels (None deletes). Raises NotFound, Conflict."""
        with self._lock:
            self._enter("patch_pod_metadata")
            pod = self._pod(namespace, name)
            self._check_version(pod, resource_version, f"pod {namespace}/{name}")
            self._merge(pod, "annotations", annotations)
            if labels is not None:
                self._merge(pod, "labels", labels)
            return read_pod(self._record("pods", self._restamp(pod)))

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Set the pod's `spec.nodeName`. Raises NotFound, Conflict (bound elsewhere, another
        uid); binding again to the same node counts as done, as `KubeClient.bind_pod` does."""
        with self._lock:
            self._enter("bind_pod")
            pod = self._pod(namespace, name)
            spec = pod.setdefault("spec", {})
            current = read_pod(pod)
            if (uid and current.uid != uid) or current.node_name not in ("", node):
                raise Conflict(f"bind pod {namespace}/{name} to node {node}: HTTP 409", 409)
            spec["nodeName"] = node
            self._record("pods", self._restamp(pod))

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> PodInfo:
        """Merge `status` into the pod's (None deletes a key). Raises NotFound."""
        with self._lock:
            self._enter("patch_pod_status")
            pod = self._pod(namespace, name)
            stored = pod.setdefault("status", {})
            for key, value in status.items():
                if value is None:
                    stored.pop(key, None)
                else:
                    stored[key] = value
            return read_pod(self._record("pods", self._restamp(pod)))

    def add_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> PodInfo:
        """Add or replace one `status.conditions` entry, by `type`. Raises NotFound."""
        with self._lock:
            self._enter("add_pod_condition")
            pod = self._pod(namespace, name)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            kept = [c for c in conditions if c.get("type") != condition.get("type")]
            pod["status"]["conditions"] = [*kept, dict(condition)]
            return read_pod(self._record("pods", self._restamp(pod)))

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """Begin a graceful deletion: `metadata.deletionTimestamp` set, the pod kept (no
        kubelet here ends it). Raises NotFound, Conflict (another uid)."""
        with self._lock:
            self._enter("delete_pod")
            pod = self._pod(namespace, name)
            if uid and read_pod(pod).uid != uid:
                raise Conflict(f"delete pod {namespace}/{name}: HTTP 409", 409)
            pod["metadata"]["deletionTimestamp"] = self._clock.now().isoformat()
            self._record("pods", self._restamp(pod))

    # --- any collection -------------------------------------------------------------------

    def list_objects(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        """LIST `/api/v1/nodes`, `/api/v1/pods` or `/api/v1/namespaces/<ns>/pods`, with
        equality selectors (`a=b,c=d`; a bare label key asks for its presence), in one page.
        Raises ValueError for another path or selector."""
        with self._lock:
            self._enter("list_objects")
            return self._list(path, label_selector, field_selector)

    def list_pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[ObjectList]:
        """`list_objects` as `KubeClient.list_pages` pages it: here, always one page."""
        with self._lock:
            self._enter("list_pages")
            listed = self._list(path, label_selector, field_selector)
        yield listed

    def watch_objects(
        self,
        path: str,
        resource_version: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        stop: threading.Event | None = None,
        read_timeout_seconds: float = WATCH_READ_TIMEOUT_SECONDS,
    ) -> Iterator[WatchEvent]:
        """The writes to `path`'s collection after `resource_version` ("" or "0": the objects
        there now first, as ADDED), as the API server streams them (an object that stops
        matching the selectors arrives as DELETED), until `timeout_seconds` pass or `stop` is
        set. Raises ValueError for a path `list_objects` does not know."""
        with self._lock:
            self._enter("watch_objects")
            kind = collection_of(path)
            listed = self._list(path, label_selector, field_selector)
        if resource_version in ("", "0"):
            yield from (WatchEvent("ADDED", obj) for obj in listed.items)
            resource_version = listed.resource_version
        seen = int(resource_version)
        deadline = time.monotonic() + timeout_seconds
        while not (stop is not None and stop.is_set()) and time.monotonic() < deadline:
            with self._lock:
                writes = [w for w in self._history if w.version > seen and w.kind == kind]
                if not writes:
                    self._written.wait(_WATCH_POLL_SECONDS)
                    continue
            for write in writes:
                seen = write.version
                event = write.event(path, label_selector, field_selector)
                if event is not None:
                    yield event

    def deadline(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """No time budget in memory: the calls take no time."""
        return contextlib.nullcontext()

    # --- leases ---------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        """The lease. Raises NotFound."""
        with self._lock:
            self._enter("get_lease")
            record = self.leases.get((namespace, name))
            if record is None:
                raise NotFound(f"get lease {namespace}/{name}: HTTP 404: not found", 404)
            return record

    def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Store a new lease. Raises Conflict when it exists."""
        with self._lock:
            self._enter("create_lease")
            if (record.namespace, record.name) in self.leases:
                raise Conflict(
                    f"create lease {record.namespace}/{record.name}: HTTP 409: already exists", 409
                )
            return self._store_lease(record)

    def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the lease if it is still at `record.resource_version`. Raises NotFound,
        Conflict; ValueError for a record without resource_version."""
        with self._lock:
            self._enter("update_lease")
            if not record.resource_version:
                raise ValueError(
                    f"update_lease {record.namespace}/{record.name}: no resource_version"
                )
            current = self.leases.get((record.namespace, record.name))
            if current is None:
                raise NotFound(f"update lease {record.namespace}/{record.name}: HTTP 404", 404)
            if current.resource_version != record.resource_version:
                raise Conflict(
                    f"update lease {record.namespace}/{record.name}: HTTP 409: the object has "
                    "been modified",
                    409,
                )
            return self._store_lease(record)

    # --- secrets and webhook configurations -----------------------------------------------

    def get_secret(self, namespace: str, name: str) -> SecretRecord:
        """The Secret. Raises NotFound."""
        with self._lock:
            self._enter("get_secret")
            return self._secret(namespace, name)

    def create_secret(self, record: SecretRecord) -> SecretRecord:
        """Store a new Secret. Raises Conflict when it exists."""
        with self._lock:
            self._enter("create_secret")
            if (record.namespace, record.name) in self.secrets:
                raise Conflict(
                    f"create secret {record.namespace}/{record.name}: HTTP 409: already exists",
                    409,
                )
            return self._store_secret(record)

    def patch_secret_data(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes | None],
        resource_version: str | None = None,
    ) -> SecretRecord:
        """Merge `data` into the Secret's (None deletes). Raises NotFound, Conflict."""
        with self._lock:
            self._enter("patch_secret_data")
            current = self._secret(namespace, name)
            if resource_version is not None and current.resource_version != resource_version:
                raise Conflict(
                    f"patch secret {namespace}/{name}: HTTP 409: the object has been modified",
                    409,
                )
            merged = dict(current.data)
            for key, value in data.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            return self._store_secret(dataclasses.replace(current, data=merged))

    def get_mutating_webhook_configuration(self, name: str) -> WebhookConfigurationRecord:
        """The webhook configuration. Raises NotFound."""
        with self._lock:
            self._enter("get_mutating_webhook_configuration")
            return self._webhook_configuration(name)

    def patch_mutating_webhook_ca_bundles(
        self, name: str, webhooks: Sequence[str], ca_bundle: bytes
    ) -> WebhookConfigurationRecord:
        """Set every webhook's caBundle. Raises NotFound, KubeError when `webhooks` are not
        the configuration's webhook names in order (as the API server's JSON patch test)."""
        with self._lock:
            self._enter("patch_mutating_webhook_ca_bundles")
            current = self._webhook_configuration(name)
            names = [webhook for webhook, _ in current.ca_bundles]
            if list(webhooks) != names[: len(webhooks)]:
                raise KubeError(
                    f"patch mutatingwebhookconfiguration {name} caBundle: HTTP 422: test failed",
                    422,
                )
            bundles = tuple(
                (webhook, ca_bundle if index < len(webhooks) else bundle)
                for index, (webhook, bundle) in enumerate(current.ca_bundles)
            )
            self._version += 1
            self.writes += 1
            stored = WebhookConfigurationRecord(name, bundles, str(self._version))
            self.webhook_configurations[name] = stored
            return stored

    # --- events ---------------------------------------------------------------------------

    def create_event(
        self,
        ref: ObjectRef,
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "hami-scheduler",
        *,
        count: int = 1,
        first_timestamp: datetime | None = None,
        last_timestamp: datetime | None = None,
    ) -> str | None:
        """Keep the Event `KubeClient` would write, in `events`; return its name."""
        with self._lock:
            self._enter("create_event")
            body = event_body(
                ref,
                reason,
                message,
                event_type,
                component,
                last_timestamp or self._clock.now(),
                count=count,
                first_timestamp=first_timestamp,
            )
            self.events.append(body)
            name: str = body["metadata"]["name"]
            return name

    def patch_event(
        self, namespace: str, name: str, count: int, last_timestamp: datetime, message: str
    ) -> None:
        """Count a repeat onto a kept Event, as `KubeClient` patches it. Raises NotFound."""
        with self._lock:
            self._enter("patch_event")
            for event in self.events:
                metadata = event["metadata"]
                if (metadata["namespace"], metadata["name"]) == (namespace, name):
                    event.update(event_patch(count, last_timestamp, message))
                    return
            raise NotFound(f"patch event {namespace}/{name}: HTTP 404: not found", 404)

    def create_pod_event(self, event: PodEvent, component: str = "hami-device-plugin") -> None:
        """Keep the Event of `event`, as `create_event`."""
        self.create_event(event.ref(), event.reason, event.message, event.event_type, component)

    # --- internals ------------------------------------------------------------------------

    def _list(
        self, path: str, label_selector: str | None, field_selector: str | None
    ) -> ObjectList:
        kind = collection_of(path)
        objects: Iterable[dict[str, Any]] = (self.nodes if kind == "nodes" else self.pods).values()
        items = [
            copy.deepcopy(obj)
            for obj in objects
            if in_path(obj, path)
            and labels_match(obj, label_selector)
            and fields_match(obj, field_selector)
        ]
        return ObjectList(items, str(self._version))

    def _record(self, kind: str, stored: dict[str, Any]) -> dict[str, Any]:
        """Keep a write of `stored` for the watches and wake them; returns `stored`."""
        metadata = stored["metadata"]
        key = (kind, metadata.get("namespace", ""), metadata.get("name", ""))
        after = copy.deepcopy(stored)
        self._history.append(Write(self._version, kind, after, self._last.get(key)))
        self._last[key] = after
        self._written.notify_all()
        return stored

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        queued = self._failures.get(call)
        if queued:
            raise queued.pop(0)
        error = self._always.get(call)
        if error is not None:
            raise error

    def _node(self, name: str) -> dict[str, Any]:
        node = self.nodes.get(name)
        if node is None:
            raise NotFound(f"node {name}: HTTP 404: not found", 404)
        return node

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name}: HTTP 404: not found", 404)
        return pod

    def _stamp(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(obj))
        stored.setdefault("metadata", {})
        return self._restamp(stored)

    def _restamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        self.writes += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        return obj

    def _secret(self, namespace: str, name: str) -> SecretRecord:
        record = self.secrets.get((namespace, name))
        if record is None:
            raise NotFound(f"secret {namespace}/{name}: HTTP 404: not found", 404)
        return record

    def _store_secret(self, record: SecretRecord) -> SecretRecord:
        self._version += 1
        self.writes += 1
        stored = dataclasses.replace(record, resource_version=str(self._version))
        self.secrets[(record.namespace, record.name)] = stored
        return stored

    def _webhook_configuration(self, name: str) -> WebhookConfigurationRecord:
        record = self.webhook_configurations.get(name)
        if record is None:
            raise NotFound(f"mutatingwebhookconfiguration {name}: HTTP 404: not found", 404)
        return record

    def _store_lease(self, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        self.writes += 1
        stored = dataclasses.replace(record, resource_version=str(self._version))
        self.leases[(record.namespace, record.name)] = stored
        return stored

    @staticmethod
    def _check_version(obj: Mapping[str, Any], wanted: str | None, what: str) -> None:
        if wanted is not None and obj["metadata"].get("resourceVersion") != wanted:
            raise Conflict(f"patch {what}: HTTP 409: the object has been modified", 409)

    @staticmethod
    def _merge(obj: dict[str, Any], key: str, changes: Mapping[str, str | None]) -> None:
        values = obj["metadata"].get(key) or {}
        for name, value in changes.items():
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
        obj["metadata"][key] = values


_WATCH_POLL_SECONDS = 0.05  # how often an idle watch looks at its `stop` again
