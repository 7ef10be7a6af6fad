"""Child processes for the end-to-end tests and the benchmarks (a `hami` daemon, the API
server double), and the polling they wait with: never a sleep for a time, always a condition."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What the daemons read as their configuration: a test run's own values must not leak in.
_NOT_INHERITED = ("KUBECONFIG", "POD_NAME", "NODE_NAME")


def wait_until(
    predicate: Callable[[], object], what: str = "", timeout: float = 20.0, interval: float = 0.02
) -> None:
    """Poll `predicate` until it is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what or predicate}")
        time.sleep(interval)


def hami_command(*args: str) -> list[str]:
    """`python -m hami_plugin <args>`: the `hami` command of the checkout it runs in, this one
    unless `LoggedProcess` is given another as `cwd` (the benchmarks' `--scheduler-source`,
    `--plugin-source`): `-m` puts the working directory first on `sys.path`, ahead of the
    venv's editable install of this checkout."""
    return [sys.executable, "-m", "hami_plugin", *args]


class LoggedProcess:
    """A child process whose output goes to `<log_dir>/<name>.log`.

    It does not inherit `KUBECONFIG`, `POD_NAME` or `NODE_NAME` from the test run (`env` sets
    what it needs), and its Python output is unbuffered so the log can be waited on.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        environment = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        environment.update(env or {})
        environment["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                argv, cwd=cwd, env=environment, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first match of `pattern` in the log; AssertionError if the process exits or
        `timeout` passes first."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            match = re.search(pattern, self.log())
            if match is not None:
                found.append(match)
                return True
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited early:\n{self.log()[-3000:]}")
            return False

        wait_until(seen, f"{self.name} logs {pattern!r}", timeout)
        return found[0]

    def wait(self, timeout: float = 15.0) -> int:
        """The exit status of a process that ends by itself; one still running after
        `timeout` s is killed and reported (AssertionError with its log)."""
        return self._exit_status(timeout, "did not exit")

    def stop(self, timeout: float = 40.0) -> int:
        """SIGTERM, then wait for the exit status; a process that ignores SIGTERM is killed
        and reported (AssertionError with its log)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self._exit_status(timeout, "ignored SIGTERM")

    def _exit_status(self, timeout: float, failure: str) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.name} {failure}:\n{self.log()[-3000:]}") from None

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when a node or a pod dies."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def memory_kib(self) -> dict[str, int]:
        """VmRSS and VmHWM of the process, in KiB."""
        status = Path(f"/proc/{self.pid}/status").read_text(encoding="utf-8")
        figures = {}
        for key in ("VmRSS", "VmHWM"):
            match = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
            assert match is not None, status
            figures[key] = int(match.group(1))
        return figures
