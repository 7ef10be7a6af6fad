"""HAMi's node lock through the API: compare-and-patch of a node annotation, and the one lock
release both daemons use (docs/design.md 6; the rules about the value are
`hami_plugin.protocol.nodelock`'s).

`compare_and_patch` reads the node, decides from the annotation's current value and
merge-patches it with the node's resourceVersion as precondition, so nothing written since the
read is overwritten; a Conflict (a heartbeat, another writer) reads the node again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hami_plugin.kube.api import NodeApi
from hami_plugin.kube.errors import Conflict, NotFound
from hami_plugin.kube.retry import CONFLICT_RETRIES, RetryPolicy
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.protocol.nodelock import releasable_by
from hami_plugin.protocol.objects import NodeInfo

__all__ = [
    "Keep",
    "KeptChanging",
    "Patched",
    "Write",
    "compare_and_patch",
    "release_node_lock",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Keep(Generic[_T]):
    """Leave the annotation as it is; `compare_and_patch` answers `answer`."""

    answer: _T


@dataclass(frozen=True, slots=True)
class Write(Generic[_T]):
    """Set the annotation to `value` (None deletes it); once that is written,
    `compare_and_patch` answers `answer`."""

    value: str | None
    answer: _T


@dataclass(frozen=True, slots=True)
class Patched(Generic[_T]):
    """What `compare_and_patch` did: the decision's `answer`, the value it was made on, and
    whether the new value was written."""

    answer: _T
    seen: str | None
    written: bool


class KeptChanging(Conflict):
    """Every attempt of a compare-and-patch lost its race; `seen` is the value last read."""

    def __init__(self, message: str, seen: str | None) -> None:
        super().__init__(message, 409)
        self.seen = seen


def compare_and_patch(
    api: NodeApi,
    node: str,
    key: str,
    decide: Callable[[str | None], Keep[_T] | Write[_T]],
    *,
    what: str,
    read: NodeInfo | None = None,
    retry: RetryPolicy = CONFLICT_RETRIES,
) -> Patched[_T]:
    """Read node `node` (the first attempt starts from `read` when given), `decide` from its
    annotation `key`, and write the decision with the node's resourceVersion as precondition;
    each Conflict reads the node again, for `retry.attempts` attempts in all.

    Raises KeptChanging when every attempt conflicted (the message: "node <node>: <what>,
    the node kept changing"), NotFound when the node is gone, any other KubeError of the API,
    and what `decide` raises.
    """
    seen: str | None = None
    for _ in retry.tries():
        record = read if read is not None else api.get_node(node)
        read = None
        seen = record.annotations.get(key)
        decision = decide(seen)
        if isinstance(decision, Keep):
            return Patched(decision.answer, seen, written=False)
        try:
            api.patch_node_annotations(
                node, {key: decision.value}, resource_version=record.resource_version
            )
        except Conflict:
            continue
        return Patched(decision.answer, seen, written=True)
    raise KeptChanging(f"node {node}: {what}, the node kept changing", seen)


def release_node_lock(
    api: NodeApi,
    node: str,
    namespace: str,
    name: str,
    *,
    expected: str | None = None,
    read: NodeInfo | None = None,
    retry: RetryPolicy = CONFLICT_RETRIES,
) -> bool:
    """Delete node `node`'s lock by compare-and-patch (from `read`, the node as already read,
    when given).

    Without `expected`, only a lock that pod `namespace/name` may release (HAMi's owner
    check, `releasable_by`); with it, only that very value (a forced release of a stale lock).
    Returns True when a lock was deleted, False when there was none to delete or the node is
    gone. Raises KeptChanging or another KubeError when the API keeps failing.
    """

    def decide(value: str | None) -> Keep[bool] | Write[bool]:
        ours = releasable_by(value, namespace, name) if expected is None else value == expected
        return Write(None, True) if value is not None and ours else Keep(False)

    try:
        patched = compare_and_patch(
            api,
            node,
            ANNOTATION_NODE_LOCK,
            decide,
            what="lock not released",
            read=read,
            retry=retry,
        )
    except NotFound:
        return False
    if patched.written:
        logger.info("node %s: lock %r released", node, patched.seen)
    return patched.answer
