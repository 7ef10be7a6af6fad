"""daemonset/requirements.lock: the exact versions of hami-plugin's runtime dependencies that
the test suite ran with, which the image installs.

The lock is the closure of `[project] dependencies` over the installed distributions' own
requirements (markers evaluated for this interpreter: the image runs the same Python minor
version on Linux), pinned to the installed versions. `.ci/run` installs the suite's
environment with the lock as pip constraints, so CI tests exactly what the image ships.

Regenerate after changing a dependency: `.venv/bin/python -m tests.deployment.lockfile`.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

LOCK = Path(__file__).resolve().parents[2] / "daemonset" / "requirements.lock"
HEADER = """\
# Runtime dependencies of hami-plugin, pinned to the versions its test suite ran with.
# The Dockerfile installs exactly these; .ci/run tests with them (PIP_CONSTRAINT).
# Regenerate: .venv/bin/python -m tests.deployment.lockfile
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(project: str = "hami-plugin") -> dict[str, str]:
    """{canonical name: installed version} of every distribution `project` needs at run time."""
    pinned: dict[str, str] = {}
    pending = [
        Requirement(text)
        for text in metadata.requires(project) or []
        if Requirement(text).marker is None or Requirement(text).marker.evaluate({"extra": ""})  # type: ignore[union-attr]
    ]
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


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in pins.items())


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
    sys.stdout.write(f"wrote {LOCK}\n")
