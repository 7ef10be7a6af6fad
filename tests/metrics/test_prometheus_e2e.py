"""A real Prometheus scrapes both endpoints; its HTTP API shows the series; promtool lints them.

A small cluster on one API server double: the real device plugin daemon (fake NVML, test
kubelet) with a HAMi-core region file written into a container directory, and the real
`hami scheduler` daemon (in-process, as tests/extender/cluster.py runs it) that registers the
node from the device plugin's annotation, tracks the booked pod and answers a /filter call.

Needs the `prometheus` and `promtool` binaries (Debian package `prometheus`), which `make tools`
unpacks into `.venv/tools/bin/`; else they are looked up on PATH. Outside CI a missing binary
skips the test with a message; with CI=true it fails it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.extender.daemon import SchedulerDaemon
from hami_plugin.extender.settings import SchedulerConfig
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol.model import ContainerDevice
from hami_plugin.testing.apiserver import FakeApiServer
from tests.deviceplugin.test_metrics_daemon import (
    GPU_0,
    NODE,
    SPLIT,
    add_booked_pod,
    running_device_plugin,
    write_usage_region,
)
from tests.extender.helpers import gpu_pod
from tests.metrics.test_dashboard import dashboard_queries
from tests.processes import LoggedProcess, wait_until

MIB = 1 << 20
TOOLS_BIN = Path(__file__).resolve().parents[2] / ".venv" / "tools" / "bin"
INSTALL_HINT = "run `make tools`: it unpacks Debian's prometheus package into .venv/tools/"
# HAMi v2.10's name, kept for compatibility; promtool's naming lint dislikes the suffix.
ACCEPTED_LINT = frozenset(
    {'hami_gpu_shared_count non-histogram and non-summary metrics should not have "_count" suffix'}
)


def binary(name: str) -> str:
    """The binary's path, `make tools`' copy first, then PATH; skips the test (fails it under
    CI=true) when it is missing."""
    path = shutil.which(name, path=str(TOOLS_BIN)) or shutil.which(name)
    if path is not None:
        return path
    message = f"{name} not found in {TOOLS_BIN} or on PATH ({INSTALL_HINT})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true, so this test must run")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, targets: dict[str, str]) -> Iterator[str]:
    """Prometheus on loopback scraping `targets` (job -> host:port) every second; yields its
    base URL. Storage lives in tmp_path; the process is always stopped."""
    executable = binary("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": job,
                        "metrics_path": "/metrics",
                        "static_configs": [{"targets": [address]}],
                    }
                    for job, address in targets.items()
                ],
            }
        )
    )
    port = free_port()
    process = LoggedProcess(
        "prometheus",
        [
            executable,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        tmp_path,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.process.poll() is not None:
            raise AssertionError(
                f"prometheus exited with {process.process.returncode}:\n{process.log()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, "prometheus to be ready", timeout=60.0, interval=0.2)
        yield base
    finally:
        process.stop(15)


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """Run an instant query; fails the test with Prometheus' error text when it is refused."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        raise AssertionError(f"query {expr!r} refused: {error.read().decode()}") from None
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def one_value(base: str, expr: str) -> float:
    (series,) = query(base, expr)
    return float(series["value"][1])


def promtool_problems(text: bytes) -> list[str]:
    """What `promtool check metrics` reports (empty when it passes). A parse error fails."""
    result = subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).decode().strip()
    assert result.returncode in (0, 3), f"promtool could not parse the exposition: {output}"
    return [line.strip() for line in output.splitlines() if line.strip()]


def exposition(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


@contextlib.contextmanager
def running_scheduler(apiserver: FakeApiServer, metrics_port: int) -> Iterator[SchedulerDaemon]:
    """The real `hami scheduler` daemon, in-process, serving its own metrics."""
    kube = KubeClient(
        apiserver.api_client(),
        RetryPolicy(
            attempts=3, initial_backoff_seconds=0.01, max_backoff_seconds=0.05, timeout_seconds=5
        ),
    )
    config = SchedulerConfig(
        http_host="127.0.0.1", http_port=0, metrics_bind_address=f"127.0.0.1:{metrics_port}"
    )
    daemon = SchedulerDaemon(config, kube=kube, watch_timeout_seconds=30)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()), name="scheduler")
    thread.start()
    try:
        assert daemon.started.wait(20), "the scheduler did not start"
        assert daemon.ready.wait(20), "the scheduler did not get its first lists"
        yield daemon
    finally:
        daemon.stop()
        thread.join(60)
        kube.close()
    assert exit_codes == [0]


def post_filter(daemon: SchedulerDaemon, pod: dict[str, Any]) -> dict[str, Any]:
    """kube-scheduler's /filter call for one GPU pod on the node."""
    body = json.dumps({"Pod": pod, "NodeNames": [NODE]}).encode()
    request = urllib.request.Request(
        f"{daemon.url}/filter", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def test_prometheus_scrapes_both_daemons(tmp_path: Path, apiserver: FakeApiServer) -> None:
    binary("prometheus")
    binary("promtool")
    share = ContainerDevice(GPU_0, "NVIDIA", 4000, 30)
    scheduler_port = free_port()
    with (
        running_device_plugin(tmp_path / "node", apiserver) as plugin,
        running_scheduler(apiserver, scheduler_port) as scheduler,
    ):
        # What kubelet does after ListAndWatch; the scheduler's health check reads it.
        apiserver.update_object(
            "nodes",
            "",
            NODE,
            lambda node: node["status"]["allocatable"].update({"nvidia.com/gpu": str(2 * SPLIT)}),
        )
        uid = add_booked_pod(apiserver, "trainer", ((share,), (share,)))
        write_usage_region(plugin.hook, uid, "c0", used_mib=1500)
        # the filter must see trainer's booking on GPU 0, else spread's tie sends "next" there
        wait_until(
            lambda: scheduler.state.tracked("default/trainer") is not None,
            "the scheduler to count pod trainer",
            timeout=20.0,
        )
        post_filter(scheduler, gpu_pod("next", memory=1000))
        assert plugin.daemon.metrics is not None
        targets = {
            "hami-device-plugin": str(plugin.daemon.metrics.server.bound),
            "hami-scheduler": f"127.0.0.1:{scheduler_port}",
        }
        for address in targets.values():
            text = exposition(f"http://{address}/metrics")
            assert set(promtool_problems(text)) <= ACCEPTED_LINT, address

        (tmp_path / "prom").mkdir()
        with running_prometheus(tmp_path / "prom", targets) as base:
            wait_until(
                lambda: {s["metric"]["job"] for s in query(base, "up == 1")} == set(targets),
                "both targets to be scraped and up",
                timeout=60.0,
                interval=0.2,
            )
            wait_until(
                lambda: (
                    bool(query(base, 'hami_vgpu_memory_allocated_bytes{pod="trainer"}'))
                    and bool(query(base, 'hami_vgpu_memory_used_bytes{pod="trainer"}'))
                ),
                "the scheduler's booking and the container's usage of pod trainer",
                timeout=60.0,
                interval=0.2,
            )

            (series,) = query(base, f'hami_host_gpu_memory_used_bytes{{device_uuid="{GPU_0}"}}')
            assert series["metric"]["node"] == NODE
            assert series["metric"]["zone"] == "vGPU"
            assert float(series["value"][1]) == 2048 * MIB

            used = one_value(base, 'hami_vgpu_memory_used_bytes{pod="trainer", container="c0"}')
            assert used == 1500 * MIB
            allocated = one_value(base, 'sum(hami_vgpu_memory_allocated_bytes{pod="trainer"})')
            assert allocated == 8000 * MIB
            assert one_value(base, f'hami_gpu_shared_count{{device_uuid="{GPU_0}"}}') == 2
            assert one_value(base, "sum(hami_scheduler_filter_duration_seconds_count)") >= 1

            # Every dashboard query is valid PromQL to this Prometheus; the gauges have data.
            wait_until(
                lambda: bool(query(base, "increase(hami_scheduler_bookings_expired_total[1h])")),
                "two scrapes of the scheduler (for increase())",
                timeout=60.0,
                interval=0.2,
            )
            for expr in dashboard_queries():
                result = query(base, expr)
                if not any(word in expr for word in ("rate(", "increase(")):
                    assert result, f"no data for dashboard query {expr!r}"
