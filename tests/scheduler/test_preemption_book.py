"""Preemption in the book: the issue's cluster shapes (2 x A100 80 GB, four low-priority pods of
30,000 MiB), the hold on what victims free, and the rules of who may preempt."""

from __future__ import annotations

from dataclasses import replace

from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.book.book import Book, BookSettings
from tests.scheduler.preemption_cluster import (
    A100_MIB,
    T0,
    Cluster,
    node_info,
    pod,
    running,
)

HIGH = 100000
MID = 1000


def fragmented(
    priorities: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> tuple[Cluster, list[PodInfo]]:
    """One node, two GPUs, two 30,000 MiB pods on each (60,000 of 81,920 booked per GPU)."""
    cluster = Cluster(node_info("gpu-0"))
    pods = []
    for i, priority in enumerate(priorities):
        gpu = f"GPU-gpu-0-{i // 2}"
        pods.append(
            cluster.add(running(pod(f"low-{i}", 30000, priority=priority), "gpu-0", (gpu,), i))
        )
    return cluster, pods


def test_fragmented_node_one_victim_on_the_gpu_the_preemptor_gets() -> None:
    cluster, _ = fragmented()
    result, change = cluster.filter(pod("high", 40000, priority=HIGH))
    assert result.node is None
    preemption = change.preemption
    assert preemption is not None and change.preemption_outcome == "preempted"
    assert preemption.node == "gpu-0"
    assert len(preemption.victims) == 1
    (victim,) = preemption.victims
    victim_gpu = preemption.victim_gpus[0][0].uuid
    (planned,) = preemption.devices[0]
    assert planned.uuid == victim_gpu
    # the reprieve gives back the earlier-started (more important) pods first: the last one
    # that no longer fits is low-3, on GPU 1
    assert victim.name == "low-3"


def test_whole_gpu_pod_takes_the_two_pods_of_one_gpu() -> None:
    cluster, _ = fragmented()
    _, change = cluster.filter(pod("whole", A100_MIB, priority=HIGH))
    preemption = change.preemption
    assert preemption is not None
    names = sorted(victim.name for victim in preemption.victims)
    assert names == ["low-2", "low-3"]  # both pods of GPU 1 (GPU 0's started earlier)


def test_never_policy_takes_nothing() -> None:
    cluster, _ = fragmented()
    result, change = cluster.filter(pod("polite", 40000, priority=HIGH, policy="Never"))
    assert result.node is None
    assert change.preemption is None and change.preemption_outcome == "never"
    assert cluster.book.preemption.holds() == []


def test_equal_priority_pods_are_never_victims() -> None:
    cluster, _ = fragmented((HIGH, HIGH, HIGH, HIGH))
    _, change = cluster.filter(pod("peer", 40000, priority=HIGH))
    assert change.preemption is None and change.preemption_outcome == "no_victims"


def test_mid_priority_pod_kept_while_a_low_one_would_do() -> None:
    cluster, _ = fragmented((MID, MID, 0, 0))
    _, change = cluster.filter(pod("high", 40000, priority=HIGH))
    assert change.preemption is not None
    assert [victim.priority for victim in change.preemption.victims] == [0]


def test_hold_keeps_the_freed_memory_for_the_preemptor() -> None:
    cluster, low = fragmented()
    high = pod("high", 40000, priority=HIGH)
    _, change = cluster.filter(high)
    assert change.preemption is not None
    victim = next(p for p in low if p.name == change.preemption.victims[0].name)
    held = cluster.book.preemption.held(high.key)
    assert held is not None and held.tallies[0].memory_mib == 40000

    # while the victim terminates, the preemptor does not fit and does not preempt again
    going = cluster.terminate(victim)
    result, change = cluster.filter(high)
    assert result.node is None and change.preemption_outcome == "waiting"
    # a low-priority pod created meanwhile does not get the memory either
    late = pod("late-low", 25000)
    result, change = cluster.filter(late)
    assert result.node is None and change.preemption is None

    # the victim's containers are gone: still held, the low pod still does not fit
    cluster.gone(going)
    result, _ = cluster.filter(late)
    assert result.node is None
    # the preemptor does, on the GPU its victim freed
    result, _ = cluster.filter(high)
    assert result.node == "gpu-0"
    assert result.devices[0][0].uuid == "GPU-gpu-0-1"
    assert cluster.book.preemption.holds() == []


def test_hold_rebuilt_from_the_nomination_after_a_restart() -> None:
    cluster, low = fragmented()
    high = pod("high", 40000, priority=HIGH)
    _, change = cluster.filter(high)
    assert change.preemption is not None
    victim = next(p for p in low if p.name == change.preemption.victims[0].name)

    # a new book (restart, or the standby taking over) sees the pods as the API shows them
    fresh = Cluster(node_info("gpu-0"))
    for other in low:
        fresh.add(other)
    fresh.terminate(victim)
    nominated = replace(high, nominated_node_name="gpu-0")
    fresh.add(nominated)
    late = pod("late-low", 25000)
    result, change = fresh.filter(late)  # settles the nomination first
    assert result.node is None
    assert [hold.key for hold in fresh.book.preemption.holds()] == [high.key]
    # the preemptor does not evict again while its victim terminates
    result, change = fresh.filter(nominated)
    assert change.preemption_outcome == "waiting"


def test_higher_priority_pod_ignores_a_lower_hold() -> None:
    cluster = Cluster(node_info("gpu-0", count=1))
    low = cluster.add(running(pod("low", 60000), "gpu-0", ("GPU-gpu-0-0",)))
    mid = pod("mid", 40000, priority=MID)
    _, change = cluster.filter(mid)
    assert change.preemption is not None
    cluster.gone(cluster.terminate(low))
    # a pod above the hold's priority may take the held memory (kube-scheduler: nominated pods
    # of lower priority do not count)
    result, _ = cluster.filter(pod("top", 40000, priority=HIGH))
    assert result.node == "gpu-0"


def test_preemption_off_takes_nothing() -> None:
    cluster, _ = fragmented()
    cluster.book = Book(BookSettings(cluster.settings, preemption=False))
    cluster.book.apply_node(node_info("gpu-0"), T0)
    _, change = cluster.filter(pod("high", 40000, priority=HIGH))
    assert change.preemption is None and change.preemption_outcome == ""


def quarter_filled() -> tuple[Cluster, list[PodInfo]]:
    """One A100 80 GB holding four low pods of 20,000 MiB (80,000 booked)."""
    cluster = Cluster(node_info("gpu-0", count=1))
    pods = [
        cluster.add(running(pod(f"q-{i}", 20000), "gpu-0", ("GPU-gpu-0-0",), i)) for i in range(4)
    ]
    return cluster, pods


def test_two_preemptors_of_one_burst_take_one_victim_each() -> None:
    cluster, low = quarter_filled()
    first, second = pod("a", 20000, priority=HIGH), pod("b", 20000, priority=HIGH)
    _, change_a = cluster.filter(first)
    _, change_b = cluster.filter(second)
    assert change_a.preemption is not None and change_b.preemption is not None
    taken_a = [victim.name for victim in change_a.preemption.victims]
    taken_b = [victim.name for victim in change_b.preemption.victims]
    # b's search sees a's victim as gone (its GPU is held for a): one victim each, not two
    assert taken_a == ["q-3"] and taken_b == ["q-2"]

    # a's victim ends first; b's DELETE is sent but the watch does not show it yet: a retries,
    # does not fit (b's hold and b's victim still count) and must not preempt again
    cluster.gone(cluster.terminate(low[3]))
    result, change = cluster.filter(first)
    assert result.node is None and change.preemption_outcome == "waiting"
    cluster.gone(cluster.terminate(low[2]))
    assert cluster.filter(first)[0].node == "gpu-0"
    assert cluster.filter(second)[0].node == "gpu-0"
