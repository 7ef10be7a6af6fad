"""The Kubernetes calls each role of the daemons makes, as protocols: defined once, here.

`KubeClient` provides every one of them (tests/kube/test_api.py checks it signature by
signature, so they cannot drift), and so does the in-memory `hami_plugin.kube.fake.FakeKube`.
A role protocol is built from the call groups below, so each call's signature is written once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.records import (
    LeaseRecord,
    ObjectList,
    ObjectRef,
    SecretRecord,
    WatchEvent,
    WebhookConfigurationRecord,
)
from hami_plugin.kube.watch import WATCH_READ_TIMEOUT_SECONDS
from hami_plugin.protocol.objects import NodeInfo, PodInfo

__all__ = [
    "AllocateApi",
    "BindApi",
    "CertsApi",
    "DeadlineApi",
    "DevicePluginApi",
    "EventApi",
    "LeaseApi",
    "ListApi",
    "NodeApi",
    "NodeMetricsApi",
    "ObjectEventApi",
    "PodEventApi",
    "PodPatchApi",
    "PreemptionApi",
    "WatchApi",
]


class DeadlineApi(Protocol):
    """A time budget for the calls a thread makes inside the block (`KubeClient.deadline`)."""

    def deadline(self, seconds: float) -> contextlib.AbstractContextManager[None]: ...


class NodeApi(Protocol):
    """Read a node and merge-patch its annotations (the device plugin's registration)."""

    def get_node(self, name: str) -> NodeInfo: ...

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> NodeInfo: ...


class NodeMetricsApi(Protocol):
    """The pods bound to a node (the device plugin's metrics and container scan)."""

    def list_pods_on_node(self, node_name: str) -> list[PodInfo]: ...


class PodPatchApi(Protocol):
    """Merge-patch a pod's annotations and labels."""

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodInfo: ...


class PodEventApi(Protocol):
    """Record an event about a pod (best effort)."""

    def create_pod_event(self, event: PodEvent, component: str = "hami-device-plugin") -> None: ...


class ObjectEventApi(Protocol):
    """Record an event about any object (best effort): the device plugin's node Events."""

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
    ) -> str | None: ...


class EventApi(ObjectEventApi, Protocol):
    """Record an event about any object (best effort), and count a repeat onto it: the
    scheduler's event recorder, which correlates events as client-go's does."""

    def patch_event(
        self, namespace: str, name: str, count: int, last_timestamp: datetime, message: str
    ) -> None: ...


class ListApi(Protocol):
    """LIST any collection."""

    def list_objects(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList: ...


class WatchApi(Protocol):
    """LIST a collection page by page, then WATCH it from the list's version: what an
    `informer.Informer` keeps its store with."""

    def list_pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[ObjectList]: ...

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
    ) -> Iterator[WatchEvent]: ...


class AllocateApi(NodeApi, NodeMetricsApi, PodPatchApi, PodEventApi, Protocol):
    """The calls of the device plugin's Allocate: the node lock, the pending pods, the result.

    An implementation that also has `deadline(seconds)` gets its calls time-bounded.
    """


class DevicePluginApi(AllocateApi, WatchApi, ObjectEventApi, Protocol):
    """Every call of the device-plugin daemon: Allocate's, the watches of its node's pods
    and Node (`deviceplugin.nodecache`), and its Events about the Node (`deviceplugin.rivals`)."""


class BindApi(NodeApi, PodPatchApi, ListApi, DeadlineApi, Protocol):
    """The calls of the extender's bind and recovery: the node lock, the pod's annotations, the
    Binding, and a fresh read of the pod."""

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class PreemptionApi(DeadlineApi, Protocol):
    """What the scheduler's evictions use (`extender.preemption`)."""

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> PodInfo: ...

    def add_pod_condition(
        self, namespace: str, name: str, condition: Mapping[str, Any]
    ) -> PodInfo: ...

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> None: ...


class LeaseApi(PodPatchApi, ListApi, DeadlineApi, Protocol):
    """The calls of leader election: the Lease, and the role label on the replicas' pods."""

    def get_lease(self, namespace: str, name: str) -> LeaseRecord: ...

    def create_lease(self, record: LeaseRecord) -> LeaseRecord: ...

    def update_lease(self, record: LeaseRecord) -> LeaseRecord: ...


class CertsApi(Protocol):
    """The calls of `hami certs`: its Secrets, and the webhook configuration's caBundle."""

    def get_secret(self, namespace: str, name: str) -> SecretRecord: ...

    def create_secret(self, record: SecretRecord) -> SecretRecord: ...

    def patch_secret_data(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes | None],
        resource_version: str | None = None,
    ) -> SecretRecord: ...

    def get_mutating_webhook_configuration(self, name: str) -> WebhookConfigurationRecord: ...

    def patch_mutating_webhook_ca_bundles(
        self, name: str, webhooks: Sequence[str], ca_bundle: bytes
    ) -> WebhookConfigurationRecord: ...
