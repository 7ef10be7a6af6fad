"""A burst fans out only as far as it must (`decide(would_wait=..., look_ahead=...)`).

The rule (scheduler/filter.py): when the first fitting node in the policy's order would make the
bind wait, the answer is the first fitting node after it that would not, looking at most
`look_ahead` fitting nodes past the first; when every one of them would wait, the first.
"""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.model import PodDevices
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.filter import decide, pod_shape
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.settings import SchedulerSettings

from .test_filter import BINPACK, NOW, SPREAD, cluster, gpus, ledgers, make_pod, pod_specs


def _policy_order(ledger: Ledger, pod: PodInfo, settings: SchedulerSettings) -> list[str]:
    """Every fitting node in the policy's order (the exhaustive decision's scores, sorted)."""
    full = decide(ledger, pod, None, NOW, settings, exhaustive=True)
    higher = settings is BINPACK
    return sorted(full.scores, key=lambda n: (-full.scores[n] if higher else full.scores[n], n))


def test_nothing_waits_hamis_choice() -> None:
    ledger = cluster({"a": 16000, "b": 8000, "c": 0})
    pod = make_pod(gpus(1))
    asked: list[str] = []

    def never(node: str, devices: PodDevices, shape: Hashable) -> bool:
        asked.append(node)
        return False

    result = decide(ledger, pod, None, NOW, BINPACK, would_wait=never, look_ahead=4)
    assert result.node == "a" and not result.fanned_out
    assert asked == ["a"]  # asked once, of the policy's first only
    assert result.annotations == decide(ledger, pod, None, NOW, BINPACK).annotations


def test_the_next_node_in_policy_order_that_does_not_wait() -> None:
    ledger = cluster({"a": 16000, "b": 8000, "c": 4000, "d": 0})
    pod = make_pod(gpus(1))
    waiting = {"a", "b"}
    result = decide(
        ledger,
        pod,
        None,
        NOW,
        BINPACK,
        would_wait=lambda node, devices, shape: node in waiting,
        look_ahead=4,
    )
    assert result.node == "c" and result.fanned_out
    # the booking is c's own fit, as a decision on c alone would write it
    alone = decide(ledger, pod, ["c"], NOW, BINPACK)
    assert result.annotations == alone.annotations
    assert result.devices == alone.devices


def test_every_node_in_the_look_ahead_waits_the_first_is_answered() -> None:
    ledger = cluster({"a": 16000, "b": 8000, "c": 4000, "d": 0})
    pod = make_pod(gpus(1))
    result = decide(
        ledger,
        pod,
        None,
        NOW,
        BINPACK,
        would_wait=lambda node, devices, shape: node != "d",
        look_ahead=2,
    )
    assert result.node == "a" and not result.fanned_out  # d is 3 past the first


def test_look_ahead_zero_is_hamis_choice() -> None:
    ledger = cluster({"a": 16000, "b": 0})
    pod = make_pod(gpus(1))
    result = decide(ledger, pod, None, NOW, BINPACK, would_wait=lambda *_: True, look_ahead=0)
    assert result.node == "a"


def test_the_predicate_is_given_the_pods_shape_and_the_nodes_own_devices() -> None:
    ledger = cluster({"a": 16000, "b": 0})
    pod = make_pod(gpus(1))
    seen: dict[str, tuple[PodDevices, Hashable]] = {}

    def record(node: str, devices: PodDevices, shape: Hashable) -> bool:
        seen[node] = (devices, shape)
        return node == "a"

    decide(ledger, pod, None, NOW, BINPACK, would_wait=record, look_ahead=2)
    assert set(seen) == {"a", "b"}
    assert seen["b"][0] == decide(ledger, pod, ["b"], NOW, BINPACK).devices
    assert seen["a"][1] == seen["b"][1] == pod_shape(pod, BINPACK)


def test_shapes_equal_exactly_when_the_requests_and_options_are() -> None:
    same = pod_shape(make_pod(gpus(1), name="x"), BINPACK)
    assert same is not None
    assert pod_shape(make_pod(gpus(1), name="y"), BINPACK) == same
    assert pod_shape(make_pod(gpus(1, memory=4000)), BINPACK) != same
    assert pod_shape(make_pod(gpus(2)), BINPACK) != same
    assert pod_shape(make_pod(gpus(1, cores=20)), BINPACK) != same
    numa = make_pod(gpus(1), annotations={"nvidia.com/numa-bind": "true"})
    assert pod_shape(numa, BINPACK) != same
    typed = make_pod(gpus(1), annotations={"nvidia.com/use-gputype": "A100"})
    assert pod_shape(typed, BINPACK) != same
    assert pod_shape(make_pod(None), BINPACK) is None  # asks no GPU


@given(
    ledgers(),
    pod_specs,
    st.sampled_from([BINPACK, SPREAD]),
    st.integers(0, 4),
    st.sets(st.sampled_from(["n0", "n1", "n2", "n3", "n4", "n5", "n6"])),
)
def test_fan_out_rule(
    ledger: Ledger,
    pod: PodInfo,
    settings: SchedulerSettings,
    look_ahead: int,
    waiting: set[str],
) -> None:
    order = _policy_order(ledger, pod, settings)
    plain = decide(ledger, pod, None, NOW, settings)
    result = decide(
        ledger,
        pod,
        None,
        NOW,
        settings,
        would_wait=lambda node, devices, shape: node in waiting,
        look_ahead=look_ahead,
    )
    if not order:
        assert result.node is None and plain.node is None
        return
    assert plain.node == order[0]
    window = order[: look_ahead + 1]
    if order[0] not in waiting or look_ahead == 0:
        expected = order[0]
    else:
        expected = next((n for n in window[1:] if n not in waiting), order[0])
    assert result.node == expected
    assert result.fanned_out == (expected != order[0])
    # exact booking: the chosen node's own fit
    assert result.annotations == decide(ledger, pod, [expected], NOW, settings).annotations
