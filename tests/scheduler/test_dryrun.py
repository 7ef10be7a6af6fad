"""`hami schedule` on the fixture snapshot (real `kubectl get nodes,pods -A -o yaml` output;
preemption on a snapshot with PriorityClasses and PodDisruptionBudgets:
test_dryrun_preemption.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hami_plugin.cli import main
from hami_plugin.scheduler.snapshot import SNAPSHOT_COMMAND

FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler"
CLUSTER = str(FIXTURES / "cluster.yaml")
A100_GPU0 = "GPU-7b1c9e2a-3f4d-4c1e-9a6b-2d8e5f0a1b3c"
A100_GPU1 = "GPU-c4d2a8f1-6e3b-4a9d-8c7e-1f5b2a9d0e4f"
T4_FAILURE = "1/2 CardCordoned, 1/2 CardNotHealth"


def schedule(
    capsys: pytest.CaptureFixture[str],
    pod: str,
    *extra: str,
    snapshot: str = CLUSTER,
    now: str | None = "1741083600",  # 2025-03-04 10:20:00 UTC
) -> tuple[int, dict[str, Any], str]:
    pod_path = pod if "/" in pod else str(FIXTURES / pod)
    clock = ["--now", now] if now is not None else []
    code = main(["schedule", "--snapshot", snapshot, "--pod", pod_path, *clock, *extra])
    captured = capsys.readouterr()
    output = json.loads(captured.out) if captured.out else {}
    return code, output, captured.err


def test_small_pod_binpack(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, err = schedule(capsys, "pod-small.yaml")
    value = f"{A100_GPU1},NVIDIA,10000,30:;"
    assert code == 0
    assert err == ""
    assert output == {
        "node": "gpu-a100-0",
        "annotations": {
            "hami.io/vgpu-node": "gpu-a100-0",
            "hami.io/vgpu-time": "1741083600",
            "hami.io/vgpu-devices-to-allocate": value,
            "hami.io/vgpu-devices-allocated": value,
        },
        "failedNodes": {"cpu-0": "node unregistered", "gpu-t4-0": T4_FAILURE},
        "scores": {"gpu-a100-0": 8.662109, "gpu-v100-0": 5.5},
    }


def test_policies_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-small.yaml", "--node-policy", "spread")
    assert (code, output["node"]) == (0, "gpu-v100-0")
    code, output, _ = schedule(capsys, "pod-small.yaml", "--gpu-policy", "binpack")
    assert output["annotations"]["hami.io/vgpu-devices-allocated"].startswith(A100_GPU0)


def test_numa_bind_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-numa.yaml")
    assert code == 0
    assert output["node"] == "gpu-v100-0"
    assert output["failedNodes"]["gpu-a100-0"] == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"
    )
    # both GPUs from NUMA node 0 (the V100s with index 0 and 1), 8Ki = 8192 MiB each
    assert output["annotations"]["hami.io/vgpu-devices-allocated"] == (
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,NVIDIA,8192,40:"
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,8192,40:;"
    )


A100X8 = str(FIXTURES / "a100-numa.yaml")


@pytest.mark.parametrize(
    ("pod", "extra", "expected"),
    [
        # the A100 fixture: HAMi v2.10 counts the GPUs picked (device.go:748, :872)
        (
            "pod-a100-four.yaml",
            (),
            "3/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientMemory",
        ),
        (
            "pod-a100-three-numa.yaml",
            (),
            "1/8 NumaNotFit, 2/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientMemory",
        ),
        # binpack walks NUMA 0 first: two GPUs picked there, then NUMA 1 is tried
        (
            "pod-a100-three-numa.yaml",
            ("--gpu-policy", "binpack"),
            "1/8 AllocatedCardsInsufficientRequest, 2/8 NumaNotFit, 5/8 CardInsufficientMemory",
        ),
    ],
)
def test_failure_strings_count_the_gpus_picked(
    capsys: pytest.CaptureFixture[str], pod: str, extra: tuple[str, ...], expected: str
) -> None:
    code, output, _ = schedule(capsys, pod, *extra, snapshot=A100X8)
    assert code == 2
    assert output["failedNodes"] == {"gpu-a100x8-0": expected}


HANDSHAKE = str(FIXTURES / "handshake.yaml")
HEALTHY = ["gpu-live-0", "gpu-new-0", "gpu-waiting-0"]


def test_nodes_whose_device_plugin_is_gone_are_unregistered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """HAMi v2.10 CheckHealth; --now 1741083600 is 2025-03-04 10:20:00 UTC."""
    code, output, _ = schedule(capsys, "pod-small.yaml", snapshot=HANDSHAKE)
    assert code == 0
    assert output["failedNodes"] == {
        "gpu-gone-0": "node unregistered",
        "gpu-zero-0": "node unregistered",
    }
    assert sorted(output["scores"]) == HEALTHY


@pytest.mark.parametrize(
    ("now", "unregistered"),
    [
        ("1741083361", []),  # 10:16:01, 59 s after the 10:15:02 handshakes
        ("1741083362", ["gpu-gone-0", "gpu-zero-0"]),  # 60 s after: expired
        ("1741083630", ["gpu-gone-0", "gpu-waiting-0", "gpu-zero-0"]),  # 10:20:30
    ],
)
def test_the_handshake_age_is_judged_against_now(
    capsys: pytest.CaptureFixture[str], now: str, unregistered: list[str]
) -> None:
    code, output, _ = schedule(capsys, "pod-small.yaml", snapshot=HANDSHAKE, now=now)
    assert code == 0
    assert sorted(output["failedNodes"]) == unregistered
    assert set(output["failedNodes"].values()) <= {"node unregistered"}


def test_without_now_the_handshake_age_is_judged_against_the_wall_clock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # every handshake of the fixture was written in March 2025, long before any run of this
    code, output, _ = schedule(capsys, "pod-small.yaml", snapshot=HANDSHAKE, now=None)
    assert code == 0
    assert sorted(output["failedNodes"]) == ["gpu-gone-0", "gpu-waiting-0", "gpu-zero-0"]
    assert output["node"] in ("gpu-live-0", "gpu-new-0")


def test_explain_says_why_a_node_is_unregistered(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = schedule(capsys, "pod-small.yaml", "--explain", snapshot=HANDSHAKE)
    gone = [line for line in err.splitlines() if line.startswith("gpu-gone-0")]
    assert gone == [
        "gpu-gone-0     -      node unregistered  "
        "device plugin gone (handshake expired, no GPU allocatable)"
    ]


def test_init_container_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-init.yaml")
    assert code == 0
    # download-weights (no GPU), compile-engine (50 % of an 80 GiB card), proxy (no GPU), server
    assert output["annotations"]["hami.io/vgpu-devices-allocated"] == (
        f";{A100_GPU1},NVIDIA,40960,0:;;{A100_GPU1},NVIDIA,12000,20:;"
    )


def test_no_node_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, err = schedule(capsys, "pod-too-big.yaml")
    assert code == 2
    assert err == ""
    assert output["node"] is None and output["annotations"] == {} and output["scores"] == {}
    assert output["failedNodes"] == {
        "cpu-0": "node unregistered",
        "gpu-a100-0": "2/2 CardInsufficientMemory",
        "gpu-t4-0": T4_FAILURE,
        "gpu-v100-0": "4/4 CardInsufficientMemory",
    }
    # priority 0, like every GPU pod of the snapshot: nobody to take GPUs back from
    assert output["preemption"] == {"outcome": "no_victims"}


def test_no_gpu_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-no-gpu.yaml")
    assert code == 0
    assert output["node"] is None
    assert output["note"] == "the pod asks no GPU: every node passes"


def test_bytes_for_mib_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """HAMi drops the request (the pod would go anywhere, as asking no GPU): an error here."""
    code, output, err = schedule(capsys, "pod-bad-quantity.yaml")
    assert (code, output) == (1, {})
    assert err == (
        f"hami schedule: {FIXTURES / 'pod-bad-quantity.yaml'}: container 'app': "
        "nvidia.com/gpumem=16Gi: out of range 0..2147483647 (MiB); write 16384: "
        "nvidia.com/gpumem counts MiB, and 16Gi is 16384 MiB; the scheduler would drop the GPU "
        "request\n"
    )


def _pod_file(tmp_path: Path, limits: str) -> str:
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "metadata: {name: p, namespace: ns}\n"
        f"spec:\n  containers:\n  - name: app\n    resources:\n      limits: {{{limits}}}\n"
    )
    return str(pod)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("nvidia.com/gpu: 1, nvidia.com/gpumem: 16Gi", "nvidia.com/gpumem=16Gi: out of range"),
        ("nvidia.com/gpu: 1.5", "nvidia.com/gpu=1.5: not a whole number; write 1 or 2 ("),
        ("nvidia.com/gpu: -1", "nvidia.com/gpu=-1: as int32 it is -1, not positive; write a"),
        ("nvidia.com/gpu: 99999999999",
         "nvidia.com/gpu=99999999999: larger than int32; write a whole number of GPUs from 1 to "
         "2147483647; the scheduler would take it as 1215752191"),
        ("nvidia.com/gpu: 1, nvidia.com/gpumem: 99999999999",
         "nvidia.com/gpumem=99999999999: out of range 0..2147483647 (MiB); write a whole"),
        ("nvidia.com/gpu: 1, nvidia.com/gpumem: 1Gi",
         "nvidia.com/gpumem=1Gi: a byte unit on a count of MiB; write 1024: "),
        ("nvidia.com/gpu: 1, nvidia.com/gpucores: 2.5",
         "nvidia.com/gpucores=2.5: not a whole number; write 2 or 3 ("),
    ],
)  # fmt: skip
def test_a_request_the_scheduler_would_misread_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, limits: str, message: str
) -> None:
    pod = _pod_file(tmp_path, limits)
    code, output, err = schedule(capsys, pod)
    assert (code, output) == (1, {})
    assert err.startswith(f"hami schedule: {pod}: container 'app': {message}")
    assert err.count("\n") == 1


def test_every_misread_value_is_a_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "metadata: {name: p, namespace: ns}\nspec:\n"
        "  initContainers:\n  - name: i\n    resources: {limits: {nvidia.com/gpu: 1.5}}\n"
        "  containers:\n  - name: a\n    resources: {limits: {nvidia.com/gpu: 1, "
        "nvidia.com/gpumem-percentage: 50.5}}\n"
    )
    code, _, err = schedule(capsys, str(pod))
    assert code == 1
    assert [line.split(": ")[2] for line in err.splitlines()] == ["container 'i'", "container 'a'"]


def test_a_clamped_percentage_is_reported_not_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """HAMi's scheduler clamps a percentage above 100 to the whole card, which is all it can
    mean (read as given: the webhook refuses the pod, test_webhook_refusal_is_bad_input)."""
    pod = _pod_file(tmp_path, "nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 150")
    code, output, err = schedule(capsys, pod, "--no-webhook")
    assert (code, err) == (0, "")
    assert output["node"] is not None
    assert output["problems"] == [
        "container 'app': nvidia.com/gpumem-percentage=150: above 100; write at most 100; "
        "taken as 100"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no Node in the snapshot (found nothing); expected a cluster snapshot, the output "
             f"of `{SNAPSHOT_COMMAND}`"),
        ('{"foo": 1}', "object 0 has no kind; expected Kubernetes objects, the output of "
                       f"`{SNAPSHOT_COMMAND}`"),
        ((FIXTURES / "pod-small.yaml").read_text(), "no Node in the snapshot (found 1 Pod); "
                                                     "expected a cluster snapshot"),
        ("kind: List\nitems: []\n", "no Node in the snapshot (found nothing)"),
    ],
)  # fmt: skip
def test_a_snapshot_without_nodes_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(text)
    code, output, err = schedule(capsys, "pod-small.yaml", snapshot=str(snapshot))
    assert (code, output) == (1, {})
    assert err.startswith(f"hami schedule: {snapshot}: {message}")
    assert err.count("\n") == 1


def test_candidate_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-small.yaml", "--nodes", "gpu-v100-0, cpu-0")
    assert code == 0
    assert output["node"] == "gpu-v100-0"
    assert output["failedNodes"] == {"cpu-0": "node unregistered"}


def test_explain_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, err = schedule(capsys, "pod-small.yaml", "--explain")
    assert code == 0 and output["node"] == "gpu-a100-0"  # stdout stays JSON
    lines = err.splitlines()
    assert lines[0] == "admission webhook: the pod unchanged"
    assert lines[1] == "node policy binpack (nodes in the order they are tried), GPU policy spread"
    assert lines[2].split() == ["NODE", "SCORE", "RESULT", "GPUS"]
    assert lines[3].split()[:5] == ["gpu-a100-0", "8.662109", "fits", "<-", "chosen"]
    assert lines[3].endswith(f"app: {A100_GPU1} 10000MiB 30%")
    assert lines[4].split()[:3] == ["gpu-v100-0", "5.5", "fits"]
    assert lines[5].split() == ["gpu-t4-0", "3.0833335", *T4_FAILURE.split()]
    assert lines[6].split() == ["cpu-0", "-", "node", "unregistered"]


def test_repeat_adds_timings(capsys: pytest.CaptureFixture[str]) -> None:
    code, output, _ = schedule(capsys, "pod-small.yaml", "--repeat", "5")
    assert code == 0
    assert set(output["decision_ms"]) == {"p50", "p99"}
    assert 0 <= output["decision_ms"]["p50"] <= output["decision_ms"]["p99"]


def test_rescheduling_a_tracked_pod_releases_its_old_allocation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # llm-serving-0 holds 40000 MiB of the A100 GPU 0; asked again for 60000 MiB it fits there
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "metadata: {name: llm-serving-0, namespace: inference}\n"
        "spec:\n  containers:\n  - name: vllm\n    resources:\n"
        "      limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 60000}\n"
    )
    code, output, _ = schedule(capsys, str(pod))
    assert code == 0
    assert output["annotations"]["hami.io/vgpu-devices-allocated"].startswith(A100_GPU0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pod", "/nonexistent/pod.yaml"], "cannot read /nonexistent/pod.yaml"),
        (["--gpu-policy", "bogus"], "--gpu-policy: unknown GPU scheduler policy"),
        (["--node-policy", "fill"], "--node-policy: unknown node scheduler policy"),
        (["--repeat", "-1"], "--repeat must not be negative"),
        (["--now", "99999999999999"], "--now 99999999999999 is not a time"),
        (["--memory-factor", "0"], "--memory-factor must be at least 1, got 0"),
        (["--default-cores", "101"], "--default-cores must be between 0 and 100, got 101"),
        (["--default-memory", "-1"], "--default-memory must not be negative, got -1"),
        (
            ["--pod", str(FIXTURES / "pod-bad-policy.yaml")],
            'unknown GPU scheduler policy "packbin"',
        ),
        (["--pod", CLUSTER], "expected one pod, found 10 objects"),
    ],
)
def test_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    argv = ["schedule", "--snapshot", CLUSTER, "--pod", str(FIXTURES / "pod-small.yaml"), *args]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("hami schedule: ")
    assert message in captured.err


def test_bad_snapshot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text("apiVersion: v1\nitems:\n- kind: Node\n  metadata: [oops\n")
    code = main(
        ["schedule", "--snapshot", str(snapshot), "--pod", str(FIXTURES / "pod-small.yaml")]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.startswith(f"hami schedule: {snapshot}: ")
    assert captured.err.count("\n") == 1


def test_python_dash_m(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami_plugin",
            "schedule",
            "--snapshot",
            CLUSTER,
            "--pod",
            str(FIXTURES / "pod-too-big.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert json.loads(completed.stdout)["node"] is None
