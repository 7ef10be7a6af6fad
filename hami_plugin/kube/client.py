"""The Kubernetes API as hami-plugin needs it: nodes, pods, patches, list/watch, bindings, leases,
events.

The only module of the package that imports `kubernetes`. It uses the real client's plumbing
(`kubernetes.client.ApiClient`: configuration, auth, TLS, request building with
`param_serialize`, the urllib3 REST client) but not its generated API classes, and adds what the
daemons need on top of it:

* a dozen plain REST calls (`_Request`: nodes, pods, bindings, leases, events, any list or watch)
  instead of `CoreV1Api`. Importing `kubernetes.client.api.core_v1_api` wraps ~400 methods in
  pydantic `validate_call` and pulls in ~250 model modules: ~20 MiB of resident memory in a daemon
  that needs a dozen URLs. Only the client's plumbing submodules and the config loaders are
  imported; `kubernetes.client` and `kubernetes.client.models` load their members lazily, so no
  generated API or model module is ever loaded (tests/test_k8s.py checks this in a fresh
  interpreter);
* plain frozen dataclasses (`NodeRecord`, `PodRecord`) instead of the generated models. Responses
  are raw urllib3 responses decoded here from JSON: the generated pydantic models cost far more
  per pod than the handful of fields we read, and our own decoding turns a malformed body into a
  `KubeError` instead of whatever the model layer happens to raise. Events are written as plain
  JSON dicts for the same reason;
* a timeout on every request and retries with exponential backoff and jitter on 429, 5xx,
  connection errors and timeouts (`RetryPolicy`); urllib3's own retries are switched off so a
  hanging server costs `timeout_seconds` per attempt, not four times that;
* an optional time budget shared by every call a thread makes inside `KubeClient.deadline()`,
  so that a caller answering someone who waits (kubelet's Allocate) fails in bounded time
  however many calls it makes and however the API server misbehaves;
* one error-translation point (`_translate_errors`) that maps `ApiException` (raised here for a
  non-2xx answer, as the generated API would, and for a watch ERROR event) and urllib3 errors to
  `NotFound`, `Conflict`, `Gone`, `Retryable` or `KubeError`, chained with `from`;
* list and watch as the API server streams them (`list_objects`, `watch_objects`): pages
  followed with `limit`/`continue`, watch events read line by line from the raw chunked response
  with a read timeout, so that a silent connection cannot hang a watcher, and a `stop` event
  that wakes a blocked read (`_StopGuard`); `hami_plugin.kube.informer` builds the list-then-watch
  loop on them;
* metadata patches sent as JSON merge patch (`application/merge-patch+json`, see `_MERGE_PATCH`):
  merge patch is what HAMi uses for the node lock, and it gives `null` = delete and the
  `resourceVersion` precondition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar, cast

import urllib3

# Submodules only: `kubernetes.client` and `kubernetes.client.models` load their members lazily,
# and `kubernetes.client.CoreV1Api` (or any other generated API or model) must stay unloaded.
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTClientObject, RESTResponse
from kubernetes.config.incluster_config import load_incluster_config
from kubernetes.config.kube_config import load_kube_config

logger = logging.getLogger(__name__)

# Set explicitly on every patch: the generated client would pick `json-patch+json`, which its REST
# layer rewrites to `strategic-merge-patch+json` for a dict body. Strategic merge behaves like
# merge patch on string maps, but it is not what HAMi sends.
_MERGE_PATCH = "application/merge-patch+json"
_JSON = "application/json"
# The auth entry of the generated configuration (`Configuration.auth_settings()`): the bearer
# token, refreshed by the loaders' `refresh_api_key_hook` (in-cluster token rotation, exec
# plugins). Client certificates are set up by the REST client's pool manager.
_AUTH_SETTINGS = ["BearerToken"]

_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_LEASE = _LEASES + "/{name}"

# How long a watch stream may stay silent before it counts as dead. The API server sends a
# bookmark about once a minute to watchers that allow them, so a live but quiet stream is not
# cut; a dead one (a half-open connection) is noticed within this time and the watch resumed.
WATCH_READ_TIMEOUT_SECONDS = 90.0
# How often a watch's stop guard looks at its stop event (see _StopGuard).
_STOP_POLL_SECONDS = 0.1
# Kubernetes objects are at most ~1.5 MiB in etcd; a longer line is a broken stream.
_MAX_WATCH_LINE_BYTES = 16 * 1024 * 1024

_T = TypeVar("_T")


# --- errors -----------------------------------------------------------------------------------


class KubeError(Exception):
    """A Kubernetes API call failed; the message names the call and the object.

    `status` is the HTTP status when the server answered, else None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):  # noqa: N818 - names are the shared contract
    """The object does not exist (HTTP 404)."""


class Conflict(KubeError):  # noqa: N818 - names are the shared contract
    """The write lost a race (HTTP 409): resourceVersion mismatch or the object already exists."""


class Gone(KubeError):  # noqa: N818 - names are the shared contract
    """The resourceVersion or continue token is older than the server keeps (HTTP 410, or a
    watch ERROR event with code 410): list again."""


class Retryable(KubeError):  # noqa: N818 - names are the shared contract
    """A transient failure (429, 5xx, connection error, timeout) that outlived the retries.

    Inside the retry loop it also carries the server's `Retry-After` hint, in seconds.
    """

    def __init__(
        self, message: str, status: int | None = None, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(message, status)
        self.retry_after_seconds = retry_after_seconds


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container of a pod spec, reduced to what Allocate reads."""

    name: str
    env: dict[str, str]
    """Only literal `value` env entries; `valueFrom` entries are left out."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a Pod that the scheduler and the device plugin read."""

    namespace: str
    name: str
    uid: str
    phase: str
    node_name: str
    annotations: dict[str, str]
    labels: dict[str, str]
    init_containers: tuple[ContainerSpec, ...]
    containers: tuple[ContainerSpec, ...]
    resource_version: str
    creation_timestamp: datetime | None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """The fields of a Node that the scheduler and the device plugin read."""

    name: str
    annotations: dict[str, str]
    labels: dict[str, str]
    allocatable: dict[str, str]
    resource_version: str


@dataclass(frozen=True, slots=True)
class ObjectList:
    """A whole LIST answer: its items as the server sent them and the list's resourceVersion
    (the version to start a watch from)."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: `type` is ADDED, MODIFIED, DELETED or BOOKMARK (ERROR events are raised,
    never returned). A DELETED object is the last state, at the deletion's resourceVersion; a
    BOOKMARK object carries only `kind`, `apiVersion` and `metadata.resourceVersion`."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        """The object's `metadata.resourceVersion` ("" when absent)."""
        metadata = self.object.get("metadata")
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        return version if isinstance(version, str) else ""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about (core/v1 ObjectReference). `namespace` is "" for
    cluster-scoped objects such as nodes; `uid` and `resource_version` are left out when ""."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = "v1"
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A coordination.k8s.io/v1 Lease, as leader election reads and writes it.

    Times are timezone-aware datetimes (naive ones are taken as UTC when written); they go on
    the wire as MicroTime, `2026-11-30T12:00:00.000000Z`. `resource_version` is "" for a lease
    not yet created.
    """

    namespace: str
    name: str
    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard each API call tries.

    `attempts` counts the first try; the wait before retry k (1-based) is drawn uniformly from
    [b/2, b] with b = min(initial * 2**(k-1), max), or the server's Retry-After when it is given
    (capped at max). `timeout_seconds` bounds each attempt (connect + response).
    """

    attempts: int = 5
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 2.0
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.initial_backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("RetryPolicy backoff seconds must be >= 0")
        if self.timeout_seconds <= 0:
            raise ValueError(f"RetryPolicy.timeout_seconds must be > 0, got {self.timeout_seconds}")

    def backoff_seconds(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number `retry` (1-based), with jitter."""
        ceiling = min(self.initial_backoff_seconds * 2 ** (retry - 1), self.max_backoff_seconds)
        return rng.uniform(ceiling / 2, ceiling)


# --- error translation ------------------------------------------------------------------------

# Failures below HTTP: refused or dropped connections, timeouts, broken responses.
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


@contextlib.contextmanager
def _translate_errors(what: str) -> Iterator[None]:
    """Map client-library failures inside the block to `KubeError` types, chained with `from`.

    `what` names the call and the object ("get pod default/p1"). A `ValueError` means a body we
    could not decode (bad JSON, wrong shape) and becomes a plain `KubeError`.
    """
    try:
        yield
    except KubeError:
        raise
    except ApiException as exc:
        raise _from_api_exception(what, exc) from exc
    except _TRANSPORT_ERRORS as exc:
        raise Retryable(f"{what}: {_describe_transport_error(exc)}") from exc
    except ValueError as exc:
        raise KubeError(f"{what}: malformed response from the API server: {exc}") from exc


def _from_api_exception(what: str, exc: ApiException) -> KubeError:
    status = exc.status if isinstance(exc.status, int) else None
    detail = _status_message(exc.body) or str(exc.reason or "").strip() or "no detail"
    if not status:
        # status 0: the client could not build or send the request (TLS setup, body encoding).
        return KubeError(f"{what}: {detail}")
    message = f"{what}: HTTP {status}: {detail}"
    if status == 404:
        return NotFound(message, status)
    if status == 409:
        return Conflict(message, status)
    if status == 410:
        return Gone(message, status)
    if status == 429 or 500 <= status <= 599:
        return Retryable(message, status, _retry_after_seconds(exc))
    return KubeError(message, status)


def _status_message(body: object) -> str:
    """The `message` of a metav1.Status body, else the first 200 characters of the body."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return body.strip()[:200]


def _retry_after_seconds(exc: ApiException) -> float | None:
    headers = exc.headers
    if not headers:
        return None
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _describe_transport_error(exc: BaseException) -> str:
    # MaxRetryError wraps the real cause; name that one.
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    # urllib3 makes NewConnectionError a ConnectTimeoutError; a refused connection is no timeout.
    timeout = urllib3.exceptions.TimeoutError | TimeoutError
    if isinstance(exc, timeout) and not isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"timed out ({exc})"
    return f"connection failed: {type(exc).__name__}: {exc}"


# --- decoding ---------------------------------------------------------------------------------


def _json_object(data: bytes) -> dict[str, Any]:
    decoded = json.loads(data)
    if not isinstance(decoded, dict):
        raise ValueError(f"expected a JSON object, got {type(decoded).__name__}")
    return decoded


def _field(obj: Mapping[str, Any], key: str, kind: type[_T], default: _T) -> _T:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ValueError(f"field {key!r} should be {kind.__name__}, got {type(value).__name__}")
    return value


def _str_map(obj: Mapping[str, Any], key: str) -> dict[str, str]:
    value = _field(obj, key, dict, {})
    for k, v in value.items():
        if not isinstance(v, str):
            raise ValueError(f"{key}[{k!r}] should be a string, got {type(v).__name__}")
    return dict(value)


def _timestamp(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"bad timestamp {text!r}") from exc


def _container(obj: object) -> ContainerSpec:
    if not isinstance(obj, dict):
        raise ValueError(f"container should be an object, got {type(obj).__name__}")
    env: dict[str, str] = {}
    for entry in _field(obj, "env", list, []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"bad env entry {entry!r}")
        value = entry.get("value")
        if isinstance(value, str):
            env[entry["name"]] = value
    return ContainerSpec(name=_field(obj, "name", str, ""), env=env)


def pod_record(obj: Mapping[str, Any]) -> PodRecord:
    """Decode a Pod object (a GET answer, a list item or a watch event's object).

    Raises ValueError naming the field when the object has the wrong shape.
    """
    metadata = _field(obj, "metadata", dict, {})
    spec = _field(obj, "spec", dict, {})
    status = _field(obj, "status", dict, {})
    return PodRecord(
        namespace=_field(metadata, "namespace", str, ""),
        name=_field(metadata, "name", str, ""),
        uid=_field(metadata, "uid", str, ""),
        phase=_field(status, "phase", str, ""),
        node_name=_field(spec, "nodeName", str, ""),
        annotations=_str_map(metadata, "annotations"),
        labels=_str_map(metadata, "labels"),
        init_containers=tuple(_container(c) for c in _field(spec, "initContainers", list, [])),
        containers=tuple(_container(c) for c in _field(spec, "containers", list, [])),
        resource_version=_field(metadata, "resourceVersion", str, ""),
        creation_timestamp=_timestamp(_field(metadata, "creationTimestamp", str, "")),
    )


def _pod_records(obj: Mapping[str, Any]) -> list[PodRecord]:
    records = []
    for item in _field(obj, "items", list, []):
        if not isinstance(item, dict):
            raise ValueError(f"list item should be an object, got {type(item).__name__}")
        records.append(pod_record(item))
    return records


def node_record(obj: Mapping[str, Any]) -> NodeRecord:
    """Decode a Node object. Raises ValueError naming the field when it has the wrong shape."""
    metadata = _field(obj, "metadata", dict, {})
    status = _field(obj, "status", dict, {})
    return NodeRecord(
        name=_field(metadata, "name", str, ""),
        annotations=_str_map(metadata, "annotations"),
        labels=_str_map(metadata, "labels"),
        allocatable=_str_map(status, "allocatable"),
        resource_version=_field(metadata, "resourceVersion", str, ""),
    )


def lease_record(obj: Mapping[str, Any]) -> LeaseRecord:
    """Decode a coordination.k8s.io/v1 Lease. Raises ValueError on a wrong shape."""
    metadata = _field(obj, "metadata", dict, {})
    spec = _field(obj, "spec", dict, {})
    return LeaseRecord(
        namespace=_field(metadata, "namespace", str, ""),
        name=_field(metadata, "name", str, ""),
        holder_identity=_field(spec, "holderIdentity", str, ""),
        lease_duration_seconds=_int_field(spec, "leaseDurationSeconds"),
        acquire_time=_timestamp(_field(spec, "acquireTime", str, "")),
        renew_time=_timestamp(_field(spec, "renewTime", str, "")),
        lease_transitions=_int_field(spec, "leaseTransitions"),
        resource_version=_field(metadata, "resourceVersion", str, ""),
    )


def _int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    # bool is an int in Python, not in JSON schema.
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"field {key!r} should be int, got {type(value).__name__}")
    return value or 0


def _micro_time(when: datetime) -> str:
    """metav1.MicroTime as the API server writes it: RFC 3339, six fraction digits, UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease_body(record: LeaseRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": record.name, "namespace": record.namespace}
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    spec: dict[str, Any] = {
        "holderIdentity": record.holder_identity,
        "leaseDurationSeconds": record.lease_duration_seconds,
        "leaseTransitions": record.lease_transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = _micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = _micro_time(record.renew_time)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class _Page:
    """One page of a LIST answer and the token for the next one ("" on the last page)."""

    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str


def _page(obj: Mapping[str, Any]) -> _Page:
    metadata = _field(obj, "metadata", dict, {})
    items = _field(obj, "items", list, [])
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"list item should be an object, got {type(item).__name__}")
    return _Page(
        items=items,
        resource_version=_field(metadata, "resourceVersion", str, ""),
        continue_token=_field(metadata, "continue", str, ""),
    )


_WATCH_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


def _watch_event(line: bytes) -> WatchEvent:
    """Decode one line of a watch stream. Raises ValueError on a malformed event."""
    decoded = _json_object(line)
    kind, obj = decoded.get("type"), decoded.get("object")
    if kind not in _WATCH_TYPES:
        raise ValueError(f"unknown watch event type {kind!r}")
    if not isinstance(obj, dict):
        raise ValueError(f"watch event object should be an object, got {type(obj).__name__}")
    return WatchEvent(str(kind), obj)


def _status_exception(status: Mapping[str, Any]) -> ApiException:
    """A watch ERROR event's metav1.Status as the ApiException an HTTP answer with its code would
    raise, for `_translate_errors` (a code that is not a number counts as 500)."""
    code = status.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = 500
    return ApiException(
        status=code, reason=str(status.get("reason") or ""), body=json.dumps(dict(status))
    )


# --- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """One REST call. `{name}` parts of `path` are filled (URL-quoted) from `path_params`."""

    method: str
    path: str
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: tuple[tuple[str, str], ...] = ()
    body: Mapping[str, Any] | None = None
    content_type: str | None = None


def _event_body(
    ref: ObjectRef, reason: str, message: str, event_type: str, component: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Event about `ref`, as the JSON the API server takes.

    The name is `<object>.<hex nanoseconds>` as client-go writes it; the timestamps are RFC 3339
    in whole seconds, as metav1.Time serialises. An event about a cluster-scoped object (no
    namespace) lives in `default`, as client-go's recorder puts it. uid and resourceVersion are
    left out when unknown.
    """
    involved: dict[str, str] = {"apiVersion": ref.api_version, "kind": ref.kind}
    if ref.namespace:
        involved["namespace"] = ref.namespace
    involved["name"] = ref.name
    if ref.uid:
        involved["uid"] = ref.uid
    if ref.resource_version:
        involved["resourceVersion"] = ref.resource_version
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{ref.name}.{time.time_ns():x}",
            "namespace": ref.namespace or "default",
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


# --- the client -------------------------------------------------------------------------------

_AUTH_REFRESH_SECONDS = 1.0
"""How often the loaders' token refresh hook may run (it runs before every request otherwise)."""


def _throttled_refresh(
    hook: Callable[[Configuration], None], clock: Callable[[], float]
) -> Callable[[Configuration], None]:
    """`hook`, run at most once per `_AUTH_REFRESH_SECONDS`.

    The kubeconfig loader's hook re-applies the whole loaded configuration on every request,
    and setting `host` re-reads the proxy environment: about a tenth of a busy scheduler's CPU.
    Tokens (in-cluster rotation, exec plugins) are still refreshed within a second of expiry.
    """
    lock = threading.Lock()
    last: list[float] = []
    inner = [hook]

    def refresh(configuration: Configuration) -> None:
        now = clock()
        with lock:
            if last and now - last[0] < _AUTH_REFRESH_SECONDS:
                return
            last[:] = [now]
        inner[0](configuration)
        # The kubeconfig loader's hook installs itself again each time it runs.
        installed = configuration.refresh_api_key_hook
        if installed is not refresh and installed is not None:
            inner[0] = installed
            configuration.refresh_api_key_hook = refresh

    return refresh


class KubeClient:
    """Typed, retried, timed Kubernetes calls over one `kubernetes.client.ApiClient`.

    The client takes ownership of `api_client`: it switches off urllib3's built-in retries when
    the configuration left them at the default (the policy here does the retrying) and closes
    it in `close()`. Safe to share between threads.
    """

    def __init__(
        self,
        api_client: ApiClient,
        retry: RetryPolicy = RetryPolicy(),
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if api_client.configuration.retries is None:
            api_client.configuration.retries = False
            api_client.rest_client.close()
            api_client.rest_client = RESTClientObject(api_client.configuration)
        hook = api_client.configuration.refresh_api_key_hook
        if hook is not None:
            api_client.configuration.refresh_api_key_hook = _throttled_refresh(hook, clock)
        self._api_client = api_client
        self._retry = retry
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._clock = clock
        self._local = threading.local()

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        retry: RetryPolicy = RetryPolicy(),
    ) -> KubeClient:
        """Connect with the kubeconfig file given, else `$KUBECONFIG`, else in-cluster config.

        Raises KubeError naming the source tried when none of them gives a usable configuration.
        """
        configuration = Configuration()
        source = kubeconfig or os.environ.get("KUBECONFIG") or ""
        try:
            if source:
                load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=source, client_configuration=configuration, persist_config=False
                )
            else:
                load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
        # The loaders fail in many ways (ConfigException, OSError, YAML errors, KeyError or
        # TypeError on a wrong shape, exec-plugin errors); each means "this source is unusable".
        except Exception as exc:
            where = (
                f"kubeconfig {source!r}"
                if source
                else "in-cluster config (no --kubeconfig and no $KUBECONFIG)"
            )
            raise KubeError(f"cannot load Kubernetes configuration from {where}: {exc}") from exc
        configuration.retries = False
        logger.info("Kubernetes API server %s", configuration.host)
        return cls(ApiClient(configuration), retry)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pooled connections."""
        self._api_client.rest_client.close()
        self._api_client.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Give the calls this thread makes inside the block `seconds` in total.

        Each attempt's timeout is cut to the time left, no retry starts that would end after
        it, and a call started with no time left raises Retryable at once (the message says the
        budget was spent). A nested block sets its own budget for its duration; other threads
        are not affected.
        """
        previous = getattr(self._local, "budget", None)
        self._local.budget = (self._clock() + seconds, seconds)
        try:
            yield
        finally:
            self._local.budget = previous

    def _time_left(self) -> tuple[float, float] | None:
        """(seconds left, whole budget) inside `deadline()`, else None."""
        budget: tuple[float, float] | None = getattr(self._local, "budget", None)
        if budget is None:
            return None
        end, seconds = budget
        return end - self._clock(), seconds

    # --- nodes ----------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeRecord:
        """GET the node. Raises NotFound, Retryable or KubeError."""
        request = _Request("GET", "/api/v1/nodes/{name}", {"name": name})
        return self._call(f"get node {name}", request, node_record)

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> NodeRecord:
        """Merge-patch node annotations (None deletes a key) and return the updated node.

        With `resource_version` the patch only applies to that version of the node, else it
        raises Conflict. Also raises NotFound, Retryable or KubeError.
        """
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        request = _Request(
            "PATCH",
            "/api/v1/nodes/{name}",
            {"name": name},
            body={"metadata": metadata},
            content_type=_MERGE_PATCH,
        )
        return self._call(f"patch node {name} annotations", request, node_record)

    # --- pods -----------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> PodRecord:
        """GET the pod. Raises NotFound, Retryable or KubeError."""
        request = _Request(
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
        )
        return self._call(f"get pod {namespace}/{name}", request, pod_record)

    def list_pods_on_node(self, node_name: str) -> list[PodRecord]:
        """All pods bound to the node, every namespace (field selector `spec.nodeName`).

        Raises Retryable or KubeError.
        """
        request = _Request(
            "GET", "/api/v1/pods", query=(("fieldSelector", f"spec.nodeName={node_name}"),)
        )
        return self._call(f"list pods on node {node_name}", request, _pod_records)

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodRecord:
        """Merge-patch pod annotations and labels (None deletes a key); return the updated pod.

        With `resource_version` the patch only applies to that version of the pod, else it
        raises Conflict. Also raises NotFound, Retryable or KubeError.
        """
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if labels is not None:
            metadata["labels"] = dict(labels)
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        request = _Request(
            "PATCH",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
            body={"metadata": metadata},
            content_type=_MERGE_PATCH,
        )
        return self._call(f"patch pod {namespace}/{name} metadata", request, pod_record)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind the pod to `node` (POST a v1 Binding to `pods/<name>/binding`).

        `uid` (when not "") is a precondition: the API server refuses to bind another pod of
        the same name. A Conflict is checked against the pod: if it is already bound to `node`
        (a retry after an attempt that did succeed), the bind counts as done. Raises NotFound,
        Conflict (bound elsewhere, or another uid), Retryable or KubeError.
        """
        what = f"bind pod {namespace}/{name} to node {node}"
        metadata = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        request = _Request(
            "POST",
            "/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {"namespace": namespace, "name": name},
            body={
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
            content_type=_JSON,
        )
        try:
            self._call(what, request, _ignore_body)
        except Conflict:
            pod = self.get_pod(namespace, name)
            if pod.node_name != node or (uid and pod.uid != uid):
                raise
            logger.debug("%s: already bound there", what)

    # --- any resource: list and watch -----------------------------------------------------

    def list_objects(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        """LIST a collection (`/api/v1/pods`, `/api/v1/namespaces/ns/pods`, `/api/v1/nodes`...)
        in pages of `page_size` (0: one page), following `continue`; every page is retried like
        any call.

        If a continue token expires (410) the list starts over once without pages, as
        client-go's pager does. Raises Gone, Retryable or KubeError.
        """
        items: list[dict[str, Any]] = []
        version = ""
        pages = 0
        try:
            for page in self.list_pages(
                path,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
            ):
                items.extend(page.items)
                version = page.resource_version
                pages += 1
        except Gone:
            if pages == 0:
                raise
            logger.info("list %s: continue token expired; listing again in one page", path)
            return self.list_objects(
                path, label_selector=label_selector, field_selector=field_selector, page_size=0
            )
        return ObjectList(items, version)

    def list_pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[ObjectList]:
        """LIST a collection page by page (`limit`/`continue`; `page_size` 0: one page), so a
        caller can reduce each page before the next one is read. Every page carries the list's
        resourceVersion. Raises Gone (a continue token expired: list again), Retryable or
        KubeError.
        """
        base: list[tuple[str, str]] = []
        if label_selector:
            base.append(("labelSelector", label_selector))
        if field_selector:
            base.append(("fieldSelector", field_selector))
        if page_size > 0:
            base.append(("limit", str(page_size)))
        token = ""
        number = 1
        while True:
            query = [*base, ("continue", token)] if token else base
            request = _Request("GET", path, query=tuple(query))
            page = self._call(f"list {path} (page {number})", request, _page)
            yield ObjectList(page.items, page.resource_version)
            if not page.continue_token:
                return
            token = page.continue_token
            number += 1

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
        """WATCH a collection from `resource_version` ("" or "0": the current state first, as
        ADDED events), with bookmarks, for at most `timeout_seconds` (asked of the server).

        The request is sent (and retried like any call, each attempt waiting at most the retry
        policy's timeout for the answer's headers) on the first `next()`; events are read as
        they arrive. The iterator ends when the server ends the stream, when the connection
        drops or stays silent for `read_timeout_seconds`, past `timeout_seconds +
        read_timeout_seconds` in any case, and when `stop` is set (a blocked read is woken).
        Resume from the last event's resourceVersion. Raises Gone (HTTP 410 or an ERROR event
        with code 410: list again), Retryable (could not connect, 5xx, or such an ERROR event)
        or KubeError (any other refusal, a malformed event).
        """
        what = f"watch {path} from resourceVersion {resource_version or '(now)'}"
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        request = _Request("GET", path, query=tuple(query))
        end = self._clock() + timeout_seconds + read_timeout_seconds

        def open_stream(timeout: float) -> urllib3.BaseHTTPResponse:
            response = self._send(request, (timeout, timeout))
            # The headers came within the call's timeout; events may be far apart.
            if response.connection is not None:
                response.connection.timeout = read_timeout_seconds
            return response

        response = self._with_retries(what, open_stream, stop)
        guard = _StopGuard(stop, response) if stop is not None else None
        finished = False
        try:
            lines = _lines(response, what)
            while stop is None or not stop.is_set():
                try:
                    line = next(lines)
                except StopIteration:
                    finished = True
                    return
                except _TRANSPORT_ERRORS as exc:
                    if stop is None or not stop.is_set():
                        logger.debug("%s: stream ended: %s", what, _describe_transport_error(exc))
                    return
                with _translate_errors(what):
                    event = _watch_event(line)
                    if event.type == "ERROR":
                        raise _status_exception(event.object)
                yield event
                if self._clock() > end:
                    logger.debug("%s: past its %d s timeout; ending it", what, timeout_seconds)
                    return
        finally:
            if guard is not None:
                guard.close()
            if not finished:
                # Unread data (or a broken stream) stays behind: never reuse this connection.
                response.close()
            response.release_conn()

    # --- leases ---------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        """GET a coordination.k8s.io/v1 Lease. Raises NotFound, Retryable or KubeError."""
        request = _Request("GET", _LEASE, {"namespace": namespace, "name": name})
        return self._call(f"get lease {namespace}/{name}", request, lease_record)

    def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Create the lease (its resource_version is ignored); return it as stored.

        Raises Conflict if it exists already, Retryable or KubeError.
        """
        record = dataclasses.replace(record, resource_version="")
        request = _Request(
            "POST",
            _LEASES,
            {"namespace": record.namespace},
            body=_lease_body(record),
            content_type=_JSON,
        )
        return self._call(f"create lease {record.namespace}/{record.name}", request, lease_record)

    def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the lease (PUT) if it is still at `record.resource_version`; return it as
        stored, with its new resource_version.

        Raises Conflict when the lease changed since (someone else renewed or took it),
        NotFound, Retryable or KubeError; ValueError for a record without resource_version.
        """
        if not record.resource_version:
            raise ValueError(f"update_lease {record.namespace}/{record.name}: no resource_version")
        request = _Request(
            "PUT",
            _LEASE,
            {"namespace": record.namespace, "name": record.name},
            body=_lease_body(record),
            content_type=_JSON,
        )
        return self._call(f"update lease {record.namespace}/{record.name}", request, lease_record)

    # --- events ---------------------------------------------------------------------------

    def create_event(
        self,
        ref: ObjectRef,
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "hami-scheduler",
    ) -> None:
        """Record a core/v1 Event about any object. Best effort: failures are logged, not raised.

        The event name is `<object>.<hex nanoseconds>` as client-go writes it, so a retry after
        a timeout that had in fact succeeded gets 409 and counts as done.
        """
        kind = ref.kind.lower()
        where = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
        what = f"create event {reason} for {kind} {where}"
        body = _event_body(ref, reason, message, event_type, component, datetime.now(UTC))
        request = _Request(
            "POST",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": body["metadata"]["namespace"]},
            body=body,
            content_type=_JSON,
        )
        try:
            self._call(what, request, _ignore_body)
        except Conflict:
            logger.debug("%s: already recorded", what)
        except KubeError as exc:
            logger.warning("event not recorded: %s", exc)

    def create_pod_event(
        self,
        pod: PodRecord,
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "hami-device-plugin",
    ) -> None:
        """Record a core/v1 Event about the pod; best effort, as `create_event`."""
        ref = ObjectRef(
            "Pod", pod.namespace, pod.name, uid=pod.uid, resource_version=pod.resource_version
        )
        self.create_event(ref, reason, message, event_type, component)

    # --- plumbing -------------------------------------------------------------------------

    def _send(
        self, request: _Request, timeout: float | tuple[float, float]
    ) -> urllib3.BaseHTTPResponse:
        """One attempt: build the request with the ApiClient (host, auth, default headers, URL
        quoting), send it with `timeout` (seconds for the whole answer, or (connect, read)
        seconds for a stream) and return the raw 2xx response, unread.

        Raises ApiException for any other status (the body read, the connection released), as
        the generated API does, and urllib3 errors as they come.
        """
        headers = {"Accept": _JSON}
        if request.content_type:
            headers["Content-Type"] = request.content_type
        method, url, header_params, body, post_params = self._api_client.param_serialize(
            method=request.method,
            resource_path=request.path,
            path_params=dict(request.path_params),
            query_params=list(request.query),
            header_params=headers,
            body=dict(request.body) if request.body is not None else None,
            auth_settings=_AUTH_SETTINGS,
        )
        response: RESTResponse = self._api_client.call_api(
            method,
            url,
            header_params,
            body,
            post_params,
            _request_timeout=timeout,
        )
        if 200 <= response.status <= 299:
            return cast(urllib3.BaseHTTPResponse, response.response)
        try:
            response.read()  # type: ignore[no-untyped-call]
        finally:
            response.response.release_conn()
        raise ApiException.from_response(http_resp=response, body=None, data=None)

    def _call(
        self,
        what: str,
        request: _Request,
        decode: Callable[[dict[str, Any]], _T],
    ) -> _T:
        """Send `request` with retries; `decode` the JSON object it answers.

        Raises as `_with_retries`. A body that does not decode (ValueError) is a KubeError,
        not retried.
        """
        return self._with_retries(
            what, lambda timeout: decode(_read_object(self._send(request, timeout)))
        )

    def _with_retries(
        self,
        what: str,
        attempt: Callable[[float], _T],
        stop: threading.Event | None = None,
    ) -> _T:
        """Run `attempt(timeout_seconds)` with retries, its failures translated.

        Raises NotFound, Conflict, Gone, KubeError at once and Retryable after the last
        attempt, as soon as the thread's `deadline()` budget does not allow another one, or
        when `stop` is set during a backoff.
        """
        retry = 0
        while True:
            timeout = self._retry.timeout_seconds
            left = self._time_left()
            if left is not None:
                if left[0] <= 0:
                    raise Retryable(f"{what}: not sent, its {left[1]:g} s time budget is spent")
                timeout = min(timeout, left[0])
            try:
                with _translate_errors(what):
                    return attempt(timeout)
            except Retryable as exc:
                retry += 1
                if retry >= self._retry.attempts:
                    raise Retryable(
                        f"{exc} (gave up after {retry} attempts)", exc.status
                    ) from exc.__cause__
                delay = self._retry.backoff_seconds(retry, self._rng)
                if exc.retry_after_seconds is not None:
                    delay = min(exc.retry_after_seconds, self._retry.max_backoff_seconds)
                left = self._time_left()
                if left is not None and left[0] <= delay:
                    raise Retryable(
                        f"{exc} (gave up after {retry} attempts: its {left[1]:g} s time budget "
                        "is spent)",
                        exc.status,
                    ) from exc.__cause__
                logger.debug("%s; retry %d in %.3f s", exc, retry, delay)
                if stop is None:
                    self._sleep(delay)
                elif stop.wait(delay):
                    raise Retryable(f"{exc} (stopped after {retry} attempts)", exc.status) from (
                        exc.__cause__
                    )


class _StopGuard:
    """Wakes a read blocked on a streaming `response` once `stop` is set, by shutting the
    socket down for reading from a helper thread (the read then fails at once).

    `threading.Event` cannot be waited on together with another event, so the helper polls
    `stop` every `_STOP_POLL_SECONDS`; `close()` ends it (the stream is done) and joins it.
    """

    def __init__(self, stop: threading.Event, response: urllib3.BaseHTTPResponse) -> None:
        self._stop = stop
        self._response = response
        self._done = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="k8s-watch-stop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            stopped = self._stop.wait(_STOP_POLL_SECONDS)
            with self._lock:
                if self._done:
                    return
                if stopped:
                    # The response may be between reads or already broken: nothing to wake.
                    with contextlib.suppress(Exception):
                        self._response.shutdown()
                    return

    def close(self) -> None:
        with self._lock:
            self._done = True
        self._thread.join()


def _lines(response: urllib3.BaseHTTPResponse, what: str) -> Iterator[bytes]:
    """The non-empty lines of a streamed response as they arrive (the API server sends one
    JSON watch event per line, usually one per chunk). Raises KubeError naming `what` for a
    line longer than `_MAX_WATCH_LINE_BYTES` (a server that never ends a line must not exhaust
    memory)."""
    buffer = bytearray()
    for data in response.stream(amt=None):
        buffer.extend(data)
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > _MAX_WATCH_LINE_BYTES:
            raise KubeError(
                f"{what}: malformed response from the API server: an event longer than "
                f"{_MAX_WATCH_LINE_BYTES} bytes"
            )
    if buffer.strip():
        yield bytes(buffer)


def _read_object(response: urllib3.BaseHTTPResponse) -> dict[str, Any]:
    """Read, release and decode a raw (unread) urllib3 response."""
    try:
        data = response.data
    finally:
        response.release_conn()
    return _json_object(data)


def _ignore_body(body: dict[str, Any]) -> None:
    return None
