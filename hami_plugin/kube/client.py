"""The Kubernetes API as hami-plugin needs it: nodes, pods, patches, bindings, leases, events,
the certificate job's Secrets and webhook caBundles, and (`hami_plugin.kube.listing`) any list
or watch.

`KubeClient` uses the real client's plumbing (`kubernetes.client.ApiClient`: configuration,
auth, TLS, request building with `param_serialize`, the urllib3 REST client) but not its
generated API classes, and adds what the daemons need on top of it:

* a dozen plain REST calls, each a `Request` sent by `hami_plugin.kube.transport`, instead of
  `CoreV1Api`. Importing `kubernetes.client.api.core_v1_api` wraps ~400 methods in pydantic
  `validate_call` and pulls in ~250 model modules: ~20 MiB of resident memory in a daemon that
  needs a dozen URLs. Only the client's plumbing submodules and the config loaders are
  imported; `kubernetes.client` and `kubernetes.client.models` load their members lazily, so no
  generated API or model module is ever loaded (tests/kube/test_client.py checks this in a fresh
  interpreter);
* answers decoded here from the raw urllib3 responses into the one pod and node model
  (`hami_plugin.protocol.objects`) and the records of `hami_plugin.kube.records`;
* from the transport (`hami_plugin.kube.transport`): a timeout on every request and retries with
  backoff (`hami_plugin.kube.retry`), and on request a client-side rate limit
  (`hami_plugin.kube.ratelimit`, `--kube-qps`/`--kube-burst`); every namespace, name and node
  name checked as one path segment and percent-quoted before anything is sent, so no name
  changes the path (`hami_plugin.kube.paths`); errors translated in one place
  (`hami_plugin.kube.errors`);
* an optional time budget shared by every call a thread makes inside `KubeClient.deadline()`,
  so that a caller answering someone who waits (kubelet's Allocate) fails in bounded time
  however many calls it makes and however the API server misbehaves;
* metadata patches sent as JSON merge patch (`application/merge-patch+json`,
  `transport.MERGE_PATCH`): merge patch is what HAMi uses for the node lock, and it gives
  `null` = delete and the `resourceVersion` precondition.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

# Submodules only: `kubernetes.client` and `kubernetes.client.models` load their members lazily,
# and `kubernetes.client.CoreV1Api` (or any other generated API or model) must stay unloaded.
from kubernetes.client.api_client import ApiClient
from kubernetes.client.rest import RESTClientObject

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.config import load_configuration, throttled_refresh
from hami_plugin.kube.errors import Conflict, KubeError
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.listing import CollectionCalls
from hami_plugin.kube.paths import check_selector_value
from hami_plugin.kube.ratelimit import ClientRateLimit, TokenBucket
from hami_plugin.kube.records import (
    LeaseRecord,
    ObjectRef,
    SecretRecord,
    WebhookConfigurationRecord,
    event_body,
    event_patch,
    lease_body,
    lease_record,
    pod_listing,
    secret_body,
    secret_data,
    secret_record,
    webhook_configuration_record,
)
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.kube.transport import JSON, JSON_PATCH, MERGE_PATCH, Request, Transport
from hami_plugin.protocol.objects import NodeInfo, PodInfo, read_node, read_pod

logger = logging.getLogger(__name__)

_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_LEASE = _LEASES + "/{name}"
_SECRETS = "/api/v1/namespaces/{namespace}/secrets"
_SECRET = _SECRETS + "/{name}"
_MUTATING_WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"

_DEFAULT_RETRY = RetryPolicy()


class KubeClient(CollectionCalls):
    """Typed, retried, timed Kubernetes calls over one `kubernetes.client.ApiClient`.

    The client takes ownership of `api_client`: it switches off urllib3's built-in retries when
    the configuration left them at the default (the policy here does the retrying) and closes
    it in `close()`. Safe to share between threads. `clock` times the `deadline()` budgets, the
    watches, the token refreshes and the `rate_limit` (every call waits for its token; None:
    calls go at once), and dates the events (the system clock when None); backoffs and rate
    limit waits are waited out with `sleep`, in real time.
    """

    def __init__(
        self,
        api_client: ApiClient,
        retry: RetryPolicy = _DEFAULT_RETRY,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        rate_limit: ClientRateLimit | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        if api_client.configuration.retries is None:
            api_client.configuration.retries = False
            api_client.rest_client.close()
            api_client.rest_client = RESTClientObject(api_client.configuration)
        hook = api_client.configuration.refresh_api_key_hook
        if hook is not None:
            api_client.configuration.refresh_api_key_hook = throttled_refresh(hook, self._clock)
        self._api_client = api_client
        bucket = TokenBucket(rate_limit, self._clock) if rate_limit is not None else None
        self._transport = Transport(
            api_client, retry, clock=self._clock, sleep=sleep, rng=rng, rate_limit=bucket
        )
        self._unreadable_lock = threading.Lock()
        self._unreadable: dict[str, dict[str, str]] = {}
        """Per node listed: the pods its last list could not read, at the version logged."""

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        retry: RetryPolicy = _DEFAULT_RETRY,
        *,
        clock: Clock | None = None,
        qps: float | None = None,
        burst: int | None = None,
        timeout_seconds: float | None = None,
    ) -> KubeClient:
        """Connect with the kubeconfig given (`--kubeconfig`, `$KUBECONFIG`), else in-cluster.

        `qps` and `burst` (`--kube-qps`, `--kube-burst`; both or neither): the client-side rate
        limit, none without them; `timeout_seconds` (`--kube-timeout`): each attempt's timeout
        instead of `retry`'s. Raises KubeError naming the source tried when none of them gives a
        usable configuration, ValueError for a rate limit or timeout out of range.
        """
        if (qps is None) != (burst is None):
            raise ValueError("KubeClient.from_config: qps and burst go together")
        rate_limit = None if qps is None or burst is None else ClientRateLimit(qps, burst)
        if timeout_seconds is not None:
            retry = dataclasses.replace(retry, timeout_seconds=timeout_seconds)
        configuration = load_configuration(kubeconfig)
        logger.info("Kubernetes API server %s", configuration.host)
        if rate_limit is not None:
            logger.info(
                "client-side rate limit: %g calls a second, %d at once",
                rate_limit.qps,
                rate_limit.burst,
            )
        return cls(ApiClient(configuration), retry, clock=clock, rate_limit=rate_limit)

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

    def deadline(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """Give the calls this thread makes inside the block `seconds` in total.

        Each attempt's timeout is cut to the time left, no retry starts that would end after
        it, and a call started with no time left raises Retryable at once (the message says the
        budget was spent). A nested block sets its own budget for its duration; other threads
        are not affected.
        """
        return self._transport.deadline(seconds)

    # --- namespaces -----------------------------------------------------------------------

    def get_namespace_labels(self, name: str) -> Mapping[str, str]:
        """GET the namespace; its labels (only the string ones). Raises NotFound, Retryable
        or KubeError."""
        request = Request("GET", "/api/v1/namespaces/{name}", {"name": name})
        return self._transport.call(f"get namespace {name}", request, _labels_of)

    # --- nodes ----------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeInfo:
        """GET the node. Raises NotFound, Retryable or KubeError."""
        request = Request("GET", "/api/v1/nodes/{name}", {"name": name})
        return self._transport.call(f"get node {name}", request, read_node)

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> NodeInfo:
        """Merge-patch node annotations (None deletes a key) and return the updated node.

        With `resource_version` the patch only applies to that version of the node, else it
        raises Conflict. Also raises NotFound, Retryable or KubeError.
        """
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        request = Request(
            "PATCH",
            "/api/v1/nodes/{name}",
            {"name": name},
            body={"metadata": metadata},
            content_type=MERGE_PATCH,
        )
        return self._transport.call(f"patch node {name} annotations", request, read_node)

    # --- pods -----------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> PodInfo:
        """GET the pod. Raises NotFound, Retryable or KubeError."""
        request = Request(
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
        )
        return self._transport.call(f"get pod {namespace}/{name}", request, read_pod)

    def list_pods_on_node(self, node_name: str) -> list[PodInfo]:
        """All pods bound to the node, every namespace (field selector `spec.nodeName`).

        A pod that cannot be read (`read_pod`) is left out and logged once per version, as the
        informer does: one bad pod must not hide the node's others from the device plugin.
        Raises InvalidName (a node name no API path or selector can hold), Retryable or
        KubeError.
        """
        selector = f"spec.nodeName={check_selector_value('node name', node_name)}"
        request = Request("GET", "/api/v1/pods", query=(("fieldSelector", selector),))
        listing = self._transport.call(f"list pods on node {node_name}", request, pod_listing)
        with self._unreadable_lock:
            logged = self._unreadable.pop(node_name, {})
            for identity, (version, why) in listing.unreadable.items():
                if logged.get(identity) != version:
                    logger.warning(
                        "list pods on node %s: skipping pod %s at resourceVersion %s: %s",
                        node_name,
                        identity,
                        version,
                        why,
                    )
            if listing.unreadable:
                self._unreadable[node_name] = {
                    identity: version for identity, (version, _) in listing.unreadable.items()
                }
        return listing.pods

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PodInfo:
        """Merge-patch pod annotations and labels (None deletes a key); return the updated pod.

        With `resource_version` the patch only applies to that version of the pod, else it
        raises Conflict. Also raises NotFound, Retryable or KubeError.
        """
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if labels is not None:
            metadata["labels"] = dict(labels)
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        request = Request(
            "PATCH",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
            body={"metadata": metadata},
            content_type=MERGE_PATCH,
        )
        return self._transport.call(f"patch pod {namespace}/{name} metadata", request, read_pod)

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> PodInfo:
        """Merge-patch the pod's `status` through the `pods/<name>/status` subresource (lists
        such as `conditions` are replaced whole); return the updated pod. The kube-scheduler
        stand-in writes `PodScheduled` this way. Raises NotFound, Retryable or KubeError."""
        request = Request(
            "PATCH",
            "/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"namespace": namespace, "name": name},
            body={"status": dict(status)},
            content_type=MERGE_PATCH,
        )
        return self._transport.call(f"patch pod {namespace}/{name} status", request, read_pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """DELETE the pod with default DeleteOptions (its own grace period), as
        kube-scheduler's preemption does (`util.DeletePod`). Raises NotFound, Retryable or
        KubeError."""
        request = Request(
            "DELETE",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
        )
        self._transport.call(f"delete pod {namespace}/{name}", request, _ignore_body)

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
        request = Request(
            "POST",
            "/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {"namespace": namespace, "name": name},
            body={
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
            content_type=JSON,
        )
        try:
            self._transport.call(what, request, _ignore_body)
        except Conflict:
            pod = self.get_pod(namespace, name)
            if pod.node_name != node or (uid and pod.uid != uid):
                raise
            logger.debug("%s: already bound there", what)

    # --- leases ---------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        """GET a coordination.k8s.io/v1 Lease. Raises NotFound, Retryable or KubeError."""
        request = Request("GET", _LEASE, {"namespace": namespace, "name": name})
        return self._transport.call(f"get lease {namespace}/{name}", request, lease_record)

    def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Create the lease (its resource_version is ignored); return it as stored.

        Raises Conflict if it exists already, Retryable or KubeError.
        """
        record = dataclasses.replace(record, resource_version="")
        request = Request(
            "POST",
            _LEASES,
            {"namespace": record.namespace},
            body=lease_body(record),
            content_type=JSON,
        )
        return self._transport.call(
            f"create lease {record.namespace}/{record.name}", request, lease_record
        )

    def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the lease (PUT) if it is still at `record.resource_version`; return it as
        stored, with its new resource_version.

        Raises Conflict when the lease changed since (someone else renewed or took it),
        NotFound, Retryable or KubeError; ValueError for a record without resource_version.
        """
        if not record.resource_version:
            raise ValueError(f"update_lease {record.namespace}/{record.name}: no resource_version")
        request = Request(
            "PUT",
            _LEASE,
            {"namespace": record.namespace, "name": record.name},
            body=lease_body(record),
            content_type=JSON,
        )
        return self._transport.call(
            f"update lease {record.namespace}/{record.name}", request, lease_record
        )

    # --- secrets and webhook configurations (the certificate job) -------------------------

    def get_secret(self, namespace: str, name: str) -> SecretRecord:
        """GET a Secret, its data decoded. Raises NotFound, Retryable or KubeError."""
        request = Request("GET", _SECRET, {"namespace": namespace, "name": name})
        return self._transport.call(f"get secret {namespace}/{name}", request, secret_record)

    def create_secret(self, record: SecretRecord) -> SecretRecord:
        """Create the Secret (its resource_version is ignored); return it as stored.

        Raises Conflict if it exists already, Retryable or KubeError.
        """
        record = dataclasses.replace(record, resource_version="")
        request = Request(
            "POST",
            _SECRETS,
            {"namespace": record.namespace},
            body=secret_body(record),
            content_type=JSON,
        )
        return self._transport.call(
            f"create secret {record.namespace}/{record.name}", request, secret_record
        )

    def patch_secret_data(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes | None],
        resource_version: str | None = None,
    ) -> SecretRecord:
        """Merge-patch the Secret's `data` (None deletes a key; the keys not named, the type
        and the rest of the metadata stay) and return it as stored.

        With `resource_version` the patch only applies to that version, else it raises
        Conflict. Also raises NotFound, Retryable or KubeError.
        """
        metadata: dict[str, Any] = {}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        request = Request(
            "PATCH",
            _SECRET,
            {"namespace": namespace, "name": name},
            body={"metadata": metadata, "data": secret_data(data)},
            content_type=MERGE_PATCH,
        )
        return self._transport.call(f"patch secret {namespace}/{name} data", request, secret_record)

    def get_mutating_webhook_configuration(self, name: str) -> WebhookConfigurationRecord:
        """GET a MutatingWebhookConfiguration's webhook names and caBundles. Raises NotFound,
        Retryable or KubeError."""
        request = Request("GET", _MUTATING_WEBHOOK, {"name": name})
        return self._transport.call(
            f"get mutatingwebhookconfiguration {name}", request, webhook_configuration_record
        )

    def patch_mutating_webhook_ca_bundles(
        self, name: str, webhooks: Sequence[str], ca_bundle: bytes
    ) -> WebhookConfigurationRecord:
        """Set `clientConfig.caBundle` of every webhook to `ca_bundle`; `webhooks` are their
        names in order, as read.

        A JSON patch: for each webhook a `test` of its name at its index, then the caBundle,
        so a list that changed since it was read (reordered, shortened) is refused, never
        patched at the wrong index. Raises NotFound, KubeError (the list changed: read again),
        Retryable.
        """
        encoded = base64.b64encode(ca_bundle).decode("ascii")
        operations: list[dict[str, Any]] = []
        for index, webhook in enumerate(webhooks):
            operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook})
            operations.append(
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
            )
        request = Request(
            "PATCH",
            _MUTATING_WEBHOOK,
            {"name": name},
            body=operations,
            content_type=JSON_PATCH,
        )
        return self._transport.call(
            f"patch mutatingwebhookconfiguration {name} caBundle",
            request,
            webhook_configuration_record,
        )

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
        """Record a core/v1 Event about any object, seen `count` times between the two
        timestamps (each the clock's now when None); return its name, None when it was not
        recorded. Best effort: failures are logged, not raised.

        The event name is `<object>.<hex nanoseconds>` as client-go writes it, so a retry after
        a timeout that had in fact succeeded gets 409 and counts as done.
        """
        kind = ref.kind.lower()
        where = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
        what = f"create event {reason} for {kind} {where}"
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
        name: str = body["metadata"]["name"]
        request = Request(
            "POST",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": body["metadata"]["namespace"]},
            body=body,
            content_type=JSON,
        )
        try:
            self._transport.call(what, request, _ignore_body)
        except Conflict:
            logger.debug("%s: already recorded", what)
        except KubeError as exc:
            logger.warning("event not recorded: %s", exc)
            return None
        return name

    def patch_event(
        self, namespace: str, name: str, count: int, last_timestamp: datetime, message: str
    ) -> None:
        """Count a repeat onto the Event `name`: merge-patch its `count`, `lastTimestamp` and
        `message`, as client-go's recorder does.

        Raises NotFound (the Event expired: create it anew), Retryable or KubeError.
        """
        request = Request(
            "PATCH",
            "/api/v1/namespaces/{namespace}/events/{name}",
            {"namespace": namespace, "name": name},
            body=event_patch(count, last_timestamp, message),
            content_type=MERGE_PATCH,
        )
        self._transport.call(f"patch event {namespace}/{name}", request, _ignore_body)

    def create_pod_event(self, event: PodEvent, component: str = "hami-device-plugin") -> None:
        """Record `event` as a core/v1 Event; best effort, as `create_event`."""
        self.create_event(event.ref(), event.reason, event.message, event.event_type, component)


def _ignore_body(body: dict[str, Any]) -> None:
    return None


def _labels_of(obj: dict[str, Any]) -> dict[str, str]:
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
