"""Leader election over a `coordination.k8s.io/v1` Lease, with client-go's algorithm.

With `--leader-elect` every `hami scheduler` replica keeps its ledger warm from the watches,
but only the replica holding the Lease answers filter and bind, recovers stuck allocations and
is ready. The rules are those of client-go's `tools/leaderelection` (what kube-scheduler runs),
with its defaults:

* lease duration 15 s, renew deadline 10 s, retry period 2 s; a leader renews every retry
  period;
* a lease may be taken when it does not exist, has no holder, is already ours, or has not
  changed for its `leaseDurationSeconds` as measured on OUR clock since we last saw it change
  (client-go's observedTime rule: the holder's `renewTime` is never compared with our clock, so
  clock skew between replicas does not matter);
* every write carries the resourceVersion read (optimistic concurrency): a Conflict is a lost
  race; a takeover increments `leaseTransitions`, a renewal keeps it and `acquireTime`;
* a clean stop releases the lease as client-go's ReleaseOnCancel does (`holderIdentity`
  emptied, `leaseDurationSeconds` 1), so another replica takes over on its next try instead of
  after a lease duration.

Deliberate differences, each on the safe side:

* when a candidate reads the lease (the rule for taking it stays client-go's: faster, no less
  safe): every retry period x (0.5, 1], and once more the moment the lease it observed expires
  on our clock (client-go reads every retry period x [1, 2.2), JitterFactor 1.2, and not at
  expiry). A renewal is thus seen at most one retry period after it was written, so a lease
  whose holder died is taken at most one retry period after it would have expired (client-go:
  up to 4.4 retry periods), and a released one within one retry period (client-go: 2.2). The
  price is a read every 1.5 s on average per candidate instead of every 3.2 s;
* the renew deadline counts from the moment the last successful renewal was *sent* (client-go
  counts from the start of the renewal round, up to a retry period later), and `is_leader()`
  itself turns False at that moment, even while the election thread is stuck in a call. Other
  replicas measure the lease duration from when they saw that renewal, which is later, so a
  leader stops acting as one at least lease duration - renew deadline (5 s) before anyone
  else can take the lease;
* a leader that reads a lease held by another identity steps down at once;
* on a clean stop the leader first stops leading (callback), then releases the lease, so two
  replicas never act as leader at once (client-go releases first);
* a replica that lost the lease campaigns again (kube-scheduler exits instead).

While `POD_NAME` and `POD_NAMESPACE` are set, the replica labels its own pod
`hami.io/scheduler-role=leader|follower`, and a new leader relabels any other pod still marked
leader as follower, as HAMi's `updateSchedulerLabel` does (v2.10 pkg/scheduler/scheduler.go;
the chart's Service selects `hami.io/scheduler-role: leader`). Labels are written from their own
thread: a slow API call there never delays a renewal.

HAMi itself runs no election in the extender: it watches the Lease that the kube-scheduler next
to it holds (chart: `--leader-elect-resource-name=<schedulerName>`, i.e. `hami-scheduler`) and
counts itself leader when the holder's identity starts with its hostname
(v2.10 pkg/util/leaderelection/leaderelection.go). Its flag defaults are empty strings
(v2.10 cmd/scheduler/main.go:84-85). Our lease must therefore NOT be the one kube-scheduler
uses, hence `DEFAULT_LEASE_NAME`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.kube.api import LeaseApi
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.records import LeaseRecord

__all__ = [
    "CANDIDATE_JITTER",
    "DEFAULT_LEASE_DURATION_SECONDS",
    "DEFAULT_LEASE_NAME",
    "DEFAULT_LEASE_NAMESPACE",
    "DEFAULT_RENEW_DEADLINE_SECONDS",
    "DEFAULT_RETRY_PERIOD_SECONDS",
    "JITTER_FACTOR",
    "LABEL_SCHEDULER_ROLE",
    "ROLE_FOLLOWER",
    "ROLE_LEADER",
    "ElectionConfig",
    "LeaderElector",
    "holder_identity",
]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_DURATION_SECONDS = 15
DEFAULT_RENEW_DEADLINE_SECONDS = 10.0
DEFAULT_RETRY_PERIOD_SECONDS = 2.0
JITTER_FACTOR = 1.2
"""client-go's `JitterFactor` (its candidates wait retry period x (1 + U[0, 1.2))); kept for
client-go's check that the renew deadline exceeds retry period x JitterFactor."""
CANDIDATE_JITTER = 0.5
"""Our candidates wait retry period x (1 - U[0, 0.5)): never longer than one retry period,
jittered so that candidates do not read in step."""
_EXPIRY_SLACK_SECONDS = 0.01
"""Past the observed expiry, so that the read at expiry finds the lease no longer valid."""

DEFAULT_LEASE_NAME = "hami-scheduler-extender"
"""Not `hami-scheduler`: HAMi's chart gives kube-scheduler's own election that name, and two
elections on one lease would lock each other out."""
DEFAULT_LEASE_NAMESPACE = "kube-system"
"""Used when neither a flag nor `POD_NAMESPACE` names one (kube-scheduler's default)."""

LABEL_SCHEDULER_ROLE = "hami.io/scheduler-role"
ROLE_LEADER = "leader"
ROLE_FOLLOWER = "follower"

_RELEASED_LEASE_SECONDS = 1  # what client-go's release() writes


def holder_identity(pod_name: str, hostname: str | None = None) -> str:
    """This replica's holder identity: its pod's name (unique among running pods, and a
    restarted container takes its own lease back at once), else `<hostname>_<random UUID>` as
    kube-scheduler builds it."""
    if pod_name:
        return pod_name
    return f"{hostname or socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """Where the lease lives, who we are, and client-go's three timings.

    `lease_duration_seconds` is whole seconds because that is what the Lease carries
    (`leaseDurationSeconds`); the other two may be fractions. `pod_namespace`/`pod_name` name
    the pod to label with its role ("" : no labels). Raises ValueError, as client-go's
    NewLeaderElector refuses, unless lease duration > renew deadline > 1.2 x retry period > 0.
    """

    namespace: str
    name: str
    identity: str
    lease_duration_seconds: int = DEFAULT_LEASE_DURATION_SECONDS
    renew_deadline_seconds: float = DEFAULT_RENEW_DEADLINE_SECONDS
    retry_period_seconds: float = DEFAULT_RETRY_PERIOD_SECONDS
    release_on_cancel: bool = True
    pod_namespace: str = ""
    pod_name: str = ""

    def __post_init__(self) -> None:
        if not self.namespace or not self.name:
            raise ValueError("leader election needs a lease namespace and name")
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if self.retry_period_seconds <= 0:
            raise ValueError("the leader election retry period must be > 0")
        if self.renew_deadline_seconds <= JITTER_FACTOR * self.retry_period_seconds:
            raise ValueError(
                f"the leader election renew deadline ({self.renew_deadline_seconds:g} s) must "
                f"be greater than retry period x {JITTER_FACTOR:g} "
                f"({JITTER_FACTOR * self.retry_period_seconds:g} s)"
            )
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            raise ValueError(
                f"the leader election lease duration ({self.lease_duration_seconds} s) must be "
                f"greater than the renew deadline ({self.renew_deadline_seconds:g} s)"
            )

    @classmethod
    def from_flags(
        cls,
        name: str = "",
        namespace: str = "",
        *,
        pod_namespace: str = "",
        pod_name: str = "",
        lease_duration_seconds: int = DEFAULT_LEASE_DURATION_SECONDS,
        renew_deadline_seconds: float = DEFAULT_RENEW_DEADLINE_SECONDS,
        retry_period_seconds: float = DEFAULT_RETRY_PERIOD_SECONDS,
    ) -> ElectionConfig:
        """The configuration for flags `--leader-elect-resource-name`/`-namespace` ("" : the
        default) in this replica's pod (`pod_namespace`/`pod_name`, resolved once from
        `$POD_NAMESPACE`/`$POD_NAME` by the settings; "" outside a pod): the namespace falls
        back to `pod_namespace`, then `DEFAULT_LEASE_NAMESPACE`; the identity is
        `holder_identity(pod_name)`; the pod labelled is that pod when both are known. Raises
        ValueError as the constructor does."""
        labelled = bool(pod_namespace and pod_name)
        return cls(
            namespace=namespace or pod_namespace or DEFAULT_LEASE_NAMESPACE,
            name=name or DEFAULT_LEASE_NAME,
            identity=holder_identity(pod_name),
            lease_duration_seconds=lease_duration_seconds,
            renew_deadline_seconds=renew_deadline_seconds,
            retry_period_seconds=retry_period_seconds,
            pod_namespace=pod_namespace if labelled else "",
            pod_name=pod_name if labelled else "",
        )


def _spec(record: LeaseRecord | None) -> tuple[object, ...] | None:
    """The part of a lease that says who holds it (client-go compares this raw record; a
    change of labels or resourceVersion alone does not restart the expiry clock)."""
    if record is None:
        return None
    return (
        record.holder_identity,
        record.lease_duration_seconds,
        record.acquire_time,
        record.renew_time,
        record.lease_transitions,
    )


def _noop() -> None:
    return None


class LeaderElector:
    """Campaigns for, holds and releases one Lease; see the module docstring for the rules.

    `run(stop)` is the blocking loop (give it a thread); `tick()` is one step of it, which
    tests drive with a fake `clock`. `on_started_leading` / `on_stopped_leading` are called
    from the election thread on every transition; keep them short (flip a flag, wake a
    thread), an exception there is logged and ignored. `is_leader()` is safe from any thread.
    """

    def __init__(
        self,
        api: LeaseApi,
        config: ElectionConfig,
        *,
        on_started_leading: Callable[[], None] = _noop,
        on_stopped_leading: Callable[[], None] = _noop,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._config = config
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # our clock when the observed holder record last changed
        self._renewed_at = 0.0  # our clock just before the last successful write was sent
        self._leading = False
        self._logged_holder: str | None = None
        self._labeler = (
            _RoleLabeler(api, config.pod_namespace, config.pod_name, config.retry_period_seconds)
            if config.pod_namespace and config.pod_name
            else None
        )

    def _wall_now(self) -> datetime:
        # Lease times are written in UTC, whatever the clock's time zone
        return self._clock.now().astimezone(UTC)

    # --- reading (any thread) -----------------------------------------------------------------

    @property
    def config(self) -> ElectionConfig:
        return self._config

    @property
    def identity(self) -> str:
        return self._config.identity

    def is_leader(self) -> bool:
        """True while this replica leads and its last renewal is younger than the renew
        deadline (so False at once when the election thread is stuck)."""
        with self._lock:
            return self._leading and self._clock.monotonic() < (
                self._renewed_at + self._config.renew_deadline_seconds
            )

    def holder(self) -> str:
        """The holder identity last read or written ("" : none known, or released)."""
        with self._lock:
            return self._observed.holder_identity if self._observed is not None else ""

    # --- the loop -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Campaign and lead until `stop` is set; then stop leading and, with
        `release_on_cancel`, release the lease. Blocking; never raises for API failures."""
        logger.info(
            "leader election: %s campaigns for lease %s/%s",
            self.identity,
            self._config.namespace,
            self._config.name,
        )
        labeler_thread = None
        if self._labeler is not None:
            self._labeler.want(ROLE_FOLLOWER)
            labeler_thread = threading.Thread(
                target=self._labeler.run, name="leader-labels", daemon=True
            )
            labeler_thread.start()
        try:
            while not stop.is_set():
                stop.wait(self.tick())
        finally:
            if self._leading:
                self._step_down("stopping")
            if self._config.release_on_cancel:
                self.release()
            if self._labeler is not None and labeler_thread is not None:
                self._labeler.close()
                labeler_thread.join(timeout=2 * self._config.retry_period_seconds + 1)

    def tick(self) -> float:
        """One step: a candidate tries to acquire, a leader to renew (or steps down when its
        renew deadline passed or someone else holds the lease). Returns the seconds to wait
        before the next step."""
        config = self._config
        if not self._leading:
            if self._attempt(config.renew_deadline_seconds):
                self._start_leading()
                return config.retry_period_seconds
            return self._candidate_wait()
        left = self._renewed_at + config.renew_deadline_seconds - self._clock.monotonic()
        if left <= 0:
            self._step_down(
                f"lease not renewed within the {config.renew_deadline_seconds:g} s renew deadline"
            )
            return self._candidate_wait()
        if self._attempt(left):
            return config.retry_period_seconds
        holder = self.holder()
        if holder != self.identity:
            self._step_down(f"lease now held by {holder or 'nobody'}")
            return self._candidate_wait()
        left = self._renewed_at + config.renew_deadline_seconds - self._clock.monotonic()
        return max(0.0, min(config.retry_period_seconds, left))

    def release(self) -> bool:
        """Give the lease up if we hold it (client-go's release): holder emptied, lease
        duration 1 s, transitions kept. Returns False when the write failed (logged)."""
        if self.holder() != self.identity:
            return True
        config = self._config
        try:
            with self._api.deadline(config.renew_deadline_seconds):
                current = self._api.get_lease(config.namespace, config.name)
                if current.holder_identity != self.identity:
                    self._observe(current, self._clock.monotonic())
                    return True
                now = self._wall_now()
                released = dataclasses.replace(
                    current,
                    holder_identity="",
                    lease_duration_seconds=_RELEASED_LEASE_SECONDS,
                    acquire_time=now,
                    renew_time=now,
                )
                written = self._api.update_lease(released)
        except KubeError as exc:
            logger.warning("leader election: lease %s not released: %s", self._describe(), exc)
            return False
        self._observe(written, self._clock.monotonic())
        logger.info("leader election: %s released lease %s", self.identity, self._describe())
        return True

    # --- one attempt (client-go's tryAcquireOrRenew) ------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """Acquire or renew the lease once; True when we hold it afterwards. API failures are
        logged and count as False."""
        config = self._config
        now = self._clock.monotonic()
        stamp = self._wall_now()
        wanted = LeaseRecord(
            namespace=config.namespace,
            name=config.name,
            holder_identity=self.identity,
            lease_duration_seconds=config.lease_duration_seconds,
            acquire_time=stamp,
            renew_time=stamp,
            lease_transitions=0,
        )
        observed = self._observed
        # 1. Fast path: the holder renews assuming the lease is as it wrote it last.
        if observed is not None and observed.holder_identity == self.identity and self._valid(now):
            renewal = dataclasses.replace(
                wanted,
                acquire_time=observed.acquire_time,
                lease_transitions=observed.lease_transitions,
                resource_version=observed.resource_version,
            )
            if self._write(self._api.update_lease, renewal, quiet=True):
                return True
        # 2. Read the lease, or create it.
        try:
            current = self._api.get_lease(config.namespace, config.name)
        except NotFound:
            return self._write(self._api.create_lease, wanted)
        except KubeError as exc:
            logger.warning("leader election: cannot read lease %s: %s", self._describe(), exc)
            return False
        # 3. Someone else's unexpired lease stays theirs.
        self._observe(current, self._clock.monotonic())
        holder = current.holder_identity
        if holder and holder != self.identity and self._valid(now):
            self._log_holder(holder)
            return False
        # 4. Take it over (count the transition) or renew it.
        if holder == self.identity:
            update = dataclasses.replace(
                wanted,
                acquire_time=current.acquire_time,
                lease_transitions=current.lease_transitions,
                resource_version=current.resource_version,
            )
        else:
            update = dataclasses.replace(
                wanted,
                lease_transitions=current.lease_transitions + 1,
                resource_version=current.resource_version,
            )
        return self._write(self._api.update_lease, update)

    # --- internals ----------------------------------------------------------------------------

    def _attempt(self, budget_seconds: float) -> bool:
        """`try_acquire_or_renew` with every call it makes bounded by `budget_seconds`."""
        with self._api.deadline(budget_seconds):
            return self.try_acquire_or_renew()

    def _write(
        self, send: Callable[[LeaseRecord], LeaseRecord], record: LeaseRecord, quiet: bool = False
    ) -> bool:
        sent_at = self._clock.monotonic()
        try:
            written = send(record)
        except Conflict as exc:
            # Lost the race (or our cached resourceVersion is stale on the fast path).
            logger.debug("leader election: lease %s write lost a race: %s", self._describe(), exc)
            return False
        except KubeError as exc:
            log = logger.debug if quiet else logger.warning
            log("leader election: lease %s not written: %s", self._describe(), exc)
            return False
        with self._lock:
            self._observed = written
            self._observed_at = self._clock.monotonic()
            if written.holder_identity == self.identity:
                self._renewed_at = sent_at
        return written.holder_identity == self.identity

    def _observe(self, record: LeaseRecord, at: float) -> None:
        with self._lock:
            if _spec(record) != _spec(self._observed):
                self._observed_at = at
            self._observed = record

    def _valid(self, now: float) -> bool:
        """client-go's isLeaseValid: the observed record is younger, on our clock, than the
        lease duration its holder declared."""
        with self._lock:
            if self._observed is None:
                return False
            return self._observed_at + self._observed.lease_duration_seconds > now

    def _start_leading(self) -> None:
        with self._lock:
            self._leading = True
            self._logged_holder = self.identity
        logger.info("leader election: %s acquired lease %s", self.identity, self._describe())
        self._call(self._on_started, "on_started_leading")
        if self._labeler is not None:
            self._labeler.want(ROLE_LEADER)

    def _step_down(self, why: str) -> None:
        with self._lock:
            self._leading = False
        logger.warning(
            "leader election: %s stops leading lease %s: %s", self.identity, self._describe(), why
        )
        self._call(self._on_stopped, "on_stopped_leading")
        if self._labeler is not None:
            self._labeler.want(ROLE_FOLLOWER)

    def _call(self, callback: Callable[[], None], what: str) -> None:
        try:
            callback()
        except Exception:  # a callback bug must not stop the election loop
            logger.exception("leader election: %s callback failed", what)

    def _log_holder(self, holder: str) -> None:
        if holder != self._logged_holder:
            self._logged_holder = holder
            logger.info("leader election: lease %s is held by %s", self._describe(), holder)

    def _candidate_wait(self) -> float:
        """Until a candidate's next read: retry period x (0.5, 1], cut short to just after the
        moment the lease held by another identity expires on our clock (nothing else would
        wake us then: a dead holder writes nothing). Once that moment has passed (the read or
        the write at expiry failed), the plain wait: no busy loop against a failing API."""
        wait = self._config.retry_period_seconds * (1 - self._rng.random() * CANDIDATE_JITTER)
        with self._lock:
            observed = self._observed
            if observed is None or observed.holder_identity in ("", self.identity):
                return wait
            expires_in = (
                self._observed_at + observed.lease_duration_seconds - self._clock.monotonic()
            )
        if expires_in <= 0:
            return wait
        return min(wait, expires_in + _EXPIRY_SLACK_SECONDS)

    def _describe(self) -> str:
        return f"{self._config.namespace}/{self._config.name}"


class _RoleLabeler:
    """Keeps `hami.io/scheduler-role` on our pod equal to the wanted role, retrying every retry
    period; a new leader also relabels other pods still marked leader (a leader killed
    without a clean stop cannot do it itself)."""

    def __init__(self, api: LeaseApi, namespace: str, pod: str, retry_seconds: float) -> None:
        self._api = api
        self._namespace = namespace
        self._pod = pod
        self._retry = retry_seconds
        self._condition = threading.Condition()
        self._wanted: str | None = None
        self._applied: str | None = None
        self._closing = False
        self._failing = False

    def want(self, role: str) -> None:
        with self._condition:
            self._wanted = role
            self._condition.notify_all()

    def close(self) -> None:
        """Apply a pending role once more, then end `run`."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()

    def run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(
                    lambda: self._closing or self._wanted != self._applied,
                    timeout=self._retry if self._failing else None,
                )
                role, closing = self._wanted, self._closing
                if role is None or role == self._applied:
                    if closing:
                        return
                    continue
            applied = self._apply(role)
            with self._condition:
                if applied:
                    self._applied = role
                self._failing = not applied
                if closing:
                    return

    def _apply(self, role: str) -> bool:
        where = f"{self._namespace}/{self._pod}"
        try:
            with self._api.deadline(2 * self._retry):
                self._api.patch_pod_metadata(
                    self._namespace, self._pod, {}, {LABEL_SCHEDULER_ROLE: role}
                )
                if role == ROLE_LEADER:
                    self._demote_others()
        except KubeError as exc:
            log = logger.debug if self._failing else logger.warning
            log("leader election: pod %s not labelled %s: %s", where, role, exc)
            return False
        logger.info("leader election: pod %s labelled %s=%s", where, LABEL_SCHEDULER_ROLE, role)
        return True

    def _demote_others(self) -> None:
        listed = self._api.list_objects(
            f"/api/v1/namespaces/{self._namespace}/pods",
            label_selector=f"{LABEL_SCHEDULER_ROLE}={ROLE_LEADER}",
        )
        for item in listed.items:
            name = item.get("metadata", {}).get("name")
            if isinstance(name, str) and name and name != self._pod:
                with contextlib.suppress(NotFound):
                    self._api.patch_pod_metadata(
                        self._namespace, name, {}, {LABEL_SCHEDULER_ROLE: ROLE_FOLLOWER}
                    )
