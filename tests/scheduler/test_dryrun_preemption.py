"""`hami schedule` shows the victims the scheduler would preempt, on the issue's fragmented node
(tests/fixtures/scheduler/preemption.yaml: one node, 2 x A100 80 GB = 81,920 MiB per GPU, four
pods of the `low-priority` class (100) asking 30,000 MiB, two per GPU; the notebooks on GPU 0
started before the training pods on GPU 1), and PriorityClasses and PodDisruptionBudgets in
the snapshot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler"
SNAPSHOT = FIXTURES / "preemption.yaml"
GPU0 = "GPU-3e1f6a2b-8c4d-4f7a-b5e9-0d2c7a1f6b30"  # notebook-0, notebook-1
GPU1 = "GPU-9a4c2e7d-1b6f-4d3a-8e5c-6f0b3d9a2c71"  # train-0, train-1
NOW = "1765016100"  # 2025-12-06 10:15:00 UTC
A100_MIB = 81920


def pod_file(
    tmp_path: Path,
    memory: int,
    priority_class: str | None = "high-priority",
    **spec: Any,
) -> Path:
    """An inference pod as written by hand (no `spec.priority`: not admitted yet)."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory)}
    body: dict[str, Any] = {
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.7.3",
                        "resources": {"limits": limits}}],
        **spec,
    }  # fmt: skip
    if priority_class is not None:
        body["priorityClassName"] = priority_class
    path = tmp_path / "pod.yaml"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "llm-serving", "namespace": "inference"}, "spec": body}  # fmt: skip
    path.write_text(yaml.safe_dump(pod))
    return path


def with_objects(tmp_path: Path, *objects: dict[str, Any]) -> Path:
    """The fixture snapshot with `objects` added to its list."""
    snapshot = yaml.safe_load(SNAPSHOT.read_text())
    snapshot["items"].extend(objects)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(snapshot))
    return path


def budget(app: str, allowed: int) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget over the `app` pods, as the API shows it."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"{app}-pdb", "namespace": "research"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": app}}},
        "status": {"currentHealthy": 2, "desiredHealthy": 2, "disruptionsAllowed": allowed,
                   "expectedPods": 2, "observedGeneration": 1},
    }  # fmt: skip


def schedule(
    capsys: pytest.CaptureFixture[str], pod: Path, *extra: str, snapshot: Path = SNAPSHOT
) -> tuple[int, dict[str, Any], str]:
    argv = ["schedule", "--snapshot", str(snapshot), "--pod", str(pod), "--now", NOW, *extra]
    code = main(argv)
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else {}, captured.err


def victim(name: str, gpu: str) -> dict[str, Any]:
    return {
        "pod": f"research/{name}",
        "priority": 100,
        "gpus": [{"uuid": gpu, "memoryMiB": 30000, "cores": 0}],
    }


def test_a_40000_mib_pod_takes_one_pod_from_the_gpu_it_would_get(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the example of docs/scheduling.md
    code, output, err = schedule(capsys, FIXTURES / "pod-high-priority.yaml", "--explain")
    assert code == 2  # no node fits now
    assert output["node"] is None
    assert output["failedNodes"] == {"gpu-a100-0": "2/2 CardInsufficientMemory"}
    # the reprieve gives back the earlier-started pods first: train-1, the last, is the one
    # that no longer fits, and the pod would get its GPU
    assert output["preemption"] == {
        "node": "gpu-a100-0",
        "victims": [victim("train-1", GPU1)],
        "pdbViolations": 0,
        "devices": f"{GPU1},NVIDIA,40000,0:;",
    }
    lines = err.splitlines()
    start = lines.index("preemption: preempted: 1 victim on gpu-a100-0, 0 PodDisruptionBudget "
                        "violations")  # fmt: skip
    assert [line.split() for line in lines[start + 1 :]] == [
        ["GPU", "VICTIM", "PRIORITY", "FREES"],
        [GPU1, "research/train-1", "100", "30000MiB", "0%"],
        ["the", "pod", "would", "get", "vllm:", GPU1, "40000MiB", "0%"],
    ]


def test_a_whole_gpu_pod_takes_the_two_pods_of_one_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, output, err = schedule(capsys, pod_file(tmp_path, A100_MIB), "--explain")
    assert code == 2
    preemption = output["preemption"]
    assert preemption["victims"] == [victim("train-0", GPU1), victim("train-1", GPU1)]
    assert preemption["devices"] == f"{GPU1},NVIDIA,{A100_MIB},0:;"
    table = err.splitlines()[-4:]
    assert [line.split()[:2] for line in table[:3]] == [
        ["GPU", "VICTIM"],
        [GPU1, "research/train-0"],
        [GPU1, "research/train-1"],
    ]


def test_a_pdb_with_no_disruption_left_turns_preemption_to_the_other_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snapshot = with_objects(tmp_path, budget("training", 0))
    code, output, _ = schedule(capsys, pod_file(tmp_path, A100_MIB), snapshot=snapshot)
    assert code == 2
    assert output["preemption"]["victims"] == [
        victim("notebook-0", GPU0),
        victim("notebook-1", GPU0),
    ]
    assert output["preemption"]["pdbViolations"] == 0
    assert output["preemption"]["devices"] == f"{GPU0},NVIDIA,{A100_MIB},0:;"

    _, output, _ = schedule(capsys, pod_file(tmp_path, 40000), snapshot=snapshot)
    assert output["preemption"]["victims"] == [victim("notebook-1", GPU0)]


def test_pdb_violations_are_counted_when_every_choice_violates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snapshot = with_objects(tmp_path, budget("training", 0), budget("notebook", 1))
    _, output, err = schedule(capsys, pod_file(tmp_path, A100_MIB), "--explain", snapshot=snapshot)
    # kube-scheduler's reprieve, not a search for the fewest violations: the pods that would
    # violate (notebook-1, past the one disruption allowed, and both training pods) are given
    # back first; notebook-1 comes back (the pod still fits on GPU 1), then neither training
    # pod can, and both go, two violations
    assert output["preemption"]["victims"] == [victim("train-0", GPU1), victim("train-1", GPU1)]
    assert output["preemption"]["pdbViolations"] == 2
    assert (
        "preemption: preempted: 2 victims on gpu-a100-0, 2 PodDisruptionBudget violations\n" in err
    )


def test_preemption_policy_never_takes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # from the class (the admission plugin copies its preemptionPolicy), or the pod's own
    for pod in (
        pod_file(tmp_path, 40000, "high-priority-nonpreempting"),
        pod_file(tmp_path, 40000, preemptionPolicy="Never"),
    ):
        code, output, err = schedule(capsys, pod, "--explain")
        assert code == 2
        assert output["preemption"] == {"outcome": "never"}
        assert err.splitlines()[-1] == "preemption: never: its preemptionPolicy is Never"


@pytest.mark.parametrize("priority_class", [None, "low-priority"])
def test_no_pod_of_lower_priority_no_victims(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, priority_class: str | None
) -> None:
    """Without a class the pod is of priority 0; of the victims' own class, 100: neither
    takes a pod of equal or higher priority."""
    code, output, err = schedule(capsys, pod_file(tmp_path, 40000, priority_class), "--explain")
    assert code == 2
    assert output["preemption"] == {"outcome": "no_victims"}
    assert err.splitlines()[-1] == (
        "preemption: no_victims: no node frees enough GPU capacity by taking pods of lower priority"
    )


def test_a_global_default_class_is_the_priority_of_a_pod_without_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    default = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "production"},
        "value": 5000,
        "globalDefault": True,
    }
    snapshot = with_objects(tmp_path, default)
    _, output, _ = schedule(capsys, pod_file(tmp_path, 40000, None), snapshot=snapshot)
    assert output["preemption"]["victims"] == [victim("train-1", GPU1)]


def test_no_preemption_leaves_it_out(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, output, err = schedule(capsys, pod_file(tmp_path, 40000), "--no-preemption", "--explain")
    assert code == 2
    assert "preemption" not in output
    assert "preemption" not in err


def test_a_pod_that_fits_is_decided_as_before(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, output, _ = schedule(capsys, pod_file(tmp_path, 20000))
    assert code == 0
    assert output["node"] == "gpu-a100-0"
    # written by hand, the pod names no scheduler: the webhook sets it (test_dryrun_webhook.py)
    assert list(output) == ["node", "annotations", "failedNodes", "scores", "webhook"]


def test_an_unknown_priority_class_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pod = pod_file(tmp_path, 40000, "gold")
    code, output, err = schedule(capsys, pod)
    assert (code, output) == (1, {})
    assert err == (
        f"hami schedule: {pod}: pod inference/llm-serving: no PriorityClass with name gold was "
        "found in the snapshot (the Priority admission plugin would refuse the pod); take the "
        "snapshot with `kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,"
        "priorityclasses -A -o yaml`\n"
    )


def terminating(tmp_path: Path, name: str) -> Path:
    """The fixture snapshot with pod `name` deleted, its grace period running."""
    snapshot = yaml.safe_load(SNAPSHOT.read_text())
    for item in snapshot["items"]:
        if item["kind"] == "Pod" and item["metadata"]["name"] == name:
            item["metadata"]["deletionTimestamp"] = "2025-12-06T10:14:50Z"
            item["metadata"]["deletionGracePeriodSeconds"] = 30
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(snapshot))
    return path


def test_a_terminating_pod_is_no_victim(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """train-1 is going already (still holding its memory): the next pod that does not fit
    back on GPU 1 beside it is taken instead."""
    snapshot = terminating(tmp_path, "train-1")
    _, output, _ = schedule(capsys, pod_file(tmp_path, 40000), snapshot=snapshot)
    assert output["preemption"]["victims"] == [victim("train-0", GPU1)]


def test_a_nominated_pod_waits_for_the_pods_terminating_there(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """kube-scheduler's `PodEligibleToPreemptOthers`: not while a pod of lower priority
    terminates on the node it is nominated to (what an earlier preemption took)."""
    snapshot = terminating(tmp_path, "train-1")
    pod = pod_file(tmp_path, 40000)
    nominated = yaml.safe_load(pod.read_text())
    nominated["status"] = {"nominatedNodeName": "gpu-a100-0", "phase": "Pending"}
    pod.write_text(yaml.safe_dump(nominated))
    code, output, err = schedule(capsys, pod, "--explain", snapshot=snapshot)
    assert code == 2
    assert output["preemption"] == {"outcome": "waiting"}
    assert err.splitlines()[-1] == (
        "preemption: waiting: pods of lower priority are still terminating on its nominated node"
    )
