"""Is a node's NVIDIA device plugin alive? HAMi v2.10's `CheckHealth`, as pure rules.

HAMi's scheduler asks this of every node on each registration pass (docs/hami-reference.md 3.2); an
unhealthy node loses its GPUs (`node unregistered` in the filter). Two pieces, both from v2.10:

* The handshake (`pkg/device/devices.go` CheckHealth, lines 576-615; docs/hami-reference.md 1.6). A
  value containing `Requesting` is judged by the time after its first `_`, Go layout
  `2006-01-02 15:04:05` read strictly (unparsable: healthy): younger than 60 s, healthy; older,
  healthy only while the node's allocatable `nvidia.com/gpu` is above 0. Any other value
  (absent, `Reported ...`, `Deleted_...`, garbage) gets `Requesting_<now>` written over it and
  is healthy, with `need_update`.
* The allocatable count and register text remembered per node (`pkg/device/nvidia/device.go`
  CheckHealth, lines 234-272): `NodeHealthTracker`. A count that drops to 0 makes the node
  unhealthy once; a count that changes, or a register annotation whose text changes, asks for
  the node's devices to be read again (`need_update`).

Time: the handshake carries a wall-clock time without a zone, which HAMi writes and reads in
the scheduler's local time. Here it is read and written in the zone of the `now` passed in
(pass `datetime.now().astimezone()` for HAMi's behaviour; HAMi's image sets no zone, so that is
usually UTC). The 60 s are compared as instants when `now` is aware.

Not modelled: HAMi returns `need_update` False when its GET of the node before writing the
handshake fails; the caller that writes `write_handshake` knows whether it could.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_UP

from hami_plugin.protocol.codec import format_handshake_requesting
from hami_plugin.protocol.model import (
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_REGISTER,
    RESOURCE_GPU,
)
from hami_plugin.protocol.objects import NodeInfo
from hami_plugin.protocol.quantity import QuantityError, parse_quantity

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "HealthVerdict",
    "NodeHealthTracker",
    "allocatable_count",
    "check_node_health",
    "handshake_verdict",
    "parse_requesting_time",
]

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = timedelta(seconds=60)
"""A `Requesting_` handshake younger than this keeps a node healthy (devices.go:587)."""

_REQUESTING = "Requesting"
# Go's time.DateTime layout as time.Parse reads it (checked against Go's own parser): 4-digit
# year, 2-digit month and day, a 1- or 2-digit hour ("15" is not zero-padded), 2-digit minute
# and second, then an optional fraction ("." or "," and digits) and nothing else.
_GO_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]+))?"
)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    """What HAMi's CheckHealth answers for one node.

    `healthy` False: forget the node's GPUs (and delete its handshake, HAMi's NodeCleanUp).
    `need_update`: read the node's devices again from its register annotation (False: keep
    what is registered; a node not yet registered stays so). `write_handshake`: the value to
    patch into `hami.io/node-handshake` first, or None.
    """

    healthy: bool
    need_update: bool
    write_handshake: str | None = None


def parse_requesting_time(text: str) -> datetime | None:
    """The time in the text after `Requesting_`, read as Go's `time.Parse(time.DateTime, ...)`
    reads it; None when Go would fail. Naive (the zone is the reader's, see the module).
    Year 0 (Go accepts `0000`, Python has no such year) comes back as `datetime.min`."""
    match = _GO_DATE_TIME.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(group) for group in match.groups()[:6])
    fraction = match.group(7) or ""
    micros = int(fraction[:6].ljust(6, "0"))
    try:
        if year == 0:
            # Go still range-checks the rest; year 0 is a leap year, as year 4 is
            datetime(4, month, day, hour, minute, second)
            return datetime.min
        return datetime(year, month, day, hour, minute, second, micros)
    except ValueError:
        return None


def allocatable_count(node: NodeInfo, resource: str = RESOURCE_GPU) -> int:
    """`status.allocatable[resource]` as Go's `Quantity.Value()`: rounded up, away from 0;
    0 when absent. Raises QuantityError for a value that is not a quantity."""
    value = node.allocatable.get(resource)
    if value is None:
        return 0
    if not isinstance(value, (str, int, float)):
        raise QuantityError(f"invalid quantity {value!r}: not a string")
    amount = parse_quantity(value)
    if amount.is_zero():
        return 0
    if amount.adjusted() > 18:  # beyond int64: saturate rather than build a huge int
        return _INT64_MAX if amount > 0 else -_INT64_MAX - 1
    count = int(amount.to_integral_value(rounding=ROUND_UP))
    return max(-_INT64_MAX - 1, min(_INT64_MAX, count))


def _expired(written: datetime, now: datetime) -> bool:
    # Differences, not sums: a time near year 1 or 9999 must not overflow. An aware `now`
    # reads the handshake in its own zone and compares instants.
    if now.tzinfo is None:
        return now - written >= HANDSHAKE_TIMEOUT
    age = now.timestamp() - written.replace(tzinfo=now.tzinfo).timestamp()
    return age >= HANDSHAKE_TIMEOUT.total_seconds()


def handshake_verdict(value: str | None, allocatable: int, now: datetime) -> HealthVerdict:
    """HAMi's handshake evaluation (devices.go CheckHealth) of `hami.io/node-handshake`
    (`value`, None when absent) with the node's allocatable GPU count."""
    if value is None or _REQUESTING not in value:
        return HealthVerdict(True, True, format_handshake_requesting(now))
    _, underscore, text = value.partition("_")
    written = parse_requesting_time(text) if underscore else None
    if written is None or not _expired(written, now):
        return HealthVerdict(True, False)
    # expired: the device plugin stopped answering, unless kubelet still sees its GPUs
    return HealthVerdict(allocatable > 0, False)


def _allocatable_or_zero(node: NodeInfo, resource: str) -> int:
    try:
        return allocatable_count(node, resource)
    except QuantityError as error:
        logger.warning("node %s: allocatable %s read as 0: %s", node.name, resource, error)
        return 0


class NodeHealthTracker:
    """HAMi's NVIDIA CheckHealth (nvidia/device.go:234-272): the handshake verdict, overruled
    by the allocatable count and the register annotation last seen per node.

    Not thread-safe: the caller serialises checks (HAMi holds a mutex around the same maps).
    """

    def __init__(self, resource: str = RESOURCE_GPU) -> None:
        self._resource = resource
        self._counts: dict[str, int] = {}  # HAMi's ReportedGPUNum
        self._registers: dict[str, str] = {}  # HAMi's ReportedRegisterAnnos

    def check(self, node: NodeInfo, now: datetime) -> HealthVerdict:
        """Judge the node at `now` and remember what HAMi remembers."""
        name = node.name
        current = _allocatable_or_zero(node, self._resource)
        reported = self._counts.get(name, 0)
        handshake = handshake_verdict(node.annotations.get(ANNOTATION_NODE_HANDSHAKE), current, now)
        register = node.annotations.get(ANNOTATION_NODE_REGISTER, "")
        if current == 0:
            if reported == 0:
                return handshake
            # kubelet stopped reporting the GPUs: unhealthy once, then the handshake decides
            self._remember(name, current, register)
            return HealthVerdict(False, handshake.need_update, handshake.write_handshake)
        if reported != current:
            self._remember(name, current, register)
            return HealthVerdict(True, True, handshake.write_handshake)
        if self._registers.get(name, "") != register:
            self._registers[name] = register
            return HealthVerdict(handshake.healthy, True, handshake.write_handshake)
        return handshake

    def forget(self, name: str) -> None:
        """The node was deleted or cleaned up (HAMi's NodeDeleted): start afresh."""
        self._counts.pop(name, None)
        self._registers.pop(name, None)

    def _remember(self, name: str, count: int, register: str) -> None:
        self._counts[name] = count
        self._registers[name] = register


def check_node_health(node: NodeInfo, now: datetime, resource: str = RESOURCE_GPU) -> HealthVerdict:
    """The verdict of a scheduler that has not seen the node before (the dry run): healthy
    unless the allocatable GPU count is 0 (or absent) and a `Requesting_` handshake is at
    least 60 s old at `now`."""
    return NodeHealthTracker(resource).check(node, now)
