"""Which pod kubelet's Allocate (or GetPreferredAllocation) is for, on this node. Pure, no I/O.

Kubelet's call names devices, not a pod (docs/hami-reference.md 4.4): the pending pod is the one
HAMi's node lock names, else a Pending pod bound here `allocating`; several of them (our
scheduler's in-flight protocol) are told apart by kubelet's device count and, in-flight/v2, by
kubelet's PodResources list (`inflight.choose`, docs/design.md 5.3 and 5.6).

With a booking key only signed bookings are served (docs/design.md 8.2, `booking_refusal`), and
only to the pod kubelet's PodResources list shows it is admitting (`admission_doubt`, checked by
the allocator on every call: a pod bound here without the scheduler would otherwise be served
the one pending booking). A
refused or unreadable booking is never chosen for another pod's call: it stands where kubelet
could be admitting it (the lock's pod, the one candidate, the in-flight wildcard) so that it,
not a signed pod, takes the failure; a refused pod that asks for none of the plugin's resource
is no candidate at all (kubelet never calls Allocate for it). What remains is in
docs/design.md 8.5.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason, to_allocate_problem
from hami_plugin.protocol import inflight, nodelock
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.model import RESOURCE_GPU
from hami_plugin.protocol.objects import POD_PENDING, ContainerSpec, PodInfo
from hami_plugin.protocol.quantity import QuantityError, parse_quantity
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingKeys

BOOKING_NOT_SIGNED = "booking not signed by the scheduler"
"""How a refused booking's message starts (the Allocate error and the pod's Warning event)."""
NOT_CONFIRMED = "kubelet is not admitting this pod"
"""How an unconfirmed choice's message starts (`admission_doubt`)."""


@dataclass(frozen=True, slots=True)
class KubeletPods:
    """Kubelet's PodResources `List` as Allocate reads it: the (namespace, name) of every pod it
    lists (`listed`), and of those none of whose containers holds a device of the resource
    (`without_devices`: the pod it is admitting is among them, the pods it admits later are not
    listed at all; docs/design.md 5.6)."""

    listed: frozenset[tuple[str, str]]
    without_devices: frozenset[tuple[str, str]]


def admission_doubt(pod: PodInfo, kubelet: KubeletPods | None, unknown: str = "") -> str | None:
    """With a booking key: why kubelet's call cannot be confirmed to be for `pod`, the pod
    chosen for it; None when it can (docs/design.md 8.2).

    Kubelet adds a pod to its pod manager just before admitting it and records each
    container's devices after its Allocate (pkg/kubelet/kubelet.go HandlePodAdditions,
    cm/devicemanager allocateContainerResources), so during the call:
    * a not-started pod kubelet is admitting is listed without a device of the resource;
    * a started pod (an entry consumed: kubelet is between its containers) is listed;
    * a pod kubelet admits later in the same batch (or a later one) is not listed at all.
    A pod not shown so is not the one being admitted: another pod, one that skipped the
    scheduler (`spec.nodeName` set by its author), would get its booking. `kubelet` None: the
    list is unknown (`unknown` says why), and nothing can be confirmed.
    """
    key = (pod.namespace, pod.name)
    if kubelet is None:
        return (
            f"{NOT_CONFIRMED} as far as can be told: kubelet's PodResources list, which names "
            f"the pod being admitted, is unavailable ({unknown}); with a booking key a booking "
            "is served only to the pod kubelet is admitting"
        )
    view = inflight.in_flight_pod(pod)
    if view is not None and view.started and not view.finished:
        if key in kubelet.listed:
            return None
        return (
            f"{NOT_CONFIRMED}: kubelet's PodResources list does not show it, though some of its "
            "containers were allocated; its booking is left for its own admission"
        )
    if key in kubelet.without_devices:
        return None
    if key in kubelet.listed:
        where = "shows it with devices already"
    else:
        where = "does not show it yet (kubelet admits it later, if at all)"
    return (
        f"{NOT_CONFIRMED}: kubelet's PodResources list {where}, so this call is for another "
        "pod (one bound to the node without the scheduler?); the booking is left for the "
        "pod's own admission"
    )


@dataclass(frozen=True, slots=True)
class PendingPodChoice:
    """The pod the kubelet call is for. `lock_warning` explains a node lock that could not be
    used; `refusal`, when set, says why the pod's booking must not be served (Allocate fails
    the pod with it)."""

    pod: PodInfo
    via_lock: bool
    lock_warning: str | None = None
    refusal: str | None = None


def booking_refusal(pod: PodInfo, keys: BookingKeys | None) -> str | None:
    """Why `pod`'s booking must not be served; None when it may be (always without `keys`).

    With `keys` a booking is served only when `hami-plugin.io/booking-signature` verifies for
    the pod's UID, `hami.io/vgpu-node`, `hami.io/vgpu-devices-allocated` and `hami.io/bind-time`
    (`protocol.signature`), and its to-allocate is that booking with some entries consumed
    (`allocate.to_allocate_problem`): a signature proves the booking, not what its author
    wrote into to-allocate afterwards.
    """
    if keys is None:
        return None
    booking = pod.booking
    if booking is None or not booking.verifies(keys, pod.uid):
        if booking is None or booking.signature is None:
            return f"{BOOKING_NOT_SIGNED}: the pod has no {ANNOTATION_BOOKING_SIGNATURE}"
        return (
            f"{BOOKING_NOT_SIGNED}: {ANNOTATION_BOOKING_SIGNATURE} does not verify for this "
            "pod's UID, node, booked devices and bind-time (copied from another pod, changed "
            "after the bind, or signed with a key this node does not have)"
        )
    return to_allocate_problem(booking)


def _asks_for(container: ContainerSpec, resource_name: str) -> bool:
    # An amount that is no quantity (no API server stores one) counts as asking.
    for amounts in (container.limits, container.requests):
        value = amounts.get(resource_name)
        if value is None:
            continue
        try:
            if not isinstance(value, str | int | float) or parse_quantity(value) > 0:
                return True
        except QuantityError:
            return True
    return False


def requests_resource(pod: PodInfo, resource_name: str) -> bool:
    """True when a container of the pod, init or app, asks for `resource_name` (a positive
    amount in its limits or requests): only then can kubelet call Allocate for the pod.

    Kubelet calls this plugin for each container whose limits name its resource with a
    non-zero count (docs/design.md 5.2); the API server requires an extended resource in the
    limits, so requests add nothing there but are read as well, and an amount that does not
    parse counts as asking: a pod is taken to ask for nothing only when kubelet surely never
    calls for it.
    """
    return any(
        _asks_for(container, resource_name) for container in (*pod.init_containers, *pod.containers)
    )


def _bind_time_key(pod: PodInfo) -> tuple[int, int, str, str]:
    seconds = pod.booking.bind_seconds if pod.booking is not None else None
    # An unreadable bind-time sorts after every readable one.
    if seconds is None:
        return (1, 0, pod.namespace, pod.name)
    return (0, seconds, pod.namespace, pod.name)


def is_pending_on(pod: PodInfo, node_name: str) -> bool:
    """True when the pod waits for its devices on `node_name` (docs/hami-reference.md 4.4,
    step 1): bound here, Pending, `hami.io/bind-phase: allocating`, with a bind-time and
    `hami.io/vgpu-node`.

    A pod being deleted still qualifies: kubelet admits a pod it has not seen before even when
    its deletionTimestamp is set (HandlePodAdditions only skips pods its pod workers already
    terminate), so an Allocate may still be for it.
    """
    booking = pod.booking
    return (
        pod.phase == POD_PENDING
        and pod.node_name == node_name
        and booking is not None
        and booking.bind_time is not None
        and booking.allocating
        and booking.node == node_name
    )


def _choose_in_flight(
    node_name: str,
    candidates: Sequence[PodInfo],
    device_count: int,
    refused: Collection[tuple[str, str]] = frozenset(),
    admitting: Collection[tuple[str, str]] | None = None,
) -> tuple[PodInfo | None, str]:
    """The candidate kubelet's call for `device_count` devices is for (`inflight.choose`, with
    `admitting` when kubelet's PodResources list is known).

    A candidate without a usable booking (to-allocate missing, unreadable or all consumed, or
    its (namespace, name) in `refused`: a booking not to be served) could be any Allocate: it
    is taken instead whenever kubelet could be admitting it, that is when nothing else matches
    or the match is a not-started pod created no earlier; it then fails, and the caller's
    kubelet call with it, rather than another pod's GPUs going to it. With `admitting` known,
    kubelet could be admitting it only when it is in `admitting` (the module docstring): one
    that is not is left out, and the call is decided without it.
    """
    readable: dict[tuple[str, str], PodInfo] = {}
    views = []
    unusable: list[PodInfo] = []
    for pod in candidates:
        view = inflight.in_flight_pod(pod)
        if view is None or view.finished or (pod.namespace, pod.name) in refused:
            unusable.append(pod)
        else:
            readable[view.key] = pod
            views.append(view)
    choice = inflight.choose(views, device_count, admitting)
    if admitting is not None:
        unusable = [pod for pod in unusable if (pod.namespace, pod.name) in admitting]
    if unusable:
        wildcard = min(
            unusable,
            key=lambda p: (inflight.created_seconds_of(p.creation_timestamp), p.namespace, p.name),
        )
        wildcard_created = inflight.created_seconds_of(wildcard.creation_timestamp)
        if choice.pod is None or (
            not choice.pod.started and wildcard_created <= choice.pod.created_seconds
        ):
            return wildcard, ""
    if choice.pod is None:
        return None, (
            f"node {node_name}: cannot tell which pod an allocation of {device_count} device(s) "
            f"is for: {choice.reason}"
        )
    return readable[choice.pod.key], ""


def _asks_next(pod: PodInfo, device_count: int) -> bool:
    """True unless the pod's next to-allocate entry is readable and asks another count (an
    unreadable or used-up booking is left to fail the pod, as without the rule)."""
    view = inflight.in_flight_pod(pod)
    if view is None or view.finished:
        return True
    return view.remaining_counts[0] == device_count


def select_pending_pod(
    node_name: str,
    lock_value: str | None,
    pods: Sequence[PodInfo],
    device_count: int,
    keys: BookingKeys | None = None,
    *,
    resource_name: str = RESOURCE_GPU,
    count_must_match: bool = False,
    admitting: Collection[tuple[str, str]] | None = None,
) -> PendingPodChoice:
    """The pod kubelet's call for `device_count` devices is for (docs/design.md 5.3, 5.6).

    The pod the node lock names, when Pending here (HAMi's scheduler); else the one pod pending
    here (`is_pending_on`), whatever the count (a wrong one then fails "device number not
    matched", as in HAMi); else `inflight.choose` over the candidates' bookings. A malformed
    lock is a warning, not a failure (HAMi fails every Allocate until it expires).

    `keys`: a refused booking (`booking_refusal`) is the answer only where kubelet could be
    admitting it, with `refusal` set, and never when the pod asks no `resource_name`.
    `count_must_match` (pods from the watch while the API server is away): the lock's pod and
    the one candidate must ask `device_count` next too. `admitting`: kubelet's PodResources
    list (in-flight/v2), for the in-flight choice only.

    Raises AllocateFailure NO_PENDING_POD (none qualifies) or NO_MATCHING_POD (none can be told
    to be the one), both with `pod_known` False: nothing is patched.
    """
    warning: str | None = None
    lock: nodelock.NodeLock | None = None
    if lock_value:
        try:
            lock = nodelock.parse_node_lock(lock_value)
        except AnnotationError as error:
            warning = f"ignoring node lock: {error}"
    if lock is not None:
        chosen, warning = _locked_pod(
            node_name, lock, pods, device_count, keys, resource_name, count_must_match, warning
        )
        if chosen is not None:
            return chosen
    refusals: dict[tuple[str, str], str | None] = {}
    candidates = []
    for pod in sorted((p for p in pods if is_pending_on(p, node_name)), key=_bind_time_key):
        refusal = booking_refusal(pod, keys)
        if refusal is None or requests_resource(pod, resource_name):
            refusals[(pod.namespace, pod.name)] = refusal
            candidates.append(pod)
    if not candidates:
        raise AllocateFailure(
            FailureReason.NO_PENDING_POD,
            f"no binding pod found on node {node_name}",
            pod_known=False,
        )
    chosen_pod = candidates[0]
    if len(candidates) > 1 or count_must_match:
        refused = {key for key, refusal in refusals.items() if refusal is not None}
        found, reason = _choose_in_flight(node_name, candidates, device_count, refused, admitting)
        if found is None:
            raise AllocateFailure(FailureReason.NO_MATCHING_POD, reason, pod_known=False)
        chosen_pod = found
    return PendingPodChoice(
        pod=chosen_pod,
        via_lock=False,
        lock_warning=warning,
        refusal=refusals[(chosen_pod.namespace, chosen_pod.name)],
    )


def _locked_pod(
    node_name: str,
    lock: nodelock.NodeLock,
    pods: Sequence[PodInfo],
    device_count: int,
    keys: BookingKeys | None,
    resource_name: str,
    count_must_match: bool,
    warning: str | None,
) -> tuple[PendingPodChoice | None, str | None]:
    """The Pending pod the node lock names, or None and why it is passed over (a legacy lock,
    the time alone, is owned by no pod)."""
    for pod in pods:
        if lock.owned_by(pod.namespace, pod.name) and pod.phase == POD_PENDING:
            refusal = booking_refusal(pod, keys)
            if count_must_match and refusal is None and not _asks_next(pod, device_count):
                raise AllocateFailure(
                    FailureReason.NO_MATCHING_POD,
                    f"node {node_name}: pod {pod.key}, which the node lock names, does not "
                    f"ask {device_count} device(s) next",
                    pod_known=False,
                )
            if refusal is None or requests_resource(pod, resource_name):
                return PendingPodChoice(pod=pod, via_lock=True, refusal=refusal), warning
            warning = (
                f"ignoring the node lock of pod {pod.key}: it asks for no {resource_name}, "
                f"so kubelet's call is not for it ({refusal})"
            )
    return None, warning
