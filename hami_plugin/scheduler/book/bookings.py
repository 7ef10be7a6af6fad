"""Filter bookings: the GPUs a filter answer holds in memory until the bind's patch is seen.

Filter answers one node and books the pod's GPUs there in memory only (the annotations go out
in bind's one patch). A booking is FILTERED until bind starts (it expires after the booking
TTL, freed and counted), BINDING while a bind runs (never expires), BOUND once the Binding
succeeded, until the watch delivers the pod as patched.

A bind turns the booking into a `BindPlan` (what it writes), or a `BindRefusal` when there is
no booking to bind and the pod does not fit again (`Book.plan_bind`).

`Bookings` keeps them with their expiry queue and the relist check; part of the book, which
does what dropping a booking implies for the ledger and the in-flight pods.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable, ItemsView
from dataclasses import dataclass

from hami_plugin.protocol import inflight
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.model import LABEL_VGPU_NODE
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.filter import FilterResult
from hami_plugin.scheduler.fit import FitFailure

__all__ = ["BindPlan", "BindRefusal", "Booking", "BookingPhase", "Bookings"]


class BookingPhase(enum.Enum):
    FILTERED = "filtered"
    BINDING = "binding"
    BOUND = "bound"


@dataclass(frozen=True, slots=True)
class Booking:
    """One pod's booking; replaced (`dataclasses.replace`) as it moves through its phases."""

    key: str
    uid: str
    node: str
    result: FilterResult
    phase: BookingPhase
    expires: float
    """Monotonic time a FILTERED booking is freed."""
    bind_time: str = ""
    """`hami.io/bind-time` of the bind patch (BINDING/BOUND), to recognise its watch event."""
    signature: str = ""
    """The patch's `hami-plugin.io/booking-signature` (with a booking key), for the same."""
    allocated_text: str = ""
    """The patch's `hami.io/vgpu-devices-allocated`, for the same."""
    seen: bool = False
    """The watch has shown this pod (this UID). Until then, events of another UID under the
    same name are a predecessor's, still being delivered, not a sign the booking is stale."""
    token: int = 0
    """Stays the same through `replace`: the expiry queue and the relist check recognise a
    booking by it."""

    def shown_by(self, info: PodInfo) -> bool:
        """Does this pod event show the booking itself (the bind patch reached the watch)?
        Its devices and signature too: an author who writes the bind's node and time first
        does not end the booking before the patch lands."""
        if self.phase is BookingPhase.FILTERED:
            return False
        if self.phase is BookingPhase.BOUND and info.node_name:
            return True  # the Binding came after our patch
        shown = info.booking
        return (
            shown is not None
            and shown.bind_time == self.bind_time
            and shown.node == self.node
            and shown.allocated_text == self.allocated_text
            and (not self.signature or shown.signature == self.signature)
            and not shown.failed
        )


class Bookings:
    """Pod key -> standing booking, the FILTERED expiry queue and the bookings a relist did not
    show (see `mark_unshown`)."""

    def __init__(self) -> None:
        self._bookings: dict[str, Booking] = {}
        self._by_node: dict[str, set[str]] = {}  # node -> keys of the bookings there
        self._expiries: deque[Booking] = deque()  # FILTERED bookings, oldest first
        self._vanishing: dict[str, tuple[int, float]] = {}  # key -> (token, deadline)
        self._tokens = itertools.count(1)

    def get(self, key: str) -> Booking | None:
        return self._bookings.get(key)

    def items(self) -> ItemsView[str, Booking]:
        return self._bookings.items()

    def on_node(self, node: str) -> list[Booking]:
        """The standing bookings on `node`, in any phase."""
        return [self._bookings[key] for key in self._by_node.get(node, ())]

    def _store(self, booking: Booking) -> None:
        previous = self._bookings.get(booking.key)
        if previous is not None and previous.node != booking.node:
            self._unindex(previous)
        self._bookings[booking.key] = booking
        self._by_node.setdefault(booking.node, set()).add(booking.key)

    def _unindex(self, booking: Booking) -> None:
        keys = self._by_node.get(booking.node)
        if keys is not None:
            keys.discard(booking.key)
            if not keys:
                del self._by_node[booking.node]

    def book(
        self,
        key: str,
        uid: str,
        node: str,
        result: FilterResult,
        *,
        seen: bool,
        expires: float | None = None,
    ) -> Booking:
        """A new FILTERED booking with a fresh token. With `expires` it is stored and queued
        for expiry; without, the caller stores it (`put`) in the phase it moves it to."""
        booking = Booking(
            key=key,
            uid=uid,
            node=node,
            result=result,
            phase=BookingPhase.FILTERED,
            expires=0.0 if expires is None else expires,
            seen=seen,
            token=next(self._tokens),
        )
        if expires is not None:
            self._store(booking)
            self._expiries.append(booking)
        return booking

    def put(self, booking: Booking) -> None:
        """Store `booking` (a `replace` of the standing one, or one made by `book`)."""
        self._store(booking)

    def pop(self, key: str) -> Booking | None:
        booking = self._bookings.pop(key, None)
        if booking is not None:
            self._unindex(booking)
        return booking

    def expired(self, now: float) -> list[Booking]:
        """The FILTERED bookings whose time is past at monotonic `now` (still stored: the
        caller drops them)."""
        # FILTERED bookings are made in time order with one TTL, so they expire in the order
        # of `_expiries`; entries of bookings since replaced, bound or dropped are skipped.
        expired = []
        while self._expiries and self._expiries[0].expires <= now:
            queued = self._expiries.popleft()
            booking = self._bookings.get(queued.key)
            if (
                booking is not None
                and booking.token == queued.token
                and booking.phase is BookingPhase.FILTERED
            ):
                expired.append(booking)
        return expired

    def mark_unshown(self, deadline: float, shown: Callable[[Booking], bool]) -> None:
        """After a relist: every bound or binding booking whose pod the list did not show is
        checked again at `deadline` (`vanished`)."""
        for key, booking in self._bookings.items():
            if booking.phase is not BookingPhase.FILTERED and not shown(booking):
                self._vanishing[key] = (booking.token, deadline)

    def vanished(self, now: float, shown: Callable[[Booking], bool]) -> list[Booking]:
        """The bookings marked by `mark_unshown` whose pod has still not shown up at `now`
        (still stored: the caller drops them). A booking since replaced or shown is unmarked."""
        gone = []
        for key, (token, deadline) in list(self._vanishing.items()):
            booking = self._bookings.get(key)
            if booking is None or booking.token != token or shown(booking):
                del self._vanishing[key]
            elif deadline <= now:
                del self._vanishing[key]
                gone.append(booking)
        return gone


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What a bind writes, decided under the lock from the pod's booking.

    `annotations`/`labels` are the ONE pod patch; `in_flight` is the pod as the in-flight rules
    see it once patched (protocol nodes only); `needs_lock`: take HAMi's node lock first.
    """

    pod: PodInfo
    node: str
    annotations: dict[str, str]
    labels: dict[str, str]
    protocol: bool
    needs_lock: bool
    in_flight: inflight.InFlightPod | None
    rebooked: bool

    @classmethod
    def of(
        cls,
        pod: PodInfo,
        uid: str,
        node: str,
        result: FilterResult,
        annotations: dict[str, str],
        protocol: bool,
        rebooked: bool,
    ) -> BindPlan:
        """The plan for `pod` (UID `uid`) booked by `result` on `node`; `protocol`: the node's
        device plugin follows the allocate protocol (in-flight rules instead of a node lock)."""
        entry = None
        if protocol:
            created = inflight.created_seconds_of(pod.creation_timestamp)
            entry = inflight.InFlightPod.booked(
                pod.namespace, pod.name, created, result.devices, uid=uid, shape=result.shape
            )
        app_gpu = any(r is not None for r in result.requests.app_requests)
        return cls(
            pod=pod,
            node=node,
            annotations=annotations,
            labels={LABEL_VGPU_NODE: node},
            protocol=protocol,
            needs_lock=not protocol and app_gpu,
            in_flight=entry,
            rebooked=rebooked,
        )


@dataclass(frozen=True, slots=True)
class BindRefusal:
    """Why `plan_bind` has no plan: the pod's GPU annotation cannot be read
    (`annotation_error`), or the pod does not fit on `node` (`failure`: the node's fit failure,
    None when the decision named none, as for a pod that asks no GPU). The bind edge renders it."""

    pod: PodInfo
    node: str
    annotation_error: AnnotationError | None = None
    failure: FitFailure | None = None
