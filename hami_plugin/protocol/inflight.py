"""Several `allocating` pods on one node, told apart by what kubelet does (protocol in-flight/v1).

Why: kubelet's Allocate and GetPreferredAllocation do not name the pod they are for. HAMi holds a
node lock (`hami.io/mutex.lock`) from bind until Allocate, so a burst onto one node binds one pod
per bind-to-Allocate round trip. These pure rules let the scheduler keep several pods in flight on
a node whose device plugin is ours, and let our device plugin tell them apart safely.

What kubelet does (pkg/kubelet/kubelet.go HandlePodAdditions, cm/devicemanager):
- it admits new pods one at a time; each batch its pod watch delivers is sorted by
  creationTimestamp (whole seconds on the wire; `sort.Sort`, so ties come in any order);
- it calls Allocate once per container that requests the resource, init containers first, each
  preceded by GetPreferredAllocation when the plugin offers it, and finishes one pod before it
  admits the next; the device count it asks is the container's request.

The rules (both sides must agree; docs/design.md 5 is the contract):
- `choose_pod` (device plugin): (1) a started pod whose next entry asks the count: kubelet is in
  the middle of that pod; (2) else the oldest-created not-started pod whose first entry asks the
  count: kubelet admits older pods first. Two pods matching (1), or two matching (2) in the same
  second: ambiguous, no pod (the Allocate fails; a guess could hand one pod's GPUs to another).
  In-flight/v2: where several not-started pods match (2) and kubelet's PodResources `List` is
  known (`admitting`, the pods it holds without a device of the resource: the one it is
  admitting, never one it admits later), only those it lists count: one is the pod, several
  fall back to the oldest second among them, none is no pod.
- `must_wait_for` (scheduler): a pod may be bound while another is in flight only when no
  Allocate of either could match the other under `choose_pod`: their GPU device counts do not
  overlap, except that the first entry of an older (strictly earlier second), already bound,
  not-started pod may share the new pod's counts, since kubelet admits that pod first.

Residual risks (no rule over these inputs can exclude them): kubelet rejecting a pod before its
Allocate (eviction, sysctl, node shutdown admission handlers) or between two of its containers,
and a pod force-deleted after kubelet received it; see docs/scheduler.md
("Residual risks").
"""

from __future__ import annotations

import calendar
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from hami_plugin.protocol.model import ContainerDevices, PodDevices
from hami_plugin.protocol.objects import PodInfo

ANNOTATION_ALLOCATE_PROTOCOL = "hami-plugin.io/allocate-protocol"
"""Node annotation: the device plugin here tells in-flight pods apart (`ALLOCATE_PROTOCOL`)."""

ALLOCATE_PROTOCOL = "in-flight/v1"
"""Written by our device plugin with the register annotation, removed on its clean shutdown.
Absent: the node runs HAMi's device plugin, and the scheduler uses HAMi's node lock exactly."""

ALLOCATE_PROTOCOL_V2 = "in-flight/v2"
"""`ALLOCATE_PROTOCOL` plus: the device plugin asks kubelet's PodResources API (v1 `List`) which
of several not-started pods kubelet is admitting, so interchangeable pods (same `shape`) need
not wait for each other. Written instead of v1 only while that API answers."""


def protocol_level(value: str | None) -> int:
    """The node annotation's value as a level: 0 no allocate protocol (HAMi's node lock),
    1 `ALLOCATE_PROTOCOL`, 2 `ALLOCATE_PROTOCOL_V2`."""
    if value == ALLOCATE_PROTOCOL_V2:
        return 2
    if value == ALLOCATE_PROTOCOL:
        return 1
    return 0


@dataclass(frozen=True, slots=True)
class InFlightPod:
    """A pod bound (or being bound) to a node whose GPUs kubelet has not all allocated yet.

    `allocated` is the booking (`hami.io/vgpu-devices-allocated`), `to_allocate` what is left
    (`hami.io/vgpu-devices-to-allocate`; our device plugin empties an entry per Allocate).
    `bound` is False while the scheduler's Binding call has not returned: kubelet may not have
    the pod yet, so its order relative to later pods is unknown.
    """

    namespace: str
    name: str
    created_seconds: int
    allocated: PodDevices
    to_allocate: PodDevices
    bound: bool = True
    uid: str = ""
    shape: Hashable | None = None
    """What makes two pods interchangeable at Allocate: equal (and not None) when their GPU
    requests are the same in every field that matters (the scheduler's reading of counts,
    memory, cores per container, init containers, and the pod's type/UUID/NUMA/policy options).
    Set by the scheduler only; None: interchangeable with no pod."""

    @classmethod
    def booked(
        cls,
        namespace: str,
        name: str,
        created_seconds: int,
        devices: PodDevices,
        *,
        bound: bool = True,
        uid: str = "",
        shape: Hashable | None = None,
    ) -> InFlightPod:
        """A pod with `devices` booked and nothing consumed yet (its bind under way)."""
        return cls(namespace, name, created_seconds, devices, devices, bound, uid, shape)

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return self.namespace, self.name

    @property
    def started(self) -> bool:
        """Some booked GPU entry is consumed: kubelet is admitting (or has admitted) this pod."""
        for index, entry in enumerate(self.allocated):
            if entry and (index >= len(self.to_allocate) or not self.to_allocate[index]):
                return True
        return False

    @property
    def next_devices(self) -> ContainerDevices | None:
        """The next entry kubelet's Allocate will consume; None when every entry is consumed."""
        return next((entry for entry in self.to_allocate if entry), None)

    @property
    def finished(self) -> bool:
        """Every entry is consumed: no Allocate is for this pod any more."""
        return self.next_devices is None

    @property
    def remaining_counts(self) -> tuple[int, ...]:
        """The device count of each entry left, in Allocate order."""
        return tuple(len(entry) for entry in self.to_allocate if entry)


def created_seconds_of(created: datetime | None) -> int:
    """Whole seconds of a creationTimestamp, as kubelet compares them (None, never sent by an API
    server, counts as 0). A naive datetime is read as UTC."""
    if created is None:
        return 0
    return calendar.timegm(created.utctimetuple())


def in_flight_pod(pod: PodInfo, *, bound: bool = True) -> InFlightPod | None:
    """The in-flight view of a pod from its booking (`PodInfo.booking`).

    None when `hami.io/vgpu-devices-to-allocate` is missing or unreadable: such a pod can never
    be allocated, and callers must treat it as one that could be any Allocate (the device plugin
    does). A missing or unreadable `-devices-allocated` is read as equal to to-allocate (the pod
    then counts as not started).
    """
    booking = pod.booking
    if booking is None:
        return None
    try:
        to_allocate = booking.to_allocate
    except ValueError:
        return None
    if to_allocate is None:
        return None
    try:
        allocated = booking.allocated
    except ValueError:
        allocated = None
    return InFlightPod(
        namespace=pod.namespace,
        name=pod.name,
        created_seconds=created_seconds_of(pod.creation_timestamp),
        allocated=to_allocate if allocated is None else allocated,
        to_allocate=to_allocate,
        bound=bound,
        uid=pod.uid,
    )


# --- scheduler side ------------------------------------------------------------------------------


def _admitted_before(earlier: InFlightPod, later: InFlightPod) -> bool:
    """True when kubelet is sure to admit `earlier` before `later`, which is bound after it.

    Only if `earlier` is bound (its Binding precedes `later`'s, so kubelet's watch delivers it in
    an earlier batch or the same one) and created in a strictly earlier second (kubelet sorts a
    batch by creation second; ties are in any order).
    """
    return earlier.bound and not earlier.started and earlier.created_seconds < later.created_seconds


def interchangeable(pod: InFlightPod, other: InFlightPod) -> bool:
    """True when the two pods ask the same in every field that matters (equal `shape`) and
    each has one GPU entry: either booking gives a container the same limits, and on a node
    whose device plugin speaks `ALLOCATE_PROTOCOL_V2` kubelet's own list tells them apart.

    One entry only: kubelet's list shows which pod it is admitting, not whether a pod it gave
    up on between two of its containers is still to come, so pods with several GPU containers
    keep the v1 rule (their later entries must not be confusable)."""
    return (
        pod.shape is not None
        and pod.shape == other.shape
        and _entries(pod) == 1
        and _entries(other) == 1
    )


def _entries(pod: InFlightPod) -> int:
    return sum(1 for entry in pod.allocated if entry)


def confusable(pod: InFlightPod, other: InFlightPod, *, level: int = 1) -> bool:
    """True when an Allocate of `pod` could be taken for one of `other`'s, or the reverse, should
    kubelet give up on a pod part-way (see the module docstring). `level` is the node's
    `protocol_level`: at 2, interchangeable pods are never confusable."""
    if pod.key == other.key or pod.finished or other.finished:
        return False
    if level >= 2 and interchangeable(pod, other):
        return False
    other_counts = other.remaining_counts
    if _admitted_before(other, pod):
        # `other` is admitted first: while it is not started, `choose_pod` takes the older one
        # for its first entry, and `pod` cannot start before it.
        other_counts = other_counts[1:]
    return not set(pod.remaining_counts).isdisjoint(other_counts)


def must_wait_for(
    pod: InFlightPod, others: Iterable[InFlightPod], *, level: int = 1
) -> InFlightPod | None:
    """Scheduler side: the in-flight pod that `pod` must not be bound alongside, else None.

    `pod` is about to be bound (not started, `bound` irrelevant); `others` are the pods in
    flight on the same node (annotated `allocating`, Pending, including pods being deleted,
    until they are gone), with `bound=False` for those whose Binding has not returned yet.
    `level` is the node's `protocol_level` (1 or 2; at 2 interchangeable pods never wait for
    each other). Returns the first blocker in `others` order. The answer only gets more
    permissive as `others` start, finish, get bound or disappear, so a stale view errs on the
    safe side.
    """
    for other in others:
        if confusable(pod, other, level=level):
            return other
    return None


# --- device-plugin side --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Choice:
    """`choose` result: the pod, or None and `reason`, a sentence for the Allocate error."""

    pod: InFlightPod | None
    reason: str = ""


def _describe(pod: InFlightPod) -> str:
    counts = ",".join(str(c) for c in pod.remaining_counts) or "none"
    state = "started" if pod.started else "not started"
    created = datetime.fromtimestamp(pod.created_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{pod.namespace}/{pod.name} ({state}, created {created}, device counts {counts})"


def choose(
    candidates: Sequence[InFlightPod],
    device_count: int,
    admitting: Collection[tuple[str, str]] | None = None,
) -> Choice:
    """Which candidate kubelet's Allocate/GetPreferredAllocation asking `device_count` devices
    is for, with the reason when none can be told (see `choose_pod`; `admitting` as there)."""
    live = [pod for pod in candidates if not pod.finished]
    started = [pod for pod in live if pod.started]
    started_match = [pod for pod in started if pod.remaining_counts[0] == device_count]
    if len(started_match) == 1:
        return Choice(started_match[0])
    if len(started_match) > 1:
        return Choice(
            None,
            f"several started pods ask {device_count} device(s) next: "
            + "; ".join(_describe(p) for p in started_match),
        )
    fresh = [p for p in live if not p.started and p.remaining_counts[0] == device_count]
    if not fresh:
        return Choice(
            None,
            f"no pod in flight asks {device_count} device(s) next; in flight: "
            + ("; ".join(_describe(p) for p in live) or "none"),
        )
    listed = ""
    if len(fresh) > 1 and admitting is not None:
        # kubelet adds a pod to its pod manager just before admitting it, and records a
        # container's devices after its Allocate: the pod it is admitting is listed without
        # devices, and the pods it admits after it are not listed at all.
        shown = [pod for pod in fresh if pod.key in admitting]
        if not shown:
            return Choice(
                None,
                f"{len(fresh)} not-started pods ask {device_count} device(s) first, and "
                "kubelet's PodResources list shows none of them without devices (kubelet is "
                "admitting none of them): " + "; ".join(_describe(p) for p in fresh),
            )
        if len(shown) == 1:
            return Choice(shown[0])
        fresh = shown
        listed = ", each listed by kubelet without devices,"
    oldest = min(pod.created_seconds for pod in fresh)
    tied = [pod for pod in fresh if pod.created_seconds == oldest]
    if len(tied) > 1:
        return Choice(
            None,
            f"pods created in the same second{listed} ask {device_count} device(s) first, and "
            "kubelet admits them in any order: " + "; ".join(_describe(p) for p in tied),
        )
    return Choice(tied[0])


def choose_pod(
    candidates: Sequence[InFlightPod],
    device_count: int,
    admitting: Collection[tuple[str, str]] | None = None,
) -> InFlightPod | None:
    """Device-plugin side: the candidate kubelet's call asking `device_count` devices is for
    (`choose`'s pod, docs/design.md 5.3 and 5.6): a started candidate whose next entry asks
    that count, else the oldest not-started one whose first entry does, told apart by
    `admitting` (kubelet's PodResources list, in-flight/v2) where several match. None when
    no candidate matches or a guess would be needed."""
    return choose(candidates, device_count, admitting).pod
