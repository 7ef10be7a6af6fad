"""Which pod kubelet's Allocate (or GetPreferredAllocation) is for, on this node.

Kubelet's call names devices, not a pod. HAMi v2.10 behaviour being matched
(docs/hami-reference.md 4.4): the pending pod is the one the node lock names, else a Pending pod
bound to this node whose `hami.io/bind-phase` is `allocating`; where several such pods are in
flight (our scheduler on a node marked `hami-plugin.io/allocate-protocol`), `inflight.choose`
tells them apart from kubelet's device count (HAMi takes whatever the API list order gives).

With a booking key (`--booking-key-file`, docs/design.md 8) only bookings the scheduler signed
are served (`booking_refusal`). A pod with any other booking is never chosen for another pod's
call: it is kept out of the in-flight choice and stands where kubelet could be admitting it (the
one candidate, the pod a node lock names, or the wildcard of `_choose_in_flight`), so that it,
and not a signed pod, takes the refusal. A refused pod none of whose containers asks for the
plugin's resource is no candidate at all: kubelet never calls Allocate for it, so it could only
take a signed pod's call. What is left: a forged pod that does ask for the resource and was
created no later than a signed pod that has not started can still take that pod's call, so
that one admission fails (nothing is served to the forged pod). Without a key every booking is
trusted, as in HAMi.

In-flight/v2 (docs/design.md 5.6): with `admitting`, the pods kubelet's PodResources `List`
shows without a device of the resource, several not-started pods asking kubelet's count are
told apart by it (`inflight.choose`), and a pod without a usable booking is the wildcard only
when it is listed there too: kubelet lists the pod it is admitting without devices until its
first app container has some, and does not list the pods it admits after it, so a pod it lists
with devices is past its first Allocate and one it does not list is not being admitted yet;
a refused or unreadable booking only ever meets a first Allocate (it fails there). That also
closes the forged-pod case above while `List` answers: a forged pod kubelet does not list
without devices takes no call. Pure, no I/O.
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
    """Choose the pod kubelet is admitting, from the node lock, the pods on the node and the
    number of devices kubelet asks (`len(devices_ids)`, or `allocation_size`).

    The pod the lock names wins when it is a Pending pod on this node (HAMi's scheduler). Else
    the one pod pending on this node (`is_pending_on`), whatever the count: a wrong count then
    fails it with "device number not matched", as in HAMi. Several (our scheduler's in-flight
    protocol): `inflight.choose` over their bookings. A malformed lock does not block allocation
    (HAMi fails every Allocate until the lock expires); the choice carries a warning instead.

    With `keys`, a pod whose booking is refused (`booking_refusal`) is still the answer where
    kubelet could be admitting it (the lock's pod, the one candidate, the in-flight wildcard),
    with `refusal` set; it is never the answer for a call a served pod matches, nor at all
    when no container of it asks for `resource_name` (the plugin's resource,
    `requests_resource`): kubelet never calls Allocate for such a pod.

    With `count_must_match` (the pods come from this node's watch, the API server being away:
    kubelet may be admitting a pod the watch never delivered), the pod the lock names and the
    one candidate are chosen only when their next entry asks `device_count` devices too, as
    `inflight.choose` chooses among several: a wrong guess would fail a pod kubelet is not
    admitting, or serve it to another.

    `admitting` (in-flight/v2): the (namespace, name) of the pods kubelet's PodResources `List`
    shows without a device of `resource_name`, None when not asked or it did not answer. It
    tells several not-started candidates apart (`inflight.choose_pod`) and keeps a pod without
    a usable booking from being the wildcard unless it is listed (the module docstring). The
    pod the lock names and the one candidate are chosen as without it.

    Raises AllocateFailure(NO_PENDING_POD) when no pod qualifies, and (NO_MATCHING_POD) when
    several do (or, with `count_must_match`, one does) and none can be told to be the one;
    `pod_known` is False for both (nothing is patched).
    """
    warning: str | None = None
    lock: nodelock.NodeLock | None = None
    if lock_value:
        try:
            lock = nodelock.parse_node_lock(lock_value)
        except AnnotationError as error:
            warning = f"ignoring node lock: {error}"
    if lock is not None:
        # A legacy lock (time only) is owned by no pod.
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
                    return PendingPodChoice(pod=pod, via_lock=True, refusal=refusal)
                warning = (
                    f"ignoring the node lock of pod {pod.key}: it asks for no {resource_name}, "
                    f"so kubelet's call is not for it ({refusal})"
                )
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
    chosen = candidates[0]
    if len(candidates) > 1 or count_must_match:
        refused = {key for key, refusal in refusals.items() if refusal is not None}
        found, reason = _choose_in_flight(node_name, candidates, device_count, refused, admitting)
        if found is None:
            raise AllocateFailure(FailureReason.NO_MATCHING_POD, reason, pod_known=False)
        chosen = found
    return PendingPodChoice(
        pod=chosen,
        via_lock=False,
        lock_warning=warning,
        refusal=refusals[(chosen.namespace, chosen.name)],
    )
