"""HAMi's node lock: its value's format and its rules (v2.10 nodelock.go), one table each."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.nodelock import (
    LockAction,
    NodeLock,
    TakeoverReason,
    decide_lock,
    format_node_lock,
    held_by,
    lock_value,
    parse_node_lock,
    releasable_by,
    stale_lock,
)

NOW = datetime(2026, 7, 3, 12, 0, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=5)


def _stamp(age: timedelta) -> str:
    return (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the value's format ------------------------------------------------------------------------

_PLUS8 = timezone(timedelta(hours=8))


@pytest.mark.parametrize(
    ("value", "lock"),
    [
        (
            "2024-05-10T08:01:02Z,default,gpu-pod",
            NodeLock(datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC), "default", "gpu-pod"),
        ),
        (
            "2026-07-03T15:35:10+08:00,ns,name",
            NodeLock(datetime(2026, 7, 3, 15, 35, 10, tzinfo=_PLUS8), "ns", "name"),
        ),
        # legacy (HAMi before v2.5): the time alone, no owner
        ("2024-05-10T08:01:02Z", NodeLock(datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC))),
    ],
)
def test_lock_values_parse_and_format_back(value: str, lock: NodeLock) -> None:
    parsed = parse_node_lock(value)
    assert parsed == lock
    assert parsed.time.utcoffset() == lock.time.utcoffset()
    assert format_node_lock(parsed) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a,b", "malformed lock annotation: expected 3 parts, got 2 from a,b"),
        ("t,ns,pod,extra", "malformed lock annotation: expected 3 parts, got 4"),
        ("yesterday,ns,pod", "not RFC3339"),
        ("", "not RFC3339"),
        ("x" * (256 * 1024 + 1), "exceeds the 262144-byte limit"),
    ],
)
def test_unreadable_lock_values(value: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=message) as raised:
        parse_node_lock(value)
    assert raised.value.key == "hami.io/mutex.lock"


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=0)),
    st.integers(-14 * 60, 14 * 60),
)
def test_node_lock_round_trip(when: datetime, offset_minutes: int) -> None:
    local = when.astimezone(timezone(timedelta(minutes=offset_minutes)))
    text = format_node_lock(NodeLock(local, "ns", "pod"))
    assert parse_node_lock(text) == NodeLock(local, "ns", "pod")
    assert format_node_lock(parse_node_lock(text)) == text


@given(st.text(max_size=300))
def test_hostile_values_raise_only_annotation_error(value: str) -> None:
    with contextlib.suppress(AnnotationError):
        parse_node_lock(value)


def test_lock_value_round_trips() -> None:
    lock = parse_node_lock(lock_value(NOW, "ns", "pod-a"))
    assert (lock.time, lock.namespace, lock.pod_name) == (NOW, "ns", "pod-a")


# --- who holds it ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lock", "holder"),
    [
        (NodeLock(NOW, "default", "me"), True),
        (NodeLock(NOW, "default", "other"), False),
        (NodeLock(NOW, "other-ns", "me"), False),
        (NodeLock(NOW), False),  # legacy: no pod holds it
    ],
)
def test_owned_by(lock: NodeLock, holder: bool) -> None:
    assert lock.owned_by("default", "me") is holder


@pytest.mark.parametrize(
    ("value", "held"),
    [
        (None, False),
        ("", False),
        ("2026-07-03T12:00:00Z,default,me", True),
        ("2026-07-03T12:00:00Z,default,other", False),
        ("2026-07-03T12:00:00Z,default,xme", False),
        ("2026-07-03T12:00:00Z", False),  # legacy: held by no pod (yet anyone may release it)
        ("garbage,default,me", True),
        ("garbage", False),
    ],
)
def test_held_by(value: str | None, held: bool) -> None:
    assert held_by(value, "default", "me") is held


# --- a pod that wants it (bind) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "owner_exists", "action", "reason"),
    [
        (None, None, LockAction.TAKE, None),
        (f"{_stamp(timedelta(seconds=10))},default,me", None, LockAction.REENTRANT, None),
        (f"{_stamp(timedelta(seconds=10))},default,other", None, LockAction.CHECK_OWNER, None),
        (f"{_stamp(timedelta(seconds=10))},default,other", True, LockAction.CONTENTION, None),
        (
            f"{_stamp(timedelta(seconds=10))},default,other",
            False,
            LockAction.TAKE_OVER,
            TakeoverReason.OWNER_GONE,
        ),
        # expiry wins before the owner is even looked at (nodelock.go:256)
        (
            f"{_stamp(timedelta(minutes=5, seconds=1))},default,other",
            None,
            LockAction.TAKE_OVER,
            TakeoverReason.EXPIRED,
        ),
        # exactly the timeout is not expired: HAMi compares with `>`
        (f"{_stamp(TIMEOUT)},default,other", True, LockAction.CONTENTION, None),
        # a fresh legacy lock names no owner: honoured until it expires, as HAMi does
        (_stamp(timedelta(seconds=10)), None, LockAction.CONTENTION, None),
        (_stamp(timedelta(minutes=6)), None, LockAction.TAKE_OVER, TakeoverReason.EXPIRED),
        # unreadable: HAMi fails every bind for ever; taken over here
        ("garbage,x", None, LockAction.TAKE_OVER, TakeoverReason.MALFORMED),
        ("not-a-time,default,p", None, LockAction.TAKE_OVER, TakeoverReason.MALFORMED),
        ("", None, LockAction.TAKE_OVER, TakeoverReason.MALFORMED),
        # a lock with an empty owner part has no owner to check
        (f"{_stamp(timedelta(seconds=10))},,", None, LockAction.CONTENTION, None),
    ],
)
def test_decide_lock_table(
    value: str | None,
    owner_exists: bool | None,
    action: LockAction,
    reason: TakeoverReason | None,
) -> None:
    decision = decide_lock("n1", value, NOW, TIMEOUT, "default", "me", owner_exists)
    assert decision.action is action
    assert decision.reason is reason


def test_contention_message_is_hamis() -> None:
    value = f"{_stamp(timedelta(seconds=1))},default,other"
    decision = decide_lock("gpu-1", value, NOW, TIMEOUT, "default", "me", owner_exists=True)
    assert decision.message == "node gpu-1 has been locked within 5m0s: node lock contention"


def test_lock_in_another_zone_compares_as_an_instant() -> None:
    plus8 = timezone(timedelta(hours=8))
    value = lock_value(NOW.astimezone(plus8) - timedelta(minutes=4), "default", "other")
    assert value.startswith("2026-07-03T19:56:00+08:00,")
    decision = decide_lock("n", value, NOW, TIMEOUT, "default", "me", owner_exists=True)
    assert decision.action is LockAction.CONTENTION


_names = st.text(alphabet="abcdefghij-", min_size=1, max_size=6)


@given(
    age_seconds=st.integers(min_value=-600, max_value=3600),
    owner=st.tuples(_names, _names),
    me=st.tuples(_names, _names),
    exists=st.booleans(),
    timeout_seconds=st.integers(min_value=1, max_value=900),
)
def test_decisions_never_steal_a_live_fresh_lock(
    age_seconds: int,
    owner: tuple[str, str],
    me: tuple[str, str],
    exists: bool,
    timeout_seconds: int,
) -> None:
    """Whatever the inputs: a fresh lock of another live pod is contention, never taken; an
    expired or orphaned one is taken over; the owner is only looked up when it matters."""
    timeout = timedelta(seconds=timeout_seconds)
    value = lock_value(NOW - timedelta(seconds=age_seconds), *owner)
    first = decide_lock("n", value, NOW, timeout, *me)
    expired = age_seconds > timeout_seconds
    if expired:
        assert first.action is LockAction.TAKE_OVER
        assert first.reason is TakeoverReason.EXPIRED
        return
    if owner == me:
        assert first.action is LockAction.REENTRANT
        return
    assert first.action is LockAction.CHECK_OWNER
    second = decide_lock("n", value, NOW, timeout, *me, owner_exists=exists)
    if exists:
        assert second.action is LockAction.CONTENTION
        assert second.message.endswith("node lock contention")
    else:
        assert second.action is LockAction.TAKE_OVER
        assert second.reason is TakeoverReason.OWNER_GONE


@given(st.text(max_size=40))
def test_any_value_gets_a_decision(value: str) -> None:
    decision = decide_lock("n", value, NOW, TIMEOUT, "default", "me", owner_exists=True)
    assert decision.action in {
        LockAction.TAKE_OVER,
        LockAction.REENTRANT,
        LockAction.CONTENTION,
    }


# --- who may release it ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mine"),
    [
        (None, False),
        ("", False),
        ("2026-07-03T12:00:00Z,default,me", True),
        ("2026-07-03T12:00:00Z,default,other", False),
        ("2026-07-03T12:00:00Z,other-ns,me", False),
        ("2026-07-03T12:00:00Z", True),  # legacy: nobody's, so anyone's
        ("garbage", True),
        # unreadable, with commas: the pod it ends with, whatever comes before
        ("garbage,default,me", True),
        ("x,y,default,me", True),
        ("garbage,x", False),
        ("garbage,default,other", False),
        # the owner part must match whole: `,default,me` is not a suffix of `,default,xme`
        ("2026-07-03T12:00:00Z,default,xme", False),
        ("2026-07-03T12:00:00Z,xdefault,me", False),
    ],
)
def test_releasable_by(value: str | None, mine: bool) -> None:
    assert releasable_by(value, "default", "me") is mine


# --- whether a held lock is stale (recovery) ---------------------------------------------------


@pytest.mark.parametrize(
    ("value", "owner_exists", "action", "reason"),
    [
        ("garbage,x", None, LockAction.TAKE_OVER, TakeoverReason.MALFORMED),
        (f"{_stamp(timedelta(minutes=6))},default,me", None, LockAction.TAKE_OVER, "lock_expired"),
        # no pod asks: a lock is never re-entrant for the recovery loop
        (f"{_stamp(timedelta(seconds=10))},default,me", None, LockAction.CHECK_OWNER, None),
        (f"{_stamp(timedelta(seconds=10))},default,me", True, LockAction.CONTENTION, None),
        (f"{_stamp(timedelta(seconds=10))},default,me", False, LockAction.TAKE_OVER, "owner_gone"),
        (_stamp(timedelta(seconds=10)), None, LockAction.CONTENTION, None),  # legacy, fresh
    ],
)
def test_the_recovery_loops_view_of_a_held_lock(
    value: str, owner_exists: bool | None, action: LockAction, reason: str | None
) -> None:
    decision = stale_lock("gpu-1", value, NOW, TIMEOUT, owner_exists)
    assert (decision.action, decision.reason) == (action, reason)
    if action is not LockAction.TAKE_OVER:
        assert decision.message == ""  # nothing to report: the lock stays
    else:
        assert decision.message.startswith("node gpu-1: ") and "released" in decision.message
