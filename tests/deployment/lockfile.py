"""The two locks `make` installs with, as pip constraints, so that a fresh clone gets the
versions the suite last passed with, whatever was released since:

* `daemonset/requirements.lock`: the runtime dependencies, which the image installs (and
  nothing else: the Dockerfile installs it with `--no-deps`);
* `tests/dev-requirements.lock`: what the dev extras add on top (pytest, mypy, ruff, ... and
  their own dependencies).

Each lock is the closure of pyproject's requirements over the installed distributions' own
requirements (markers evaluated for this interpreter: the image runs the same Python minor
version on Linux), pinned to the installed versions.

Refresh both on purpose with `make lock` (it upgrades .venv without constraints, then runs
`.venv/bin/python -m tests.deployment.lockfile`).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "daemonset" / "requirements.lock"
DEV_LOCK = ROOT / "tests" / "dev-requirements.lock"
HEADER = """\
# Runtime dependencies of hami-plugin, pinned to the versions its test suite ran with.
# The Dockerfile installs exactly these; `make` installs with them as constraints.
# Refresh: make lock
"""
DEV_HEADER = """\
# What hami-plugin's dev extras add to daemonset/requirements.lock, pinned to the versions
# its test suite ran with; `make` installs with both locks as constraints.
# Refresh: make lock
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[Requirement]) -> dict[str, str]:
    pinned: dict[str, str] = {}
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        name = canonical(requirement.name)
        if name in pinned:
            continue
        distribution = metadata.distribution(requirement.name)
        pinned[name] = distribution.version
        for text in distribution.requires or []:
            child = Requirement(text)
            if child.marker is None or child.marker.evaluate({"extra": ""}):
                pending.append(child)
    return dict(sorted(pinned.items()))


def _requirements(project: str, extra: str) -> list[Requirement]:
    found = []
    for text in metadata.requires(project) or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            found.append(requirement)
    return found


def runtime_closure(project: str = "hami-plugin") -> dict[str, str]:
    """{canonical name: installed version} of every distribution `project` needs at run time."""
    return _closure(_requirements(project, ""))


def dev_closure(project: str = "hami-plugin") -> dict[str, str]:
    """{canonical name: installed version} of what the `dev` extra adds to the runtime ones."""
    runtime = runtime_closure(project)
    everything = _closure(_requirements(project, "dev"))
    return {name: version for name, version in everything.items() if name not in runtime}


def render(pins: dict[str, str], header: str = HEADER) -> str:
    return header + "".join(f"{name}=={version}\n" for name, version in pins.items())


def read_lock(path: Path = LOCK) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version
    return pins


if __name__ == "__main__":
    LOCK.write_text(render(runtime_closure()))
    DEV_LOCK.write_text(render(dev_closure(), DEV_HEADER))
    sys.stdout.write(f"wrote {LOCK} and {DEV_LOCK}\n")
