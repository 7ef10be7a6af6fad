"""The extender's routes: kube-scheduler's filter and bind, the admission webhook, probes.

Routes (HAMi v2.10 `pkg/scheduler/routes/route.go`, docs/hami-reference.md 3.8):

* `POST /filter`, `POST /bind`: the extender v1 JSON (`hami_plugin.extender.wire`),
  always HTTP 200 with `Error` set on a problem (malformed JSON, a body over the cap, a pod
  missing, "not the leader" on a follower), as HAMi answers;
* `POST /webhook`: the AdmissionReview (`hami_plugin.scheduler.admission_review`), answered on
  every replica (it needs no state); `POST /webhook/gpu-admin` the same for the namespaces
  labelled `hami-plugin.io/gpu-admin=true` (their GPU pods may set HAMi-core's environment);
* `GET /healthz`: 200 while the process serves; `GET /readyz`: 200 once the first pod and node
  lists are in and, with leader election, while this replica leads, else 503 with the reason
  (HAMi always answers 200, so a Service could route to a replica that refuses everything);
  `GET /readyz/informer-sync`: that first check alone (the pod's readiness probe: a follower
  must stay ready, or a rolling update never completes and the webhook loses its replicas).

`ExtenderApp` is bytes in, `HttpReply` out, independent of the socket; the listeners
(`hami_plugin.httpserve.server`) frame HTTP and call it. One listener serves every route, or,
with `--webhook-bind`, the extender listener serves `EXTENDER_ROUTES` (with `--client-ca-file`
only to clients holding a certificate from that CA: kube-scheduler) and the webhook listener
`WEBHOOK_ROUTES` (the API server and kubelet's probes present no client certificate); a route a
listener does not serve is a 404 there (`ExtenderApp.only`). Anything unexpected is one log line
with its traceback and an HTTP 500, never a dead server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Set

from hami_plugin.extender.bind import Binder
from hami_plugin.extender.filtering import FilterAnswer
from hami_plugin.extender.state import SchedulerState
from hami_plugin.extender.wire import (
    MAX_BODY_BYTES,
    ExtenderArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionResult,
    HttpReply,
    MetaVictims,
    admission_reply,
    binding_reply,
    decode_binding_request,
    decode_filter_request,
    decode_preemption_request,
    filter_reply,
    preemption_reply,
)
from hami_plugin.httpserve.routes import TEXT_CONTENT_TYPE
from hami_plugin.kube.events import EventSink
from hami_plugin.protocol.objects import ObjectError, read_pod
from hami_plugin.scheduler.admission_review import WEBHOOK_MAX_BODY_BYTES, review_admission_body
from hami_plugin.scheduler.webhook import WebhookSettings

__all__ = [
    "EXTENDER_ROUTES",
    "NOT_LEADER",
    "WEBHOOK_ADMIN_PATH",
    "WEBHOOK_ROUTES",
    "ExtenderApp",
    "RouteSubset",
]

NOT_LEADER = "not the leader"
_SYNC_WAIT_SECONDS = 10.0
_INFORMER_SYNC = "/readyz/informer-sync"
_NOT_SYNCED = "waiting for the first pod and node lists"
_PROBES = frozenset({"/healthz", "/readyz", _INFORMER_SYNC})
EXTENDER_ROUTES = frozenset({"/filter", "/bind", "/preempt"}) | _PROBES
"""What the extender listener serves when the webhook has a listener of its own."""
WEBHOOK_ADMIN_PATH = "/webhook/gpu-admin"
"""The webhook for namespaces labelled `hami-plugin.io/gpu-admin=true` (the webhook
configuration's second entry): their GPU pods may set HAMi-core's control environment."""
WEBHOOK_ROUTES = frozenset({"/webhook", WEBHOOK_ADMIN_PATH}) | _PROBES
"""What the webhook listener serves: the API server's calls and kubelet's probes."""
_NOT_FOUND = "404 page not found"


def text_reply(status: int, message: str) -> HttpReply:
    """A plain-text answer, one line."""
    return HttpReply(status, (message + "\n").encode(), TEXT_CONTENT_TYPE)


class ExtenderApp:
    """The routes, independent of the socket: bytes in, `HttpReply` out. Thread-safe.

    `is_leader` says whether this replica serves filter and bind now; `readiness` returns None
    when ready, else why not.
    """

    def __init__(
        self,
        state: SchedulerState,
        binder: Binder,
        webhook: WebhookSettings,
        events: EventSink,
        is_leader: Callable[[], bool],
        readiness: Callable[[], str | None],
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        sync_wait_seconds: float = _SYNC_WAIT_SECONDS,
    ) -> None:
        self._state = state
        self._binder = binder
        self._webhook = webhook
        self._admin_webhook = dataclasses.replace(webhook, control_env_allowed=True)
        self._events = events
        self._is_leader = is_leader
        self._readiness = readiness
        self.max_body_bytes = max_body_bytes
        self._sync_wait = sync_wait_seconds

    def body_limit(self, path: str) -> int:
        """How many body bytes a route reads at most."""
        webhook = path in ("/webhook", WEBHOOK_ADMIN_PATH)
        return WEBHOOK_MAX_BODY_BYTES if webhook else self.max_body_bytes

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> HttpReply:
        """Route one request."""
        routes: dict[str, tuple[str, Callable[[], HttpReply]]] = {
            "/filter": ("POST", lambda: self.filter(body)),
            "/bind": ("POST", lambda: self.bind(body)),
            "/preempt": ("POST", lambda: self.preempt(body)),
            "/webhook": ("POST", lambda: self.webhook(body, content_type)),
            WEBHOOK_ADMIN_PATH: ("POST", lambda: self.webhook(body, content_type, admin=True)),
            "/healthz": ("GET", lambda: text_reply(200, "ok")),
            "/readyz": ("GET", self.readyz),
            _INFORMER_SYNC: ("GET", self.informer_sync),
        }
        route = routes.get(path)
        if route is None:
            return text_reply(404, _NOT_FOUND)
        if method != route[0] and not (method == "HEAD" and route[0] == "GET"):
            return text_reply(405, "Method Not Allowed")
        return route[1]()

    def only(self, paths: Set[str]) -> RouteSubset:
        """These routes alone, for a listener that serves no others."""
        return RouteSubset(self, paths)

    def readyz(self) -> HttpReply:
        why = self._readiness()
        return text_reply(200, "ok") if why is None else text_reply(503, why)

    def informer_sync(self) -> HttpReply:
        """200 once the first pod and node lists are in, leader or not."""
        return text_reply(200, "ok") if self._state.synced else text_reply(503, _NOT_SYNCED)

    def filter(self, body: bytes) -> HttpReply:
        clock = self._state.clock
        started = clock.monotonic()
        decoded = decode_filter_request(body, max_bytes=self.max_body_bytes)
        if isinstance(decoded, HttpReply):
            self._state.observer.filter_done(clock.monotonic() - started, "error")
            return decoded
        answer = self._filter(decoded)
        for event in answer.events:
            self._events.record(event)
        self._state.observer.filter_done(clock.monotonic() - started, answer.outcome)
        return filter_reply(
            ExtenderFilterResult(
                nodes=tuple(answer.nodes) if answer.nodes is not None else None,
                node_names=tuple(answer.node_names) if answer.node_names is not None else None,
                failed_nodes=answer.failed_nodes,
                error=answer.error,
            )
        )

    def _filter(self, args: ExtenderArgs) -> FilterAnswer:
        if not self._is_leader():
            return FilterAnswer(error=NOT_LEADER, outcome="error")
        # HAMi waits for its first registration pass (route.go: WaitForCacheSync)
        if not self._state.synced and not self._state.wait_for_lists(self._sync_wait):
            return FilterAnswer(error="scheduler cache not synced yet", outcome="error")
        try:
            pod = read_pod(args.pod)
        except ObjectError as error:
            return FilterAnswer(error=f"invalid pod: {error}", outcome="error")
        return self._state.filter(pod, args.node_names, args.nodes)

    def bind(self, body: bytes) -> HttpReply:
        decoded = decode_binding_request(body, max_bytes=self.max_body_bytes)
        if isinstance(decoded, HttpReply):
            return decoded
        if not self._is_leader():
            error = NOT_LEADER
        else:
            error = self._binder.bind(
                decoded.pod_namespace, decoded.pod_name, decoded.pod_uid, decoded.node
            )
        return binding_reply(ExtenderBindingResult(error=error))

    def preempt(self, body: bytes) -> HttpReply:
        """kube-scheduler's preempt verb: its candidates with the victims the GPUs need added,
        a node where the pod's GPUs cannot be freed left out (docs/design.md 11.3)."""
        decoded = decode_preemption_request(body, max_bytes=self.max_body_bytes)
        if isinstance(decoded, HttpReply):
            return decoded
        if not self._is_leader():
            return text_reply(503, NOT_LEADER)
        try:
            pod = read_pod(decoded.pod)
        except ObjectError as error:
            return text_reply(400, f"invalid pod: {error}")
        proposed = {
            node: (victims.uids, victims.num_pdb_violations)
            for node, victims in decoded.victims.items()
        }
        refined = self._state.refine_preemption(pod, proposed)
        if refined is None:
            return preemption_reply(ExtenderPreemptionResult(dict(decoded.victims)))
        answer = {
            node: MetaVictims(victims.uids, victims.pdb_violations)
            for node, victims in refined.items()
        }
        return preemption_reply(ExtenderPreemptionResult(answer))

    def webhook(self, body: bytes, content_type: str, *, admin: bool = False) -> HttpReply:
        settings = self._admin_webhook if admin else self._webhook
        outcome = review_admission_body(body, settings, content_type=content_type)
        return admission_reply(outcome)


class RouteSubset:
    """Some of an `ExtenderApp`'s routes (a `Routes` for one listener); any other path is a
    404 there, its body read no further than a filter body would be."""

    def __init__(self, app: ExtenderApp, paths: Set[str]) -> None:
        self._app = app
        self.paths = frozenset(paths)

    def body_limit(self, path: str) -> int:
        return self._app.body_limit(path) if path in self.paths else self._app.max_body_bytes

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> HttpReply:
        if path not in self.paths:
            return text_reply(404, _NOT_FOUND)
        return self._app.handle(method, path, body, content_type)
