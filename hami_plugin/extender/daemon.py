"""`hami scheduler`: the kube-scheduler extender daemon, wired together.

config -> KubeClient -> SchedulerState fed by pod, node and ResourceQuota informers -> Binder,
Recovery, EventRecorder -> BoundedServer (filter, bind, webhook, probes) [+ metrics, + leader
election].

`SchedulerDaemon` runs in-process too (tests, benchmarks): inject the `KubeClient`, a clock, an
observer or an elector factory; `start()` returns once the HTTP port is bound (`port`), `ready`
is set once the first lists are in, `stop()` shuts down (thread-safe, idempotent), `run()` is
start + wait + shutdown. SIGTERM/SIGINT in the CLI (`extender.command`): stop accepting, let
filter/bind calls in progress finish (a bind waiting for a lock gives up and rolls back),
release what this process holds (a lock taken by a bind in progress, the Lease), exit 0.

Leader election: with `--leader-elect`, `hami_plugin.extender.leader.LeaderElector` (a
`Elector`); without it this replica always leads. Only the leader answers filter/bind, runs the
recovery loop and writes handshakes; every replica keeps its state warm from the watches.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.config.keys import BookingKeyFile, KeyRole
from hami_plugin.extender.bind import Binder
from hami_plugin.extender.events import EventRecorder
from hami_plugin.extender.http import EXTENDER_ROUTES, WEBHOOK_ROUTES, ExtenderApp
from hami_plugin.extender.leader import ElectionConfig, LeaderElector
from hami_plugin.extender.metrics import SchedulerMetrics
from hami_plugin.extender.observer import SchedulerObserver
from hami_plugin.extender.preemption import Evictor
from hami_plugin.extender.recovery import Recovery
from hami_plugin.extender.requeue import Requeuer
from hami_plugin.extender.settings import (
    SchedulerConfig,
)
from hami_plugin.extender.state import SchedulerState
from hami_plugin.extender.tls import TlsFiles
from hami_plugin.extender.watches import make_watches
from hami_plugin.httpserve.probes import DISABLED, Liveness, probe_server
from hami_plugin.httpserve.server import BoundedServer, ServerLimits
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError
from hami_plugin.kube.informer import Informer
from hami_plugin.lifecycle import StopSignal
from hami_plugin.metrics.server import MetricsServerError
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.usage import NodeUsage
from hami_plugin.scheduler.webhook import QuotaCheck

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "WEBHOOK_LIMITS",
    "Elector",
    "ElectorFactory",
    "SchedulerDaemon",
    "StartError",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILURE = 1


class StartError(Exception):
    """The daemon cannot start (an address in use, no Kubernetes configuration...)."""


class Elector(Protocol):
    """Leader election as the daemon uses it (`hami_plugin.extender.leader.LeaderElector`)."""

    def is_leader(self) -> bool:
        """Whether this replica leads now (thread-safe)."""

    def run(self, stop: threading.Event) -> None:
        """Campaign and lead until `stop` is set, then release; blocking."""


ElectorFactory = Callable[["KubeClient", Callable[[], None], Callable[[], None]], Elector]
"""(client, on_started_leading, on_stopped_leading) -> an Elector."""


class _View:
    """The `SchedulerView` the metrics read."""

    def __init__(self, daemon: SchedulerDaemon) -> None:
        self._daemon = daemon

    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        return self._daemon.state.usage_snapshot()

    def is_leader(self) -> bool:
        return self._daemon.is_leader()


WEBHOOK_LIMITS = ServerLimits(max_connections=256, max_per_client=192)
"""The webhook's listener: the API server (or the konnectivity agent its calls go through) is
one source address and opens a connection per concurrent admission call, so a burst of pod
creations from a Job or ReplicaSet needs more than `ServerLimits()`' 64 per client: a call
over the cap is reset, the webhook fails open, and the fail-closed policy `hami-gpu-pods` then
refuses the unmutated pod. 64 slots stay for everyone else."""


class SchedulerDaemon:
    """The running scheduler extender; see the module docstring.

    `kube`: the API client (owned by the caller; default: from `config.kubeconfig`, closed at
    stop). `observer`: where filter/bind/recovery events go (default: the Prometheus metrics
    when `config.metrics_bind_address` is not "0", else nothing). `elector_factory`: builds the
    leader election when `config.leader_elect` (default: the Lease elector). `clock`: the time
    of bookings, binds and recovery; `election_clock`: the leader election's (default: `clock`),
    apart so that a test can move the booking time on without the lease expiring under it.
    `listener_limits`: the extender's and the webhook's connection bounds (default
    `ServerLimits()` and `WEBHOOK_LIMITS`).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        kube: KubeClient | None = None,
        clock: Clock | None = None,
        election_clock: Clock | None = None,
        observer: SchedulerObserver | None = None,
        elector_factory: ElectorFactory | None = None,
        recovery_interval_seconds: float = 5.0,
        watch_timeout_seconds: int = 300,
        listener_limits: ServerLimits | None = None,
    ) -> None:
        self.config = config
        self._limits = listener_limits or ServerLimits()
        self._webhook_limits = listener_limits or WEBHOOK_LIMITS
        self._kube = kube
        self._owned_kube: KubeClient | None = None
        self._observer = observer
        self._elector_factory = elector_factory
        self._recovery_interval = recovery_interval_seconds
        self._watch_timeout = watch_timeout_seconds
        self._election_clock = election_clock
        clock = clock or SystemClock()
        # raises ConfigError when the file is no longer usable (resolve_config read it)
        keys = (
            BookingKeyFile(
                config.booking_key_file,
                role=KeyRole.SIGN,
                legacy_path=config.legacy_booking_key_file,
                clock=clock,
            )
            if config.booking_key_file
            else None
        )
        self.state: SchedulerState = SchedulerState(
            BookSettings(
                scheduler=config.settings,
                booking_ttl_seconds=config.filter_booking_ttl_seconds,
                burst_look_ahead=config.burst_look_ahead,
                node_lock_timeout=config.node_lock_timeout,
                node_selector=dict(config.node_label_selector),
                preemption=config.preemption,
            ),
            clock=clock,
            booking_keys=keys.keys if keys is not None else None,
        )
        if keys is None:
            logger.warning(
                "no --booking-key-file: pod annotations are trusted as HAMi does; any pod "
                "author can book GPUs"
            )
        self._stop = threading.Event()
        self.stop_signal = StopSignal(self.stop, self._stop)
        """What `run`'s main thread waits on: `stop()`, or SIGTERM/SIGINT once installed."""
        self._stopped = threading.Event()
        self._start_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._server: BoundedServer | None = None
        self._webhook_server: BoundedServer | None = None
        self._probe_server: BoundedServer | None = None
        self.liveness = Liveness()
        """What `/healthz` on the probe listener checks: every listener's accept loop."""
        self._events: EventRecorder | None = None
        self._elector: Elector | None = None
        self._metrics_server: Any = None
        self.pod_informer: Informer[Any] | None = None
        self.node_informer: Informer[Any] | None = None
        self.quota_informer: Informer[Any] | None = None
        self.budget_informer: Informer[Any] | None = None
        self.started = threading.Event()
        """Set once the HTTP port is bound (`port`, `url`)."""
        self.ready = threading.Event()
        """Set once the first pod and node lists are in (this replica may still be a follower)."""

    # --- facts ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The HTTP port (the one the kernel picked for port 0). Raises before `start()`."""
        if self._server is None:
            raise RuntimeError("the scheduler daemon is not started")
        return self._server.port

    @property
    def webhook_port(self) -> int:
        """The webhook listener's port (`--webhook-bind`). Raises before `start()` or without
        a webhook listener."""
        if self._webhook_server is None:
            raise RuntimeError("the scheduler daemon serves no webhook listener")
        return self._webhook_server.port

    @property
    def metrics_port(self) -> int:
        """The `/metrics` port (`--metrics-bind-address`). Raises without one."""
        if self._metrics_server is None:
            raise RuntimeError("the scheduler daemon serves no metrics")
        return int(self._metrics_server.port)

    @property
    def probe_port(self) -> int:
        """The probe listener's port (`--probe-bind-address`). Raises without one."""
        if self._probe_server is None:
            raise RuntimeError("the scheduler daemon serves no probe listener")
        return self._probe_server.port

    @property
    def url(self) -> str:
        """`http(s)://127.0.0.1:<port>` (or the bound host)."""
        host = self.config.http_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://{host}:{self.port}"

    def is_leader(self) -> bool:
        elector = self._elector
        return True if elector is None else elector.is_leader()

    def readiness(self) -> str | None:
        """None when ready to serve, else why not (GET /readyz)."""
        if self._stop.is_set():
            return "shutting down"
        if not self.state.synced:
            return "waiting for the first pod and node lists"
        if not self.is_leader():
            return "not the leader"
        return None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the port and start every thread; returns at once. Raises OSError when the
        address cannot be bound, KubeError without a usable Kubernetes configuration, StartError
        when the metrics endpoint cannot start."""
        with self._start_lock:
            if self._server is not None:
                return
            kube = self._kube_client()
            self._start_metrics()
            events = self._events = EventRecorder(
                kube, self.config.scheduler_name, clock=self.state.clock
            )
            app = self._app(kube, events)
            self._server, self._webhook_server = self._http_servers(app)
            self._probe_server = self._probe_listener(app)
            self._make_informers(kube)
            recovery = self._recovery(kube, events)
            if self.config.leader_elect:
                self._elector = self._make_elector(kube)
            events.start()
            self._spawn_loops(kube, recovery)
            self._serve_http()
            self.started.set()

    # --- what `start` needs, one builder each ---------------------------------------------

    def _kube_client(self) -> KubeClient:
        """The client given, or one from the kubeconfig (owned: closed at shutdown)."""
        if self._kube is None:
            config = self.config
            self._kube = self._owned_kube = KubeClient.from_config(
                config.kubeconfig,
                clock=self.state.clock,
                qps=config.kube_qps,
                burst=config.kube_burst,
                timeout_seconds=config.kube_timeout_seconds,
            )
        return self._kube

    def _app(self, kube: KubeClient, events: EventRecorder) -> ExtenderApp:
        """Filter, bind, the webhook and the probes, as routes."""
        config = self.config
        binder = Binder(
            self.state,
            kube,
            events,
            node_lock_timeout=config.node_lock_timeout,
            retry_timeout_seconds=config.node_lock_retry_timeout_seconds,
            stop=self._stop,
        )
        return ExtenderApp(
            self.state,
            binder,
            # the webhook denies a pod beyond its namespace's GPU quota as HAMi's does
            replace(config.webhook, quota=QuotaCheck(self.state.settings, self.state.fits_quota)),
            events,
            self.is_leader,
            self.readiness,
            max_body_bytes=config.max_body_bytes,
        )

    def _http_servers(self, app: ExtenderApp) -> tuple[BoundedServer, BoundedServer | None]:
        """The extender's listener and, with `--webhook-bind`, the webhook's own (bound when
        started)."""
        config, clock = self.config, self.state.clock
        tls = None
        if config.tls:
            tls = TlsFiles(
                config.cert_file, config.key_file, client_ca_file=config.client_ca_file, clock=clock
            )
        if config.webhook_host is None:
            server = BoundedServer(
                config.http_host,
                config.http_port,
                app,
                tls=tls,
                limits=self._webhook_limits,  # the API server's calls come here too
                name="extender-http",
            )
            self.liveness.add(server.problem)
            return server, None
        # the API server and kubelet present no client certificate: the webhook and the probes
        # get a listener of their own, without the client CA
        extender = BoundedServer(
            config.http_host,
            config.http_port,
            app.only(EXTENDER_ROUTES),
            tls=tls,
            limits=self._limits,
            name="extender-http",
        )
        webhook = BoundedServer(
            config.webhook_host,
            config.webhook_port,
            app.only(WEBHOOK_ROUTES),
            tls=TlsFiles(config.cert_file, config.key_file, clock=clock),
            limits=self._webhook_limits,
            name="webhook-http",
        )
        self.liveness.add(extender.problem)
        self.liveness.add(webhook.problem)
        return extender, webhook

    def _probe_listener(self, app: ExtenderApp) -> BoundedServer | None:
        """kubelet's probes on a plain-HTTP listener of their own (`--probe-bind-address`),
        which strangers filling the webhook's or the extender's slots cannot starve; None when
        off. `/healthz` there fails when any listener's accept loop ended."""
        try:
            return probe_server(
                self.config.probe_bind_address,
                self.liveness,
                {"/readyz": app.readyz, "/readyz/informer-sync": app.informer_sync},
            )
        except ValueError as error:
            raise StartError(f"--probe-bind-address: {error}") from error

    def _make_informers(self, kube: KubeClient) -> None:
        """The pod, node, ResourceQuota and PodDisruptionBudget watches that feed the state."""
        watches = make_watches(
            kube, self.state, self.config.node_label_selector, self._watch_timeout
        )
        self.pod_informer, self.node_informer = watches.pods, watches.nodes
        self.quota_informer, self.budget_informer = watches.quotas, watches.budgets

    def _evictor(self, kube: KubeClient) -> Evictor:
        assert self._events is not None
        return Evictor(self.state, kube, self._events, self.config.scheduler_name)

    def _recovery(self, kube: KubeClient, events: EventRecorder) -> Recovery:
        """The loop that fails pods stuck allocating and frees stale node locks."""
        return Recovery(
            self.state,
            kube,
            events,
            self.is_leader,
            allocation_timeout_seconds=self.config.allocation_timeout_seconds,
            node_lock_timeout=self.config.node_lock_timeout,
            interval_seconds=self._recovery_interval,
            watch_failed_at=self._pod_watch_failed_at,
        )

    def _spawn_loops(self, kube: KubeClient, recovery: Recovery) -> None:
        """The watches, the recovery and requeue loops, readiness and the election."""
        assert self.pod_informer and self.node_informer and self.quota_informer
        assert self.budget_informer is not None
        self.state.expect_quota_list()  # ready once the quota list is in too
        self._spawn("informer-pods", self.pod_informer.run, self._stop)
        self._spawn("informer-nodes", self.node_informer.run, self._stop)
        self._spawn("informer-resourcequotas", self.quota_informer.run, self._stop)
        self._spawn("recovery", recovery.run, self._stop)
        if self.config.preemption:
            self._spawn("informer-poddisruptionbudgets", self.budget_informer.run, self._stop)
            self._spawn("preemption", self._evictor(kube).run, self._stop)
        if self.config.requeue_qps > 0:
            self._spawn("requeue", self._make_requeuer(kube).run, self._stop)
        self._spawn("ready", self._watch_ready)
        if self._elector is not None:
            self._spawn("leader-election", self._campaign, self._elector)

    def _serve_http(self) -> None:
        """Bind and serve the listeners; one log line each."""
        config = self.config
        assert self._server is not None
        self._server.start()
        logger.info(
            "hami scheduler serving on %s (%s%s)",
            self.url,
            "leader election on" if config.leader_elect else "always leader",
            ", client certificates required" if config.client_ca_file else "",
        )
        if self._webhook_server is not None:
            self._webhook_server.start()
            logger.info(
                "webhook and probes on https://%s:%d", config.webhook_host, self.webhook_port
            )
        if self._probe_server is not None:
            self._probe_server.start()
            logger.info("probes on http://%s", config.probe_bind_address)

    def _pod_watch_failed_at(self) -> float | None:
        informer = self.pod_informer
        return None if informer is None else informer.last_failure

    def _start_metrics(self) -> None:
        if self._observer is not None:
            self.state.attach_observer(self._observer)
            return
        if self.config.metrics_bind_address.strip() == DISABLED:
            return
        metrics = SchedulerMetrics(
            _View(self), clock=self.state.clock, quotas=self.state.quota_entries
        )
        try:
            self._metrics_server = metrics.serve(self.config.metrics_bind_address)
        except MetricsServerError as error:
            raise StartError(f"metrics endpoint: {error}") from error
        if self._metrics_server is not None:
            self.liveness.add(self._metrics_server.problem)
        self.state.attach_observer(metrics)

    def _make_elector(self, kube: KubeClient) -> Elector:
        if self._elector_factory is not None:
            return self._elector_factory(kube, self._started_leading, self._stopped_leading)
        config = self.config
        try:
            election = ElectionConfig.from_flags(
                name=config.leader_elect_resource_name,
                namespace=config.leader_elect_resource_namespace,
                pod_namespace=config.pod_namespace,
                pod_name=config.pod_name,
                lease_duration_seconds=config.leader_elect_lease_duration_seconds,
                renew_deadline_seconds=config.leader_elect_renew_deadline_seconds,
                retry_period_seconds=config.leader_elect_retry_period_seconds,
            )
        except ValueError as error:
            raise StartError(f"leader election: {error}") from error
        return LeaderElector(
            kube,
            election,
            on_started_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
            clock=self._election_clock or self.state.clock,
        )

    def _make_requeuer(self, kube: KubeClient) -> Requeuer:
        """The loop that asks kube-scheduler to retry the GPU pods it parked while this replica
        could not answer (`hami_plugin.extender.requeue`)."""
        informer = self.pod_informer
        assert informer is not None
        state = self.state
        return Requeuer(
            kube,
            informer.items,
            lambda: self.readiness() is None,
            lambda pod: state.booking_phase(pod.namespace, pod.name) is not None,
            scheduler_name=self.config.scheduler_name,
            settings=self.config.settings,
            clock=state.clock,
            qps=self.config.requeue_qps,
            window_seconds=self.config.requeue_window_seconds,
        )

    def _started_leading(self) -> None:
        logger.info("this replica leads now")
        self.state.observer.leader_changed(True)
        self.state.request_recovery()  # run the recovery pass at once

    def _stopped_leading(self) -> None:
        logger.info("this replica stopped leading")
        self.state.observer.leader_changed(False)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _campaign(self, elector: Elector) -> None:
        """Run the election once the first lists are in. A replica that cannot answer yet must
        not hold the Lease: a restarted leader would take its own back at once (its identity
        is its pod's name) while the synced follower waits out the lease duration."""
        while not self.ready.wait(0.2):
            if self._stop.is_set():
                return
        elector.run(self._stop)

    def _watch_ready(self) -> None:
        while not self.state.wait_synced(0.2):
            if self._stop.is_set():
                return
        self.ready.set()
        logger.info("first lists in: %d nodes registered, %d pods tracked", *self.state.counts())

    def stop(self) -> None:
        """Ask the daemon to stop (thread-safe, idempotent); `run()` returns after shutdown."""
        self._stop.set()
        self.state.wake_waiters()  # binds waiting for a lock or an in-flight pod give up

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop and wait until everything is down: HTTP (requests in progress finish), the
        loops, the events queue, the Lease released, the owned client closed."""
        self.stop()
        with self._start_lock:
            if self._stopped.is_set():
                return
            drain = (
                timeout if timeout is not None else self.config.node_lock_retry_timeout_seconds + 5
            )
            for listener in (self._server, self._webhook_server, self._probe_server):
                if listener is not None:
                    listener.stop(drain)
            for thread in self._threads:
                thread.join(drain)
                if thread.is_alive():
                    logger.warning("thread %s still running at shutdown", thread.name)
            if self._events is not None:
                self._events.stop()
            if self._metrics_server is not None:
                self._metrics_server.stop()
            if self._owned_kube is not None:
                self._owned_kube.close()
            self._stopped.set()
            logger.info("hami scheduler stopped")

    def run(self) -> int:
        """Start, serve until `stop()`, shut down. Returns the exit status."""
        try:
            self.start()
        except (OSError, KubeError, StartError) as error:
            logger.error("cannot start: %s", error)
            self.shutdown(5)
            return EXIT_FAILURE
        self.stop_signal.wait(math.inf)
        self.shutdown()
        return EXIT_OK
