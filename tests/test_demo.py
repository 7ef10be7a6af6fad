"""`hami demo` as a user runs it: a subprocess, its exit status, its report, and nothing left
behind (no daemon still running, no work directory). Plus the report's pure pieces."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import hami_plugin.demo as demo
from hami_plugin.demo import report
from hami_plugin.demo.cluster import ContainerResult, PodResult
from hami_plugin.demo.workload import NODES, SAMPLE_PODS
from hami_plugin.protocol.model import ContainerDevice
from tests.processes import wait_until

HAMI = [sys.executable, "-m", "hami_plugin"]


@pytest.fixture
def tmpdir_env() -> Iterator[tuple[Path, dict[str, str]]]:
    """A short TMPDIR (unix socket paths are short) that only this demo uses, and its env."""
    path = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    try:
        yield path, {**os.environ, "TMPDIR": str(path)}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def processes_using(path: Path) -> list[str]:
    """Command lines of running processes that name `path` (every demo daemon does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if str(path) in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_the_demo_schedules_every_pod_reports_it_and_leaves_nothing_behind(
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    tmp, env = tmpdir_env
    done = subprocess.run(
        [*HAMI, "demo"], env=env, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the daemons log to files, grpc's C core stays quiet: the terminal gets the report only
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    for sample in SAMPLE_PODS:
        rows = [line for line in lines if line.startswith(f"  {sample.name}/")]
        if sample.fits:
            # one env row per container with GPUs, each with a visible GPU of a demo node
            expected = len(sample.containers) + len(sample.init_containers)
            assert len(rows) == expected, (sample.name, rows)
            assert all(" GPU-" in row for row in rows), rows
        else:
            assert rows == []
    unfit = next(i for i, line in enumerate(lines) if line.startswith("  too-big ("))
    assert lines[unfit].endswith("no node fits")
    assert lines[unfit + 1] == "    gpu-a100: 4/4 CardInsufficientMemory"
    assert lines[unfit + 2] == "    gpu-t4: 4/4 CardInsufficientMemory"
    header = next(line for line in lines if line.startswith("  POD "))
    assert "node policy binpack" in header and "node policy spread" in header
    t4_only = next(line for line in lines if line.startswith("  t4-only "))
    assert t4_only.count("gpu-t4 GPU") == 2  # use-gputype=T4 holds under both policies
    for metric in (
        "hami_host_gpu_memory_used_bytes{",
        "hami_host_gpu_vgpu_slots_allocated{",
        "hami_node_gpu_memory_allocated_ratio{",
        'hami_vgpu_memory_allocated_bytes{node="gpu-a100",pod="infer-10g"} 10737418240',
        'hami_scheduler_filter_failures_total{reason="CardInsufficientMemory"} 2',
    ):
        assert any(metric in line for line in lines), metric
    assert lines[-1].startswith("all 6 daemons stopped")
    assert processes_using(tmp) == []
    assert list(tmp.iterdir()) == []  # the work directory is gone


def _ctrl_c_not_ignored() -> None:
    """In the child: SIGINT back to its default, as in a terminal (a suite started in the
    background by a non-interactive shell inherits it ignored, and so would the demo)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_demo_once_running(tmp: Path, env: dict[str, str]) -> tuple[int, str, str] | None:
    """Start `hami demo`, SIGINT it once its six daemons run; None when it finished first (a
    whole demo takes seconds: on a loaded machine the six can come and go between two looks)."""
    demo = subprocess.Popen(
        [*HAMI, "demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_not_ignored,
    )
    try:
        # all six daemons started (each names the work directory on its command line)
        wait_until(
            lambda: len(processes_using(tmp)) >= 6 or demo.poll() is not None,
            "the six daemons start",
            timeout=60,
        )
        if demo.poll() is not None:
            demo.communicate(timeout=60)
            return None
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    return demo.returncode, stdout, stderr


def test_ctrl_c_stops_every_daemon_and_keeps_the_logs(
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    tmp, env = tmpdir_env
    for _ in range(5):
        interrupted = _interrupt_demo_once_running(tmp, env)
        if interrupted is not None:
            break
        assert processes_using(tmp) == [] and list(tmp.iterdir()) == []
    else:
        pytest.fail("the demo finished five times before its six daemons were seen running")
    returncode, stdout, stderr = interrupted
    assert returncode == 130, stdout + stderr
    assert "interrupted" in stderr
    assert processes_using(tmp) == []
    (workdir,) = tmp.iterdir()
    assert f"kept in {workdir}" in stderr
    logs = sorted(p.relative_to(workdir).as_posix() for p in workdir.glob("*/*.log"))
    assert logs == [
        "binpack/device-plugin-a100.log",
        "binpack/device-plugin-t4.log",
        "binpack/scheduler.log",
        "spread/device-plugin-a100.log",
        "spread/device-plugin-t4.log",
        "spread/scheduler.log",
    ]


def test_a_ctrl_c_while_the_demo_stops_interrupts_it_once_nothing_runs() -> None:
    """A signal during the final stop is held until every process is stopped, then interrupts
    the demo (exit 130, no report), instead of being ignored."""
    stopped: list[str] = []

    class Cluster:
        def close(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the stop
            stopped.append("admission")

        def close_after_processes(self) -> None:
            stopped.append("kubelets and API server")

    class Processes:
        def stop_all(self) -> list[str]:
            stopped.append("daemons")
            return []

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            demo._stop([Cluster()], Processes())  # type: ignore[list-item,arg-type]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped == ["admission", "daemons", "kubelets and API server"]


# --- the report's pure pieces ---------------------------------------------------------------------


def test_table_aligns_columns_and_does_not_pad_the_last() -> None:
    assert report.table(["A", "LONG"], [["xyz", "1"], ["", "22"]]) == [
        "  A    LONG",
        "  xyz  1",
        "       22",
    ]


def test_parse_metrics_reads_labels_with_spaces_and_skips_comments() -> None:
    text = (
        "# HELP x y\n"
        '# TYPE hami_gpu_memory_limit_bytes gauge\n'
        'hami_gpu_memory_limit_bytes{device_type="NVIDIA A100-SXM4-80GB",node="n"} 8.5e+10\n'
        "hami_scheduler_leader 1.0\n"
        "garbage line here\n"
    )  # fmt: skip
    samples = report.parse_metrics(text)
    assert [(s.name, dict(s.labels), s.value) for s in samples] == [
        (
            "hami_gpu_memory_limit_bytes",
            {"device_type": "NVIDIA A100-SXM4-80GB", "node": "n"},
            "8.5e+10",
        ),
        ("hami_scheduler_leader", {}, "1.0"),
    ]
    lines = report.metric_lines(
        "src", text, {"hami_gpu_memory_limit_bytes": {"node": "n"}}, ("node",)
    )
    assert lines == [f"  {'src':<24}" + 'hami_gpu_memory_limit_bytes{node="n"} 85000000000']


def test_comparison_and_gpu_tables_show_each_container_on_its_gpus() -> None:
    a100 = NODES[0]
    train = next(s for s in SAMPLE_PODS if s.name == "train-2gpu")
    too_big = next(s for s in SAMPLE_PODS if not s.fits)
    devices = (
        ContainerDevice(a100.gpus[1].uuid, "NVIDIA", 24576, 50),
        ContainerDevice(a100.gpus[0].uuid, "NVIDIA", 24576, 50),
    )
    placed = [
        PodResult(train, "gpu-a100", (ContainerResult("trainer", devices, {}),)),
        PodResult(too_big, failed_nodes={"gpu-t4": "4/4 CardInsufficientMemory"}),
    ]
    lines = report.comparison_lines({"binpack": placed, "spread": placed}, NODES)
    row = next(line for line in lines if line.startswith("  train-2gpu"))
    assert row.split("  ")[-1] == "gpu-a100 GPU 1+0"
    assert lines[-1].split("  ")[-1].strip() == "gpu-a100 2/4, gpu-t4 0/4"
    gpu_rows = report.gpu_lines(placed, NODES, {("gpu-a100", a100.gpus[0].uuid): (24576, 50)})
    assert sum("train-2gpu/trainer" in line for line in gpu_rows) == 2
    assert report.unfit_lines(placed) == [
        "  too-big (1 x 102400 MiB): no node fits",
        "    gpu-t4: 4/4 CardInsufficientMemory",
    ]


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_closed_pipe_ends_the_demo_quietly_and_leaves_nothing_behind(
    tmpdir_env: tuple[Path, dict[str, str]], unbuffered: str
) -> None:
    """`hami demo | head -3`: the reader is gone before the report (buffered: found at the
    last flush; unbuffered: at the first line, before any daemon starts); the demo stops what
    it started, removes its work directory and exits 141 without a traceback."""
    tmp, env = tmpdir_env
    env = {**env, "PYTHONUNBUFFERED": unbuffered}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [*HAMI, "demo"], env=env, stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=110, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert processes_using(tmp) == []
    assert list(tmp.iterdir()) == []
