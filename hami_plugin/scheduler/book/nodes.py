"""The nodes the scheduler sees: their GPUs registered while healthy, their locks and handshakes.

HAMi's registration step for each node (CheckHealth, then the register annotation read into
the ledger), the nodes as the watch last showed them (only those matching
`--node-label-selector`), the handshakes CheckHealth asks the leader to write, and what the
node lock annotation on a node says for the recovery loop.

Part of the book: not thread-safe, no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from hami_plugin.protocol import inflight
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.protocol.nodelock import held_by
from hami_plugin.protocol.objects import NodeInfo, ObjectError
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURES
from hami_plugin.scheduler.health import NodeHealthTracker
from hami_plugin.scheduler.ledger import Ledger

__all__ = ["NodeRegistry"]

logger = logging.getLogger(__name__)

_WATCHED_BY_BINDS = (ANNOTATION_NODE_LOCK, inflight.ANNOTATION_ALLOCATE_PROTOCOL)
"""Node annotations a waiting bind must hear about when they change."""


class NodeRegistry:
    """Node name -> last seen `NodeInfo`, with the health verdicts and pending handshakes;
    registers and unregisters the nodes' GPUs in `ledger`."""

    def __init__(
        self, ledger: Ledger, health: NodeHealthTracker, selector: Mapping[str, str]
    ) -> None:
        self._ledger = ledger
        self._health = health
        self.selector = dict(selector)
        self._nodes: dict[str, NodeInfo] = {}
        self._handshakes: dict[str, str | None] = {}

    def get(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def selected(self, info: NodeInfo) -> bool:
        """The node matches `--node-label-selector`."""
        return all(info.labels.get(k) == v for k, v in self.selector.items())

    def allocate_protocol_level(self, name: str) -> int:
        """`inflight.protocol_level` of the node's device plugin: 0 (HAMi's node lock), 1 or 2."""
        info = self._nodes.get(name)
        if info is None:
            return 0
        return inflight.protocol_level(info.annotations.get(inflight.ANNOTATION_ALLOCATE_PROTOCOL))

    def booking_signatures(self, name: str) -> str | None:
        """The node's `hami-plugin.io/booking-signatures` (the versions its device plugin
        verifies) as the watch last showed it."""
        info = self._nodes.get(name)
        return None if info is None else info.annotations.get(ANNOTATION_BOOKING_SIGNATURES)

    def lock_value(self, name: str) -> str | None:
        """The node's `hami.io/mutex.lock` as the watch last showed it."""
        info = self._nodes.get(name)
        return None if info is None else info.annotations.get(ANNOTATION_NODE_LOCK)

    def locked(self) -> list[NodeInfo]:
        """Nodes whose last seen version carries `hami.io/mutex.lock`."""
        return [n for n in self._nodes.values() if ANNOTATION_NODE_LOCK in n.annotations]

    def lock_held_by(self, node: str, namespace: str, name: str) -> str | None:
        """The lock value on `node` when pod `namespace/name` holds it, else None."""
        if not node:
            return None
        info = self._nodes.get(node)
        if info is None:
            return None
        value = info.annotations.get(ANNOTATION_NODE_LOCK)
        if held_by(value, namespace, name):
            return value
        return None

    def upsert(self, info: NodeInfo, now: datetime) -> bool:
        """A selected node was added or changed: judge it at `now`. Returns whether its lock
        or allocate-protocol annotation changed (waiting binds must look again)."""
        previous = self._nodes.get(info.name)
        self._nodes[info.name] = info
        self._judge(info, now)
        before = previous.annotations if previous is not None else {}
        return any(before.get(key) != info.annotations.get(key) for key in _WATCHED_BY_BINDS)

    def _judge(self, info: NodeInfo, now: datetime) -> None:
        """HAMi's registration step for one node (docs/hami-reference.md 3.2): CheckHealth, then
        forget the GPUs of an unhealthy node (and delete its handshake, NodeCleanUp), or read them
        again when the verdict asks for it. A node HAMi would not read again keeps what it has;
        reading an unchanged register annotation again is free, and picks up a change of
        `hami.io/device-cordon`."""
        verdict = self._health.check(info, now)
        name = info.name
        if verdict.write_handshake is not None:
            self._handshakes[name] = verdict.write_handshake
        if not verdict.healthy:
            if name in self._ledger:
                logger.warning("node %s is unhealthy: its GPUs are not scheduled", name)
                self._ledger.remove_node(name)
                self._health.forget(name)
                self._handshakes[name] = None
            return
        if verdict.need_update or name in self._ledger:
            try:
                self._ledger.update_node(info)
            except ObjectError as error:
                logger.warning("node %s not registered: %s", name, error)
                self._ledger.remove_node(name)

    def delete(self, name: str) -> None:
        """A node was deleted (or left the label selector): forget it and its GPUs."""
        self._nodes.pop(name, None)
        self._handshakes.pop(name, None)
        self._health.forget(name)
        self._ledger.remove_node(name)

    def recheck(self, now: datetime) -> None:
        """Judge every node again at `now`."""
        for info in list(self._nodes.values()):
            self._judge(info, now)

    def take_handshakes(self) -> dict[str, str | None]:
        """Node -> handshake value to write (None: delete it), and forget them."""
        pending, self._handshakes = self._handshakes, {}
        return pending
