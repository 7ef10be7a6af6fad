"""The API's JSON as the adapter returns and sends it: lists, watch events, leases, events,
secrets and webhook configurations.

Plain frozen dataclasses instead of the `kubernetes` client's generated models: those cost far
more per object than the handful of fields we read, and our own decoding turns a malformed body
into a `KubeError` (a `ValueError` here, translated by `errors.translate_errors`) instead of
whatever the model layer happens to raise. Pods and nodes are read by the one model of
`hami_plugin.protocol.objects`; events and leases are written as plain JSON dicts.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from hami_plugin.protocol.objects import PodInfo, read_pod

_T = TypeVar("_T")


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
class Page:
    """One page of a LIST answer and the token for the next one ("" on the last page)."""

    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str


# --- decoding ---------------------------------------------------------------------------------


def json_object(data: bytes) -> dict[str, Any]:
    """Decode a JSON object. Raises ValueError for bad JSON or another JSON value."""
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


def _int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    # bool is an int in Python, not in JSON schema.
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"field {key!r} should be int, got {type(value).__name__}")
    return value or 0


def _timestamp(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"bad timestamp {text!r}") from exc


def page(obj: Mapping[str, Any]) -> Page:
    """Decode one page of a LIST answer. Raises ValueError on a wrong shape."""
    metadata = _field(obj, "metadata", dict, {})
    items = _field(obj, "items", list, [])
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"list item should be an object, got {type(item).__name__}")
    return Page(
        items=items,
        resource_version=_field(metadata, "resourceVersion", str, ""),
        continue_token=_field(metadata, "continue", str, ""),
    )


@dataclass(frozen=True, slots=True)
class PodListing:
    """A PodList's items: the pods `read_pod` reads, and why each of the others could not be
    read, by `object_identity` ("namespace/name" -> (resourceVersion, why))."""

    pods: list[PodInfo]
    unreadable: dict[str, tuple[str, str]]


def pod_listing(obj: Mapping[str, Any]) -> PodListing:
    """Decode a PodList's items; one pod that cannot be read fails none of the others. Raises
    ValueError when the list itself has a wrong shape."""
    pods: list[PodInfo] = []
    unreadable: dict[str, tuple[str, str]] = {}
    for item in page(obj).items:
        try:
            pods.append(read_pod(item))
        except ValueError as exc:  # ObjectError: a wrong type or a missing name
            identity, version = object_identity(item)
            unreadable[identity] = (version, str(exc))
    return PodListing(pods, unreadable)


def object_identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    """("namespace/name" or "name", resourceVersion) of a raw object, for log lines."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return "(object without metadata)", ""
    name, namespace = metadata.get("name"), metadata.get("namespace")
    identity = f"{namespace}/{name}" if namespace else str(name)
    version = metadata.get("resourceVersion")
    return identity, version if isinstance(version, str) else ""


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


# --- encoding ---------------------------------------------------------------------------------


def _micro_time(when: datetime) -> str:
    """metav1.MicroTime as the API server writes it: RFC 3339, six fraction digits, UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(record: LeaseRecord) -> dict[str, Any]:
    """The Lease as the JSON the API server takes (resourceVersion only when known)."""
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


def event_body(
    ref: ObjectRef,
    reason: str,
    message: str,
    event_type: str,
    component: str,
    now: datetime,
    *,
    count: int = 1,
    first_timestamp: datetime | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about `ref`, as the JSON the API server takes: seen `count` times, the
    last at `now`, the first at `first_timestamp` (`now` when None).

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
        "firstTimestamp": _event_time(first_timestamp or now),
        "lastTimestamp": _event_time(now),
        "count": count,
    }


def event_patch(count: int, last_timestamp: datetime, message: str) -> dict[str, Any]:
    """The merge patch that counts a repeat onto an existing Event: the fields client-go's
    recorder changes (`count`, `lastTimestamp`, `message`), nothing else."""
    return {"count": count, "lastTimestamp": _event_time(last_timestamp), "message": message}


def _event_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- secrets and webhook configurations (the certificate job) --------------------------------


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A core/v1 Secret: its `data` decoded from base64, its `type` (`Opaque`,
    `kubernetes.io/tls`...), its labels. `resource_version` is "" for one not yet created."""

    namespace: str
    name: str
    type: str
    data: Mapping[str, bytes]
    labels: Mapping[str, str]
    resource_version: str = ""

    def __repr__(self) -> str:  # never print key material
        keys = ", ".join(sorted(self.data))
        return f"SecretRecord({self.namespace}/{self.name}, {self.type}, keys: {keys})"


@dataclass(frozen=True, slots=True)
class WebhookConfigurationRecord:
    """An admissionregistration.k8s.io/v1 Mutating- or ValidatingWebhookConfiguration as the
    certificate job reads it: each webhook's name and `clientConfig.caBundle` (decoded; b""
    when unset), in order."""

    name: str
    ca_bundles: tuple[tuple[str, bytes], ...]
    resource_version: str


def _decode_base64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} should be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"{what} is not base64: {exc}") from None


def secret_record(obj: Mapping[str, Any]) -> SecretRecord:
    """Decode a core/v1 Secret. Raises ValueError on a wrong shape or a value not base64."""
    metadata = _field(obj, "metadata", dict, {})
    data = _field(obj, "data", dict, {})
    labels = _field(metadata, "labels", dict, {})
    return SecretRecord(
        namespace=_field(metadata, "namespace", str, ""),
        name=_field(metadata, "name", str, ""),
        type=_field(obj, "type", str, "Opaque"),
        data={key: _decode_base64(value, f"data[{key}]") for key, value in data.items()},
        labels={str(key): str(value) for key, value in labels.items()},
        resource_version=_field(metadata, "resourceVersion", str, ""),
    )


def secret_body(record: SecretRecord) -> dict[str, Any]:
    """The Secret as the JSON the API server takes (resourceVersion only when known)."""
    metadata: dict[str, Any] = {"name": record.name, "namespace": record.namespace}
    if record.labels:
        metadata["labels"] = dict(record.labels)
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": record.type,
        "data": secret_data(record.data),
    }


def secret_data(data: Mapping[str, bytes | None]) -> dict[str, str | None]:
    """Secret `data` as the API takes it: each value base64 (None stays null: a merge patch's
    delete)."""
    return {
        key: None if value is None else base64.b64encode(value).decode("ascii")
        for key, value in data.items()
    }


def webhook_configuration_record(obj: Mapping[str, Any]) -> WebhookConfigurationRecord:
    """Decode a webhook configuration's names and caBundles. Raises ValueError on a wrong
    shape."""
    metadata = _field(obj, "metadata", dict, {})
    bundles: list[tuple[str, bytes]] = []
    for index, webhook in enumerate(_field(obj, "webhooks", list, [])):
        if not isinstance(webhook, dict):
            raise ValueError(f"webhooks[{index}] should be an object")
        client_config = _field(webhook, "clientConfig", dict, {})
        bundle = client_config.get("caBundle")
        bundles.append(
            (
                _field(webhook, "name", str, ""),
                b"" if bundle is None else _decode_base64(bundle, f"webhooks[{index}].caBundle"),
            )
        )
    return WebhookConfigurationRecord(
        name=_field(metadata, "name", str, ""),
        ca_bundles=tuple(bundles),
        resource_version=_field(metadata, "resourceVersion", str, ""),
    )
