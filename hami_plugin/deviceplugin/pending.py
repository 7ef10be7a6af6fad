"""Which pod kubelet's Allocate (or GetPreferredAllocation) is for, on this node.

Kubelet's call names devices, not a pod. HAMi v2.10 behaviour being matched
(docs/hami-reference.md 4.4): the pending pod is the one the node lock names, else a Pending pod
bound to this node whose `hami.io/bind-phase` is `allocating`; where several such pods are in
flight (our scheduler on a node marked `hami-plugin.io/allocate-protocol`), `inflight.choose`
tells them apart from kubelet's device count (HAMi takes whatever the API list order gives).
Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.protocol import inflight, nodelock
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_VGPU_NODE,
    BindPhase,
)
from hami_plugin.protocol.objects import POD_PENDING, PodInfo


@dataclass(frozen=True, slots=True)
class PendingPodChoice:
    """The pod Allocate works on. `lock_warning` explains a node lock that could not be used."""

    pod: PodInfo
    via_lock: bool
    lock_warning: str | None = None


def _bind_time_key(pod: PodInfo) -> tuple[int, int, str, str]:
    text = pod.annotations.get(ANNOTATION_BIND_TIME, "")
    try:
        return (0, int(text), pod.namespace, pod.name)
    except ValueError:
        # An unreadable bind-time sorts after every readable one.
        return (1, 0, pod.namespace, pod.name)


def is_pending_on(pod: PodInfo, node_name: str) -> bool:
    """True when the pod waits for its devices on `node_name` (docs/hami-reference.md 4.4,
    step 1): bound here, Pending, `hami.io/bind-phase: allocating`, with a bind-time and
    `hami.io/vgpu-node`.

    A pod being deleted still qualifies: kubelet admits a pod it has not seen before even when
    its deletionTimestamp is set (HandlePodAdditions only skips pods its pod workers already
    terminate), so an Allocate may still be for it.
    """
    annotations = pod.annotations
    return (
        pod.phase == POD_PENDING
        and pod.node_name == node_name
        and ANNOTATION_BIND_TIME in annotations
        and annotations.get(ANNOTATION_BIND_PHASE) == BindPhase.ALLOCATING
        and annotations.get(ANNOTATION_VGPU_NODE) == node_name
    )


def _choose_in_flight(
    node_name: str, candidates: Sequence[PodInfo], device_count: int
) -> tuple[PodInfo | None, str]:
    """The candidate kubelet's call for `device_count` devices is for (`inflight.choose`).

    A candidate without a usable booking (to-allocate missing, unreadable or all consumed) could
    be any Allocate: it is taken instead whenever kubelet could be admitting it, that is when
    nothing else matches or the match is a not-started pod created no earlier; it then fails on
    its annotation, and the caller's kubelet call with it, rather than another pod's GPUs going
    to it.
    """
    readable: dict[tuple[str, str], PodInfo] = {}
    views = []
    unusable: list[PodInfo] = []
    for pod in candidates:
        view = inflight.in_flight_pod(
            pod.namespace, pod.name, pod.creation_timestamp, pod.annotations
        )
        if view is None or view.finished:
            unusable.append(pod)
        else:
            readable[view.key] = pod
            views.append(view)
    choice = inflight.choose(views, device_count)
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


def select_pending_pod(
    node_name: str, lock_value: str | None, pods: Sequence[PodInfo], device_count: int
) -> PendingPodChoice:
    """Choose the pod kubelet is admitting, from the node lock, the pods on the node and the
    number of devices kubelet asks (`len(devices_ids)`, or `allocation_size`).

    The pod the lock names wins when it is a Pending pod on this node (HAMi's scheduler). Else
    the one pod pending on this node (`is_pending_on`), whatever the count: a wrong count then
    fails it with "device number not matched", as in HAMi. Several (our scheduler's in-flight
    protocol): `inflight.choose` over their bookings. A malformed lock does not block allocation
    (HAMi fails every Allocate until the lock expires); the choice carries a warning instead.

    Raises AllocateFailure(NO_PENDING_POD) when no pod qualifies, and (NO_MATCHING_POD) when
    several do and none can be told to be the one; `pod_known` is False for both (nothing is
    patched).
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
                return PendingPodChoice(pod=pod, via_lock=True)
    candidates = sorted((p for p in pods if is_pending_on(p, node_name)), key=_bind_time_key)
    if not candidates:
        raise AllocateFailure(
            FailureReason.NO_PENDING_POD,
            f"no binding pod found on node {node_name}",
            pod_known=False,
        )
    if len(candidates) == 1:
        return PendingPodChoice(pod=candidates[0], via_lock=False, lock_warning=warning)
    chosen, reason = _choose_in_flight(node_name, candidates, device_count)
    if chosen is None:
        raise AllocateFailure(FailureReason.NO_MATCHING_POD, reason, pod_known=False)
    return PendingPodChoice(pod=chosen, via_lock=False, lock_warning=warning)
