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


# --- errors name what the user gave: the flag, the config key, the file -----------------------


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("device-plugin", "--node-name", "n", "--device-split-count", "0"), 2,
         "--device-split-count must be at least 1, got 0"),
        (("device-plugin", "--node-name", "n", "--health-wait-ms", "0"), 2,
         "--health-wait-ms must be at least 1, got 0"),
        (("schedule", "--snapshot", str(FIXTURES / "cluster.yaml"), "--pod",
          str(FIXTURES / "pod-small.yaml"), "--memory-factor", "0"), 1,
         "hami schedule: --memory-factor must be at least 1, got 0"),
        (("schedule", "--snapshot", str(FIXTURES / "cluster.yaml"), "--pod",
          str(FIXTURES / "pod-small.yaml"), "--default-cores", "101"), 1,
         "hami schedule: --default-cores must be between 0 and 100, got 101"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_named_by_its_flag(
    args: tuple[str, ...], status: int, message: str
) -> None:
    done = hami(*args)
    assert done.returncode == status, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("nvidia", "message"),
    [
        ("memoryFactor: 0", "nvidia.memoryFactor must be at least 1, got 0"),
        ("defaultCores: 101", "nvidia.defaultCores must be between 0 and 100, got 101"),
        ("defaultMemory: -1", "nvidia.defaultMemory must not be negative, got -1"),
        ("gpuCorePolicy: strict", "nvidia.gpuCorePolicy must be one of default, force, disable"),
    ],
)
def test_a_bad_device_config_value_is_named_by_its_key(
    tmp_path: Path, nvidia: str, message: str
) -> None:
    config = tmp_path / "device-config.yaml"
    config.write_text(f"nvidia:\n  {nvidia}\n")
    done = hami("scheduler", "--device-config-file", str(config))
    assert done.returncode == 2, done.stderr
    assert f"--device-config-file {config}: {message}" in done.stderr


def test_a_missing_certificate_file_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    key = tmp_path / "tls.key"
    key.write_text("not read")
    done = hami("scheduler", "--cert-file", str(tmp_path / "tls.crt"), "--key-file", str(key))
    assert done.returncode == 2, done.stderr
    assert f"--cert-file {tmp_path / 'tls.crt'}: No such file or directory" in done.stderr
    assert "Errno" not in done.stderr


@pytest.mark.parametrize(
    "command", [("scheduler", "--metrics-bind-address", "127.0.0.1:0"), ("certs",)]
)
def test_a_missing_kubeconfig_is_named(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "nope"
    done = hami(*command, "--kubeconfig", str(missing))
    assert done.returncode != 0
    assert f"kubeconfig '{missing}' does not exist" in done.stderr
    assert "No configuration found" not in done.stderr
