"""`hami schedule` reads the pod as the admission webhook would let it in (`--no-webhook`: as
given), and refuses a `--nodes` name the snapshot lacks; run as the command users run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.processes import REPO, hami_command

FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler"
CLUSTER = str(FIXTURES / "cluster.yaml")
NOW = "1741083600"


def pod_file(tmp_path: Path, limits: dict[str, Any], **container: Any) -> str:
    """A pod written by hand: no scheduler named, one container `app` with `limits`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": limits}, **container}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return str(path)


def schedule(*args: str) -> subprocess.CompletedProcess[str]:
    argv = hami_command("schedule", "--snapshot", CLUSTER, "--now", NOW, *args)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def allocated(output: dict[str, Any]) -> str:
    return str(output["annotations"]["hami.io/vgpu-devices-allocated"])


def test_memory_alone_gets_one_gpu_from_the_webhook(tmp_path: Path) -> None:
    pod = pod_file(tmp_path, {"nvidia.com/gpumem": 3000})
    done = schedule("--pod", pod, "--explain")
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)
    assert output["node"] == "gpu-a100-0"
    assert allocated(output).endswith(",NVIDIA,3000,0:;")
    assert output["webhook"] == [
        {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "1"},
        {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
    ]
    assert done.stderr.splitlines()[0] == (
        "admission webhook (--no-webhook: the pod as given): container app: limits "
        "nvidia.com/gpu: 1; spec.schedulerName: hami-scheduler"
    )

    as_given = schedule("--pod", pod, "--no-webhook", "--explain")
    assert as_given.returncode == 0, as_given.stderr
    output = json.loads(as_given.stdout)
    assert output["node"] is None
    assert output["note"] == "the pod asks no GPU: every node passes"
    assert "webhook" not in output
    assert as_given.stderr.splitlines()[0] == (
        "admission webhook: not applied (--no-webhook): the pod as given"
    )


def test_whole_gpu_gets_all_cores_from_the_webhook(tmp_path: Path) -> None:
    pod = pod_file(tmp_path, {"nvidia.com/gpu": 1})
    done = schedule("--pod", pod)
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)
    assert allocated(output).endswith(",100:;")  # HAMi's defaultExclusiveCoreIfNeeded
    assert output["webhook"][0] == {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
        "value": "100",
    }

    as_given = schedule("--pod", pod, "--no-webhook")
    assert as_given.returncode == 0, as_given.stderr
    assert allocated(json.loads(as_given.stdout)).endswith(",0:;")


def test_an_admitted_pod_is_unchanged() -> None:
    done = schedule("--pod", str(FIXTURES / "pod-small.yaml"))
    assert done.returncode == 0, done.stderr
    assert "webhook" not in json.loads(done.stdout)


def test_webhook_refusal_is_bad_input(tmp_path: Path) -> None:
    privileged = pod_file(tmp_path, {"nvidia.com/gpu": 1}, securityContext={"privileged": True})
    done = schedule("--pod", privileged)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(
        f"hami schedule: {privileged}: the admission webhook would deny the pod: "
        "container app is privileged (--no-webhook reads the pod as given"
    )
    assert done.stderr.count("\n") == 1
    assert schedule("--pod", privileged, "--no-webhook").returncode == 0

    too_much = pod_file(tmp_path, {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150})
    done = schedule("--pod", too_much)
    assert done.returncode == 1
    assert "would deny the pod: invalid nvidia.com/gpumem-percentage value 150" in done.stderr


def test_a_node_the_snapshot_lacks_is_named() -> None:
    done = schedule("--pod", str(FIXTURES / "pod-small.yaml"), "--nodes", "gpu-a10O-0,gpu-a100-0")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"hami schedule: --nodes: no node gpu-a10O-0 in {CLUSTER} "
        "(it holds gpu-a100-0, gpu-v100-0, gpu-t4-0, cpu-0)\n"
    )
