"""`FakeApiServer`, the double's face: start and stop it, point a client at it, store and read
objects as another client would, and steer it with faults, dropped watches and an expired
history."""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hami_plugin.testing.apiserver import client, deletion
from hami_plugin.testing.apiserver.deletion import DeleteOptions
from hami_plugin.testing.apiserver.http import HttpServer
from hami_plugin.testing.apiserver.objects import JsonObject, make_node, make_pod
from hami_plugin.testing.apiserver.request import Fault, RecordedRequest, RequestLog
from hami_plugin.testing.apiserver.store import RESOURCES, ObjectStore
from hami_plugin.testing.apiserver.watch import Watches

if TYPE_CHECKING:
    from kubernetes import client as k8s


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
        self._store = ObjectStore(history_size)
        self._stopping = threading.Event()
        self._watches = Watches(self._store, self._stopping, bookmark_interval_seconds)
        self._log = RequestLog()
        self._httpd: HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def history_size(self) -> int:
        """How many writes (at least) the event history keeps for watches to resume from."""
        return self._store.history_size

    @history_size.setter
    def history_size(self, size: int) -> None:
        with self._store.lock:
            self._store.history_size = size

    @property
    def bookmark_interval_seconds(self) -> float:
        """How long a watch that allows bookmarks stays silent before it gets one."""
        return self._watches.bookmark_interval_seconds

    @bookmark_interval_seconds.setter
    def bookmark_interval_seconds(self, seconds: float) -> None:
        self._watches.bookmark_interval_seconds = seconds

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        """Bind a random port on 127.0.0.1 and serve in a background thread."""
        if self._httpd is not None:
            raise RuntimeError("FakeApiServer already started")
        self._stopping.clear()
        self._httpd = HttpServer(self._store, self._watches, self._log, self._stopping)
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
        with self._store.lock:
            self._store.changed.notify_all()
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
        return client.configuration(self.url)

    def api_client(self) -> k8s.ApiClient:
        """A fresh `kubernetes.client.ApiClient` bound to this server (caller closes it)."""
        return client.api_client(self.url)

    def write_kubeconfig(self, path: str | Path, *, token: str = "fake-token") -> Path:
        """Write a kubeconfig file for this server (for `--kubeconfig` tests); returns the path."""
        return client.write_kubeconfig(self.url, path, token=token)

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
        self._log.add_fault(fault)
        return fault

    def clear_faults(self) -> None:
        self._log.clear_faults()

    def drop_watches(self) -> None:
        """Cut every open watch stream at once, without the terminating chunk (a dropped
        connection, as a restarting API server or a load balancer gives)."""
        self._watches.drop_all()

    def expire_history(self) -> None:
        """Forget the event history and every continue token: a watch from any version older
        than the current one, or a continue, now answers 410 Expired (etcd compaction)."""
        with self._store.lock:
            self._store.expire_history()

    @property
    def watch_count(self) -> int:
        """How many watch streams are open now."""
        return self._watches.count

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        return self._log.requests

    def requests_matching(self, method: str = ".*", path: str = ".*") -> list[RecordedRequest]:
        """Requests whose method and path fully match the regular expressions."""
        return [
            r
            for r in self.requests
            if re.fullmatch(method, r.method, re.IGNORECASE) and re.fullmatch(path, r.path)
        ]

    def answered_with(
        self, status: int, method: str = ".*", path: str = ".*"
    ) -> list[RecordedRequest]:
        """Requests matching as in `requests_matching` that the store answered with `status`
        (injected faults are not counted)."""
        return [
            r
            for r, answered in self._log.answers
            if answered == status
            and re.fullmatch(method, r.method, re.IGNORECASE)
            and re.fullmatch(path, r.path)
        ]

    def clear_requests(self) -> None:
        self._log.clear_requests()

    # --- object helpers -------------------------------------------------------------------

    def add_object(self, obj: Mapping[str, Any]) -> JsonObject:
        """Store an object dict of any kind the double serves (by `kind`: Node, Pod, Event,
        Lease, Secret, PodDisruptionBudget, PriorityClass, ...) as if created, without
        admission (a Pod keeps the `spec.priority` it has); returns the stored copy."""
        plural = {r.kind: r.plural for r in RESOURCES.values()}.get(str(obj.get("kind")))
        if plural is None:
            raise ValueError(f"unsupported kind {obj.get('kind')!r}")
        namespace = str(obj.get("metadata", {}).get("namespace") or "default")
        with self._store.lock:
            return copy.deepcopy(self._store.create(plural, namespace, copy.deepcopy(dict(obj))))

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

    def get_node(self, name: str) -> JsonObject | None:
        return self.get_object("nodes", "", name)

    def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        return self.get_object("pods", namespace, name)

    def get_lease(self, namespace: str, name: str) -> JsonObject | None:
        return self.get_object("leases", namespace, name)

    def get_object(self, plural: str, namespace: str, name: str) -> JsonObject | None:
        """A copy of the stored object, or None (`namespace` is ignored for nodes)."""
        with self._store.lock:
            obj = self._store.get(plural, self._store.key(plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None) -> list[JsonObject]:
        """Copies of the stored objects of a resource, optionally of one namespace."""
        with self._store.lock:
            return [
                copy.deepcopy(obj)
                for (ns, _), obj in self._store.items(plural)
                if namespace is None or ns == namespace
            ]

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Remove the pod at once, with no grace period and a single DELETED event (as if its
        deletion had already run its course; `finish_termination` is kubelet's last DELETE)."""
        return self.delete_object("pods", namespace, name)

    def finish_termination(self, namespace: str, name: str) -> bool:
        """What kubelet does once a terminating pod's containers have stopped: DELETE it with
        grace period 0 and its UID as precondition (kubelet `status_manager.go`
        `syncPod`), so that it is removed: a MODIFIED then a DELETED watch event, as over
        HTTP. False if the pod was not there."""
        with self._store.lock:
            key = self._store.key("pods", namespace, name)
            pod = self._store.get("pods", key)
            if pod is None:
                return False
            options = DeleteOptions(grace_period_seconds=0, uid=pod["metadata"].get("uid"))
            deletion.delete(self._store, "pods", key, options, datetime.now(UTC))
            return True

    def events_about(self, namespace: str, name: str, kind: str = "Pod") -> list[JsonObject]:
        """Stored core/v1 Events whose `involvedObject` is the `kind` object `namespace/name`,
        oldest first (the list a `fieldSelector` on `involvedObject.*` gives)."""
        return [
            event
            for event in self.objects("events")
            if (event.get("involvedObject") or {}).get("kind") == kind
            and (event.get("involvedObject") or {}).get("name") == name
            and (event.get("involvedObject") or {}).get("namespace", namespace) == namespace
        ]

    def delete_object(self, plural: str, namespace: str, name: str) -> bool:
        """Delete as another client would (a DELETED watch event); False if it was not there."""
        with self._store.lock:
            key = self._store.key(plural, namespace, name)
            if self._store.get(plural, key) is None:
                return False
            self._store.commit(plural, key, "DELETED", None)
            return True

    def update_object(
        self, plural: str, namespace: str, name: str, change: Callable[[JsonObject], None]
    ) -> JsonObject:
        """Change a stored object (a copy is passed to `change`, which edits it in place) as
        another client would: its version is bumped and a MODIFIED watch event sent."""
        with self._store.lock:
            key = self._store.key(plural, namespace, name)
            stored = self._store.get(plural, key)
            if stored is None:
                raise KeyError(key)
            obj = copy.deepcopy(stored)
            change(obj)
            return copy.deepcopy(self._store.commit(plural, key, "MODIFIED", obj))

    def events(self, namespace: str | None = None) -> list[JsonObject]:
        """Stored events, oldest first, optionally of one namespace."""
        return self.objects("events", namespace)

    @property
    def resource_version(self) -> int:
        """The cluster-wide resourceVersion counter (the last write's version)."""
        with self._store.lock:
            return self._store.resource_version
