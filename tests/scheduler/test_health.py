"""HAMi v2.10 CheckHealth: the handshake (pkg/device/devices.go:576-615) and the NVIDIA
allocatable/register memory (pkg/device/nvidia/device.go:234-272),
docs/hami-reference.md 1.6 and 3.2."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.protocol.objects import NodeInfo
from hami_plugin.protocol.quantity import QuantityError
from hami_plugin.scheduler.health import (
    HealthVerdict,
    NodeHealthTracker,
    allocatable_count,
    check_node_health,
    handshake_verdict,
    parse_requesting_time,
)

NOW = datetime(2025, 3, 4, 10, 20, 0, tzinfo=UTC)
HANDSHAKE = "hami.io/node-handshake"
REGISTER = "hami.io/node-nvidia-register"
WRITTEN = "Requesting_2025-03-04 10:20:00"  # what a check at NOW writes
FRESH = "Requesting_2025-03-04 10:19:01"  # 59 s old at NOW
EXPIRED = "Requesting_2025-03-04 10:19:00"  # 60 s old at NOW: no longer before t + 60 s
REGISTER_TEXT = '[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100"}]'


def node_info(
    handshake: str | None = None,
    gpus: object = None,
    register: str | None = REGISTER_TEXT,
    name: str = "n1",
) -> NodeInfo:
    annotations = {}
    if handshake is not None:
        annotations[HANDSHAKE] = handshake
    if register is not None:
        annotations[REGISTER] = register
    allocatable: dict[str, object] = {"cpu": "63"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return NodeInfo(name, annotations, allocatable=allocatable)


# --- the handshake (devices.go CheckHealth) ------------------------------------------------


@pytest.mark.parametrize(
    ("handshake", "gpus", "expected"),
    [
        # not Requesting: write Requesting_<now>, healthy, need_update (devices.go:597-613)
        (None, None, (True, True, WRITTEN)),
        ("", None, (True, True, WRITTEN)),
        ("Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.7", 0, (True, True, WRITTEN)),
        ("Deleted_2025-03-04 09:00:00", None, (True, True, WRITTEN)),
        ("requesting_2025-03-04 09:00:00", None, (True, True, WRITTEN)),
        # Requesting, no "_" or a time Go cannot parse: healthy, nothing to do (580-586)
        ("Requesting", None, (True, False, None)),
        ("Requesting_not-a-timestamp", None, (True, False, None)),
        ("Requesting_2024.01.23 04:30:04", None, (True, False, None)),  # v2.4 layout
        ("Requesting_2025-03-04 09:00:00 UTC", None, (True, False, None)),
        ("Requesting_2025-02-30 09:00:00", None, (True, False, None)),
        ("Requesting_2025-03-04 24:00:00", None, (True, False, None)),
        # younger than 60 s: healthy (587-589)
        (FRESH, None, (True, False, None)),
        ("Requesting_2128-12-02 00:00:00", "0", (True, False, None)),
        # expired: healthy only while kubelet reports GPUs (591-596)
        (EXPIRED, None, (False, False, None)),
        (EXPIRED, "0", (False, False, None)),
        (EXPIRED, "8", (True, False, None)),
        ("Requesting_2024-01-02 00:00:00", 8, (True, False, None)),
        # Go reads what follows the first "_" wherever "Requesting" stands
        ("x_2025-03-04 09:00:00 Requesting", None, (True, False, None)),
        ("Requesting_2025-03-04 9:00:00", None, (False, False, None)),  # hour "15"
        ("Requesting_2025-03-04 09:00:00.123456789", None, (False, False, None)),
        ("Requesting_2025-03-04 09:00:00,5", None, (False, False, None)),
        ("Requesting_0000-01-01 00:00:00", None, (False, False, None)),
    ],
)
def test_handshake_verdict(
    handshake: str | None, gpus: object, expected: tuple[bool, bool, str | None]
) -> None:
    count = allocatable_count(node_info(gpus=gpus))
    assert handshake_verdict(handshake, count, NOW) == HealthVerdict(*expected)
    if not count:  # without GPUs the stateless rule is the handshake's
        assert check_node_health(node_info(handshake, gpus), NOW) == HealthVerdict(*expected)


def test_stateless_gpus_reported_are_healthy_and_need_a_refresh() -> None:
    """A scheduler that never saw the node has 0 remembered: any other count is a change."""
    for handshake in (EXPIRED, FRESH, "Requesting_x"):
        assert check_node_health(node_info(handshake, "8"), NOW) == HealthVerdict(True, True)
    assert check_node_health(node_info(None, "8"), NOW) == HealthVerdict(True, True, WRITTEN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-03-04 10:15:02", datetime(2025, 3, 4, 10, 15, 2)),
        ("2025-03-04 7:05:09", datetime(2025, 3, 4, 7, 5, 9)),
        ("2025-03-04 10:15:02.25", datetime(2025, 3, 4, 10, 15, 2, 250000)),
        ("2024-02-29 00:00:00", datetime(2024, 2, 29)),
        ("0000-02-29 00:00:00", datetime.min),  # year 0 is a leap year
        ("0001-01-01 00:00:00", datetime.min),
        ("-001-01-01 00:00:00", None),  # the year's first character must be a digit
        ("+202-01-01 00:00:00", None),
        ("2025-03-04 010:00:00", None),
        ("2025-3-04 10:15:02", None),  # month and day are two digits
        ("2025-03-04 10:5:02", None),  # minute too
        ("2025-03-04T10:15:02", None),
        ("2025-03-04 10:15:02.", None),
        ("2023-02-29 00:00:00", None),
        ("0000-02-30 00:00:00", None),
        ("2025-03-04 09:00:00,5", datetime(2025, 3, 4, 9, 0, 0, 500000)),
        ("2025-03-04 10:15:60", None),
        ("\uff12\uff10\uff12\uff15-03-04 10:15:02", None),  # only ASCII digits
    ],
)
def test_requesting_time_is_read_like_go(text: str, expected: datetime | None) -> None:
    """Each case was run through Go's time.ParseInLocation("2006-01-02 15:04:05", ...)."""
    assert parse_requesting_time(text) == expected


def test_the_handshake_is_read_and_written_in_the_zone_of_now() -> None:
    berlin = NOW.astimezone(timezone(timedelta(hours=1)))  # 11:20 wall clock
    assert check_node_health(node_info(), berlin).write_handshake == (
        "Requesting_2025-03-04 11:20:00"
    )
    # 11:19:01 in now's zone is 59 s ago; the same text read as UTC would be in the future
    assert not check_node_health(node_info("Requesting_2025-03-04 11:19:01"), berlin).need_update
    assert check_node_health(node_info("Requesting_2025-03-04 11:19:00"), berlin).healthy is False
    # a naive now is compared as wall-clock time
    naive = datetime(2025, 3, 4, 10, 20, 0)
    assert check_node_health(node_info(EXPIRED), naive).healthy is False
    assert check_node_health(node_info(FRESH), naive).healthy is True


def test_times_at_the_ends_of_the_calendar_do_not_overflow() -> None:
    far = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-12)))
    assert check_node_health(node_info("Requesting_9999-12-31 23:59:30"), far).healthy
    early = datetime(1, 1, 1, 0, 0, 30, tzinfo=timezone(timedelta(hours=14)))
    assert check_node_health(node_info("Requesting_0001-01-01 00:00:00"), early).healthy


@pytest.mark.parametrize(
    ("gpus", "count"),
    [(None, 0), ("0", 0), (0, 0), ("8", 8), (8, 8), ("500m", 1), ("1.2", 2), ("-500m", -1),
     ("2k", 2000), ("1e30", 2**63 - 1), (2.0, 2)],
)  # fmt: skip
def test_allocatable_count_is_gos_quantity_value(gpus: object, count: int) -> None:
    assert allocatable_count(node_info(gpus=gpus)) == count


def test_an_unreadable_allocatable_count_is_logged_and_read_as_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(QuantityError):
        allocatable_count(node_info(gpus="eight"))
    assert check_node_health(node_info(EXPIRED, "eight"), NOW).healthy is False
    assert "node n1: allocatable nvidia.com/gpu read as 0" in caplog.text


def test_a_custom_resource_name() -> None:
    node = NodeInfo("n1", {HANDSHAKE: EXPIRED}, allocatable={"example.com/gpu": "4"})
    assert check_node_health(node, NOW).healthy is False
    assert check_node_health(node, NOW, resource="example.com/gpu") == HealthVerdict(True, True)


# --- the tracker (nvidia/device.go CheckHealth), HAMi's TestCheckHealth cases ----------------


@pytest.mark.parametrize(
    ("current", "reported", "cached", "register", "healthy", "need_update"),
    [
        # current=0 reported=0: the handshake decides (expired here)
        (0, 0, None, REGISTER_TEXT, False, False),
        # current>0 reported same: a changed register annotation asks for a refresh
        (4, 4, REGISTER_TEXT, REGISTER_TEXT.replace("8192", "4096"), True, True),
        # ... an unchanged one keeps the cache
        (4, 4, REGISTER_TEXT, REGISTER_TEXT, True, False),
        # ... a deleted one asks for a refresh
        (4, 4, REGISTER_TEXT, None, True, True),
    ],
)
def test_hamis_own_cases(
    current: int,
    reported: int,
    cached: str | None,
    register: str | None,
    healthy: bool,
    need_update: bool,
) -> None:
    tracker = NodeHealthTracker()
    if reported:  # HAMi's test seeds ReportedGPUNum/ReportedRegisterAnnos directly
        tracker.check(node_info(FRESH, reported, cached), NOW)
    verdict = tracker.check(node_info(EXPIRED, current or None, register), NOW)
    assert (verdict.healthy, verdict.need_update) == (healthy, need_update)


def test_gpus_gone_make_the_node_unhealthy_once() -> None:
    tracker = NodeHealthTracker()
    assert tracker.check(node_info(FRESH, "4"), NOW) == HealthVerdict(True, True)
    # kubelet reports 0 GPUs: unhealthy even with a fresh handshake, and the count is kept
    assert tracker.check(node_info(FRESH, "0"), NOW) == HealthVerdict(False, False)
    # from then on the handshake decides
    assert tracker.check(node_info(FRESH, "0"), NOW) == HealthVerdict(True, False)
    assert tracker.check(node_info(EXPIRED, "0"), NOW) == HealthVerdict(False, False)
    # no handshake: it is written, and the node is still unhealthy the first time
    other = NodeHealthTracker()
    other.check(node_info(FRESH, "4", name="n2"), NOW)
    assert other.check(node_info(None, None, name="n2"), NOW) == HealthVerdict(False, True, WRITTEN)


def test_a_changed_count_asks_for_a_refresh_whatever_the_handshake() -> None:
    tracker = NodeHealthTracker()
    assert tracker.check(node_info(EXPIRED, "4"), NOW) == HealthVerdict(True, True)
    assert tracker.check(node_info(EXPIRED, "4"), NOW) == HealthVerdict(True, False)
    assert tracker.check(node_info(None, "8"), NOW) == HealthVerdict(True, True, WRITTEN)
    # same count, same register: the handshake's answer, its write included
    assert tracker.check(node_info("Deleted_x", "8"), NOW) == HealthVerdict(True, True, WRITTEN)


def test_a_changed_register_keeps_the_handshakes_health() -> None:
    tracker = NodeHealthTracker()
    tracker.check(node_info(FRESH, "4"), NOW)
    changed = node_info(FRESH, "4", register="[]")
    assert tracker.check(changed, NOW) == HealthVerdict(True, True)
    assert tracker.check(changed, NOW) == HealthVerdict(True, False)


def test_nodes_are_remembered_apart_and_forgotten() -> None:
    tracker = NodeHealthTracker()
    tracker.check(node_info(FRESH, "4", name="a"), NOW)
    assert tracker.check(node_info(FRESH, "4", name="b"), NOW).need_update  # b is new
    assert not tracker.check(node_info(FRESH, "4", name="a"), NOW).need_update
    tracker.forget("a")
    tracker.forget("never-seen")
    assert tracker.check(node_info(FRESH, "4", name="a"), NOW).need_update
    # forgotten after the GPUs went away: 0 is no change any more
    tracker.check(node_info(FRESH, "0", name="b"), NOW)
    tracker.forget("b")
    assert tracker.check(node_info(FRESH, "0", name="b"), NOW) == HealthVerdict(True, False)


# --- properties ------------------------------------------------------------------------------

_MOMENTS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_HANDSHAKES = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.sampled_from(["Reported 2024-01-23 04:30:04", "Deleted_2025-03-04 09:00:00", "Requesting"]),
    st.integers(-3600, 3600).map(lambda seconds: ("Requesting", seconds)),
)
_COUNTS = st.one_of(st.none(), st.sampled_from(["0", "4", "8", "500m", "-1"]))


def _handshake_at(value: object, now: datetime) -> str | None:
    if isinstance(value, tuple):  # ("Requesting", seconds before now)
        return "Requesting_" + (now - timedelta(seconds=value[1])).strftime("%Y-%m-%d %H:%M:%S")
    assert value is None or isinstance(value, str)
    return value


@settings(max_examples=300, deadline=None)
@given(_MOMENTS, st.integers(0, 59), _COUNTS, st.lists(st.tuples(_COUNTS, st.booleans())))
def test_a_fresh_requesting_handshake_is_never_rewritten(
    now: datetime, age: int, gpus: str | None, history: list[tuple[str | None, bool]]
) -> None:
    """Whatever the tracker saw before, a `Requesting_` younger than 60 s is not rewritten,
    and on its own (the stateless rule) it keeps the node healthy."""
    value = "Requesting_" + (now - timedelta(seconds=age)).strftime("%Y-%m-%d %H:%M:%S")
    assert check_node_health(node_info(value, gpus), now) == (
        HealthVerdict(True, True)
        if allocatable_count(node_info(gpus=gpus))
        else HealthVerdict(True, False)
    )
    tracker = NodeHealthTracker()
    for count, changed_register in history:
        register = "[]" if changed_register else REGISTER_TEXT
        tracker.check(node_info(value, count, register), now)
    assert tracker.check(node_info(value, gpus), now).write_handshake is None


@settings(max_examples=300, deadline=None)
@given(_MOMENTS, _HANDSHAKES, _COUNTS)
def test_a_handshake_is_written_exactly_when_the_value_is_not_requesting(
    now: datetime, handshake: object, gpus: str | None
) -> None:
    value = _handshake_at(handshake, now)
    verdict = check_node_health(node_info(value, gpus), now)
    if value is not None and "Requesting" in value:
        assert verdict.write_handshake is None
    else:
        assert verdict.write_handshake == now.strftime("Requesting_%Y-%m-%d %H:%M:%S")
        assert (verdict.healthy, verdict.need_update) == (True, True)


@settings(max_examples=300, deadline=None)
@given(_MOMENTS, _HANDSHAKES, _COUNTS)
def test_stateless_unhealthy_only_without_gpus_and_with_an_old_request(
    now: datetime, handshake: object, gpus: str | None
) -> None:
    value = _handshake_at(handshake, now)
    old_request = isinstance(handshake, tuple) and handshake[1] >= 60
    no_gpus = allocatable_count(node_info(gpus=gpus)) == 0
    assert check_node_health(node_info(value, gpus), now).healthy is not (old_request and no_gpus)


@dataclass
class _HamiNvidia:
    """nvidia/device.go CheckHealth (lines 234-272) written out literally, Go maps as dicts
    whose missing keys read as the zero value."""

    reported_gpu_num: dict[str, int] = field(default_factory=dict)
    reported_register_annos: dict[str, str] = field(default_factory=dict)

    def check(self, node: NodeInfo, now: datetime) -> tuple[bool, bool]:
        current = allocatable_count(node)
        reported = self.reported_gpu_num.get(node.name, 0)
        verdict = handshake_verdict(node.annotations.get(HANDSHAKE), current, now)
        handshake_healthy, handshake_changed = verdict.healthy, verdict.need_update
        register_anno = node.annotations.get(REGISTER, "")
        reported_register_anno = self.reported_register_annos.get(node.name, "")
        if current == 0:
            if reported == 0:
                return handshake_healthy, handshake_changed
            self.reported_gpu_num[node.name] = current
            self.reported_register_annos[node.name] = register_anno
            return False, handshake_changed
        if reported != current:
            self.reported_gpu_num[node.name] = current
            self.reported_register_annos[node.name] = register_anno
            return True, True
        if reported_register_anno != register_anno:
            self.reported_register_annos[node.name] = register_anno
            return handshake_healthy, True
        return handshake_healthy, handshake_changed


_OBSERVATIONS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        _HANDSHAKES,
        _COUNTS,
        st.sampled_from([None, "", "[]", REGISTER_TEXT]),
        st.integers(0, 120),
        st.booleans(),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_MOMENTS, _OBSERVATIONS)
def test_the_tracker_matches_hamis_code_over_any_history(
    start: datetime, observations: list[tuple[str, object, str | None, str | None, int, bool]]
) -> None:
    tracker, model = NodeHealthTracker(), _HamiNvidia()
    now = start
    for name, handshake, gpus, register, elapsed, deleted in observations:
        now += timedelta(seconds=elapsed)
        if deleted:  # HAMi's NodeDeleted
            tracker.forget(name)
            model.reported_gpu_num.pop(name, None)
            model.reported_register_annos.pop(name, None)
            continue
        node = node_info(_handshake_at(handshake, now), gpus, register, name)
        verdict = tracker.check(node, now)
        assert (verdict.healthy, verdict.need_update) == model.check(node, now)
