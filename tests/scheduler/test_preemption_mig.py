"""Preemption on a MIG-mode GPU: a victim frees its instance at its placement, and the
preemptor's reservation goes there (`hami schedule` on a snapshot, the scheduler's own
decision)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from hami_plugin.protocol.objects import read_pod
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.snapshot import build_book, parse_snapshot
from tests.scheduler.test_mig_dryrun import gpu_pod, node, running, schedule, write

SETTINGS = SchedulerSettings()
NOW = datetime(2026, 1, 3, tzinfo=UTC)


def mig(start: int, uuid: str) -> str:
    return (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"3g.20gb",'
        f'"placement":{{"start":{start},"size":4}},"migUUID":"{uuid}","gpuInstanceID":1,'
        '"computeInstanceID":0}]'
    )


def test_a_mig_victim_frees_its_placement_for_the_preemptor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older = running("older", "a", "GPU-a,NVIDIA,20480,42:;", mig(0, "MIG-0"))
    older["status"]["startTime"] = "2026-01-01T00:00:00Z"
    newer = running("newer", "a", "GPU-a,NVIDIA,20480,42:;", mig(4, "MIG-4"))
    newer["status"]["startTime"] = "2026-01-02T00:00:00Z"
    snapshot = write(tmp_path / "cluster.yaml", [node("a"), older, newer])
    urgent = gpu_pod("urgent", 20480)
    urgent["spec"]["priority"] = 1000
    pod = write(tmp_path / "pod.yaml", [urgent])

    code, answer, explain = schedule(capsys, snapshot, pod, "--explain")
    assert code == 2  # no placement is free now
    preemption = answer["preemption"]
    # both 3g.20gb placements are taken: one pod must go, the later started one
    assert [victim["pod"] for victim in preemption["victims"]] == ["default/newer"]
    assert preemption["node"] == "a"
    assert "default/newer" in explain

    code, answer, _ = schedule(capsys, snapshot, pod, "--no-preemption")
    assert code == 2 and "preemption" not in answer


def test_the_hold_keeps_the_freed_placement(tmp_path: Path) -> None:
    older = running("older", "a", "GPU-a,NVIDIA,20480,42:;", mig(0, "MIG-0"))
    newer = running("newer", "a", "GPU-a,NVIDIA,20480,42:;", mig(4, "MIG-4"))
    snapshot = parse_snapshot(yaml.safe_dump({"kind": "List", "items": [node("a"), older, newer]}))
    book = build_book(snapshot, SETTINGS, NOW)
    urgent = replace(read_pod(gpu_pod("urgent", 20480)), priority=1000)
    _, change = book.filter(urgent, pod_requests(urgent, SETTINGS), ["a"], NOW, 0.0)
    assert change.preemption is not None and change.preemption.mig
    (victim,) = change.preemption.victims
    # it gets the placement its victim frees, never the other pod's
    freed = {"default/older": 0, "default/newer": 4}[victim.key]
    assert [a.placement.start for a in change.preemption.mig] == [freed]
    book.delete_pod(victim)  # its instance is gone
    late = read_pod(gpu_pod("late", 20480))
    result, _ = book.filter(late, pod_requests(late, SETTINGS), ["a"], NOW, 1.0)
    assert result.node is None  # what it frees is held for the preemptor
    result, _ = book.filter(urgent, pod_requests(urgent, SETTINGS), ["a"], NOW, 2.0)
    assert result.node == "a" and result.mig == change.preemption.mig
    assert [a.placement.start for a in result.mig] == [freed]
