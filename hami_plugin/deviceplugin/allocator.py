"""Where Allocate is carried out: its Kubernetes side, and the host directories.

`PodAllocator` reads the node lock and the pods, lets `deviceplugin.pending` pick the pod and
`deviceplugin.allocate` decide (both pure), creates the host directories and writes the result
back (to-allocate consumed, bind-phase, node lock released); any failure marks the pod `failed`,
releases the lock and records a Warning event. With booking keys (asked on every call, so a
rotated key counts at once) only signed bookings are served, and an entry once served is never
served again to the same pod (`ServedEntries`). The API calls of one Allocate share a time
budget, and reporting a failure has its own: kubelet waits for Allocate without a deadline.

Through an API server outage (`ApiFallback`, docs/device-plugin.md): the pods and the node come
from the node's watch when the API does not answer in time, a pod is then chosen only when its
next entry asks kubelet's count, and the writes go through the write-behind queue. With
kubelet's PodResources list (`KubeletAdmission`, in-flight/v2, docs/design.md 5.6): without a
booking key asked only when two or more pods are pending; while kubelet does not answer, the
node stops claiming v2, and until its claim is old enough several not-started pods asking the
count fail the call instead of a guess. With a booking key it is asked on every call and must
confirm the chosen pod (`pending.admission_doubt`): a pod that skipped the scheduler, admitted
while a signed booking waits here, would otherwise get that booking. An unconfirmed choice
(kubelet does not list the pod as being admitted, or does not answer) fails the call
(`AdmissionUnconfirmed`) with a Warning event on the pod and leaves its booking untouched, for
its own admission.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.deviceplugin.admitting import NOT_ASKED, KubeletAdmission, KubeletAdmitting
from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    AllocateFailure,
    AllocationDecision,
    FailureReason,
    check_requests,
    decide_allocation,
    with_entries_consumed,
)
from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
from hami_plugin.deviceplugin.mig.allocate import MigAllocateStep, MigRealised
from hami_plugin.deviceplugin.nodecache import CacheNotListedError, NodeCache
from hami_plugin.deviceplugin.pending import (
    PendingPodChoice,
    admission_doubt,
    is_pending_on,
    select_pending_pod,
)
from hami_plugin.deviceplugin.preferred import PreferredAnswer, PreferredRequest, decide_preferred
from hami_plugin.deviceplugin.writebehind import WriteBehind, release_lock_now
from hami_plugin.kube.api import AllocateApi
from hami_plugin.kube.errors import Retryable
from hami_plugin.kube.events import PodEvent
from hami_plugin.protocol import hostpaths
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    RESOURCE_GPU,
    BindPhase,
)
from hami_plugin.protocol.objects import NodeInfo, PodInfo
from hami_plugin.protocol.signature import BookingKeys

logger = logging.getLogger(__name__)

EVENT_REASON_ALLOCATE_FAILED = "AllocateFailed"
EVENT_REASON_ADMISSION_UNCONFIRMED = "AllocateNotForThisPod"
"""A Warning event on a pod whose booking an Allocate call did not get (`AdmissionUnconfirmed`)."""

ALLOCATE_BUDGET_SECONDS = 20.0
"""All API calls of one Allocate, up to writing its result."""
REPORT_BUDGET_SECONDS = 10.0
"""Reporting a failed Allocate (bind-phase, lock, event), and releasing the lock after success."""
PREFERRED_BUDGET_SECONDS = 5.0
"""Finding the pending pod for GetPreferredAllocation; after it, the answer falls back."""
READ_BUDGET_SECONDS = 5.0
"""Reading the node and its pods from the API when a watch can answer instead."""
AWAY_HOLD_SECONDS = 5.0
"""After a read found the API server away, how long the next reads go to the watch directly."""
MAX_SERVED_PODS = 10_000
"""Pods whose served entries `ServedEntries` remembers; beyond it the oldest are forgotten."""


class HostSetupError(Exception):
    """A host directory for the container could not be prepared."""


class AdmissionUnconfirmed(AllocateFailure):
    """With a booking key, kubelet's PodResources list did not confirm that its call is for
    `pod`, the pod chosen for it (`pending.admission_doubt`): nothing was served or patched,
    the pod's booking stands for its own admission."""

    def __init__(self, pod: PodInfo, doubt: str) -> None:
        super().__init__(
            FailureReason.NO_MATCHING_POD,
            f"the booking of pod {pod.namespace}/{pod.name} is not served: {doubt}",
            pod_known=False,
        )
        self.pod = pod


class PodAllocationError(Exception):
    """Allocate failed for a known pod; the pod is already marked `failed`.

    `cause` is the original error (an AllocateFailure, a KubeError, a HostSetupError or
    anything unexpected).
    """

    def __init__(self, pod: PodInfo, cause: BaseException) -> None:
        super().__init__(f"pod {pod.namespace}/{pod.name}: {cause}")
        self.pod = pod
        self.cause = cause


def prepare_host_dirs(decision: AllocationDecision, vgpulock_path: str) -> None:
    """Recreate each container's cache directory (0777) and make sure the lock dir exists.

    Raises HostSetupError naming the path.
    """
    for container in decision.containers:
        try:
            shutil.rmtree(container.host_dir, ignore_errors=True)
            os.makedirs(container.host_dir, exist_ok=True)
            os.chmod(container.host_dir, 0o777)
        except OSError as error:
            raise HostSetupError(
                f"cannot create {container.host_dir}: {error.strerror or error}"
            ) from error
    try:
        os.makedirs(vgpulock_path, exist_ok=True)
    except OSError as error:
        raise HostSetupError(f"cannot create {vgpulock_path}: {error.strerror or error}") from error
    with contextlib.suppress(OSError):
        # Another user's existing directory keeps its mode; HAMi-core only needs it to exist.
        os.chmod(vgpulock_path, 0o777)


class ServedEntries:
    """The to-allocate entries this process has served, per pod UID: each is served once.

    The author of a signed pod can write a consumed entry back between two Allocate calls (it
    still equals the signed booking); `applied` reads every listed pod with its served entries
    consumed. An entry counts as served once the patch that consumed it succeeded (a failed
    patch fails the pod, so the entry was never handed out). Bounded: a UID no listing shows
    is forgotten, and beyond `max_pods` the one served longest ago goes. Thread-safe.
    """

    def __init__(self, max_pods: int = MAX_SERVED_PODS) -> None:
        self._max_pods = max_pods
        self._served: OrderedDict[str, frozenset[int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._served)

    def served(self, uid: str) -> frozenset[int]:
        """The entry indexes served to the pod with `uid` (empty when none or forgotten)."""
        with self._lock:
            return self._served.get(uid, frozenset())

    def record(self, uid: str, indexes: Iterable[int]) -> None:
        """Remember that the entries at `indexes` were served to the pod with `uid`."""
        if not uid:
            return  # no pod without a UID is ever served (decide_allocation refuses it)
        with self._lock:
            self._served[uid] = self._served.get(uid, frozenset()).union(indexes)
            self._served.move_to_end(uid)
            while len(self._served) > self._max_pods:
                self._served.popitem(last=False)

    def applied(self, pods: Sequence[PodInfo]) -> list[PodInfo]:
        """`pods` (every pod bound to the node) with their served entries consumed
        (`allocate.with_entries_consumed`); forgets the UIDs that are not among them."""
        with self._lock:
            listed = {pod.uid for pod in pods}
            for uid in [uid for uid in self._served if uid not in listed]:
                del self._served[uid]
            served = dict(self._served)
        result = []
        for pod in pods:
            indexes = served.get(pod.uid)
            read = with_entries_consumed(pod, indexes) if indexes else pod
            if read is not pod:
                logger.warning(
                    "pod %s/%s: %s offers entries %s again, which were served already: "
                    "read as consumed",
                    pod.namespace,
                    pod.name,
                    ANNOTATION_DEVICES_TO_ALLOCATE,
                    ",".join(str(index) for index in sorted(served[pod.uid])),
                )
            result.append(read)
        return result


@dataclasses.dataclass(frozen=True, slots=True)
class AllocateBudgets:
    """How long the API calls of one call may take, all retries included."""

    allocate_seconds: float = ALLOCATE_BUDGET_SECONDS
    report_seconds: float = REPORT_BUDGET_SECONDS
    preferred_seconds: float = PREFERRED_BUDGET_SECONDS
    read_seconds: float = READ_BUDGET_SECONDS
    away_hold_seconds: float = AWAY_HOLD_SECONDS


@dataclasses.dataclass(frozen=True, slots=True)
class ApiFallback:
    """Where Allocate reads and writes while the API server is away: the node's watch and the
    write-behind queue (the module docstring)."""

    cache: NodeCache
    writes: WriteBehind


class PodAllocator:
    """Allocate and GetPreferredAllocation against the API server, for one node.

    `booking_keys` gives the current keys (None: every booking trusted, as in HAMi; then no
    `served` record either); `resource_name` is the plugin's resource (a refused pod that asks
    none of it is no candidate). `fallback` carries Allocate through an API server outage,
    `kubelet` is kubelet's PodResources answer, `budgets` bound the API calls (the module
    docstring). `hamicore` says whether HAMi-core is installed (None: watched here); while it is
    not, Allocate fails the pod rather than run a container without limits. `mig` (a
    dynamic-MIG node) realises each container's MIG reservations, destroying what the call
    created should a later step fail.
    """

    def __init__(
        self,
        kube: AllocateApi,
        node_name: str,
        config: AllocateConfig,
        *,
        booking_keys: Callable[[], BookingKeys] | None = None,
        resource_name: str = RESOURCE_GPU,
        new_cache_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        budgets: AllocateBudgets = AllocateBudgets(),
        fallback: ApiFallback | None = None,
        kubelet: KubeletAdmission | None = None,
        hamicore: HamiCoreWatch | None = None,
        mig: MigAllocateStep | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._kube = kube
        self._mig = mig
        """Dynamic MIG (`operatingmode: mig`): realises each container's MIG reservations."""
        self._node_name = node_name
        self._config = config
        self._booking_keys = booking_keys
        self._resource_name = resource_name
        self.served: ServedEntries | None = ServedEntries() if booking_keys is not None else None
        self._new_cache_id = new_cache_id
        self._allocate_budget = budgets.allocate_seconds
        self._report_budget = budgets.report_seconds
        self._preferred_budget = budgets.preferred_seconds
        self._read_budget = budgets.read_seconds
        self._away_hold = budgets.away_hold_seconds
        self._cache = fallback.cache if fallback is not None else None
        self._writes = fallback.writes if fallback is not None else None
        self._clock: Clock = clock or SystemClock()
        self.hamicore = hamicore or HamiCoreWatch(
            config.hook_path, node_name=node_name, clock=self._clock
        )
        self._away_since: float | None = None
        """When a read last found the API server away (monotonic), None once one succeeds."""
        self._kubelet = KubeletAdmitting(kubelet, node_name) if kubelet is not None else None

    def _within(self, seconds: float) -> contextlib.AbstractContextManager[object]:
        """The API calls of this thread inside the block share `seconds` (when supported)."""
        deadline: Callable[[float], contextlib.AbstractContextManager[object]] | None = getattr(
            self._kube, "deadline", None
        )
        return deadline(seconds) if deadline is not None else contextlib.nullcontext()

    def _current_config(self) -> AllocateConfig:
        # HAMi stats these files on every call: its plugin's postStart hook installs them on
        # the host after the daemon is already up (and a pre-installed HAMi-core may change).
        check = self.hamicore.current()
        return dataclasses.replace(
            self._config,
            libvgpu_host_path=check.library_host_path,
            license_present=os.path.exists(hostpaths.license_path(self._config.hook_path)),
            library_problem=check.library_problem and self.hamicore.on_node(check.library_problem),
            preload_problem=check.preload_problem and self.hamicore.on_node(check.preload_problem),
        )

    def _read(self, *, past_queue: bool = False) -> tuple[NodeInfo, list[PodInfo], str | None]:
        """The node and its pods, and why they come from the watch (None: from the API).
        `past_queue`: ask the API even though writes are queued.

        Raises the API's KubeError when there is no watch to fall back on, and
        AllocateFailure(NO_PENDING_POD) when the API does not answer and the watch has not
        listed yet.
        """
        cache, writes = self._cache, self._writes
        if cache is None:
            return self._kube.get_node(self._node_name), self._list_pods(), None
        away: str | None = None
        since = self._away_since
        if writes is not None and writes.backlog and not past_queue:
            away = f"{writes.backlog} write(s) wait for it"
        elif since is not None and self._clock.monotonic() - since < self._away_hold:
            away = f"a read {self._clock.monotonic() - since:.1f} s ago found it away"
        else:
            try:
                with self._within(self._read_budget):
                    read = self._kube.get_node(self._node_name), self._list_pods(), None
                self._away_since = None
                return read
            except Retryable as error:
                self._away_since = self._clock.monotonic()
                away = str(error)
        try:
            return cache.node(), cache.pods(), away
        except CacheNotListedError as error:
            raise AllocateFailure(
                FailureReason.NO_PENDING_POD,
                f"the API server does not answer ({away}) and {error}: nothing to choose from",
                pod_known=False,
            ) from error

    def _list_pods(self) -> list[PodInfo]:
        return self._kube.list_pods_on_node(self._node_name)

    def _pending_pod(self, device_count: int) -> tuple[NodeInfo, PendingPodChoice, bool]:
        """The pod kubelet's call for `device_count` devices is for (`select_pending_pod`),
        read as this process left it (its queued writes, the entries it served, its written
        writes, in that order: see `writebehind`), and whether the API server is away (the
        choice came from the watch: the call's writes are queued without asking it again).

        While writes are queued the watch is asked first, and the API only when the watch holds
        no pod the call could be for: after the API server returns, the queue waits out its
        backoff (up to 5 s) and the watch its own (up to 30 s), and a pod bound meanwhile is in
        neither (kubelet does not retry a failed Allocate)."""
        try:
            return self._pending_pod_from(self._read(), device_count)
        except AllocateFailure as error:
            writes = self._writes
            if writes is None or not writes.backlog or isinstance(error, AdmissionUnconfirmed):
                raise
            # still from the watch within `away_hold_seconds` of a failed read
            return self._pending_pod_from(self._read(past_queue=True), device_count)

    def _pending_pod_from(
        self, read: tuple[NodeInfo, list[PodInfo], str | None], device_count: int
    ) -> tuple[NodeInfo, PendingPodChoice, bool]:
        node, pods, away = read
        writes = self._writes
        if writes is not None:
            node = writes.node_applied(node)
            pods = writes.applied(pods, queued=True)
        if self.served is not None:
            pods = self.served.applied(pods)
        if writes is not None:
            pods = writes.applied(pods, queued=False)
        keys = self._booking_keys() if self._booking_keys is not None else None
        kubelet, confirm = NOT_ASKED, False
        if self._kubelet is not None:
            # with a key on every call; without, only to tell several pending pods apart
            confirm = keys is not None
            if confirm or sum(1 for pod in pods if is_pending_on(pod, self._node_name)) > 1:
                kubelet = self._kubelet.view(confirming=confirm)
        try:
            choice = select_pending_pod(
                self._node_name,
                node.annotations.get(ANNOTATION_NODE_LOCK),
                pods,
                device_count,
                keys,
                resource_name=self._resource_name,
                count_must_match=away is not None,
                admitting=kubelet.admitting,
            )
        except AllocateFailure as error:
            if away is None:
                raise
            raise AllocateFailure(
                error.reason,
                f"{error}; the API server does not answer ({away}), so the pods come from this "
                "node's watch, and it holds none that this call could be for (a pod bound just "
                "before the outage that the watch never delivered is served once it answers)",
                pod_known=False,
            ) from error
        if away is not None:
            logger.info(
                "the API server does not answer (%s): pod %s chosen from the node's watch",
                away,
                choice.pod.key,
            )
        if choice.lock_warning:
            logger.warning("node %s: %s", self._node_name, choice.lock_warning)
        if confirm:
            doubt = admission_doubt(choice.pod, kubelet.pods, kubelet.failure)
            if doubt is not None:
                raise AdmissionUnconfirmed(choice.pod, doubt)
        return node, choice, away is not None

    def allocate(
        self, requests: Sequence[Sequence[str]], advertised: Collection[str] | None = None
    ) -> AllocationDecision:
        """Decide and carry out one Allocate call.

        `advertised` is every device ID kubelet was offered; an ID outside it fails the pod.
        Raises AllocateFailure(NO_PENDING_POD, NO_MATCHING_POD or INVALID_REQUEST) or a
        KubeError when no pod could be chosen (nothing is patched then), AdmissionUnconfirmed
        when kubelet's list did not confirm the chosen pod (nothing patched, a Warning event on
        the pod), or PodAllocationError
        when the chosen pod failed (it is then marked `failed`, its lock released and a Warning
        event recorded), its cause an AllocateFailure(BOOKING_NOT_SIGNED) when its booking was
        refused.
        """
        check_requests(requests)
        with self._within(self._allocate_budget):
            # kubelet sends one container per call; the first one's count picks the pod.
            try:
                node, choice, away = self._pending_pod(len(requests[0]))
            except AdmissionUnconfirmed as error:
                self._tell_unconfirmed(error)
                raise
            pod = choice.pod
            realised: MigRealised | None = None
            try:
                if choice.refusal is not None:
                    raise AllocateFailure(FailureReason.BOOKING_NOT_SIGNED, choice.refusal)
                decision = decide_allocation(
                    pod, requests, self._current_config(), self._new_cache_id, advertised
                )
                if self._mig is not None:  # MIG instances, no HAMi-core directories
                    realised = self._mig.realise(pod, decision)
                    decision = realised.decision
                else:
                    prepare_host_dirs(decision, self._config.vgpulock_host_path)
                patch: dict[str, str | None] = {
                    ANNOTATION_DEVICES_TO_ALLOCATE: decision.remaining_to_allocate,
                    **(realised.annotations if realised is not None else {}),
                }
                if decision.complete:
                    patch[ANNOTATION_BIND_PHASE] = BindPhase.SUCCESS
                self._patch_pod(pod, patch, away)
                if self.served is not None:
                    self.served.record(pod.uid, (c.entry_index for c in decision.containers))
            except Exception as error:
                if realised is not None and self._mig is not None:
                    self._mig.rollback(realised.created)
                self._fail(pod, node, error, away)  # with a budget of its own
                raise PodAllocationError(pod, error) from error
        if decision.complete:
            with self._within(self._report_budget):
                self._release_lock(pod, node, away)
        for container in decision.containers:
            if container.kubelet_ids_not_used:
                logger.warning(
                    "pod %s/%s container %s: kubelet chose %s, which are not on the GPUs the "
                    "scheduler booked; the container gets the booked GPUs [%s]",
                    pod.namespace,
                    pod.name,
                    container.container_name,
                    ",".join(container.kubelet_ids_not_used),
                    container.gpu_list,
                )
        logger.info(
            "allocated %s to pod %s/%s%s",
            ", ".join(f"{c.container_name}=[{c.gpu_list}]" for c in decision.containers),
            pod.namespace,
            pod.name,
            " (bind-phase success)" if decision.complete else "",
        )
        return decision

    def preferred(self, requests: Sequence[PreferredRequest]) -> tuple[PreferredAnswer, ...]:
        """GetPreferredAllocation: follow the pending pod's GPUs; never raises for a pod or
        API problem (the answer falls back to a valid choice from `available`)."""
        pod: PodInfo | None
        try:
            with self._within(self._preferred_budget):
                _, choice, _ = self._pending_pod(requests[0].size if requests else 0)
            pod = choice.pod
            if choice.refusal is not None:
                # Told when kubelet's Allocate comes; the answer only falls back here.
                logger.info(
                    "preferred allocation without a pod: pod %s/%s: %s",
                    pod.namespace,
                    pod.name,
                    choice.refusal,
                )
                pod = None
        except AllocateFailure as error:
            logger.info("preferred allocation without a pod: %s", error)
            pod = None
        except Exception as error:  # the API server is away: still answer
            logger.warning("preferred allocation without a pod: %s", error)
            pod = None
        answers = decide_preferred(pod, requests)
        for answer in answers:
            if answer.fallback_note:
                logger.info(
                    "preferred allocation fell back (%s): %s",
                    answer.fallback_note,
                    ",".join(answer.device_ids),
                )
        return answers

    def _fail(self, pod: PodInfo, node: NodeInfo, error: BaseException, away: bool) -> None:
        """Tell the pod: bind-phase `failed`, lock released, a Warning event (best effort,
        within the report budget). Logged by the RPC edge (`_abort_with`), not here."""
        message = f"allocate failed for pod {pod.namespace}/{pod.name}: {error}"
        with self._within(self._report_budget):
            try:
                self._patch_pod(pod, {ANNOTATION_BIND_PHASE: BindPhase.FAILED}, away)
            except Exception as patch_error:
                logger.warning(
                    "could not mark pod %s/%s failed: %s", pod.namespace, pod.name, patch_error
                )
            self._release_lock(pod, node, away)
            # The allocation's own error must reach kubelet: the event is best effort.
            self._record(
                PodEvent.of_pod(pod, EVENT_REASON_ALLOCATE_FAILED, message, "Warning"), away
            )

    def _tell_unconfirmed(self, error: AdmissionUnconfirmed) -> None:
        """A Warning event on the pod whose booking a call did not get (best effort, within
        the report budget); its booking, bind-phase and lock stay as they are."""
        with self._within(self._report_budget):
            event = PodEvent.of_pod(
                error.pod,
                EVENT_REASON_ADMISSION_UNCONFIRMED,
                f"an Allocate call on node {self._node_name} was refused: {error}",
                "Warning",
            )
            self._record(event, away=False)

    def _record(self, event: PodEvent, away: bool) -> None:
        """Record `event` (through the write-behind queue when there is one); never raises."""
        if self._writes is not None:
            self._writes.record(event, queue=away)
            return
        try:
            self._kube.create_pod_event(event)
        except Exception as event_error:
            logger.warning("no event for pod %s/%s: %s", event.namespace, event.name, event_error)

    def _patch_pod(self, pod: PodInfo, annotations: dict[str, str | None], away: bool) -> None:
        """Patch the pod's annotations, through the write-behind queue when there is one
        (queued at once when the API server is `away`); raises what `WriteBehind.patch_pod`
        raises, else the API's KubeError."""
        if self._writes is not None:
            self._writes.patch_pod(pod, annotations, queue=away)
        else:
            self._kube.patch_pod_metadata(pod.namespace, pod.name, annotations)

    def _release_lock(self, pod: PodInfo, node: NodeInfo, away: bool) -> None:
        """Delete the node lock if `pod` may (`writebehind.release_lock_now`: HAMi's rule,
        the node's resourceVersion as precondition, retried on conflict); never raises."""
        if self._writes is not None:
            self._writes.release_lock(node, pod.namespace, pod.name, queue=away)
            return
        try:
            release_lock_now(self._kube, node.name, pod.namespace, pod.name, read=node)
        except Retryable as error:
            logger.warning("node %s: lock not released: %s", node.name, error)
