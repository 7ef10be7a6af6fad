"""Capacity held for preemptors: what victims free goes to the pod they were taken for.

From the moment victims are chosen until the preemptor is bound or gone, its planned GPUs on
the node count in the ledger under a key of their own (`hold_key`), so a pod of equal or lower
priority fits around them, never on them (kube-scheduler's rule for nominated pods,
`RunFilterPluginsWithNominatedPods`: a nominated pod of priority >= the pod's counts as
placed). The preemptor itself and pods of higher priority are decided with the hold lifted
(`lift`). While victims terminate they still count too: the GPU is then booked twice over, so
nothing else lands there and the preemptor does not fit before they are gone.

A hold is rebuilt from the pod alone after a restart or on a standby (`status.nominatedNodeName`
names the node; what the victims still terminating free is what it holds), so it survives a
leader change; `confirmed` records that the watch showed the nomination, after which a cleared
nomination ends the hold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.ledger import Ledger, TrackedPod

__all__ = ["HOLD_PREFIX", "Hold", "Holds", "hold_key", "is_hold_key"]

HOLD_PREFIX = "preemption-hold:"
"""Ledger keys of holds; no pod key (`<namespace>/<name>`) starts like this."""


def hold_key(pod_key: str) -> str:
    return HOLD_PREFIX + pod_key


def is_hold_key(key: str) -> bool:
    return key.startswith(HOLD_PREFIX)


@dataclass(frozen=True, slots=True)
class Hold:
    """Capacity held on `node` for the pod `key` (UID `uid`, priority `priority`), freed by
    `victims` (pod keys)."""

    key: str
    uid: str
    node: str
    priority: int
    victims: tuple[str, ...] = ()
    victim_uids: frozenset[str] = frozenset()
    confirmed: bool = False


class Holds:
    """The standing holds and the ledger entries that make them count. Not thread-safe."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def get(self, key: str) -> Hold | None:
        return self._holds.get(key)

    def all(self) -> list[Hold]:
        return [self._holds[key] for key in sorted(self._holds)]

    def place(
        self, hold: Hold, tallies: tuple[DeviceTally, ...], mig: tuple[MigAllocation, ...] = ()
    ) -> None:
        """Hold `tallies` on the hold's node for its pod, replacing what it held before."""
        self._holds[hold.key] = hold
        self._ledger.track(hold_key(hold.key), hold.node, tallies, mig=mig)

    def confirm(self, key: str) -> None:
        hold = self._holds.get(key)
        if hold is not None and not hold.confirmed:
            self._holds[key] = replace(hold, confirmed=True)

    def drop(self, key: str) -> Hold | None:
        hold = self._holds.pop(key, None)
        if hold is not None:
            self._ledger.untrack(hold_key(key))
        return hold

    def preempting(self) -> set[str]:
        """The pod keys some hold took as victims (being evicted, or terminating)."""
        return {victim for hold in self._holds.values() for victim in hold.victims}

    def lift(self, pod_key: str, priority: int) -> list[tuple[Hold, TrackedPod]]:
        """Take out of the ledger the holds that do not apply to a pod of `priority` (its own,
        and those of lower priority); `restore` puts them back."""
        lifted = []
        for hold in self._holds.values():
            if hold.key != pod_key and hold.priority >= priority:
                continue
            tracked = self._ledger.tracked(hold_key(hold.key))
            if tracked is not None:
                self._ledger.untrack(tracked.key)
                lifted.append((hold, tracked))
        return lifted

    def restore(self, lifted: list[tuple[Hold, TrackedPod]]) -> None:
        """Put lifted holds back, those still standing unchanged (a hold dropped or placed anew
        meanwhile is not)."""
        for hold, tracked in lifted:
            if self._holds.get(hold.key) is hold:
                self._ledger.track(
                    tracked.key, tracked.node, tracked.tallies, tracked.app_only, tracked.mig
                )
