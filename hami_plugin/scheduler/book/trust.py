"""Which pod bookings the scheduler counts, when it has a booking key (docs/design.md 8.2).

HAMi's booking annotations are pod metadata any pod author can write. Counted as they stand, a
pod that asks for no GPU and is bound nowhere, naming every GPU of a node, makes that node look
full; one `allocating` with an unreadable to-allocate stops every bind there. With a booking
key a booking counts only when:

* the pod asks for the GPU resource (a booking of a pod that asks for none was never ours);
* it is bound to the node its booking names, or not bound yet (between a bind's patch and its
  Binding, of this replica or of another leader);
* its `hami-plugin.io/booking-signature` verifies with the current keys (over the UID, so a
  copied signature fails), or it is a booking this process signed or verified before.

A booking that fails is read as no booking at all (`without_booking`), with one exception:
a pod kubelet already admitted on the node its booking names keeps its GPUs counted, signed or
not (`admitted.admitted_booking`: bookings made before the key, by HAMi's scheduler or ours),
yet is never sealed: nothing else about it is trusted. `BookingTrust` applies
the rules to every pod event and remembers, per pod, what it signed or verified (one
verification per change of a pod's booking, none per filter call) and how it counted an
untrusted pod. Without keys every booking counts, as in HAMi, and nothing is remembered. Pure:
the keys are passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS, read_booking
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingFields,
    BookingKeys,
    signing_version,
)
from hami_plugin.scheduler.book.admitted import admitted_booking
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "BookingSeal",
    "BookingTrust",
    "booking_seal",
    "same_pod",
    "untrusted_booking",
    "without_booking",
]

logger = logging.getLogger(__name__)

_BOOKING_KEYS = frozenset(BOOKING_ANNOTATIONS)


def same_pod(uid: str, other: str) -> bool:
    """Two UIDs of a pod name designate the same pod (an unknown UID matches any)."""
    return not uid or not other or uid == other


@dataclass(frozen=True, slots=True)
class BookingSeal:
    """A booking as a pod's annotations state it: the signed fields (None when one is
    missing) and the signature (None when absent). Two equal seals verify alike."""

    fields: BookingFields | None
    signature: str | None


def booking_seal(info: PodInfo) -> BookingSeal | None:
    """The pod's booking and its signature; None when the pod names no node: then it books
    nothing that anyone counts."""
    booking = info.booking
    if booking is None or not booking.node:
        return None
    return BookingSeal(booking.signed_fields(info.uid), booking.signature)


def untrusted_booking(
    info: PodInfo,
    keys: BookingKeys,
    settings: SchedulerSettings,
    *,
    known: BookingSeal | None = None,
) -> str | None:
    """None when the pod's booking counts (or it carries none), else why it does not.

    `known`: a booking of this very pod (same UID) this process signed or verified before;
    equal to the pod's, it counts without a new verification (and after its key was rotated
    out) nor a new look at its requests (a pod's GPU requests cannot change in place)."""
    seal = booking_seal(info)
    if seal is None or info.booking is None:
        return None
    node = info.booking.node
    if info.node_name and info.node_name != node:
        return f"it is bound to node {info.node_name}, not to node {node} its booking names"
    if known is not None and seal == known:
        return None
    if not pod_requests(info, settings).wants_gpu:
        return f"it asks for no {settings.resources.count}"
    if seal.signature is None:
        return f"it carries no {ANNOTATION_BOOKING_SIGNATURE}"
    if seal.fields is None:
        return (
            f"its booking lacks {ANNOTATION_BIND_TIME} or {ANNOTATION_DEVICES_ALLOCATED}, which "
            "the signature covers"
        )
    if not keys.verify(seal.signature, seal.fields):
        return (
            f"its {ANNOTATION_BOOKING_SIGNATURE} does not verify: not written by this scheduler "
            "for this pod's booking"
        )
    return None


def without_booking(info: PodInfo) -> PodInfo:
    """The pod as if it carried no HAMi booking (its other annotations kept)."""
    return replace(
        info,
        annotations={
            key: value for key, value in info.annotations.items() if key not in _BOOKING_KEYS
        },
    )


class BookingTrust:
    """What is trusted of each pod's booking, remembered per pod key. Not thread-safe."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self._settings = settings
        # the untrusted pods as counted (without their booking), the booking of each pod
        # signed or verified by this process (UID, seal), the pods logged as ignored
        self._counted_views: dict[str, PodInfo] = {}
        self._sealed: dict[str, tuple[str, BookingSeal]] = {}
        self._ignored: dict[str, str] = {}  # pod key -> UID logged
        self._admitted: dict[str, str] = {}  # pod key -> UID logged as counted unsigned

    def counted(self, info: PodInfo, keys: BookingKeys | None) -> PodInfo:
        """The pod as the ledger and the in-flight view count it: itself, or without its
        booking when `keys` are set and the booking is not to be trusted, unless kubelet
        admitted the pod on its booking's node (`admitted.admitted_booking`; never for a
        booking that replaced one this process sealed). Remembered for `last_counted`; an
        ignored pod, and an unsigned one counted, is logged once per UID."""
        key = info.key
        if keys is None:
            return info
        seal = booking_seal(info)
        if seal is None:
            self._counted_views.pop(key, None)
            return info
        sealed = self._sealed.get(key)
        known = sealed[1] if sealed is not None and sealed[0] == info.uid else None
        reason = untrusted_booking(info, keys, self._settings, known=known)
        if reason is None:
            if seal != known:
                self._sealed[key] = (info.uid, seal)
            self._counted_views.pop(key, None)
            return info
        not_admitted = admitted_booking(info, self._settings) if known is None else None
        if known is None and not_admitted is None:
            if self._admitted.get(key) != info.uid:
                self._admitted[key] = info.uid
                logger.warning(
                    "pod %s: its GPU booking is counted although %s: kubelet admitted the pod "
                    "on node %s (a booking made before the booking key); it is never served "
                    "by this scheduler's device plugin",
                    key,
                    reason,
                    info.node_name,
                )
            self._counted_views.pop(key, None)
            return info
        if self._ignored.get(key) != info.uid:
            self._ignored[key] = info.uid
            logger.warning(
                "pod %s: its GPU booking is ignored (counted as no booking): %s%s",
                key,
                reason,
                f"; nor is it counted as admitted: {not_admitted}" if not_admitted else "",
            )
        counted = without_booking(info)
        self._counted_views[key] = counted
        return counted

    def last_counted(self, pod: PodInfo) -> PodInfo:
        """The stored pod as its latest `counted` call gave it, not judged again (a standing
        booking was dropped and the pod's own annotations count again)."""
        return self._counted_views.get(pod.key, pod)

    def signed_and_bound(self, info: PodInfo) -> bool:
        """The pod is bound to a node (`spec.nodeName`) and its booking is one this process
        signed or verified (`counted` saw it). Such a booking may have been served by kubelet's
        Allocate, so it counts until the pod is Failed, Succeeded or deleted, whatever its
        `hami.io/bind-phase` says: bind-phase is not signed, and the pod's author can write
        `failed` on a pod whose container holds the GPU (issue 25). Always False without keys
        (nothing is sealed then): HAMi's rules."""
        if not info.node_name:
            return False
        sealed = self._sealed.get(info.key)
        return sealed is not None and sealed[0] == info.uid and booking_seal(info) == sealed[1]

    def sign(
        self,
        key: str,
        uid: str,
        annotations: dict[str, str],
        keys: BookingKeys | None,
        announced: str | None = None,
    ) -> str:
        """With `keys`: add the booking signature to a bind's annotations (a whole booking: node,
        devices, bind time), remember the booking as this process's own (its watch events count
        without a new verification) and return the signature. Without: "", the annotations
        untouched. `announced`: the node's `hami-plugin.io/booking-signatures`
        (`protocol.signature.signing_version`)."""
        if keys is None:
            return ""
        booking = read_booking(annotations)
        fields = booking.signed_fields(uid) if booking is not None else None
        assert fields is not None, "a bind's annotations hold a whole booking"
        signature = keys.sign(fields, signing_version(announced, keys))
        annotations[ANNOTATION_BOOKING_SIGNATURE] = signature
        self._sealed[key] = (uid, BookingSeal(fields, signature))
        return signature

    def bind_failed(self, key: str, annotations: Mapping[str, str]) -> None:
        """A bind with these annotations was rolled back: the booking it signed is no longer
        this process's own (should the revert not reach the pod, its events are verified
        again)."""
        sealed = self._sealed.get(key)
        signature = annotations.get(ANNOTATION_BOOKING_SIGNATURE)
        if sealed is not None and signature is not None and sealed[1].signature == signature:
            del self._sealed[key]

    def pod_deleted(self, key: str, uid: str) -> None:
        """Forget what was remembered of the pod `key` of that UID (a successor's stays)."""
        view = self._counted_views.get(key)
        if view is not None and same_pod(view.uid, uid):
            del self._counted_views[key]
        sealed = self._sealed.get(key)
        if sealed is not None and same_pod(sealed[0], uid):
            del self._sealed[key]
        for logged in (self._ignored, self._admitted):
            if same_pod(logged.get(key, ""), uid):
                logged.pop(key, None)
