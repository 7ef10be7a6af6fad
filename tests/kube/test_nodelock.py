"""hami_plugin.kube.nodelock: compare-and-patch of a node annotation, and the one lock release
both daemons use, against the in-memory cluster."""

from __future__ import annotations

import logging

import pytest

from hami_plugin.kube.errors import Conflict, Retryable
from hami_plugin.kube.fake import FakeKube
from hami_plugin.kube.nodelock import (
    Keep,
    KeptChanging,
    Write,
    compare_and_patch,
    release_node_lock,
)
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK
from hami_plugin.testing.apiserver import make_node

OURS = "2026-01-01T00:00:00Z,default,p"
THEIRS = "2026-01-01T00:00:00Z,default,q"
LEGACY = "2026-01-01T00:00:00Z"
RACE = Conflict("patch node n1 annotations: HTTP 409: the object has been modified", 409)


def cluster(lock: str | None = None) -> FakeKube:
    annotations = {} if lock is None else {ANNOTATION_NODE_LOCK: lock}
    return FakeKube(nodes=[make_node("n1", annotations=annotations)])


def lock_of(kube: FakeKube) -> str | None:
    return kube.get_node("n1").annotations.get(ANNOTATION_NODE_LOCK)


def test_a_decision_is_written_with_the_version_it_was_made_on() -> None:
    kube = cluster("old")
    seen: list[str | None] = []

    def decide(value: str | None) -> Keep[str] | Write[str]:
        seen.append(value)
        return Write("new", "done")

    patched = compare_and_patch(kube, "n1", "key", decide, what="key not written")
    assert kube.calls == ["get_node", "patch_node_annotations"]
    assert (patched.answer, patched.seen, patched.written) == ("done", None, True)
    assert kube.get_node("n1").annotations["key"] == "new"

    kept = compare_and_patch(kube, "n1", "key", lambda value: Keep(value), what="unused")
    assert (kept.answer, kept.seen, kept.written) == ("new", "new", False)
    assert seen == [None]


def test_a_conflict_reads_the_node_again_and_decides_anew() -> None:
    kube = cluster(OURS)
    kube.fail("patch_node_annotations", RACE)

    assert release_node_lock(kube, "n1", "default", "p")

    assert kube.calls == ["get_node", "patch_node_annotations"] * 2
    assert lock_of(kube) is None


def test_a_node_read_already_is_the_first_attempt_and_a_conflict_reads_it_fresh() -> None:
    kube = cluster(OURS)
    stale = kube.get_node("n1")
    kube.put_node(make_node("n1", annotations={ANNOTATION_NODE_LOCK: OURS, "beat": "1"}))
    kube.calls.clear()

    assert release_node_lock(kube, "n1", "default", "p", read=stale)

    assert kube.calls == ["patch_node_annotations", "get_node", "patch_node_annotations"]
    assert kube.get_node("n1").annotations == {"beat": "1"}


def test_every_attempt_lost_is_kept_changing_with_the_last_value_seen() -> None:
    kube = cluster(OURS)
    kube.fail("patch_node_annotations", RACE, times=None)

    with pytest.raises(KeptChanging, match=r"^node n1: lock not released, the node kept changing$"):
        release_node_lock(kube, "n1", "default", "p")
    assert kube.calls.count("patch_node_annotations") == 3

    kube.calls.clear()
    with pytest.raises(KeptChanging) as caught:
        release_node_lock(kube, "n1", "default", "p", retry=RetryPolicy(attempts=4))
    assert caught.value.seen == OURS
    assert caught.value.status == 409
    assert kube.calls.count("patch_node_annotations") == 4


@pytest.mark.parametrize(
    ("lock", "released"),
    [(OURS, True), (THEIRS, False), (LEGACY, True), (None, False)],
)
def test_the_release_applies_hamis_owner_check(lock: str | None, released: bool) -> None:
    kube = cluster(lock)

    assert release_node_lock(kube, "n1", "default", "p") is released

    assert kube.calls.count("patch_node_annotations") == int(released)
    assert lock_of(kube) == (None if released else lock)


def test_a_forced_release_deletes_only_the_value_expected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = cluster(THEIRS)

    assert not release_node_lock(kube, "n1", "", "", expected=OURS)
    assert lock_of(kube) == THEIRS
    with caplog.at_level(logging.INFO, logger="hami_plugin.kube.nodelock"):
        assert release_node_lock(kube, "n1", "", "", expected=THEIRS)
    assert lock_of(kube) is None
    assert [r.getMessage() for r in caplog.records] == [f"node n1: lock {THEIRS!r} released"]


def test_a_node_gone_has_no_lock_to_release_and_other_failures_are_raised() -> None:
    kube = cluster(OURS)
    assert not release_node_lock(kube, "ghost", "default", "p")

    kube.fail("get_node", Retryable("get node n1: HTTP 503", 503))
    with pytest.raises(Retryable):
        release_node_lock(kube, "n1", "default", "p")
    assert lock_of(kube) == OURS
