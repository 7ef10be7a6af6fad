"""`hami_build_info`: HAMi's build gauge, its labels, and both daemons' `/metrics` serving it
(scraped over HTTP and read with Prometheus' text parser)."""

from __future__ import annotations

import json
import os
import platform
import sys
import urllib.request
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.extender.metrics import SchedulerMetrics
from hami_plugin.metrics.buildinfo import BUILD_INFO, BuildInfo, BuildInfoCollector
from hami_plugin.metrics.exposition import render_text
from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.usage import NodeUsage
from hami_plugin.testing.apiserver import FakeApiServer
from tests.deviceplugin.test_metrics_daemon import running_device_plugin

LABELS = {"version", "revision", "build_date", "python_version", "compiler", "platform"}
"""HAMi's labels (pkg/metrics/metrics.go:34-39), `python_version` for its `go_version`."""


def build_info_samples(text: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == BUILD_INFO
        for sample in family.samples
    ]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_the_gauge_is_one_with_the_builds_labels() -> None:
    info = BuildInfo("0.1.0", "abc123", "unknown", "3.11.7", "CPython", "linux/arm64")
    text = render_text(BuildInfoCollector(info).collect()).decode()
    assert "# TYPE hami_build_info gauge" in text
    assert build_info_samples(text) == [
        (
            {
                "version": "0.1.0",
                "revision": "abc123",
                "build_date": "unknown",
                "python_version": "3.11.7",
                "compiler": "CPython",
                "platform": "linux/arm64",
            },
            1.0,
        )
    ]


def test_this_processes_build() -> None:
    info = BuildInfo.of_this_process()
    assert info.version == metadata.version("hami-plugin")
    assert info.python_version == platform.python_version()
    assert info.compiler == platform.python_implementation()
    os_name, _, arch = info.platform.partition("/")
    assert os_name == sys.platform
    assert arch and arch not in ("x86_64", "aarch64")  # Go's GOARCH names: amd64, arm64


class _Installed(metadata.Distribution):
    """A distribution whose `direct_url.json` is given (PEP 610)."""

    def __init__(self, direct_url: str | None) -> None:
        self._direct_url = direct_url

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return "Metadata-Version: 2.1\nName: hami-plugin\nVersion: 9.9.9\n"
        return self._direct_url if filename == "direct_url.json" else None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(path)


def test_the_revision_is_the_commit_pip_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from_git = json.dumps(
        {
            "url": "https://example.com/hami-plugin.git",
            "vcs_info": {"vcs": "git", "commit_id": "1f2e"},
        }
    )
    for direct_url, revision in [
        (from_git, "1f2e"),
        (json.dumps({"url": "file:///src", "dir_info": {}}), "unknown"),  # `pip install .`
        (None, "unknown"),
        ("not json", "unknown"),
    ]:
        monkeypatch.setattr(metadata, "distribution", lambda name, d=direct_url: _Installed(d))
        info = BuildInfo.of_this_process()
        assert (info.version, info.revision) == ("9.9.9", revision)


class _EmptyView:
    def usage_snapshot(self) -> tuple[Sequence[NodeUsage], Sequence[TrackedPod]]:
        return (), ()

    def is_leader(self) -> bool:
        return True


def test_the_scheduler_serves_it() -> None:
    server = SchedulerMetrics(_EmptyView()).serve("127.0.0.1:0")
    assert server is not None
    try:
        ((labels, value),) = build_info_samples(scrape(server.url))
    finally:
        server.stop()
    assert value == 1.0
    assert set(labels) == LABELS
    assert labels["version"] == metadata.version("hami-plugin")


def test_the_device_plugin_serves_it(tmp_path: Path, apiserver: FakeApiServer) -> None:
    with running_device_plugin(tmp_path, apiserver) as plugin:
        ((labels, value),) = build_info_samples(scrape(plugin.url))
    assert value == 1.0
    assert set(labels) == LABELS  # no zone label, as HAMi registers it
