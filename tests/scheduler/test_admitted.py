"""Unsigned bookings kubelet already admitted (bookings made before the key): counted as they
stand, never trusted for anything else (docs/design.md 8.6)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from hami_plugin.protocol.model import ANNOTATION_DEVICES_ALLOCATED
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.scheduler.book.admitted import admitted_booking, kubelet_admitted
from hami_plugin.scheduler.book.trust import BookingTrust
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings
from hami_plugin.testing.apiserver import make_container, make_pod
from tests.bookings import keys_from
from tests.extender.signing import booking, signed

KEYS = keys_from(b"k" * 32)
SETTINGS = SchedulerSettings()
ONE_GPU = [("GPU-0", 1000, 10)]
TWO_GPUS = [("GPU-0", 32768, 100), ("GPU-1", 32768, 100)]
START = "2026-01-01T00:00:05Z"
RUNNING = {"running": {"startedAt": START}}
TERMINATED = {"terminated": {"exitCode": 0, "startedAt": START, "finishedAt": START}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}


def pod(
    *,
    gpus: list[tuple[str, int, int]] = ONE_GPU,
    node: str = "n1",
    node_name: str = "n1",
    asks: int | None = 1,
    phase: str = "Running",
    status: Mapping[str, Any] | None = None,
    uid: str = "uid-1",
) -> dict[str, Any]:
    """A pod with an unsigned booking of `gpus` on `node`, asking `asks` GPUs (None: no GPU),
    with the status kubelet writes for a running pod unless `status` says otherwise."""
    limits = {"cpu": "1"} if asks is None else {"nvidia.com/gpu": str(asks)}
    obj = make_pod(
        "p",
        annotations=booking(node, gpus, phase="success"),
        containers=[make_container("main", limits=limits)],
        node_name=node_name,
        uid=uid,
    )
    obj["status"] = (
        {
            "phase": phase,
            "startTime": START,
            "containerStatuses": [{"name": "main", "state": RUNNING}],
        }
        if status is None
        else {"phase": phase, **status}
    )
    return obj


def why(obj: dict[str, Any], settings: SchedulerSettings = SETTINGS) -> str | None:
    return admitted_booking(read_pod(obj), settings)


# --- what kubelet wrote -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "status", "admitted"),
    [
        ("Running", None, True),
        # admitted, its image still pulling: kubelet wrote the start time with its first status
        ("Pending", {"startTime": START}, True),
        ("Pending", {"initContainerStatuses": [{"name": "i", "state": RUNNING}]}, True),
        ("Running", {"containerStatuses": [{"name": "main", "state": TERMINATED}]}, True),
        # never admitted: no start time, no container started
        ("Pending", {}, False),
        ("Pending", {"containerStatuses": [{"name": "main", "state": WAITING}]}, False),
        # a phase with nothing of kubelet's behind it
        ("Running", {}, False),
        # finished: the GPUs are free again
        ("Succeeded", {"startTime": START}, False),
        ("Failed", {"startTime": START}, False),
    ],
)
def test_kubelet_admitted(phase: str, status: Mapping[str, Any] | None, admitted: bool) -> None:
    info = read_pod(pod(phase=phase, status=status))
    assert kubelet_admitted(info) is admitted
    assert (admitted_booking(info, SETTINGS) is None) is admitted


def test_read_pod_sees_a_started_container() -> None:
    started = read_pod(pod(status={"containerStatuses": [{"name": "main", "state": RUNNING}]}))
    waiting = read_pod(pod(status={"containerStatuses": [{"name": "main", "state": WAITING}]}))
    assert started.containers_started and not waiting.containers_started
    assert not read_pod(make_pod("plain")).containers_started
    # read as leniently as the init containers' statuses: an odd entry started nothing
    assert not read_pod(pod(status={"containerStatuses": ["running"]})).containers_started


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (pod(asks=None), "it asks for no nvidia.com/gpu"),
        (pod(node_name=""), "it is not bound to node n1 its booking names"),
        (pod(node_name="n2"), "it is not bound to node n1 its booking names"),
        (pod(node="n2"), "it is not bound to node n2 its booking names"),
        (pod(phase="Pending", status={}), "kubelet has not started it on node n1"),
        (pod(gpus=TWO_GPUS, asks=1), "it books 2 GPUs and its containers ask for 1"),
    ],
)
def test_what_is_not_counted(obj: dict[str, Any], reason: str) -> None:
    assert why(obj) == reason


def test_a_pod_asking_as_many_gpus_as_it_books_counts() -> None:
    assert why(pod(gpus=TWO_GPUS, asks=2)) is None


def test_an_unreadable_booking_is_not_counted() -> None:
    obj = pod()
    obj["metadata"]["annotations"][ANNOTATION_DEVICES_ALLOCATED] = "junk,;"
    found = why(obj)
    assert found is not None and ANNOTATION_DEVICES_ALLOCATED in found


def test_the_resource_is_the_configured_one() -> None:
    renamed = SchedulerSettings(resources=ResourceNames(count="example.com/vgpu"))
    assert why(pod(), renamed) == "it asks for no example.com/vgpu"


# --- BookingTrust -------------------------------------------------------------------------------


def test_an_admitted_unsigned_booking_counts_and_is_never_sealed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    trust = BookingTrust(SETTINGS)
    info = read_pod(pod())
    for _ in range(2):
        assert trust.counted(info, KEYS) is info
    assert trust.last_counted(info) is info
    # not this process's own: bind-phase stays the pod's word, as for any unsigned booking
    assert not trust.signed_and_bound(info)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert lines[0] == (
        "pod default/p: its GPU booking is counted although it carries no "
        f"{ANNOTATION_BOOKING_SIGNATURE}: kubelet admitted the pod on node n1 (a booking made "
        "before the booking key); it is never served by this scheduler's device plugin"
    )
    # without a key every booking counts, as in HAMi, and nothing is logged
    assert BookingTrust(SETTINGS).counted(info, None) is info


def test_the_same_pod_before_kubelet_admits_it_counts_nothing() -> None:
    trust = BookingTrust(SETTINGS)
    pending = read_pod(pod(phase="Pending", status={}))
    counted = trust.counted(pending, KEYS)
    assert counted.booking is None
    assert trust.last_counted(pending).booking is None
    running = read_pod(pod())
    assert trust.counted(running, KEYS) is running
    assert trust.last_counted(running) is running


def test_a_signed_booking_rewritten_after_admission_is_not_counted() -> None:
    """A booking this process verified, then rewritten by its author (no admission policy
    before Kubernetes 1.30): not counted as an admitted unsigned booking."""
    trust = BookingTrust(SETTINGS)
    original = signed(pod(gpus=TWO_GPUS, asks=2), KEYS)
    assert trust.counted(read_pod(original), KEYS).booking is not None
    rewritten = pod(gpus=[("GPU-0", 32768, 100), ("GPU-1", 1, 1)], asks=2)
    rewritten["metadata"]["annotations"][ANNOTATION_BOOKING_SIGNATURE] = original["metadata"][
        "annotations"
    ][ANNOTATION_BOOKING_SIGNATURE]
    assert trust.counted(read_pod(rewritten), KEYS).booking is None
    # a new pod of the same name (another UID) is judged afresh
    successor = read_pod(pod(uid="uid-2"))
    assert trust.counted(successor, KEYS) is successor


def test_a_deleted_pod_is_logged_again_when_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    trust = BookingTrust(SETTINGS)
    info = read_pod(pod())
    trust.counted(info, KEYS)
    trust.pod_deleted(info.key, info.uid)
    trust.counted(info, KEYS)
    assert sum("is counted although" in r.getMessage() for r in caplog.records) == 2


def test_pod_info_default_reads_as_not_admitted() -> None:
    assert not kubelet_admitted(PodInfo("default", "p", phase="Running"))
