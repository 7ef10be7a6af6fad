"""The `hami` command itself, run as users run it: `--version`, no command, and output into a
pipe whose reader has gone (`hami ... | head -1`)."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.processes import REPO, hami_command

FIXTURES = REPO / "tests" / "fixtures" / "scheduler"


def hami(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hami_command(*args), cwd=REPO, input=stdin, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_version() -> None:
    done = hami("--version")
    assert (done.returncode, done.stdout) == (0, f"hami {version('hami-plugin')}\n")


def test_no_command_prints_the_usage_and_exits_2() -> None:
    done = hami()
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("usage: hami ")
    assert done.stderr.endswith("hami: error: name a command (hami --help lists them)\n")


@pytest.mark.parametrize(
    "args",
    [
        (
            "schedule",
            "--snapshot",
            str(FIXTURES / "cluster.yaml"),
            "--pod",
            str(FIXTURES / "pod-small.yaml"),
            "--explain",
        ),
        ("decode", "--indent", "2", "hami.io/vgpu-devices-allocated", "GPU-a,NVIDIA,100,0:;"),
    ],
    ids=["schedule", "decode"],
)
def test_a_reader_gone_ends_the_command_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`hami ... | head -1` whose `head` has exited: status 141, as a process SIGPIPE ends,
    and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            hami_command(*args), cwd=REPO, stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_encode_into_a_closed_pipe_is_quiet() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            hami_command("encode", "hami.io/vgpu-devices-allocated"), cwd=REPO,
            input='[[{"uuid": "GPU-a", "type": "NVIDIA", "usedmem": 100, "usedcores": 0}]]',
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")
