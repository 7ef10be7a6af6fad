"""An HTTP test double of the Kubernetes API server, for the real `kubernetes` client.

Serves a slice of the API over real HTTP/1.1 on 127.0.0.1 (random port), from a
`ThreadingHTTPServer` in a background thread: Nodes, Namespaces, Pods, Events, Secrets and
ResourceQuotas (core/v1), Leases (coordination.k8s.io/v1), MutatingWebhookConfigurations
(admissionregistration.k8s.io/v1), PodDisruptionBudgets (policy/v1, with a `status`
subresource; no disruption controller: a test writes their status) and PriorityClasses
(scheduling.k8s.io/v1, cluster-scoped) in memory. No discovery documents are served.
`python -m hami_plugin.testing.apiserver` serves it in a process of its own.

What it implements, as the real API server does it, module by module:
* `store`: one cluster-wide `resourceVersion` counter bumped on every write, and every write
  recorded as one change at its new version in a history ring buffer; Pods indexed by
  `spec.nodeName`; `limit` and `continue` pages served from a snapshot taken by the first page
  (as etcd serves them at the list's revision), a token older than the history answering 410;
* `selectors`: `fieldSelector` (`=`, `==`, `!=` on the fields listed in `FIELD_SELECTORS`) and
  `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`), on lists and watches alike;
* `routes`: GET one object, LIST (list bodies with `kind`, `apiVersion` and
  `metadata.resourceVersion`), POST (create; `generateName` works; 409 AlreadyExists), PUT
  (replace), DELETE (`deletion`); a PATCH or PUT that carries a `metadata.resourceVersion`
  that is not the current one answers 409 Conflict (a Lease PUT is how leader election takes
  and renews a lease); `POST pods/<name>/binding` sets `spec.nodeName` and the PodScheduled
  condition and merges the Binding's annotations (409 if the pod is already bound or
  `metadata.uid` names another pod, 400 if the Binding's name is not the pod's); the `status`
  subresource of Pods and PodDisruptionBudgets changes `status` only; an update never removes
  or changes a `deletionTimestamp` (k8s.io/apiserver `registry/rest/update.go`
  `BeforeUpdate`);
* `deletion`: DELETE with `metav1.DeleteOptions` (body, else the `gracePeriodSeconds` query),
  409 for a failed `uid`/`resourceVersion` precondition, and a Pod deleted gracefully: marked
  with `deletionTimestamp` and `deletionGracePeriodSeconds` (MODIFIED), removed (DELETED) at
  once when the grace period is 0 (unbound or finished pod), else by a later DELETE that
  shortens it to 0 (`FakeApiServer.finish_termination`, kubelet's) (k8s.io/apiserver
  `registry/rest/delete.go` `BeforeDelete`, `registry/generic/registry/store.go`
  `Store.Delete`; k8s.io/kubernetes `registry/core/pod/strategy.go` `CheckGracefulDelete`);
* `priority`: the Priority admission plugin on Pods and PriorityClasses written over HTTP
  (`spec.priority` and `spec.preemptionPolicy` from `spec.priorityClassName` or the
  globalDefault class, 403 for an unknown class or a mismatched priority; one globalDefault)
  (k8s.io/kubernetes `plugin/pkg/admission/priority/admission.go` `admitPod`);
* `patches`: merge, strategic merge (lists tagged `patchStrategy:"merge"` merged by their
  merge key, e.g. `status.conditions` by `type`; `$patch` and `$setElementOrder` directives)
  and JSON patch; other types answer 415;
* `validation`: the API server's checks that callers depend on: a Secret's base64 `data`,
  `stringData` folded in, its `type` defaulted and immutable, a TLS Secret's keys; a webhook
  configuration's names and base64 `caBundle`;
* `watch`: WATCH (`?watch=true`) of every collection, cluster-wide or in a namespace, from a
  `resourceVersion` (unset or "0": the current objects first, as ADDED) replayed from the
  history, a version older than it answering HTTP 200 and one ERROR event carrying a 410
  `Expired` Status, as the watch cache does; an object that stops matching the selectors is
  sent as DELETED, one that starts matching as ADDED; BOOKMARKs when allowed, `timeoutSeconds`;
* `http`: the server, the chunked newline-delimited JSON watch streams, the injected faults;
* `status`: errors as `metav1.Status` bodies with the API server's reasons and messages.

Test controls (`server.FakeApiServer`): `inject_fault` (next K matching requests, watches
included, answer status S, a raw body, hang for T seconds, or drop the connection),
`drop_watches` (cut every open watch stream mid-flight), `expire_history` (the next watch from
an older version gets 410), `requests` (a log of every request), `watch_count`, and helpers to
add, get, update and delete objects as plain dicts (writes through the helpers emit watch
events too, skip admission, and `delete_pod` removes a pod at once), `finish_termination`
(kubelet's last DELETE of a terminating pod) and `events_about` (the core/v1 Events whose
`involvedObject` is a given object). All thread-safe. `objects` builds the Nodes, Pods and
containers to store; `client` points the `kubernetes` client (or a kubeconfig) at the double.
"""

from hami_plugin.testing.apiserver.objects import JsonObject, make_container, make_node, make_pod
from hami_plugin.testing.apiserver.patches import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    json_patch,
    merge_patch,
)
from hami_plugin.testing.apiserver.request import Fault, RecordedRequest
from hami_plugin.testing.apiserver.server import FakeApiServer
from hami_plugin.testing.apiserver.status import ApiError, status_body

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ApiError",
    "FakeApiServer",
    "Fault",
    "JsonObject",
    "RecordedRequest",
    "json_patch",
    "make_container",
    "make_node",
    "make_pod",
    "merge_patch",
    "status_body",
]
