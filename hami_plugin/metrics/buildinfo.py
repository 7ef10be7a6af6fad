"""`hami_build_info`: which build of the daemon answers, as a gauge of 1 with labels.

HAMi v2.10 registers it on its scheduler's and its vGPU monitor's endpoints
(pkg/metrics/metrics.go:27-43, cmd/scheduler/metrics.go:416, cmd/vGPUmonitor/main.go:143), so
both our daemons export it too, with HAMi's name, value and labels where a label means the
same here: `version` (this package's), `revision` (the git commit when pip installed it from a
VCS URL, else `unknown`, HAMi's value for a build without one), `build_date` (`unknown`, as
HAMi's unstamped builds), `compiler` (the Python implementation, `CPython`; Go's `gc` for
HAMi), `platform` (Go's `GOOS/GOARCH` spelling, `linux/amd64`). HAMi's `go_version` is
`python_version` here. No zone label, as HAMi's.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

from hami_plugin.metrics.families import GaugeMetricFamily, Metric

__all__ = ["BUILD_INFO", "BuildInfo", "BuildInfoCollector"]

BUILD_INFO = "hami_build_info"
_HELP = "Build of this daemon, in the labels; the value is always 1"
_DISTRIBUTION = "hami-plugin"
_UNKNOWN = "unknown"
# Go's GOARCH names for the machine names Python reports.
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """The labels of `hami_build_info`."""

    version: str
    revision: str
    build_date: str
    python_version: str
    compiler: str
    platform: str

    @classmethod
    def of_this_process(cls) -> BuildInfo:
        """This installation's: the package metadata, the interpreter, the machine."""
        try:
            distribution: metadata.Distribution | None = metadata.distribution(_DISTRIBUTION)
        except metadata.PackageNotFoundError:
            distribution = None
        machine = platform.machine().lower()
        return cls(
            version=distribution.version if distribution is not None else _UNKNOWN,
            revision=_vcs_commit(distribution),
            build_date=_UNKNOWN,
            python_version=platform.python_version(),
            compiler=platform.python_implementation(),
            platform=f"{sys.platform}/{_GOARCH.get(machine, machine or _UNKNOWN)}",
        )

    def labels(self) -> dict[str, str]:
        """Label name to value."""
        return {
            "version": self.version,
            "revision": self.revision,
            "build_date": self.build_date,
            "python_version": self.python_version,
            "compiler": self.compiler,
            "platform": self.platform,
        }


def _vcs_commit(distribution: metadata.Distribution | None) -> str:
    """The commit pip recorded (PEP 610 `direct_url.json`) for an install from git."""
    if distribution is None:
        return _UNKNOWN
    try:
        direct_url = json.loads(distribution.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        return _UNKNOWN
    vcs_info = direct_url.get("vcs_info") if isinstance(direct_url, dict) else None
    commit = vcs_info.get("commit_id") if isinstance(vcs_info, dict) else None
    return commit if isinstance(commit, str) and commit else _UNKNOWN


class BuildInfoCollector:
    """Exports `hami_build_info{...} 1` with `info` (this process's when None)."""

    def __init__(self, info: BuildInfo | None = None) -> None:
        self.info = info if info is not None else BuildInfo.of_this_process()

    def _family(self) -> GaugeMetricFamily:
        labels = self.info.labels()
        return GaugeMetricFamily(BUILD_INFO, _HELP, labels=list(labels))

    def describe(self) -> Iterator[Metric]:
        """The family this collector produces (no samples), for the registry."""
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        """The gauge, 1, with the build's labels."""
        family = self._family()
        family.add_metric(list(self.info.labels().values()), 1)
        yield family
