"""HAMi's node lock `hami.io/mutex.lock`, as decisions over values (docs/hami-reference.md 1.7).

HAMi's scheduler takes a node lock before it binds a pod, and the device plugin releases it
once the pod's Allocate is done (v2.10 `pkg/util/nodelock/nodelock.go`). The lock is one node
annotation, `<RFC3339 time>,<namespace>,<pod>`. This module is the one home of its rules: the
value's format (`parse_node_lock`, `format_node_lock`, `lock_value`), which pod holds it
(`held_by` on the text, `NodeLock.owned_by` once parsed), what a pod that wants it does
(`decide_lock`), whether a held lock is stale (`stale_lock`), and who may release it
(`releasable_by`). The API calls (GET, merge patch with `resourceVersion`, retries) stay in
the daemons' edges: the extender's bind and recovery loop, the device plugin's Allocate.

`decide_lock` follows `LockNode` (nodelock.go:241-291):

| lock value                                 | decision                              |
|--------------------------------------------|---------------------------------------|
| absent                                     | TAKE                                  |
| older than the timeout (legacy or not)     | TAKE_OVER (EXPIRED)                   |
| held by the requesting pod                 | REENTRANT                             |
| held by a pod that no longer exists        | TAKE_OVER (OWNER_GONE)                |
| held by a live pod, or a fresh legacy lock | CONTENTION (HAMi's message)           |
| unreadable                                 | TAKE_OVER (MALFORMED)                 |

Where HAMi differs: a lock it cannot parse makes its `LockNode` return the parse error, for
ever (nothing can expire or release an unreadable lock whose text has commas), so the node
never binds a GPU pod again; here it is taken over, logged by the caller. A legacy lock (the
time alone, written by HAMi before v2.5) names no owner, so, as in HAMi, it is honoured until
it expires.

Whether the owner still exists is only known through the API: `decide_lock` answers
CHECK_OWNER when it needs that answer, and the caller asks again with `owner_exists` set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from hami_plugin.protocol.codec import AnnotationError, check_annotation_size
from hami_plugin.protocol.govalues import format_go_duration, format_rfc3339, parse_rfc3339
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK

__all__ = [
    "CONTENTION_SUFFIX",
    "LockAction",
    "LockDecision",
    "LockRelease",
    "NodeLock",
    "TakeoverReason",
    "contention_message",
    "decide_lock",
    "format_node_lock",
    "held_by",
    "lock_value",
    "parse_node_lock",
    "releasable_by",
    "stale_lock",
]

CONTENTION_SUFFIX = "node lock contention"
"""The text of HAMi's `ErrNodeLockContention` (nodelock.go:46)."""


@dataclass(frozen=True, slots=True)
class LockRelease:
    """A node lock to release: the lock `value` on `node`, held by pod `namespace/name`."""

    node: str
    namespace: str
    name: str
    value: str


# --- the value ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeLock:
    """Value of `hami.io/mutex.lock`: `<RFC3339 time>,<namespace>,<pod>`.

    A legacy lock carries only the time; then `namespace` and `pod_name` are None.
    """

    time: datetime
    namespace: str | None = None
    pod_name: str | None = None

    def owned_by(self, namespace: str, pod_name: str) -> bool:
        """True when pod `namespace/pod_name` holds this lock (a legacy lock: no pod does).

        The parsed reading, as HAMi's `LockNode` compares the owner; `held_by` is the textual
        one of its `ReleaseNodeLock`. HAMi has both, and they differ only on values the parse
        refuses, so each side keeps HAMi's."""
        return self.namespace == namespace and self.pod_name == pod_name


def parse_node_lock(value: str) -> NodeLock:
    """`<RFC3339>,<namespace>,<pod>` or the legacy `<RFC3339>` alone (HAMi's `ParseNodeLock`).

    Raises AnnotationError naming `hami.io/mutex.lock` and the bad part.
    """
    key = ANNOTATION_NODE_LOCK
    check_annotation_size(key, value)
    parts = value.split(",")
    if len(parts) not in (1, 3):
        raise AnnotationError(
            key, f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}"
        )
    try:
        when = parse_rfc3339(parts[0])
    except ValueError as error:
        raise AnnotationError(key, str(error)) from None
    if len(parts) == 1:
        return NodeLock(when)
    return NodeLock(when, parts[1], parts[2])


def format_node_lock(lock: NodeLock) -> str:
    """The value HAMi's scheduler writes; a legacy lock (no owner) is the time alone."""
    text = format_rfc3339(lock.time)
    if lock.namespace is None or lock.pod_name is None:
        return text
    return f"{text},{lock.namespace},{lock.pod_name}"


def lock_value(now: datetime, namespace: str, pod_name: str) -> str:
    """The value HAMi's scheduler writes (`GenerateNodeLockKeyByPod`): `now` in RFC 3339 in
    its own zone (HAMi writes the scheduler's local time), then the owner."""
    return format_node_lock(NodeLock(now, namespace, pod_name))


# --- the decisions -----------------------------------------------------------------------------


class LockAction(enum.StrEnum):
    """What the caller does with the lock."""

    TAKE = "take"
    """No lock: write ours (merge patch with the node's resourceVersion)."""
    REENTRANT = "reentrant"
    """The requesting pod already holds it: nothing to write."""
    TAKE_OVER = "take_over"
    """Delete the stale lock (only if it is still the value read), then write ours."""
    CONTENTION = "contention"
    """Another pod holds it: wait or fail with `LockDecision.message`."""
    CHECK_OWNER = "check_owner"
    """Ask again with `owner_exists`: does the pod named by `LockDecision.lock` exist?"""


class TakeoverReason(enum.StrEnum):
    """Why a held lock may be taken over (also the recovery's metric label)."""

    EXPIRED = "lock_expired"
    OWNER_GONE = "owner_gone"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class LockDecision:
    """One decision. `lock` is the parsed current value (None when absent or unreadable);
    `message` is HAMi's contention error, or why a lock is taken over."""

    action: LockAction
    lock: NodeLock | None = None
    reason: TakeoverReason | None = None
    message: str = ""


def decide_lock(
    node: str,
    value: str | None,
    now: datetime,
    timeout: timedelta,
    namespace: str,
    pod_name: str,
    owner_exists: bool | None = None,
) -> LockDecision:
    """What pod `namespace/pod_name` does about node `node`'s lock `value` at `now`.

    `now` and the lock time are compared as instants (time-zone aware `now`). A lock is
    expired when it is older than `timeout` (strictly, as HAMi's `time.Since(t) > timeout`).
    """
    if value is None:
        return LockDecision(LockAction.TAKE)
    return _held_lock(node, value, now, timeout, owner_exists, (namespace, pod_name))


def stale_lock(
    node: str,
    value: str,
    now: datetime,
    timeout: timedelta,
    owner_exists: bool | None = None,
) -> LockDecision:
    """The recovery loop's view of a held lock, with no pod asking for it: TAKE_OVER (release
    it) when it is unreadable, older than `timeout` or its owner pod is gone, CHECK_OWNER when
    the answer depends on the owner, else CONTENTION (leave it)."""
    return _held_lock(node, value, now, timeout, owner_exists, None)


def _held_lock(
    node: str,
    value: str,
    now: datetime,
    timeout: timedelta,
    owner_exists: bool | None,
    requester: tuple[str, str] | None,
) -> LockDecision:
    """The rules on a lock that is there, for a requesting pod (bind) or for none (recovery):
    unreadable or expired locks go, the requester's own lock is re-entrant (HAMi checks expiry
    first), a lock whose owner pod is gone goes, anything else is contention."""
    verb = "taken over" if requester is not None else "released"
    try:
        lock = parse_node_lock(value)
    except AnnotationError as error:
        return LockDecision(
            LockAction.TAKE_OVER,
            reason=TakeoverReason.MALFORMED,
            message=f"node {node}: unreadable lock {value!r} {verb} ({error.detail})",
        )
    if now - lock.time > timeout:
        return LockDecision(
            LockAction.TAKE_OVER,
            lock,
            TakeoverReason.EXPIRED,
            f"node {node}: lock {value!r} older than {format_go_duration(timeout)} {verb}",
        )
    if requester is not None and lock.owned_by(*requester):
        return LockDecision(LockAction.REENTRANT, lock)
    # HAMi checks the owner only when the lock names one (nodelock.go:270).
    if lock.namespace and lock.pod_name:
        if owner_exists is None:
            return LockDecision(LockAction.CHECK_OWNER, lock)
        if not owner_exists:
            return LockDecision(
                LockAction.TAKE_OVER,
                lock,
                TakeoverReason.OWNER_GONE,
                f"node {node}: lock of deleted pod {lock.namespace}/{lock.pod_name} {verb}",
            )
    message = contention_message(node, timeout) if requester is not None else ""
    return LockDecision(LockAction.CONTENTION, lock, message=message)


def contention_message(node: str, timeout: timedelta) -> str:
    """HAMi's error for a lock held by another live pod (nodelock.go:290)."""
    return f"node {node} has been locked within {format_go_duration(timeout)}: {CONTENTION_SUFFIX}"


def held_by(value: str | None, namespace: str, pod_name: str) -> bool:
    """True when the lock `value` names pod `namespace/pod_name`, read on the text as HAMi's
    `ReleaseNodeLock` does (nodelock.go:196): it ends with `,<namespace>,<pod>`. A legacy lock
    (the time alone) is held by no pod."""
    return value is not None and value.endswith(f",{namespace},{pod_name}")


def releasable_by(value: str | None, namespace: str, pod_name: str) -> bool:
    """True when pod `namespace/pod_name` may delete the lock `value` without forcing it
    (HAMi's `ReleaseNodeLock` owner check, nodelock.go:196). Decided on the text, as HAMi
    does, so that an unreadable lock cannot stay for ever: a value with commas belongs to the
    pod it ends with (`,<ns>,<name>`); one without (a legacy timestamp, or garbage) to nobody,
    so whoever finishes releases it."""
    if not value:
        return False
    return "," not in value or held_by(value, namespace, pod_name)
