"""What the scheduler daemon trusts of each pod's booking, remembered per pod: `BookingTrust`.

With a booking key (`--booking-key-file`), a pod event enters the ledger and the in-flight view
of `hami_plugin.extender.state` only through `BookingTrust.counted`: the pod itself, or the pod
without its booking when that booking is not to be trusted (the pure rules of
`hami_plugin.scheduler.trust`), so a forged booking neither fills a node nor blocks a bind.
What it remembers, per pod key:

* the booking this process signed (`sign`, at bind) or verified, with the pod's UID: the pod's
  later events showing that booking count without a new HMAC, so there is one HMAC per change
  of a pod's booking and none per filter call. A failed bind forgets its signature
  (`bind_failed`): should the revert not reach the pod, its events are verified again;
* the untrusted pod as counted (without its booking), for `last_counted`: when a standing
  booking is dropped, the stored pod counts again as it was judged, not as it is written;
* the UID logged as ignored: each ignored pod is logged once.

All of it goes with the pod (`pod_deleted`). Without a key every booking counts, as in HAMi,
and nothing is remembered.

Not thread-safe: `SchedulerState` calls it under its lock, and only there. No I/O besides the
log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from hami_plugin.extender.inflight_tracker import same_pod
from hami_plugin.protocol.mig import signed_mig_part
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingFields,
    BookingKeys,
)
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.trust import (
    BookingSeal,
    booking_seal,
    untrusted_booking,
    without_booking,
)

__all__ = ["BookingTrust"]

logger = logging.getLogger(__name__)


class BookingTrust:
    """The per-pod bookkeeping of which bookings count (see the module docstring).

    `keys` gives the current booking keys (None: trust every booking, as HAMi does); it is
    called on each verification and signature, so a rotated key file takes effect at once.
    Not thread-safe: the caller holds its own lock around every call.
    """

    def __init__(self, settings: SchedulerSettings, keys: Callable[[], BookingKeys] | None) -> None:
        self._settings = settings
        self._keys = keys
        # the untrusted pods as counted (without their booking), the booking of each pod
        # signed or verified by this process (UID, seal), the pods logged as ignored
        self._counted_views: dict[str, PodInfo] = {}
        self._sealed: dict[str, tuple[str, BookingSeal]] = {}
        self._ignored: dict[str, str] = {}  # pod key -> UID logged

    def counted(self, info: PodInfo) -> PodInfo:
        """The pod as the ledger and the in-flight view count it: itself, or without its
        booking when a booking key is set and the booking is not to be trusted
        (`scheduler.trust`). Remembered for `last_counted`."""
        key = info.key
        if self._keys is None:
            return info
        seal = booking_seal(info)
        if seal is None:
            self._counted_views.pop(key, None)
            return info
        sealed = self._sealed.get(key)
        known = sealed[1] if sealed is not None and sealed[0] == info.uid else None
        reason = untrusted_booking(info, self._keys(), self._settings, known=known)
        if reason is None:
            if seal != known:
                self._sealed[key] = (info.uid, seal)
            self._counted_views.pop(key, None)
            return info
        if self._ignored.get(key) != info.uid:
            self._ignored[key] = info.uid
            logger.warning(
                "pod %s: its GPU booking is ignored (counted as no booking): %s", key, reason
            )
        counted = without_booking(info)
        self._counted_views[key] = counted
        return counted

    def last_counted(self, pod: PodInfo) -> PodInfo:
        """The stored pod as its latest `counted` call gave it, not judged again (a standing
        booking was dropped and the pod's own annotations count again)."""
        return self._counted_views.get(pod.key, pod)

    def sign(self, key: str, uid: str, node: str, annotations: dict[str, str]) -> str:
        """With a key: add the booking signature to a bind's annotations (they hold the
        devices and the bind time), remember the booking as this process's own (its watch
        events count without a new HMAC) and return the signature. Without a key: "", the
        annotations untouched."""
        if self._keys is None:
            return ""
        fields = BookingFields(
            uid=uid,
            node=node,
            devices=annotations[ANNOTATION_DEVICES_ALLOCATED],
            bind_time=annotations[ANNOTATION_BIND_TIME],
            mig=signed_mig_part(annotations.get(ANNOTATION_VGPU_MIG_ALLOCATIONS)),
        )
        signature = self._keys().sign(fields)
        annotations[ANNOTATION_BOOKING_SIGNATURE] = signature
        self._sealed[key] = (uid, BookingSeal(fields, signature))
        return signature

    def bind_failed(self, key: str, annotations: Mapping[str, str]) -> None:
        """A bind with these annotations was rolled back: the booking it signed is no longer
        this process's own (should the revert not have reached the pod, its events are
        verified again)."""
        sealed = self._sealed.get(key)
        signature = annotations.get(ANNOTATION_BOOKING_SIGNATURE)
        if sealed is not None and signature is not None and sealed[1].signature == signature:
            del self._sealed[key]

    def pod_deleted(self, key: str, uid: str) -> None:
        """Forget what was remembered of the pod `key` of that UID (an unknown UID matches
        any); a successor's of the same name stays."""
        view = self._counted_views.get(key)
        if view is not None and same_pod(view.uid, uid):
            del self._counted_views[key]
        sealed = self._sealed.get(key)
        if sealed is not None and same_pod(sealed[0], uid):
            del self._sealed[key]
        if same_pod(self._ignored.get(key, ""), uid):
            self._ignored.pop(key, None)
